#pragma once
// unique_ptr owners for every ibverbs object, released through the seam. Deleters never
// throw; a failed destroy is logged (it means a leak in the driver, not in our memory).
// Owners are declared so that QPs die before the CQ, the CQ and MRs before the PD, and the PD
// before the context.

#include <memory>

#include "spdlog/spdlog.h"
#include "transport/verbs/verbs_api.h"

namespace ferry::verbs {

namespace internal {
inline void WarnDestroy(const char* call, int rc) {
  if (rc != 0) spdlog::warn("verbs: {} failed: {}", call, strerror(rc > 0 ? rc : errno));
}
}  // namespace internal

struct ContextDeleter {
  VerbsApi* api = nullptr;
  void operator()(ibv_context* c) const noexcept {
    internal::WarnDestroy("ibv_close_device", api->CloseDevice(c));
  }
};
struct PdDeleter {
  VerbsApi* api = nullptr;
  void operator()(ibv_pd* pd) const noexcept {
    internal::WarnDestroy("ibv_dealloc_pd", api->DeallocPd(pd));
  }
};
struct MrDeleter {
  VerbsApi* api = nullptr;
  void operator()(ibv_mr* mr) const noexcept {
    internal::WarnDestroy("ibv_dereg_mr", api->DeregMr(mr));
  }
};
struct CqDeleter {
  VerbsApi* api = nullptr;
  void operator()(ibv_cq* cq) const noexcept {
    internal::WarnDestroy("ibv_destroy_cq", api->DestroyCq(cq));
  }
};
struct QpDeleter {
  VerbsApi* api = nullptr;
  void operator()(ibv_qp* qp) const noexcept {
    internal::WarnDestroy("ibv_destroy_qp", api->DestroyQp(qp));
  }
};

using ContextPtr = std::unique_ptr<ibv_context, ContextDeleter>;
using PdPtr = std::unique_ptr<ibv_pd, PdDeleter>;
using MrPtr = std::unique_ptr<ibv_mr, MrDeleter>;
using CqPtr = std::unique_ptr<ibv_cq, CqDeleter>;
using QpPtr = std::unique_ptr<ibv_qp, QpDeleter>;

}  // namespace ferry::verbs
