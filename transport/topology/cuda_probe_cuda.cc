// Built when CUDA is available. Links cudart statically, so on machines without a driver
// every call fails with cudaErrorInsufficientDriver / cudaErrorNoDevice and we report
// "unknown" instead of failing to start.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "transport/topology/machine.h"
#include "transport/topology/probes.h"

namespace ferry::topology {
namespace {

std::string NormalizedBusId(const char* id) {
  unsigned domain, bus, device, function;
  std::string text = absl::AsciiStrToLower(id);
  if (!ParsePciAddress(text, &domain, &bus, &device, &function)) return text;
  char out[32];
  std::snprintf(out, sizeof(out), "%04x:%02x:%02x.%x", domain, bus, device, function);
  return out;
}

}  // namespace

std::vector<std::string> CudaPciBusIds() {
  std::vector<std::string> ids;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return ids;
  for (int d = 0; d < count; ++d) {
    char id[32] = {};
    if (cudaDeviceGetPCIBusId(id, sizeof(id), d) != cudaSuccess) return {};
    ids.push_back(NormalizedBusId(id));
  }
  return ids;
}

SupportProbe ProbeGpuDmabuf() {
  SupportProbe probe;
  int count = 0;
  cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    probe.detail = absl::StrCat("CUDA: ", cudaGetErrorString(rc));
    return probe;
  }
  if (count == 0) {
    probe.detail = "CUDA: no devices";
    return probe;
  }
  // The runtime has no DMA-BUF attribute; ask the driver API through the runtime's entry
  // point lookup so the binary still needs no libcuda at link time.
  PFN_cuDeviceGetAttribute_v2000 get_attribute = nullptr;
  cudaDriverEntryPointQueryResult found{};
  rc = cudaGetDriverEntryPointByVersion("cuDeviceGetAttribute",
                                        reinterpret_cast<void**>(&get_attribute), 12000,
                                        cudaEnableDefault, &found);
  if (rc != cudaSuccess || found != cudaDriverEntryPointSuccess || get_attribute == nullptr) {
    probe.detail = "CUDA: cuDeviceGetAttribute entry point not found";
    return probe;
  }
  int supported = 0;
  std::string per_device;
  for (int d = 0; d < count; ++d) {
    int value = 0;
    if (get_attribute(&value, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, d) != CUDA_SUCCESS) {
      probe.detail = absl::StrCat("CUDA device ", d, ": cuDeviceGetAttribute failed");
      return probe;
    }
    supported += value != 0;
    absl::StrAppend(&per_device, d == 0 ? "" : ", ", "device ", d, "=", value);
  }
  probe.state = supported == count ? SupportProbe::State::kSupported
                                   : SupportProbe::State::kUnsupported;
  probe.detail = absl::StrCat("CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: ", per_device);
  return probe;
}

}  // namespace ferry::topology
