#pragma once
// Probes of GPUDirect RDMA support that need the drivers, not sysfs: DMA-BUF registration
// on the NIC (rdma-core) and DMA-BUF export on the GPU (CUDA). NCCL detects DMA-BUF GDR
// the same way: `ibv_reg_dmabuf_mr` plus CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED.

#include <string>
#include <vector>

namespace ferry::topology {

struct SupportProbe {
  enum class State { kSupported, kUnsupported, kUnknown };
  State state = State::kUnknown;
  // The fact seen, e.g. "mlx5_0: ibv_reg_dmabuf_mr is implemented (EBADF on fd -1)".
  std::string detail;
};

const char* SupportStateName(SupportProbe::State state);  // "yes", "no", "unknown"

// Registers a DMA-BUF MR with fd -1 on the first RDMA device. The kernel and provider
// answer EOPNOTSUPP / EPROTONOSUPPORT when DMA-BUF registration is not implemented and
// fail on the bad fd otherwise (NCCL's ncclIbDmaBufSupport uses the same trick).
SupportProbe ProbeNicDmabuf();

// Interprets the errno of that probe registration (0 = it unexpectedly succeeded).
SupportProbe ClassifyDmabufErrno(const std::string& nic, int err);

// CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED of every CUDA device; unknown without CUDA.
SupportProbe ProbeGpuDmabuf();

// PCI bus ids ("0000:3b:00.0", lower case) of the CUDA devices by ordinal; empty without
// CUDA or without a driver.
std::vector<std::string> CudaPciBusIds();

}  // namespace ferry::topology
