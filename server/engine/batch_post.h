#pragma once
// One batch posted: TransferEngine::Post in its steps. An op between two buffers of this node
// (its peer is this node) is Local: the agent copies it (server/engine/local_copy.h). Each
// other op, in order:
//   1. PeerSide: the peer's rails (one Hello answer per peer for the batch), and whether the
//      remote buffer still belongs to the agent that resolved it;
//   2. PlanFor: the legs and routes, planned by the first op between the same two buffers
//      and shared by the rest (a KV batch of 4096 blocks plans once);
//   3. Stage, or LanesFor: a staged op takes one route and waits for the staging thread; a
//      direct op takes the plan's lanes (an endpoint per route and lane, made once per batch);
//   4. Join: direct ops between the same buffers ride together as one fabric op (a run) while
//      they fit a slice;
// and at the end, HandOff: every peer's slices go to its fair queue at once, the staged ops
// to a thread of their own, the local copies to theirs (or done there and then, if small). An op
// that cannot go settles on the spot, with why. Engine-internal: only transfer_engine.cc and
// batch_post.cc include it.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/engine/route_choice.h"
#include "server/engine/stage_sender.h"
#include "server/engine/transfer_engine.h"

namespace ferry::server {

class TransferEngine::BatchPost {
 public:
  // `planned`: the transfer's ops, held for the whole post (an early completion may finish
  // the transfer meanwhile).
  BatchPost(TransferEngine& engine, std::shared_ptr<Transfer> transfer, PlannedOps planned,
            absl::Time deadline);
  BatchPost(const BatchPost&) = delete;
  BatchPost& operator=(const BatchPost&) = delete;

  void Run();

 private:
  // What the ops of one batch between the same two buffers share: planned by the first.
  struct SharedPlan {
    RouteChoice direct;
    std::string provider;
    LegPlan local, remote;
    Transfer::Legs legs;
    bool lanes_built = false;              // direct ops only, on the first that gets that far
    std::shared_ptr<const LaneSet> lanes;  // null when no lane could be had
    absl::Status no_lane;
  };
  // Direct ops waiting to be posted as one: ops first..last, between the same two buffers in
  // the same direction, as pieces (an op adjacent on both sides to the previous one extends
  // its piece).
  struct OpRun {
    size_t first = 0, last = 0;
    const SharedPlan* plan = nullptr;
    bool read = false;
    uint64_t length = 0;                           // of all the pieces
    absl::InlinedVector<fabric::Piece, 1> pieces;  // one, unless the run gathers blocks
  };
  using PlanKey = std::pair<const Buffer*, const RemoteBuffer*>;

  // Op `i` is copied here, between two buffers of this node; settles it when it cannot be.
  void Local(size_t i);
  // Step 1. The peer's rails for op `i`; null when the op settled (the peer did not answer,
  // or restarted since its buffer was resolved).
  const PeerRails* PeerSide(size_t i);
  // Step 2. The plan op `i` shares with the ops between the same two buffers.
  SharedPlan& PlanFor(size_t i, const PeerRails& peer_rails);
  // Step 3, staged: op `i` takes one route off the NICs the ledger does not pause for the
  // peer, and waits for HandOff's staging thread; settles it when no route connects.
  void Stage(size_t i, const SharedPlan& plan, const PeerRails& peer_rails);
  // Step 3, direct: the plan's lanes, built by its first direct op; false when op `i`
  // settled because none could be had (the plan is then dropped: the next op between these
  // buffers plans again, and may take another route or provider).
  bool LanesFor(size_t i, SharedPlan& plan);
  // Step 4. Op `i` joins the run before it, or starts one (Flush posts the one before).
  void Join(size_t i, const SharedPlan& plan);
  void Flush();
  // The end: slices to the queues, staged ops to their thread.
  void HandOff();

  // One endpoint per (peer, route, lane) for the whole batch; a route that cannot connect
  // is paused in the ledger like one that broke.
  const absl::StatusOr<PeerEndpoint>& Endpoint(const std::string& node, const Route& route,
                                               uint32_t lane, uint64_t incarnation);
  // Each peer's queue, asked of the engine once per batch rather than once per op (again
  // only when an op takes more routes to the peer than those before: a wider window).
  const std::shared_ptr<FairQueue>& QueueFor(const std::string& node);
  void Settle(size_t i, const absl::Status& status, const std::string& provider) {
    engine_.Settle(transfer_, i, status, provider);
  }

  TransferEngine& engine_;
  const std::shared_ptr<Transfer> transfer_;
  const PlannedOps planned_;
  const PlannedBatch& ops_;
  const absl::Time deadline_;
  const EngineLimits limits_;
  // One instant for the batch: its routes are chosen together.
  const absl::Time now_;
  // Not finished(): a cancelled transfer whose check runs must not post its queued slices.
  const Wanted wanted_;

  std::map<std::string, absl::StatusOr<PeerRails>> rails_;
  std::map<std::tuple<std::string, Route, uint32_t>, absl::StatusOr<PeerEndpoint>> endpoints_;
  std::map<PlanKey, SharedPlan> plans_;
  std::map<std::string, std::pair<size_t, std::shared_ptr<FairQueue>>> queues_;
  std::map<std::string, std::vector<SliceWork>> work_;  // direct slices, by peer
  std::map<std::string, size_t> routes_to_;             // the most routes an op takes, by peer
  std::vector<StagedOp> staged_;
  std::vector<size_t> local_;                    // ops copied here, by index
  std::map<PlanKey, Transfer::Legs> local_legs_;  // shared by the ops between two buffers
  std::optional<OpRun> run_;

  // What the previous op looked up, for the next op that shares its remote buffer, or both
  // buffers (most ops of a KV batch): no map lookups per op for them. std::map entries stay
  // where they are while others are added.
  const RemoteBuffer* rails_for_ = nullptr;
  decltype(rails_)::iterator rails_it_;
  PlanKey plan_for_ = {nullptr, nullptr};
  decltype(plans_)::iterator plan_it_;
  const SharedPlan* counted_ = nullptr;  // the plan whose routes routes_to_ last counted
};

}  // namespace ferry::server
