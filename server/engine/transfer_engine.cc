#include "server/engine/transfer_engine.h"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/byte_size.h"
#include "base/byte_range.h"
#include "base/echo.h"
#include "base/status_macros.h"
#include "server/buffers/guarded_touch.h"
#include "server/engine/batch_post.h"
#include "server/engine/local_copy.h"
#include "server/engine/op_target.h"
#include "server/engine/route_choice.h"
#include "server/engine/slice_planner.h"
#include "server/engine/stage_sender.h"
#include "spdlog/spdlog.h"

namespace ferry::server {
namespace {

// Ops of a finished transfer whose legs the debug log shows.
constexpr size_t kLoggedOps = 4;

}  // namespace

TransferEngine::TransferEngine(EngineDeps deps, EngineLimits limits)
    : deps_(std::move(deps)), buffers_(deps_.buffers), peers_(deps_.peers), limits_(limits),
      life_(std::make_shared<Life>(this)) {
  reaper_ = std::thread([this] { ReapExpired(); });
}

TransferEngine::~TransferEngine() {
  // A completion or check's `done` running now finishes first; later ones find no engine.
  life_->going.store(true);
  while (life_->visits.load() > 0) absl::SleepFor(absl::Microseconds(100));
  std::vector<std::shared_ptr<Transfer>> running;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& [id, t] : active_) running.push_back(t);
  }
  reaper_.join();
  const absl::Status stopping = absl::UnavailableError("agent is shutting down");
  for (auto& t : running) {
    t->SettleAll(stopping);
    t->EndCheck({}, stopping);  // its bytes were never checked
  }
  std::list<Worker> workers;
  {
    absl::MutexLock lock(&workers_mu_);
    workers.swap(workers_);
  }
  for (auto& w : workers) {
    if (auto sender = w.sender.lock()) sender->Cancel();
  }
  for (auto& w : workers) w.thread.join();
}

// Sequentially consistent, both sides: a visit that found `going` false was counted before
// the destructor read the count, so the destructor waits for it.
TransferEngine::Visit::Visit(Life& life) : life_(life) {
  life_.visits.fetch_add(1);
  entered_ = !life_.going.load();
  if (!entered_) life_.visits.fetch_sub(1);
}

TransferEngine::Visit::~Visit() {
  if (entered_) life_.visits.fetch_sub(1);
}

absl::StatusOr<uint64_t> TransferEngine::Submit(const ferry::v1::SubmitRequest& request,
                                                FinishedHook on_finished, CheckHook check,
                                                int64_t owner_uid) {
  // Checked before planning too: Plan may ask peers to resolve buffers, which a drain need
  // not wait for.
  if (draining()) return absl::UnavailableError(kDrainingMessage);
  const EngineLimits limits = this->limits();
  absl::Duration timeout = request.timeout_ms() > 0 ? absl::Milliseconds(request.timeout_ms())
                                                    : limits.default_timeout;
  if (timeout > limits.max_timeout) {
    return absl::InvalidArgumentError(absl::StrCat(
        "timeout_ms: ", request.timeout_ms(), " is more than limits.max_timeout (",
        absl::ToInt64Milliseconds(limits.max_timeout), " ms)"));
  }
  absl::Time deadline = absl::Now() + timeout;
  ASSIGN_OR_RETURN(PlannedBatch ops, Plan(request, limits, deadline));
  std::shared_ptr<Transfer> transfer;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("agent is shutting down");
    if (draining_) return absl::UnavailableError(kDrainingMessage);
    if (owner_uid != Transfer::kUnknownOwner && limits.per_uid_transfers > 0) {
      size_t& running = active_by_owner_[owner_uid];
      if (running >= limits.per_uid_transfers) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "uid ", owner_uid, " has ", running, " transfers running, at most ",
            limits.per_uid_transfers, " (limits.per_uid_transfers): wait for some to end"));
      }
      ++running;
    }
    uint64_t id = next_id_++;
    transfer = std::make_shared<Transfer>(id, std::move(ops), deadline, deps_.policies->Current(),
                                          owner_uid);
    transfers_.emplace(id, transfer);
    active_.emplace(id, transfer);
    if (on_finished) finished_hooks_.emplace(id, std::move(on_finished));
    if (check) {
      transfer->ExpectCheck();  // before Post: no op has settled yet
      check_hooks_.emplace(id, std::move(check));
    }
  }
  if (spdlog::should_log(spdlog::level::debug)) {
    spdlog::debug("transfer {}: submitted, {} ops to {}, deadline in {} ms", transfer->id(),
                  transfer->op_count(), absl::StrJoin(transfer->peers(), ", "),
                  absl::ToInt64Milliseconds(timeout));
  }
  Post(transfer, deadline);
  return transfer->id();
}

void TransferEngine::Settle(const std::shared_ptr<Transfer>& transfer, size_t index,
                            const absl::Status& status, const std::string& provider) {
  if (!status.ok()) {
    // Whatever failed, the next transfer asks the peer again rather than trust the answer.
    if (PlannedOps ops = transfer->ops(); ops && index < ops->size()) {
      peers_->kept_answers().Forget((*ops)[index].remote);
    }
  }
  if (transfer->Settle(index, status, provider)) OnFinished(transfer->id());
}

void TransferEngine::SettleRun(const std::shared_ptr<Transfer>& transfer, size_t first,
                               size_t last, const absl::Status& status,
                               const std::string& provider, StripedOutcome& outcome) {
  if (!status.ok()) {
    if (PlannedOps ops = transfer->ops(); ops && first < ops->size()) {
      peers_->kept_answers().Forget((*ops)[first].remote);
    }
  }
  if (transfer->SettleRun(first, last, status, provider, std::move(outcome.ours),
                          std::move(outcome.theirs), std::move(outcome.retries))) {
    OnFinished(transfer->id());
  }
}

void TransferEngine::Post(const std::shared_ptr<Transfer>& transfer, absl::Time deadline) {
  PlannedOps planned = transfer->ops();
  if (!planned) return;  // cancelled before it was posted
  BatchPost(*this, transfer, std::move(planned), deadline).Run();
}

std::shared_ptr<FairQueue> TransferEngine::QueueFor(const std::string& node,
                                                    const EngineLimits& limits, size_t routes) {
  absl::MutexLock lock(&mu_);
  // The window is per route: n NICs to a peer keep n windows' worth on the wire.
  const uint64_t window = limits.peer_window_bytes * std::max<size_t>(1, routes);
  auto& queue = queues_[node];
  if (!queue || queue->window_bytes() < window) {
    // A queue made for fewer routes is replaced; slices already in it run out there.
    constexpr uint64_t kSolo = EngineLimits::kSoloWindows;
    const uint64_t solo = window > UINT64_MAX / kSolo ? UINT64_MAX : kSolo * window;
    queue = std::make_shared<FairQueue>(
        FairQueueWindows{.window_bytes = window, .solo_window_bytes = solo});
  }
  return queue;
}

void TransferEngine::StartStaging(const std::shared_ptr<Transfer>& transfer, PlannedOps planned,
                                  std::vector<StagedOp> ops) {
  StageSender::Deps deps;
  deps.gpus = deps_.gpus;
  deps.bounce = deps_.bounce;
  deps.stage_calls = deps_.stage_calls;
  deps.settle = [this, transfer](size_t index, const absl::Status& s, const std::string& provider) {
    Settle(transfer, index, s, provider);
  };
  deps.ledger = ledger_;
  auto sender = std::make_shared<StageSender>(transfer, std::move(planned), std::move(ops),
                                              std::move(deps));
  std::weak_ptr<StageSender> weak = sender;
  // The thread drops the sender when Run returns: a finished pipeline holds no buffers
  // while its thread waits to be joined.
  StartWorker(transfer->id(), std::move(weak), [sender = std::move(sender)]() mutable {
    sender->Run();
    sender.reset();
  });
}

void TransferEngine::StartLocalCopies(const std::shared_ptr<Transfer>& transfer,
                                      PlannedOps planned, std::vector<size_t> ops) {
  const bool here = LocalCopier::CopiesInline(*planned, ops);
  auto copier =
      std::make_unique<LocalCopier>(transfer, std::move(planned), std::move(ops), deps_.gpus,
                                    [this, transfer](size_t index, const absl::Status& s) {
                                      Settle(transfer, index, s, "local");
                                    });
  if (here) {
    copier->Run();
    return;
  }
  StartWorker(transfer->id(), {}, [copier = std::move(copier)]() mutable {
    copier->Run();
    copier.reset();  // holds the buffers until then
  });
}

void TransferEngine::StartWorker(uint64_t transfer_id, std::weak_ptr<StageSender> sender,
                                 absl::AnyInvocable<void() &&> work) {
  auto done = std::make_shared<std::atomic<bool>>(false);
  absl::MutexLock lock(&workers_mu_);
  // Join the workers that have finished, so a long-lived agent does not collect threads.
  for (auto w = workers_.begin(); w != workers_.end();) {
    if (w->done->load()) {
      w->thread.join();
      w = workers_.erase(w);
    } else {
      ++w;
    }
  }
  std::thread thread([work = std::move(work), done]() mutable {
    std::move(work)();
    done->store(true);
  });
  workers_.push_back({transfer_id, std::move(sender), std::move(thread), done});
}

void TransferEngine::OnFinished(uint64_t id) {
  std::shared_ptr<Transfer> finished;
  FinishedHook hook;
  CheckHook check;
  {
    absl::MutexLock lock(&mu_);
    auto it = active_.find(id);
    if (it == active_.end()) return;
    if (it->second->checking()) {
      // Its check starts now, once (a Cancel or the deadline meanwhile comes here again and
      // finds it taken); it stays active until the check's `done`.
      auto c = check_hooks_.find(id);
      if (c == check_hooks_.end()) return;
      check = std::move(c->second);
      check_hooks_.erase(c);
      finished = it->second;
    }
  }
  if (check) {
    check(finished, [life = life_, id, transfer = finished](
                        std::vector<Transfer::CheckFailure> failed, absl::Status rest) {
      transfer->EndCheck(failed, rest);
      Visit visit(*life);
      if (visit.engine() != nullptr) visit.engine()->OnFinished(id);
    });
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    auto it = active_.find(id);
    if (it == active_.end()) return;
    finished = std::move(it->second);
    active_.erase(it);
    if (auto owned = active_by_owner_.find(finished->owner_uid());
        owned != active_by_owner_.end() && --owned->second == 0) {
      active_by_owner_.erase(owned);
    }
    if (auto h = finished_hooks_.find(id); h != finished_hooks_.end()) {
      hook = std::move(h->second);
      finished_hooks_.erase(h);
    }
    ++finished_count_;
    history_.push_back(id);
    history_ops_ += finished->op_count();
    // The newest stays whatever its size, so that its caller can still Wait for it.
    while (history_.size() > limits_.history ||
           (history_ops_ > limits_.history_ops && history_.size() > 1)) {
      if (auto old = transfers_.find(history_.front()); old != transfers_.end()) {
        history_ops_ -= old->second->op_count();
        transfers_.erase(old);
      }
      history_.pop_front();
    }
  }
  // Outside the engine's lock: statistics and the log line are the transfer's own business.
  ferry::v1::TransferResult result = finished->Result();
  stats_.CountTransfer(result.state() == ferry::v1::SUCCEEDED);
  const bool debug = spdlog::should_log(spdlog::level::debug);
  std::vector<std::string> heads;  // "WRITE to node-b" of the first few ops, for the debug lines
  stats_.Lock();
  finished->VisitOps([&](const Transfer::OpView& op) {
    stats_.RecordLocked({.peer = op.peer,
                         .read = op.read,
                         .mode = op.mode,
                         .provider = op.provider,
                         .code = op.code,
                         .bytes = op.bytes,
                         .duration_us = op.duration_us});
    if (debug && heads.size() < kLoggedOps) {
      heads.push_back(absl::StrCat(op.read ? "READ from " : "WRITE to ", op.peer));
    }
  });
  stats_.Unlock();
  if (debug) {
    // Their legs: built as result messages only here, for the few ops logged.
    ferry::v1::TransferResult first =
        finished->Result({.include_ops = true, .limit = static_cast<uint32_t>(kLoggedOps)});
    for (int i = 0; i < first.ops_size() && i < static_cast<int>(heads.size()); ++i) {
      const ferry::v1::OpResult& op = first.ops(i);
      std::string line = absl::StrCat("op ", op.index(), " ", heads[i]);
      for (const auto& leg : op.legs()) {
        absl::StrAppend(&line, ", ", leg.side(), " ", leg.mode(), " via ",
                        leg.rails().empty() ? leg.provider() : absl::StrJoin(leg.rails(), "+"));
      }
      if (op.retries_size() > 0) absl::StrAppend(&line, ", ", op.retries_size(), " slices retried");
      spdlog::debug("transfer {}: {}", id, line);
    }
    spdlog::debug("transfer {}: {} ({} of {} ops failed), {} in {} us{}{}", id,
                  result.state() == ferry::v1::SUCCEEDED ? "succeeded" : "failed",
                  result.ops_failed(), result.ops_total(), FormatByteSize(result.bytes()),
                  result.duration_us(), result.message().empty() ? "" : ": ", result.message());
  }
  if (hook) hook(*finished);
}

std::vector<std::shared_ptr<Transfer>> TransferEngine::Running() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Transfer>> out;
  for (const auto& [id, t] : active_) out.push_back(t);
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a->id() > b->id(); });
  return out;
}

std::vector<std::shared_ptr<Transfer>> TransferEngine::Recent(size_t recent) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Transfer>> out;
  for (auto it = history_.rbegin(); it != history_.rend() && out.size() < recent; ++it) {
    auto found = transfers_.find(*it);
    if (found != transfers_.end()) out.push_back(found->second);
  }
  return out;
}

void TransferEngine::ReapExpired() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    auto stop = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_; };
    mu_.AwaitWithTimeout(absl::Condition(&stop), absl::Milliseconds(50));
    if (stopping_) break;
    absl::Time now = absl::Now();
    std::vector<std::shared_ptr<Transfer>> expired;
    for (auto& [id, t] : active_) {
      // One whose check runs has nothing left to expire: the check ends it.
      if (t->deadline() <= now && !t->checking()) expired.push_back(t);
    }
    if (expired.empty()) continue;
    mu_.Unlock();
    for (auto& t : expired) {
      // The peers it waited on, so that the caller learns which node is slow or hung.
      t->SettleAll(absl::DeadlineExceededError(
          absl::StrCat("transfer ", t->id(), " to ", absl::StrJoin(t->peers(), ", "),
                       " did not finish before its deadline")));
      OnFinished(t->id());
    }
    mu_.Lock();
  }
}

EngineLimits TransferEngine::limits() const {
  absl::MutexLock lock(&mu_);
  return limits_;
}

void TransferEngine::SetLimits(const EngineLimits& limits) {
  absl::MutexLock lock(&mu_);
  limits_ = limits;
}

absl::StatusOr<std::shared_ptr<Transfer>> TransferEngine::Cancel(uint64_t id) {
  ASSIGN_OR_RETURN(std::shared_ptr<Transfer> transfer, Find(id));
  if (transfer->finished()) return transfer;
  End(transfer, absl::CancelledError(absl::StrCat("transfer ", id, " was cancelled")));
  return transfer;
}

void TransferEngine::End(const std::shared_ptr<Transfer>& transfer, const absl::Status& why) {
  // Settled first: a staging pipeline told to stop settles its open ops with a status of its
  // own ("did not finish before its deadline"), and the first settlement wins.
  transfer->SettleAll(why);
  {
    absl::MutexLock lock(&workers_mu_);
    for (auto& w : workers_) {
      if (w.transfer_id != transfer->id()) continue;
      if (auto sender = w.sender.lock()) sender->Cancel();
    }
  }
  OnFinished(transfer->id());
}

void TransferEngine::BeginDrain() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
}

bool TransferEngine::draining() const {
  absl::MutexLock lock(&mu_);
  return draining_;
}

bool TransferEngine::AwaitIdle(absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return active_.empty(); };
  return mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
}

size_t TransferEngine::EndAll(const absl::Status& why) {
  std::vector<std::shared_ptr<Transfer>> running;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, t] : active_) running.push_back(t);
  }
  // Not under mu_: settling runs completions, which take it (OnFinished).
  for (auto& t : running) End(t, why);
  // Their staging pipelines stop at their next chunk: wait (a few seconds at most) until
  // they did, so that the agent's teardown, which follows a drain, never meets one closing.
  const absl::Time until = absl::Now() + absl::Seconds(5);
  for (bool busy = true; busy && absl::Now() < until;) {
    busy = false;
    {
      absl::MutexLock lock(&workers_mu_);
      for (const auto& w : workers_) busy |= !w.done->load();
    }
    if (busy) absl::SleepFor(absl::Milliseconds(5));
  }
  return running.size();
}

absl::StatusOr<std::shared_ptr<Transfer>> TransferEngine::Find(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = transfers_.find(id);
  if (it == transfers_.end()) {
    const bool handed_out = id >= first_id_ && id < next_id_;
    return absl::NotFoundError(absl::StrCat(
        "transfer_id: transfer ", id, handed_out ? " has been forgotten" : " does not exist"));
  }
  return it->second;
}

size_t TransferEngine::active() const {
  absl::MutexLock lock(&mu_);
  return active_.size();
}

uint64_t TransferEngine::finished() const {
  absl::MutexLock lock(&mu_);
  return finished_count_;
}

}  // namespace ferry::server
