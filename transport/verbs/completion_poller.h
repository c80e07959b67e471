#pragma once
// One completion poller per device: it owns the CQ's polling thread and the table that routes
// each completion to its QP. Completions are handed out on the poller thread with no poller
// lock held, in CQ order (which is per-QP posting order on an RC QP).

#include <infiniband/verbs.h>

#include <memory>
#include <string>
#include <thread>

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
};

class CompletionPoller {
 public:
  CompletionPoller(VerbsApi* api, ibv_cq* cq, std::string device);
  // Stops and joins the thread. Every sink should have been removed.
  ~CompletionPoller();

  void Add(uint32_t qpn, std::shared_ptr<CompletionSink> sink);
  void Remove(uint32_t qpn);
  // Ends the idle back-off: work was just posted.
  void Wake();
  bool OnPollerThread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  void Loop();

  VerbsApi* const api_;
  ibv_cq* const cq_;
  const std::string device_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<uint32_t, std::shared_ptr<CompletionSink>> sinks_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace ferry::verbs
