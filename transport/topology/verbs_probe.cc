// The NIC side of the DMA-BUF probe, against the real rdma-core API.
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "base/errno_name.h"
#include "transport/topology/probes.h"

namespace ferry::topology {
namespace {

struct DeviceListDeleter {
  void operator()(ibv_device** list) const noexcept { ibv_free_device_list(list); }
};
struct ContextDeleter {
  void operator()(ibv_context* context) const noexcept { ibv_close_device(context); }
};
struct PdDeleter {
  void operator()(ibv_pd* pd) const noexcept { ibv_dealloc_pd(pd); }
};

}  // namespace

const char* SupportStateName(SupportProbe::State state) {
  switch (state) {
    case SupportProbe::State::kSupported: return "yes";
    case SupportProbe::State::kUnsupported: return "no";
    case SupportProbe::State::kUnknown: return "unknown";
  }
  return "unknown";
}

SupportProbe ClassifyDmabufErrno(const std::string& nic, int err) {
  SupportProbe probe;
  if (err == EOPNOTSUPP || err == EPROTONOSUPPORT) {
    probe.state = SupportProbe::State::kUnsupported;
    probe.detail = absl::StrCat(nic, ": ibv_reg_dmabuf_mr is not supported (", ErrnoName(err),
                                ")");
  } else {
    // Any other answer (typically EBADF for fd -1) means the verb reached a provider that
    // implements it.
    probe.state = SupportProbe::State::kSupported;
    probe.detail = absl::StrCat(nic, ": ibv_reg_dmabuf_mr is implemented (",
                                err == 0 ? "accepted a probe" : ErrnoName(err), " on fd -1)");
  }
  return probe;
}

SupportProbe ProbeNicDmabuf(const std::string& nic) {
  SupportProbe probe;
  int count = 0;
  errno = 0;
  std::unique_ptr<ibv_device*, DeviceListDeleter> list(ibv_get_device_list(&count));
  if (list == nullptr) {
    // Without RDMA support in the kernel rdma-core answers NULL + ENOSYS, not an empty list.
    probe.detail = absl::StrCat(nic, ": no RDMA devices (", ErrnoName(errno), ")");
    return probe;
  }
  ibv_device* device = nullptr;
  for (int i = 0; i < count && device == nullptr; ++i) {
    if (nic == ibv_get_device_name(list.get()[i])) device = list.get()[i];
  }
  if (device == nullptr) {
    probe.detail = absl::StrCat(nic, ": not among the ", count, " RDMA devices rdma-core lists");
    return probe;
  }
  std::unique_ptr<ibv_context, ContextDeleter> context(ibv_open_device(device));
  if (context == nullptr) {
    probe.detail = absl::StrCat(nic, ": ibv_open_device failed (", ErrnoName(errno), ")");
    return probe;
  }
  std::unique_ptr<ibv_pd, PdDeleter> pd(ibv_alloc_pd(context.get()));
  if (pd == nullptr) {
    probe.detail = absl::StrCat(nic, ": ibv_alloc_pd failed (", ErrnoName(errno), ")");
    return probe;
  }
  errno = 0;
  ibv_mr* mr = ibv_reg_dmabuf_mr(pd.get(), 0, 0, 0, -1, 0);
  int err = errno;
  if (mr != nullptr) {
    ibv_dereg_mr(mr);
    err = 0;
  }
  return ClassifyDmabufErrno(nic, err);
}

}  // namespace ferry::topology
