#include "server/engine/batch_post.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/echo.h"
#include "server/engine/local_copy.h"

namespace ferry::server {
namespace {

// The most pieces one gathered op carries: 1 MiB of 4 KiB blocks, a frame table of 4 KiB on
// tcp (transport/tcp/wire.h takes up to kMaxWirePieces); verbs posts the pieces as WRs,
// chained by its initiator QP.
constexpr size_t kMaxPieces = 256;
// What moved a local op, in results and legs: no fabric.
constexpr char kLocalProvider[] = "local";

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

TransferEngine::BatchPost::BatchPost(TransferEngine& engine, std::shared_ptr<Transfer> transfer,
                                     PlannedOps planned, absl::Time deadline)
    : engine_(engine),
      transfer_(std::move(transfer)),
      planned_(std::move(planned)),
      ops_(*planned_),
      deadline_(deadline),
      limits_(engine.limits()),
      now_(absl::Now()),
      wanted_(MakeWanted([t = transfer_] { return !t->all_settled(); })) {}

void TransferEngine::BatchPost::Run() {
  for (size_t i = 0; i < ops_.size(); ++i) {
    if (ops_[i].here != nullptr) {
      Local(i);
      continue;
    }
    const PeerRails* peer_rails = PeerSide(i);
    if (peer_rails == nullptr) continue;
    SharedPlan& plan = PlanFor(i, *peer_rails);
    transfer_->ShareLegs(i, plan.legs);
    const bool local_refused = plan.local.mode == LegMode::kUnavailable;
    if (local_refused || plan.remote.mode == LegMode::kUnavailable) {
      Settle(i,
             absl::FailedPreconditionError(local_refused
                                               ? plan.local.reason
                                               : absl::StrCat("peer: ", plan.remote.reason)),
             plan.provider);
      continue;
    }
    if (!IsDirect(plan.local.mode) || !IsDirect(plan.remote.mode)) {
      Stage(i, plan, *peer_rails);
      continue;
    }
    if (!LanesFor(i, plan)) continue;
    Join(i, plan);
  }
  Flush();
  HandOff();
}

void TransferEngine::BatchPost::Local(size_t i) {
  const PlannedOp& op = ops_[i];
  auto [it, fresh] = local_legs_.try_emplace(PlanKey{op.local, op.remote});
  absl::StatusOr<std::string> engine = LocalCopier::EngineFor(op, engine_.deps_.gpus);
  if (!engine.ok()) {
    Settle(i, engine.status(), kLocalProvider);
    return;
  }
  if (fresh) {
    // Both legs are this node's: how each buffer is reached ("local") and what copies.
    auto leg = [&](const char* side, const Buffer& buffer) {
      return MakeLeg(side, {.mode = LegMode::kLocal, .device = buffer.device(), .backend = *engine},
                     kLocalProvider);
    };
    it->second = std::make_shared<const std::vector<ferry::v1::Leg>>(
        std::vector<ferry::v1::Leg>{leg("local", *op.local), leg("remote", *op.here)});
  }
  transfer_->ShareLegs(i, it->second);
  local_.push_back(i);
}

const PeerRails* TransferEngine::BatchPost::PeerSide(size_t i) {
  const PlannedOp& op = ops_[i];
  const std::string& node = op.remote->node;
  if (rails_for_ != op.remote) {
    rails_it_ = rails_.find(node);
    if (rails_it_ == rails_.end()) {
      rails_it_ =
          rails_.emplace(node, engine_.peers_->Rails(node, op.remote->incarnation, deadline_))
              .first;
    }
    rails_for_ = op.remote;
  }
  if (!rails_it_->second.ok()) {
    Settle(i, rails_it_->second.status(), "");
    return nullptr;
  }
  const PeerRails& peer_rails = *rails_it_->second;
  if (op.remote->incarnation != 0 && peer_rails.incarnation != op.remote->incarnation) {
    // Its keys were made by the agent that ran before: none of them reaches anything now.
    Settle(i,
           absl::AbortedError(absl::StrCat("remote_buffer: ", node, " restarted since ",
                                           Echo(op.remote->name),
                                           " was resolved; submit the transfer again")),
           "");
    return nullptr;
  }
  return &peer_rails;
}

TransferEngine::BatchPost::SharedPlan& TransferEngine::BatchPost::PlanFor(
    size_t i, const PeerRails& peer_rails) {
  const PlannedOp& op = ops_[i];
  bool fresh = false;
  if (const PlanKey key{op.local, op.remote}; key != plan_for_) {
    plan_for_ = key;
    std::tie(plan_it_, fresh) = plans_.try_emplace(key);
  }
  SharedPlan& plan = plan_it_->second;
  if (fresh) {
    plan.direct = DirectRoutes(*op.local, *op.remote, peer_rails, *engine_.ledger_, now_);
    const ProviderRails& preferred = peer_rails.providers.front();
    plan.provider = plan.direct.provider.empty() ? preferred.provider : plan.direct.provider;
    // Which way each side moves its bytes, under the policy this transfer runs with; the
    // rail tells the planner whether the fabric reaches the buffer directly.
    const fabric::RailId plan_rail =
        plan.direct.routes.empty() ? preferred.ours.front() : plan.direct.routes.front().ours;
    plan.local = engine_.deps_.plan(*op.local, transfer_->policy(), plan_rail);
    plan.remote = RemoteLeg(*op.remote);
    plan.legs = std::make_shared<const std::vector<ferry::v1::Leg>>(
        std::vector<ferry::v1::Leg>{MakeLeg("local", plan.local, plan.provider),
                                    MakeLeg("remote", plan.remote, plan.provider)});
  }
  return plan;
}

void TransferEngine::BatchPost::Stage(size_t i, const SharedPlan& plan,
                                      const PeerRails& peer_rails) {
  const PlannedOp& op = ops_[i];
  const std::string& node = op.remote->node;
  const ProviderRails& preferred = peer_rails.providers.front();
  // Our side direct: the route must leave from a rail that holds the buffer.
  std::vector<fabric::RailId> candidates;
  if (IsDirect(plan.local.mode)) {
    for (const auto& [rail, region] : op.local->regions()) candidates.push_back(rail);
  }
  // A staged leg is not striped: it takes one route, off the NICs the ledger pauses for
  // this peer while any other is left (a paused GPU NIC hands its staging to another).
  ProviderRails staging = preferred;
  std::erase_if(staging.ours, [&](const fabric::RailId& r) {
    return !engine_.ledger_->Usable(r, node, now_);
  });
  if (staging.ours.empty()) staging.ours = preferred.ours;
  std::optional<Route> route = StagedRoute(staging, candidates, plan.local.nic, plan.remote.nic);
  absl::StatusOr<PeerEndpoint> peer =
      route ? Endpoint(node, *route, 0, op.remote->incarnation)
            : absl::StatusOr<PeerEndpoint>(absl::FailedPreconditionError(
                  absl::StrCat("no ", preferred.provider, " rail reaches ",
                               Echo(op.remote->name), " on ", node, " from this buffer")));
  if (!peer.ok()) {
    Settle(i, peer.status(), plan.provider);
    return;
  }
  transfer_->SetRails(i, {peer->rail.ToString()}, {peer->peer_rail.ToString()}, {});
  staged_.push_back({i, plan.local, *peer});
}

bool TransferEngine::BatchPost::LanesFor(size_t i, SharedPlan& plan) {
  const PlannedOp& op = ops_[i];
  const std::string& node = op.remote->node;
  const RouteChoice& direct = plan.direct;
  if (direct.routes.empty()) {
    Settle(i,
           absl::FailedPreconditionError(absl::StrCat(
               "no rail of ", plan.provider, " reaches both buffers (",
               op.local->regions().empty() ? "not registered here" : "none of the peer's")),
           plan.provider);
    return false;
  }
  if (!plan.lanes_built) {
    plan.lanes_built = true;
    std::vector<Lane> lanes, reserve;
    // Lanes one NIC after the other (route 0 lane 0, route 1 lane 0, ..., route 0 lane 1),
    // so that consecutive slices leave through different NICs.
    uint32_t most_lanes = 1;
    for (const Route& route : direct.routes) {
      if (fabric::Fabric* f = engine_.peers_->FabricOf(route.ours)) {
        most_lanes = std::max(most_lanes, f->endpoints_per_peer());
      }
    }
    for (uint32_t lane = 0; lane < most_lanes; ++lane) {
      for (const Route& route : direct.routes) {
        fabric::Fabric* f = engine_.peers_->FabricOf(route.ours);
        if (f == nullptr || lane >= f->endpoints_per_peer()) continue;
        const absl::StatusOr<PeerEndpoint>& e = Endpoint(node, route, lane, op.remote->incarnation);
        if (!e.ok()) {
          if (plan.no_lane.ok()) plan.no_lane = e.status();
          continue;
        }
        lanes.push_back(
            {e->endpoint, route, op.local->region(route.ours), *op.remote->KeyFor(route.theirs)});
      }
    }
    // Where slices go when every NIC of the provider failed them (tcp behind verbs),
    // unless the policy says to fail rather than fall back.
    if (transfer_->policy().policy.fallback != config::Fallback::kFail) {
      for (const Route& route : direct.reserve) {
        const absl::StatusOr<PeerEndpoint>& e = Endpoint(node, route, 0, op.remote->incarnation);
        if (!e.ok()) continue;
        reserve.push_back(
            {e->endpoint, route, op.local->region(route.ours), *op.remote->KeyFor(route.theirs)});
      }
    }
    if (lanes.empty() && !reserve.empty()) {
      // Not one route of the provider connected (rxe's INIT->RTR timing out, issue 43 item
      // 4): the next provider both agents offer carries the op rather than it failing; the
      // routes that failed stay paused in the ledger, which says where their slices went.
      for (const Route& route : direct.routes) {
        engine_.ledger_->FellBack(route.ours, node, reserve.front().route.ToString());
      }
      lanes = std::move(reserve);
      reserve.clear();
    }
    if (!lanes.empty()) {
      plan.lanes = std::make_shared<LaneSet>(std::move(lanes), std::move(reserve));
    }
  }
  if (!plan.lanes) {
    Settle(i,
           plan.no_lane.ok() ? absl::FailedPreconditionError(absl::StrCat(
                                   "no ", plan.provider, " fabric serves the rails that reach ",
                                   Echo(op.remote->name), " on ", node))
                             : plan.no_lane,
           plan.provider);
    // The failed connect paused its rail in the ledger: the next op between these buffers
    // plans again and may take another route or provider (tcp behind verbs), as it would
    // have alone.
    plans_.erase(plan_it_);
    plan_for_ = {nullptr, nullptr};
    counted_ = nullptr;
    return false;
  }
  if (counted_ != &plan) {  // the same plan's routes count the same
    size_t& most = routes_to_[node];
    most = std::max(most, direct.routes.size());
    counted_ = &plan;
  }
  return true;
}

void TransferEngine::BatchPost::Join(size_t i, const SharedPlan& plan) {
  const PlannedOp& op = ops_[i];
  // The ops of a batch between the same two buffers ride together while they fit a slice
  // and kMaxPieces: one fabric op, one completion (tcp: one request and one ack) for a run
  // of a paged KV cache's blocks. An op adjacent on both sides to the previous one (the
  // cache's consecutive blocks) extends its piece. Only the op right after the run joins
  // it: one between that failed or went to staging has an outcome of its own, which the
  // run's completion must not write over.
  if (run_ && run_->last + 1 == i && run_->plan == &plan &&
      run_->read == (op.type == ferry::v1::READ) &&
      run_->length + op.length <= limits_.slice_bytes) {
    fabric::Piece& back = run_->pieces.back();
    if (back.local_offset + back.length == op.local_offset &&
        back.remote_offset + back.length == op.remote_offset) {
      back.length += op.length;
    } else if (run_->pieces.size() < kMaxPieces) {
      run_->pieces.push_back({op.local_offset, op.remote_offset, op.length});
    } else {
      Flush();
    }
    if (run_) {
      run_->length += op.length;
      run_->last = i;
      return;
    }
  }
  Flush();
  run_ = OpRun{.first = i,
             .last = i,
             .plan = &plan,
             .read = op.type == ferry::v1::READ,
             .length = op.length,
             .pieces = {{op.local_offset, op.remote_offset, op.length}}};
}

void TransferEngine::BatchPost::Flush() {
  if (!run_) return;
  OpRun r = std::move(*std::exchange(run_, std::nullopt));
  const std::string& node = ops_[r.first].remote->node;
  const std::string provider = r.plan->provider;
  // The completion holds the ops (and so the buffers) until the fabric is done with them,
  // even when the transfer was settled earlier (deadline, cancel). Ops that rode together
  // settle together. (Not the run itself: its plan lives only as long as this post.)
  StripedOp::Done done = [life = engine_.life_, transfer = transfer_, planned = planned_,
                          first = r.first, last = r.last, provider](StripedOutcome outcome) {
    Visit visit(*life);
    if (visit.engine() == nullptr) return;  // its destructor settled every op
    const absl::Status status = RemoteOutcome(outcome.status, (*planned)[first]);
    visit.engine()->SettleRun(transfer, first, last, status, CarriedBy(outcome, provider),
                              outcome);
  };
  transfer_->MarkPosted(r.first, r.last - r.first + 1);
  const fabric::Piece& one = r.pieces.front();
  StripedOp::Spec spec{r.read,
                       one.local_offset,
                       one.remote_offset,
                       r.length,
                       limits_.slice_bytes,
                       node,
                       transfer_->id(),
                       engine_.next_lane_.fetch_add(1, std::memory_order_relaxed)};
  spec.owner_uid = transfer_->owner_uid();
  if (r.pieces.size() > 1) {
    spec.pieces =
        std::make_shared<const std::vector<fabric::Piece>>(r.pieces.begin(), r.pieces.end());
  }
  auto striped = std::make_shared<StripedOp>(std::move(spec), r.plan->lanes, engine_.ledger_,
                                             QueueFor(node), wanted_, std::move(done));
  std::vector<SliceWork>& to_peer = work_[node];
  if (to_peer.empty()) to_peer.reserve(ops_.size() - r.first);  // grown once, not doubled
  striped->AppendSlices(to_peer);
}

void TransferEngine::BatchPost::HandOff() {
  // Each peer's slices go to its queue at once, after planning: nothing completes meanwhile.
  for (auto& [node, slices] : work_) {
    QueueFor(node)->Enqueue(transfer_->id(), std::move(slices), wanted_, transfer_->owner_uid());
  }
  if (!staged_.empty()) engine_.StartStaging(transfer_, planned_, std::move(staged_));
  if (!local_.empty()) engine_.StartLocalCopies(transfer_, planned_, std::move(local_));
}

const absl::StatusOr<PeerEndpoint>& TransferEngine::BatchPost::Endpoint(const std::string& node,
                                                                        const Route& route,
                                                                        uint32_t lane,
                                                                        uint64_t incarnation) {
  auto key = std::make_tuple(node, route, lane);
  auto it = endpoints_.find(key);
  if (it == endpoints_.end()) {
    it = endpoints_
             .emplace(key, engine_.peers_->Endpoint(node, route, lane, incarnation, deadline_))
             .first;
    if (!it->second.ok()) {
      // A route that cannot connect is paused like one that broke; the peer's rails may
      // have changed, so the next Rails asks it again.
      engine_.ledger_->Failed(route.ours, node, it->second.status(), false, absl::Now());
      engine_.peers_->Refresh(node);
    }
  }
  return it->second;
}

const std::shared_ptr<FairQueue>& TransferEngine::BatchPost::QueueFor(const std::string& node) {
  const size_t routes = routes_to_[node];
  auto& [made_for, queue] = queues_[node];
  if (!queue || made_for < routes) {
    queue = engine_.QueueFor(node, limits_, routes);
    made_for = routes;
  }
  return queue;
}

}  // namespace ferry::server
