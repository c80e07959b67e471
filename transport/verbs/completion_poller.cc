#include "transport/verbs/completion_poller.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "spdlog/spdlog.h"

namespace ferry::verbs {

absl::Status WcStatusToStatus(const ibv_wc& wc) {
  if (wc.status == IBV_WC_SUCCESS) return absl::OkStatus();
  std::string what = absl::StrFormat(
      "verbs: QP 0x%x wr_id %d: %s (ibv_wc_status %d, vendor_err 0x%x)", wc.qp_num, wc.wr_id,
      ibv_wc_status_str(wc.status), static_cast<int>(wc.status), wc.vendor_err);
  switch (wc.status) {
    // The responder refused the rkey, the range or the access: its memory is untouched.
    // (An HCA does not tell a bad key from a bad range; both are one R_Key violation.)
    case IBV_WC_REM_ACCESS_ERR:
      return absl::PermissionDeniedError(what);
    case IBV_WC_REM_INV_REQ_ERR:
      return absl::InvalidArgumentError(what);
    // Our own WR was malformed (lkey, bounds, length): a provider bug, not the peer's.
    case IBV_WC_LOC_LEN_ERR:
    case IBV_WC_LOC_QP_OP_ERR:
    case IBV_WC_LOC_PROT_ERR:
    case IBV_WC_LOC_ACCESS_ERR:
    case IBV_WC_MW_BIND_ERR:
      return absl::FailedPreconditionError(what);
    // The connection is gone or was torn down: reconnect.
    case IBV_WC_WR_FLUSH_ERR:
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
    case IBV_WC_REM_ABORT_ERR:
    case IBV_WC_RESP_TIMEOUT_ERR:
    case IBV_WC_FATAL_ERR:
      return absl::UnavailableError(what);
    default:
      return absl::InternalError(what);
  }
}

CompletionPoller::CompletionPoller(VerbsApi* api, std::string device)
    : api_(api), device_(std::move(device)) {
  thread_ = std::thread([this] { Loop(); });
}

CompletionPoller::~CompletionPoller() { Stop(); }

void CompletionPoller::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    woken_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void CompletionPoller::AddCq(ibv_cq* cq) {
  absl::MutexLock lock(&mu_);
  cqs_.push_back(cq);
  cqs_version_.fetch_add(1, std::memory_order_release);
  woken_ = true;
}

void CompletionPoller::Add(uint32_t qpn, ibv_cq* cq, std::shared_ptr<CompletionSink> sink) {
  absl::MutexLock lock(&mu_);
  sinks_[qpn] = Route{cq, std::move(sink)};
  woken_ = true;
}

void CompletionPoller::Remove(uint32_t qpn) {
  absl::MutexLock lock(&mu_);
  sinks_.erase(qpn);
}

std::vector<std::shared_ptr<CompletionSink>> CompletionPoller::TakeAll() {
  std::vector<std::shared_ptr<CompletionSink>> taken;
  absl::MutexLock lock(&mu_);
  taken.reserve(sinks_.size());
  for (auto& [qpn, route] : sinks_) taken.push_back(std::move(route.sink));
  sinks_.clear();
  return taken;
}

template <typename Pick>
void CompletionPoller::Fail(Pick pick, const absl::Status& why, bool completions_lost) {
  std::vector<std::shared_ptr<CompletionSink>> hit;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [qpn, route] : sinks_) {
      if (pick(qpn, route)) hit.push_back(route.sink);
    }
  }
  for (auto& sink : hit) sink->OnFatal(why, completions_lost);
}

void CompletionPoller::FailQp(uint32_t qpn, const absl::Status& why) {
  Fail([qpn](uint32_t q, const Route&) { return q == qpn; }, why, false);
}

void CompletionPoller::FailCq(const ibv_cq* cq, const absl::Status& why) {
  // A CQ in error takes no more completions: what its QPs had posted is lost.
  Fail([cq](uint32_t, const Route& r) { return r.cq == cq; }, why, true);
}

void CompletionPoller::FailAll(const absl::Status& why, bool completions_lost) {
  Fail([](uint32_t, const Route&) { return true; }, why, completions_lost);
}

void CompletionPoller::Wake() {
  absl::MutexLock lock(&mu_);
  woken_ = true;
}

void CompletionPoller::Loop() {
  // Busy-polling costs a core per device; instead poll hot while completions flow and back off
  // to short sleeps when idle (woken early by Wake() after a post). A completion channel
  // would save the idle wake-ups; polling keeps the seam and the model small.
  constexpr int kBatch = 32;
  constexpr int kHotPolls = 256;
  constexpr absl::Duration kMaxSleep = absl::Microseconds(500);
  ibv_wc wc[kBatch];
  int idle_polls = 0;
  absl::Duration sleep = absl::Microseconds(10);
  std::vector<std::pair<std::shared_ptr<CompletionSink>, const ibv_wc*>> batch;
  std::vector<ibv_cq*> cqs;
  std::vector<bool> cq_failed;
  uint64_t cqs_version = 0;
  size_t next_cq = 0;
  while (true) {
    if (cqs_version != cqs_version_.load(std::memory_order_acquire)) {
      absl::MutexLock lock(&mu_);
      cqs = cqs_;
      cq_failed.resize(cqs.size(), false);
      cqs_version = cqs_version_.load(std::memory_order_relaxed);
    }
    // One CQ per turn, round robin: a busy CQ cannot starve the others.
    int n = 0;
    for (size_t tried = 0; tried < cqs.size() && n == 0; ++tried) {
      const size_t i = next_cq++ % cqs.size();
      if (cq_failed[i]) continue;
      n = api_->PollCq(cqs[i], kBatch, wc);
      if (n < 0) {
        cq_failed[i] = true;
        FailCq(cqs[i], absl::UnavailableError(absl::StrFormat(
                           "verbs: ibv_poll_cq on %s CQ #%d failed (%d)", device_, i + 1, n)));
        n = 0;
      }
    }
    if (n > 0) {
      idle_polls = 0;
      sleep = absl::Microseconds(10);
      batch.clear();
      {
        absl::MutexLock lock(&mu_);
        for (int i = 0; i < n; ++i) {
          auto it = sinks_.find(wc[i].qp_num);
          // A QP removed after Close() timed out may still flush: nobody waits for it.
          if (it != sinks_.end()) batch.emplace_back(it->second.sink, &wc[i]);
        }
      }
      for (auto& [sink, w] : batch) sink->OnCompletion(*w);
      batch.clear();
      continue;
    }
    bool woke = false;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      woke = std::exchange(woken_, false);
    }
    if (woke) {
      idle_polls = 0;
      sleep = absl::Microseconds(10);
      continue;
    }
    if (++idle_polls < kHotPolls) {
      std::this_thread::yield();
      continue;
    }
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&woken_), sleep);
    }
    sleep = std::min(sleep * 2, kMaxSleep);
  }
}

}  // namespace ferry::verbs
