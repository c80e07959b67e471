#pragma once
// One opened RDMA device port: context, protection domain, the completion queues and their
// poller, and the reader of the device's asynchronous events, which keeps the port's health.
// Shared (shared_ptr) by the fabric, its regions and its QPs, so it outlives them all.

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "transport/verbs/async_events.h"
#include "transport/verbs/completion_poller.h"
#include "transport/verbs/cq_pool.h"
#include "transport/verbs/handshake.h"
#include "transport/verbs/ibv_handles.h"
#include "transport/verbs/port_info.h"
#include "base/errno_name.h"
#include "transport/verbs/verbs_api.h"
#include "transport/verbs/verbs_options.h"

namespace ferry::verbs {

// The names of the machine's RDMA devices, in ibv_get_device_list order. UNAVAILABLE when it
// has none (as Open).
absl::StatusOr<std::vector<std::string>> DeviceNames(VerbsApi& api);

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
  CompletionPoller& poller() const { return *res_->poller; }

  // Room in one of the device's CQs for every WR a new QP may have (each may complete,
  // flushed, at once); RESOURCE_EXHAUSTED when the device has no CQ room left.
  absl::StatusOr<CqSlot> ReserveCq(uint32_t entries) { return res_->cqs->Reserve(entries); }
  const CqPool& cq_pool() const { return *res_->cqs; }

  // OK while the port is up; UNAVAILABLE with the event that said otherwise (its port went
  // down, the device was lost) until a PORT_ACTIVE event. New connections are refused
  // meanwhile; the QPs there were have been failed.
  absl::Status health() const;
  // True on the device's poller or event thread, where completions run: code there must not
  // wait for completions, which only those threads deliver.
  bool OnDeviceThread() const {
    return (res_->poller && res_->poller->OnPollerThread()) ||
           (res_->events && res_->events->OnReaderThread());
  }
  // Asynchronous events read so far.
  uint64_t events_seen() const { return res_->events ? res_->events->events_seen() : 0; }

 private:
  VerbsDevice(std::shared_ptr<VerbsApi> api, ContextPtr context, PortInfo port);

  struct Health {
    mutable absl::Mutex mu;
    absl::Status status ABSL_GUARDED_BY(mu);
    bool device_lost ABSL_GUARDED_BY(mu) = false;
  };
  // Declared in creation order and destroyed in reverse: the event reader stops first (its
  // handler uses the poller and the health), then the poller, before the CQs go; CQs and PD
  // before the context closes, and the binding outlives them all.
  struct Resources {
    std::shared_ptr<VerbsApi> api;
    ContextPtr context;
    PdPtr pd;
    std::unique_ptr<CqPool> cqs;
    std::unique_ptr<CompletionPoller> poller;
    Health health;
    std::unique_ptr<AsyncEventReader> events;
    ~Resources() {
      events.reset();
      poller.reset();
    }
  };
  // What the device does about one event (the reader's handler).
  static void OnAsyncEvent(Resources& res, uint8_t port, const AsyncEventMeaning& event);

  std::unique_ptr<Resources> res_;
  PortInfo port_;
};

// "no RDMA devices (ENOSYS)" style name of an errno value (base/errno_name.h).
using ::ferry::ErrnoName;

}  // namespace ferry::verbs
