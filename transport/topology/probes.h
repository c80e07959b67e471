#pragma once
// Probes that need the drivers or this process, not sysfs: DMA-BUF registration on a NIC
// (rdma-core), DMA-BUF export on the GPU (CUDA), and the locked-memory limit. NCCL detects
// DMA-BUF GDR the same way: `ibv_reg_dmabuf_mr` plus CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED.

#include <cstdint>
#include <optional>
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

// Registers a DMA-BUF MR with fd -1 on the RDMA device named `nic` ("mlx5_0"). The kernel
// and provider answer EOPNOTSUPP / EPROTONOSUPPORT when DMA-BUF registration is not
// implemented and fail on the bad fd otherwise (NCCL's ncclIbDmaBufSupport uses the same
// trick). Providers differ, so the doctor asks each NIC the plan chose, not the first one.
SupportProbe ProbeNicDmabuf(const std::string& nic);

// Interprets the errno of that probe registration (0 = it unexpectedly succeeded).
SupportProbe ClassifyDmabufErrno(const std::string& nic, int err);

// CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED of every CUDA device; unknown without CUDA.
SupportProbe ProbeGpuDmabuf();

// The locked-memory limit `ibv_reg_mr` is held to: the kernel counts every registered page
// against RLIMIT_MEMLOCK and answers ENOMEM past it, unless the process has CAP_IPC_LOCK.
struct MemlockLimit {
  std::optional<uint64_t> soft_bytes;  // nullopt: unlimited (RLIM_INFINITY)
  bool ipc_lock = false;               // CAP_IPC_LOCK in the effective set (root has it)
};

// getrlimit(RLIMIT_MEMLOCK) and CapEff of /proc/self/status for this process.
MemlockLimit ProbeMemlock();

// PCI bus ids ("0000:3b:00.0", lower case) of the CUDA devices by ordinal; empty without
// CUDA or without a driver.
std::vector<std::string> CudaPciBusIds();

}  // namespace ferry::topology
