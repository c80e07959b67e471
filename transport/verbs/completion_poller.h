#pragma once
// One completion poller per device: it owns the polling thread of the device's CQs and the
// table that routes each completion to its QP. Completions are handed out on the poller
// thread with no poller lock held, in CQ order (which is per-QP posting order on an RC QP).
// The same table routes the device's asynchronous errors (async_events.h) to the QPs they
// break.

#include <infiniband/verbs.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "transport/verbs/verbs_api.h"

namespace ferry::verbs {

// The completion status of a WR as an absl::Status: OK for IBV_WC_SUCCESS, else a code for
// what the caller can do about it (PERMISSION_DENIED: the peer refused key, range or access;
// UNAVAILABLE: the connection is gone), with ibv_wc_status_str, QP number and wr_id.
absl::Status WcStatusToStatus(const ibv_wc& wc);

// Receives the completions of one QP.
class CompletionSink {
 public:
  virtual ~CompletionSink() = default;
  // Runs on the poller thread; may be called briefly after Remove() returned.
  virtual void OnCompletion(const ibv_wc& wc) = 0;
  // An asynchronous event broke the QP (QP fatal, its port went down, its CQ or the device
  // failed); runs on the device's event thread, with no poller lock held. When
  // `completions_lost`, no completion will come for WRs already posted (the CQ or the
  // device is gone): the sink fails them itself.
  virtual void OnFatal(const absl::Status& why, bool completions_lost) = 0;
};

class CompletionPoller {
 public:
  CompletionPoller(VerbsApi* api, std::string device);
  // Stops and joins the thread. Every sink should have been removed.
  ~CompletionPoller();

  // Starts polling `cq` too (the CQ pool's callback; CQs are never removed).
  void AddCq(ibv_cq* cq);
  // Routes the completions and errors of QP `qpn`, whose CQ is `cq`, to `sink`.
  void Add(uint32_t qpn, ibv_cq* cq, std::shared_ptr<CompletionSink> sink);
  void Remove(uint32_t qpn);
  // Removes every route and hands their sinks to the caller, to drop once it holds no lock
  // a sink's destructor takes (its device's, when the device closes: a route holds its QP,
  // the QP its device, the device this poller, a cycle until the routes go).
  std::vector<std::shared_ptr<CompletionSink>> TakeAll();
  // Asynchronous errors: OnFatal on the sink of one QP, of every QP on `cq`, or of all.
  void FailQp(uint32_t qpn, const absl::Status& why);
  void FailCq(const ibv_cq* cq, const absl::Status& why);
  void FailAll(const absl::Status& why, bool completions_lost);
  // Ends the idle back-off: work was just posted.
  void Wake();
  // Stops and joins the thread (not from it): no CQ is polled after this returns, so the
  // device may destroy them. Later calls are harmless. The destructor calls it.
  void Stop();
  bool OnPollerThread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  struct Route {
    ibv_cq* cq = nullptr;
    std::shared_ptr<CompletionSink> sink;
  };
  void Loop();
  // Calls OnFatal on the sinks `pick` selects, outside the lock.
  template <typename Pick>
  void Fail(Pick pick, const absl::Status& why, bool completions_lost);

  VerbsApi* const api_;
  const std::string device_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<ibv_cq*> cqs_ ABSL_GUARDED_BY(mu_);
  // Bumped after each AddCq, so the polling loop re-reads cqs_ only when it changed.
  std::atomic<uint64_t> cqs_version_{0};
  absl::flat_hash_map<uint32_t, Route> sinks_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace ferry::verbs
