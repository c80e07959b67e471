#include "server/agent/drain.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/agent/agent_core.h"
#include "spdlog/spdlog.h"

namespace ferry::server {

void DrainHooks::Add(std::string name, std::function<void()> hook) {
  absl::MutexLock lock(&mu_);
  hooks_.emplace_back(std::move(name), std::move(hook));
}

void DrainHooks::RunAll() {
  std::vector<std::pair<std::string, std::function<void()>>> hooks;
  {
    absl::MutexLock lock(&mu_);
    if (ran_) return;
    ran_ = true;
    hooks.swap(hooks_);
  }
  // Outside the lock: a hook may take its time (an etcd round trip) or add nothing.
  for (const auto& [name, hook] : hooks) {
    absl::Time start = absl::Now();
    hook();
    spdlog::info("drain: {} done ({})", name, absl::FormatDuration(absl::Now() - start));
  }
}

DrainOutcome Drain(AgentCore& core, absl::Duration grace, const std::function<bool()>& cut_short) {
  DrainOutcome outcome;
  core.drain_hooks().RunAll();
  TransferEngine& engine = core.engine();
  engine.BeginDrain();
  // Peers that kept our answers ask again, and are refused (ResolveBuffer says draining);
  // each answers once its transfers on those answers are done (up to two seconds).
  core.leases().RevokeAll("draining");
  outcome.running = engine.active();
  const absl::Time start = absl::Now();
  const absl::Time end = start + grace;
  spdlog::info("draining: new transfers are refused; {} running, given up to {} to finish",
               outcome.running, absl::FormatDuration(grace));
  bool idle = engine.AwaitIdle(std::min(end, absl::Now()));
  while (!idle && absl::Now() < end) {
    if (cut_short && cut_short()) {
      spdlog::info("drain: cut short by a second signal");
      break;
    }
    idle = engine.AwaitIdle(std::min(end, absl::Now() + absl::Milliseconds(100)));
  }
  outcome.waited = absl::Now() - start;
  if (!idle) {
    outcome.cancelled = engine.EndAll(absl::UnavailableError(
        grace == absl::ZeroDuration() || outcome.waited < grace
            ? std::string("agent is shutting down: stopped without waiting for transfers")
            : absl::StrCat("agent is shutting down: the transfer did not finish within the "
                           "drain grace of ", absl::FormatDuration(grace),
                           " (limits.shutdown_grace_ms)")));
  }
  spdlog::info("drain: {} of {} transfer(s) finished in {}, {} cancelled",
               outcome.running >= outcome.cancelled ? outcome.running - outcome.cancelled : 0,
               outcome.running, absl::FormatDuration(outcome.waited), outcome.cancelled);
  return outcome;
}

}  // namespace ferry::server
