#pragma once
// One opened RDMA device port: context, protection domain, the completion queue and its
// poller. Shared (shared_ptr) by the fabric, its regions and its QPs, so it outlives them all.

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "transport/verbs/completion_poller.h"
#include "transport/verbs/handshake.h"
#include "transport/verbs/ibv_handles.h"
#include "transport/verbs/port_info.h"
#include "base/errno_name.h"
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

  VerbsApi& api() const { return *res_->api; }
  // This port's half of a handshake for QP `qpn` starting at `psn`.
  QpAddress AddressOf(uint32_t qpn, uint32_t psn) const;
  const PortInfo& port() const { return port_; }
  ibv_context* context() const { return res_->context.get(); }
  ibv_pd* pd() const { return res_->pd.get(); }
  ibv_cq* cq() const { return res_->cq.get(); }
  CompletionPoller& poller() const { return *res_->poller; }

  // Every QP reserves room in the shared CQ for all its WRs (each may complete, flushed, at
  // once); RESOURCE_EXHAUSTED when the CQ cannot take another QP of this size.
  absl::Status ReserveCqEntries(uint32_t n);
  void ReleaseCqEntries(uint32_t n);

 private:
  VerbsDevice(std::shared_ptr<VerbsApi> api, ContextPtr context, PortInfo port);

  // Declared in creation order: the poller stops before the CQ goes, the CQ and PD before the
  // context closes, and the binding outlives them all.
  struct Resources {
    std::shared_ptr<VerbsApi> api;
    ContextPtr context;
    PdPtr pd;
    CqPtr cq;
    std::unique_ptr<CompletionPoller> poller;
    ~Resources() { poller.reset(); }
  };

  std::unique_ptr<Resources> res_;
  PortInfo port_;

  absl::Mutex mu_;
  uint32_t cq_capacity_ = 0;
  uint32_t cq_reserved_ ABSL_GUARDED_BY(mu_) = 0;
};

// "no RDMA devices (ENOSYS)" style name of an errno value (base/errno_name.h).
using ::ferry::ErrnoName;

}  // namespace ferry::verbs
