// Built when ferry is configured without CUDA: GPU-side facts are unknown, and say so.
#include "transport/topology/probes.h"

namespace ferry::topology {

SupportProbe ProbeGpuDmabuf() {
  SupportProbe probe;
  probe.detail = "ferry was built without CUDA (FERRY_CUDA=OFF or no toolkit)";
  return probe;
}

std::vector<std::string> CudaPciBusIds() { return {}; }

}  // namespace ferry::topology
