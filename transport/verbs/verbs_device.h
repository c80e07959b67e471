#pragma once
// One opened RDMA device port: context, protection domain, the completion queues and their
// poller, and the reader of the device's asynchronous events, which keeps the port's health.
// Shared (shared_ptr) by the fabric, its regions and its QPs, so it outlives them all.

#include <memory>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"

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

// What holds an ibverbs object on a device (a QP, an MR): when the device closes (it was
// removed, or raised DEVICE_FATAL) the device asks each to destroy its object at once, since
// the kernel finishes a removal only once every object and the context are gone.
class DeviceUser {
 public:
  virtual ~DeviceUser() = default;
  // Destroys the object now, under the device's user lock: it must neither run callers'
  // completions there nor destroy another user. Later use finds it closed.
  virtual void ReleaseFromDevice() = 0;
};

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

  // Runs `make` (which creates ibv objects on the device and Attaches their owner) unless the
  // device was closed; returns whether it ran. Close() waits for a `make` under way.
  bool WhileOpen(absl::FunctionRef<void()> make);
  // Inside WhileOpen's `make`: `user` is asked to release its object when the device closes.
  void Attach(DeviceUser* user);
  // First thing in a user's destructor (any thread): it is not asked again.
  void Detach(DeviceUser* user);
  // True once DEVICE_FATAL was read: nothing on the device works any more.
  bool lost() const;
  // True once the device's uverbs node is gone (VerbsApi::DeviceRemoved).
  bool Removed() const;
  // Closes the device so that the kernel can remove it: health() becomes `why` (UNAVAILABLE)
  // for good, every op on it fails with `why`, its threads stop, every user releases its QP
  // or MR, then the CQs, the PD and the context go. Never on a device thread. Idempotent.
  void Close(const absl::Status& why);
  bool closed() const;

 private:
  VerbsDevice(std::shared_ptr<VerbsApi> api, ContextPtr context, PortInfo port);

  struct Health {
    mutable absl::Mutex mu;
    absl::Status status ABSL_GUARDED_BY(mu);
    bool device_lost ABSL_GUARDED_BY(mu) = false;
    bool closing ABSL_GUARDED_BY(mu) = false;  // Close() ran
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
    // Held shared while objects are created on the device, exclusively by Close.
    mutable absl::Mutex life;
    bool closed ABSL_GUARDED_BY(life) = false;
    absl::Mutex users_mu;  // after `life` where both are held
    absl::flat_hash_set<DeviceUser*> users ABSL_GUARDED_BY(users_mu);
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
