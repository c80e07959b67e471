#pragma once
// One opened RDMA device port: context, protection domain, the completion queue and its
// poller. Shared (shared_ptr) by the fabric, its regions and its QPs, so it outlives them all.

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "transport/verbs/completion_poller.h"
#include "transport/verbs/ibv_handles.h"
#include "transport/verbs/port_info.h"
#include "transport/verbs/verbs_api.h"
#include "transport/verbs/verbs_options.h"

namespace ferry::verbs {

class VerbsDevice {
 public:
  // Opens options.device ("" = the first device with an active port), picks the port and,
  // on RoCE, the GID. UNAVAILABLE when the machine has no RDMA device at all.
  static absl::StatusOr<std::shared_ptr<VerbsDevice>> Open(std::shared_ptr<VerbsApi> api,
                                                           const VerbsOptions& options);
  ~VerbsDevice();

  VerbsApi& api() const { return *api_; }
  const PortInfo& port() const { return port_; }
  ibv_context* context() const { return context_.get(); }
  ibv_pd* pd() const { return pd_.get(); }
  ibv_cq* cq() const { return cq_.get(); }
  CompletionPoller& poller() const { return *poller_; }

  // Every QP reserves room in the shared CQ for all its WRs (each may complete, flushed, at
  // once); RESOURCE_EXHAUSTED when the CQ cannot take another QP of this size.
  absl::Status ReserveCqEntries(uint32_t n);
  void ReleaseCqEntries(uint32_t n);

 private:
  VerbsDevice(std::shared_ptr<VerbsApi> api, ContextPtr context, PortInfo port);

  // Declared in creation order: the poller stops before the CQ goes, the CQ and PD before the
  // context closes.
  const std::shared_ptr<VerbsApi> api_;
  ContextPtr context_;
  PortInfo port_;
  PdPtr pd_;
  CqPtr cq_;
  std::unique_ptr<CompletionPoller> poller_;

  absl::Mutex mu_;
  uint32_t cq_capacity_ = 0;
  uint32_t cq_reserved_ ABSL_GUARDED_BY(mu_) = 0;
};

// "no RDMA devices (ENOSYS)" style name of an errno value.
std::string ErrnoName(int err);

}  // namespace ferry::verbs
