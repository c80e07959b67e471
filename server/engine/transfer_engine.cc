#include "server/engine/transfer_engine.h"

#include <algorithm>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/byte_size.h"
#include "base/byte_range.h"
#include "base/echo.h"
#include "base/status_macros.h"
#include "server/buffers/guarded_touch.h"
#include "server/engine/op_target.h"
#include "server/engine/route_choice.h"
#include "server/engine/slice_planner.h"
#include "server/engine/stage_sender.h"
#include "spdlog/spdlog.h"

namespace ferry::server {
namespace {

// Ops of a finished transfer whose legs the debug log shows.
constexpr size_t kLoggedOps = 4;
// The most pieces one gathered op carries: 1 MiB of 4 KiB blocks, a frame table of 4 KiB on
// tcp (transport/tcp/wire.h takes up to kMaxWirePieces); verbs posts the pieces as WRs,
// chained by its initiator QP.
constexpr size_t kMaxPieces = 256;


absl::Status RangeError(const std::string& field, uint64_t offset, uint64_t length,
                        const std::string& what, uint64_t size) {
  return absl::OutOfRangeError(absl::StrCat(field, ": range [", offset, ", ", offset, "+", length,
                                            ") is outside ", what, " (", size, " bytes)"));
}

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

absl::StatusOr<PlannedBatch> TransferEngine::Plan(const ferry::v1::SubmitRequest& request,
                                                 const EngineLimits& limits, absl::Time deadline) {
  if (request.ops_size() == 0) return absl::InvalidArgumentError("ops: the batch is empty");
  if (static_cast<uint64_t>(request.ops_size()) > limits.max_ops_per_submit) {
    return absl::InvalidArgumentError(absl::StrCat("ops: ", request.ops_size(),
                                                   " ops is more than limits.max_ops_per_submit (",
                                                   limits.max_ops_per_submit, ")"));
  }
  // One answer per distinct remote buffer in the batch, not per op: kept from an earlier
  // transfer where the peer allows (no call), else one ResolveBuffer. The batch holds it.
  std::map<std::pair<std::string, std::string>, const RemoteBuffer*> remotes;
  PlannedBatch batch;
  std::vector<PlannedOp>& planned = batch.ops;
  planned.resize(request.ops_size());
  for (int i = 0; i < request.ops_size(); ++i) {
    const ferry::v1::Op& op = request.ops(i);
    // The field prefix of error messages, built only for an error (not for 4096 good ops).
    auto f = [i] { return absl::StrCat("ops[", i, "]."); };
    PlannedOp& p = planned[i];
    if (op.type() != ferry::v1::WRITE && op.type() != ferry::v1::READ) {
      return absl::InvalidArgumentError(absl::StrCat(f(), "type: must be WRITE or READ"));
    }
    p.type = op.type();
    if (op.length() == 0)
      return absl::InvalidArgumentError(absl::StrCat(f(), "length: must be positive"));
    if (op.length() > limits.max_op_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(f(), "length: ", op.length(),
                                                     " bytes is more than limits.max_op_bytes (",
                                                     FormatByteSize(limits.max_op_bytes), ")"));
    }
    p.length = op.length();
    // Most ops of a batch name the previous op's local buffer and peer: looked up once for
    // the run of them, not once per op (a registry lookup takes its lock).
    const PlannedOp* previous = i > 0 ? &planned[i - 1] : nullptr;
    if (previous && request.ops(i - 1).local_buffer() == op.local_buffer()) {
      p.local = previous->local;
    } else {
      static const std::string kLocalBuffer = "local_buffer";
      auto local = buffers_->Get(op.local_buffer(), kLocalBuffer);
      if (!local.ok()) {
        return absl::Status(local.status().code(), absl::StrCat(f(), local.status().message()));
      }
      // A client file that shrank under an earlier touch shows zeros, not the client's bytes.
      if (absl::Status whole = NotBroken(**local, kLocalBuffer); !whole.ok()) {
        return absl::Status(whole.code(), absl::StrCat(f(), whole.message()));
      }
      p.local = batch.Keep(*std::move(local));
    }
    if (!RangeFits(op.local_offset(), op.length(), p.local->size())) {
      return RangeError(f() + "local_offset", op.local_offset(), op.length(),
                        absl::StrCat("local buffer ", p.local->id()), p.local->size());
    }
    p.local_offset = op.local_offset();
    ASSIGN_OR_RETURN(const OpTarget target, TargetOf(request, i));
    const std::string& peer = *target.peer;
    const std::string& name = *target.remote_buffer;
    // The prefix for the target's fields, likewise built only for an error.
    auto t = [&](absl::string_view field) { return absl::StrCat(target.Field(i, field), ": "); };
    if (peer.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(t("peer"), "must name a node"));
    }
    const bool same_peer = previous && previous->remote->node == peer;
    if (!same_peer && !peers_->Known(peer)) {
      return absl::NotFoundError(absl::StrCat(t("peer"), "unknown node ", Echo(peer)));
    }
    if (name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(t("remote_buffer"), "must name a buffer"));
    }
    if (name.size() > kMaxBufferName) {
      return absl::InvalidArgumentError(absl::StrCat(t("remote_buffer"), name.size(),
                                                     " characters is longer than any buffer "
                                                     "name (at most ",
                                                     kMaxBufferName, ")"));
    }
    // Likewise the previous op's remote buffer: no key to build for them.
    if (same_peer && previous->remote->name == name) {
      p.remote = previous->remote;
    } else {
      auto key = std::make_pair(peer, name);
      auto it = remotes.find(key);
      if (it == remotes.end()) {
        auto resolved = peers_->ResolveKept(peer, name, deadline);
        if (!resolved.ok()) {
          return absl::Status(resolved.status().code(),
                              absl::StrCat(t("remote_buffer"), resolved.status().message()));
        }
        it = remotes.emplace(key, batch.Keep(*std::move(resolved))).first;
      }
      p.remote = it->second;
    }
    if (!RangeFits(op.remote_offset(), op.length(), p.remote->size)) {
      return RangeError(f() + "remote_offset", op.remote_offset(), op.length(),
                        absl::StrCat(Echo(name), " on ", peer), p.remote->size);
    }
    p.remote_offset = op.remote_offset();
  }
  return batch;
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

namespace {

ferry::v1::Leg MakeLeg(const std::string& side, const LegPlan& plan, const std::string& provider) {
  ferry::v1::Leg leg;
  leg.set_side(side);
  leg.set_mode(LegModeName(plan.mode));
  leg.set_device(plan.device);
  leg.set_backend(plan.backend);
  leg.set_nic(plan.nic);
  leg.set_path(plan.path);
  leg.set_provider(provider);
  leg.set_reason(plan.reason);
  return leg;
}

// What the ops of one batch between the same two buffers share: planned by the first.
struct SharedPlan {
  RouteChoice direct;
  std::string provider;
  LegPlan local, remote;
  Transfer::Legs legs;
  bool lanes_built = false;  // direct ops only, on the first that gets that far
  std::shared_ptr<const LaneSet> lanes;  // null when no lane could be had
  absl::Status no_lane;
};

LegPlan RemoteLeg(const RemoteBuffer& remote) {
  return {.mode = remote.mode,
          .device = remote.device,
          .backend = remote.backend,
          .nic = remote.nic,
          .path = remote.path,
          .reason = remote.reason};
}

// A peer refusing a key or range it handed out at Resolve means the buffer went away (freed
// or unexported) while the op ran: say that, with the buffer's name, not "permission denied".
absl::Status RemoteOutcome(absl::Status status, const PlannedOp& op) {
  if (status.code() != absl::StatusCode::kPermissionDenied &&
      status.code() != absl::StatusCode::kOutOfRange) {
    return status;
  }
  return absl::AbortedError(
      absl::StrCat("remote_buffer: ", Echo(op.remote->name), " on ", op.remote->node,
                   " was freed or unexported while the op ran (", status.message(), ")"));
}

}  // namespace

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
  // One Hello answer per peer and one endpoint per route lane for the whole batch.
  std::map<std::string, absl::StatusOr<PeerRails>> rails;
  std::map<std::tuple<std::string, Route, uint32_t>, absl::StatusOr<PeerEndpoint>> endpoints;
  auto endpoint = [&](const std::string& node, const Route& route, uint32_t lane,
                      uint64_t incarnation) -> const absl::StatusOr<PeerEndpoint>& {
    auto key = std::make_tuple(node, route, lane);
    auto it = endpoints.find(key);
    if (it == endpoints.end()) {
      it = endpoints.emplace(key, peers_->Endpoint(node, route, lane, incarnation, deadline))
               .first;
      if (!it->second.ok()) {
        // A route that cannot connect is paused like one that broke; the peer's rails may
        // have changed, so the next Rails asks it again.
        ledger_->Failed(route.ours, node, it->second.status(), false, absl::Now());
        peers_->Refresh(node);
      }
    }
    return it->second;
  };
  std::vector<StagedOp> staged;
  std::map<std::pair<const Buffer*, const RemoteBuffer*>, SharedPlan> plans;
  std::map<std::string, std::vector<SliceWork>> work;  // direct slices, by peer
  std::map<std::string, size_t> routes_to;             // the most routes an op takes, by peer
  const EngineLimits limits = this->limits();
  // Held for the whole loop: an early completion may finish the transfer meanwhile.
  PlannedOps planned = transfer->ops();
  if (!planned) return;  // cancelled before it was posted
  const auto& ops = *planned;
  // Not finished() : a cancelled transfer whose check runs must not post its queued slices.
  const Wanted wanted = MakeWanted([transfer] { return !transfer->all_settled(); });
  // Each peer's queue, asked of the engine once per batch rather than once per op (again
  // only when an op takes more routes to the peer than those before: a wider window).
  std::map<std::string, std::pair<size_t, std::shared_ptr<FairQueue>>> queues;
  auto queue_for = [&](const std::string& node) -> const std::shared_ptr<FairQueue>& {
    const size_t routes = routes_to[node];
    auto& [made_for, queue] = queues[node];
    if (!queue || made_for < routes) {
      queue = QueueFor(node, limits, routes);
      made_for = routes;
    }
    return queue;
  };
  // Direct ops waiting to be posted as one: ops first..last, between the same two buffers in
  // the same direction, as pieces (an op adjacent on both sides to the previous one extends
  // its piece).
  struct Run {
    size_t first = 0, last = 0;
    const SharedPlan* plan = nullptr;
    bool read = false;
    uint64_t length = 0;  // of all the pieces
    absl::InlinedVector<fabric::Piece, 1> pieces;  // one, unless the run gathers blocks
  };
  std::optional<Run> run;
  auto flush = [&] {
    if (!run) return;
    Run r = std::move(*std::exchange(run, std::nullopt));
    const std::string& node = ops[r.first].remote->node;
    const std::string provider = r.plan->provider;
    // The completion holds the ops (and so the buffers) until the fabric is done with
    // them, even when the transfer was settled earlier (deadline, cancel). Ops that rode
    // together settle together.
    // (Not the run itself: its plan lives only as long as this Post.)
    StripedOp::Done done = [life = life_, transfer, planned, first = r.first, last = r.last,
                            provider](StripedOutcome outcome) {
      Visit visit(*life);
      if (visit.engine() == nullptr) return;  // its destructor settled every op
      const absl::Status status = RemoteOutcome(outcome.status, (*planned)[first]);
      visit.engine()->SettleRun(transfer, first, last, status, provider, outcome);
    };
    transfer->MarkPosted(r.first, r.last - r.first + 1);
    const fabric::Piece& one = r.pieces.front();
    StripedOp::Spec spec{r.read, one.local_offset, one.remote_offset, r.length, limits.slice_bytes,
                         node, transfer->id(), next_lane_.fetch_add(1, std::memory_order_relaxed)};
    spec.owner_uid = transfer->owner_uid();
    if (r.pieces.size() > 1) {
      spec.pieces =
          std::make_shared<const std::vector<fabric::Piece>>(r.pieces.begin(), r.pieces.end());
    }
    auto striped = std::make_shared<StripedOp>(std::move(spec), r.plan->lanes, ledger_,
                                               queue_for(node), wanted, std::move(done));
    std::vector<SliceWork>& to_peer = work[node];
    if (to_peer.empty()) to_peer.reserve(ops.size() - r.first);  // grown once, not doubled
    striped->AppendSlices(to_peer);
  };
  // One instant for the batch: its routes are chosen together.
  const absl::Time now = absl::Now();
  // What the previous op looked up, for the next op that shares its remote buffer, or both
  // buffers (most ops of a KV batch): no map lookups per op for them. std::map entries stay
  // where they are while others are added.
  const RemoteBuffer* rails_for = nullptr;
  decltype(rails)::iterator it;
  std::pair<const Buffer*, const RemoteBuffer*> plan_for = {nullptr, nullptr};
  decltype(plans)::iterator shared;
  const SharedPlan* counted = nullptr;  // the plan whose routes routes_to last counted
  for (size_t i = 0; i < ops.size(); ++i) {
    const PlannedOp& op = ops[i];
    const std::string& node = op.remote->node;
    if (rails_for != op.remote) {
      it = rails.find(node);
      if (it == rails.end()) {
        it = rails.emplace(node, peers_->Rails(node, op.remote->incarnation, deadline)).first;
      }
      rails_for = op.remote;
    }
    if (!it->second.ok()) {
      Settle(transfer, i, it->second.status(), "");
      continue;
    }
    const PeerRails& peer_rails = *it->second;
    if (op.remote->incarnation != 0 && peer_rails.incarnation != op.remote->incarnation) {
      // Its keys were made by the agent that ran before: none of them reaches anything now.
      Settle(transfer, i,
             absl::AbortedError(absl::StrCat("remote_buffer: ", node, " restarted since ",
                                             Echo(op.remote->name),
                                             " was resolved; submit the transfer again")),
             "");
      continue;
    }
    // Ops between the same two buffers plan alike: the first of them plans, the others
    // share its legs and lanes (a KV batch of 4096 blocks plans once, not 4096 times).
    bool fresh = false;
    if (const std::pair<const Buffer*, const RemoteBuffer*> key{op.local, op.remote};
        key != plan_for) {
      plan_for = key;
      std::tie(shared, fresh) = plans.try_emplace(key);
    }
    SharedPlan& plan = shared->second;
    if (fresh) {
      plan.direct = DirectRoutes(*op.local, *op.remote, peer_rails, *ledger_, now);
      const ProviderRails& preferred = peer_rails.providers.front();
      plan.provider = plan.direct.provider.empty() ? preferred.provider : plan.direct.provider;
      // Which way each side moves its bytes, under the policy this transfer runs with; the
      // rail tells the planner whether the fabric reaches the buffer directly.
      const fabric::RailId plan_rail =
          plan.direct.routes.empty() ? preferred.ours.front() : plan.direct.routes.front().ours;
      plan.local = deps_.plan(*op.local, transfer->policy(), plan_rail);
      plan.remote = RemoteLeg(*op.remote);
      plan.legs = std::make_shared<const std::vector<ferry::v1::Leg>>(
          std::vector<ferry::v1::Leg>{MakeLeg("local", plan.local, plan.provider),
                                      MakeLeg("remote", plan.remote, plan.provider)});
    }
    const std::string& provider = plan.provider;
    const LegPlan& local = plan.local;
    const LegPlan& remote = plan.remote;
    const RouteChoice& direct = plan.direct;
    transfer->ShareLegs(i, plan.legs);
    const bool local_refused = local.mode == LegMode::kUnavailable;
    if (local_refused || remote.mode == LegMode::kUnavailable) {
      Settle(transfer, i,
             absl::FailedPreconditionError(local_refused ? local.reason
                                                         : absl::StrCat("peer: ", remote.reason)),
             provider);
      continue;
    }
    if (!IsDirect(local.mode) || !IsDirect(remote.mode)) {
      const ProviderRails& preferred = peer_rails.providers.front();
      // Our side direct: the route must leave from a rail that holds the buffer.
      std::vector<fabric::RailId> candidates;
      if (IsDirect(local.mode)) {
        for (const auto& [rail, region] : op.local->regions()) candidates.push_back(rail);
      }
      // A staged leg is not striped: it takes one route, off the NICs the ledger pauses for
      // this peer while any other is left (a paused GPU NIC hands its staging to another).
      ProviderRails staging = preferred;
      std::erase_if(staging.ours, [&](const fabric::RailId& r) {
        return !ledger_->Usable(r, node, now);
      });
      if (staging.ours.empty()) staging.ours = preferred.ours;
      std::optional<Route> route = StagedRoute(staging, candidates, local.nic, remote.nic);
      absl::StatusOr<PeerEndpoint> peer =
          route ? endpoint(node, *route, 0, op.remote->incarnation)
                : absl::StatusOr<PeerEndpoint>(absl::FailedPreconditionError(absl::StrCat(
                      "no ", preferred.provider, " rail reaches ", Echo(op.remote->name),
                      " on ", node, " from this buffer")));
      if (!peer.ok()) {
        Settle(transfer, i, peer.status(), provider);
        continue;
      }
      transfer->SetRails(i, {peer->rail.ToString()}, {peer->peer_rail.ToString()}, {});
      staged.push_back({i, local, *peer});
      continue;
    }
    if (direct.routes.empty()) {
      Settle(transfer, i,
             absl::FailedPreconditionError(absl::StrCat(
                 "no rail of ", provider, " reaches both buffers (",
                 op.local->regions().empty() ? "not registered here" : "none of the peer's")),
             provider);
      continue;
    }
    if (!plan.lanes_built) {
      plan.lanes_built = true;
      std::vector<Lane> lanes, reserve;
      // Lanes one NIC after the other (route 0 lane 0, route 1 lane 0, ..., route 0 lane 1),
      // so that consecutive slices leave through different NICs.
      uint32_t most_lanes = 1;
      for (const Route& route : direct.routes) {
        if (fabric::Fabric* f = peers_->FabricOf(route.ours)) {
          most_lanes = std::max(most_lanes, f->endpoints_per_peer());
        }
      }
      for (uint32_t lane = 0; lane < most_lanes; ++lane) {
        for (const Route& route : direct.routes) {
          fabric::Fabric* f = peers_->FabricOf(route.ours);
          if (f == nullptr || lane >= f->endpoints_per_peer()) continue;
          const absl::StatusOr<PeerEndpoint>& e =
              endpoint(node, route, lane, op.remote->incarnation);
          if (!e.ok()) {
            if (plan.no_lane.ok()) plan.no_lane = e.status();
            continue;
          }
          lanes.push_back({e->endpoint, route, op.local->region(route.ours),
                           *op.remote->KeyFor(route.theirs)});
        }
      }
      // Where slices go when every NIC of the provider failed them (tcp behind verbs),
      // unless the policy says to fail rather than fall back.
      if (transfer->policy().policy.fallback != config::Fallback::kFail) {
        for (const Route& route : direct.reserve) {
          const absl::StatusOr<PeerEndpoint>& e =
              endpoint(node, route, 0, op.remote->incarnation);
          if (!e.ok()) continue;
          reserve.push_back({e->endpoint, route, op.local->region(route.ours),
                             *op.remote->KeyFor(route.theirs)});
        }
      }
      if (!lanes.empty()) {
        plan.lanes = std::make_shared<LaneSet>(std::move(lanes), std::move(reserve));
      }
    }
    if (!plan.lanes) {
      Settle(transfer, i,
             plan.no_lane.ok() ? absl::FailedPreconditionError(absl::StrCat(
                                     "no ", provider, " fabric serves the rails that reach ",
                                     Echo(op.remote->name), " on ", node))
                               : plan.no_lane,
             provider);
      // The failed connect paused its rail in the ledger: the next op between these buffers
      // plans again and may take another route or provider (tcp behind verbs), as it would
      // have alone.
      plans.erase(shared);
      plan_for = {nullptr, nullptr};
      counted = nullptr;
      continue;
    }
    if (counted != &plan) {  // the same plan's routes count the same
      size_t& most = routes_to[node];
      most = std::max(most, direct.routes.size());
      counted = &plan;
    }
    // The ops of a batch between the same two buffers ride together while they fit a slice
    // and kMaxPieces: one fabric op, one completion (tcp: one request and one ack) for a run
    // of a paged KV cache's blocks. An op adjacent on both sides to the previous one (the
    // cache's consecutive blocks) extends its piece. Only the op right after the run joins
    // it: one between that failed or went to staging has an outcome of its own, which the
    // run's completion must not write over.
    if (run && run->last + 1 == i && run->plan == &plan &&
        run->read == (op.type == ferry::v1::READ) &&
        run->length + op.length <= limits.slice_bytes) {
      fabric::Piece& back = run->pieces.back();
      if (back.local_offset + back.length == op.local_offset &&
          back.remote_offset + back.length == op.remote_offset) {
        back.length += op.length;
      } else if (run->pieces.size() < kMaxPieces) {
        run->pieces.push_back({op.local_offset, op.remote_offset, op.length});
      } else {
        flush();
      }
      if (run) {
        run->length += op.length;
        run->last = i;
        continue;
      }
    }
    flush();
    run = Run{.first = i,
              .last = i,
              .plan = &plan,
              .read = op.type == ferry::v1::READ,
              .length = op.length,
              .pieces = {{op.local_offset, op.remote_offset, op.length}}};
  }
  flush();
  // Each peer's slices go to its queue at once, after planning: nothing completes meanwhile.
  for (auto& [node, slices] : work) {
    queue_for(node)->Enqueue(transfer->id(), std::move(slices), wanted, transfer->owner_uid());
  }
  if (!staged.empty()) StartStaging(transfer, std::move(planned), std::move(staged));
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
  std::weak_ptr<StageSender> weak = sender;
  // The thread drops the sender when Run returns: a finished pipeline holds no buffers
  // while its thread waits to be joined.
  std::thread thread([sender = std::move(sender), done]() mutable {
    sender->Run();
    sender.reset();
    done->store(true);
  });
  workers_.push_back({transfer->id(), std::move(weak), std::move(thread), done});
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
      t->SettleAll(absl::DeadlineExceededError(
          absl::StrCat("transfer ", t->id(), " did not finish before its deadline")));
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
    return absl::NotFoundError(absl::StrCat("transfer_id: transfer ", id,
                                            id > 0 && id < next_id_ ? " has been forgotten"
                                                                    : " does not exist"));
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
