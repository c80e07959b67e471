#pragma once
// Runs the staged ops of one transfer as a pipeline of chunks, at most `staging_depth` in
// flight: copy-out (GPU -> local bounce chunk) -> wire (fabric WRITE into the peer's granted
// bounce chunk, or its final buffer) -> copy-in on the peer (reported through the Stage
// call) -> done. READ into a staged local GPU runs wire (READ into a local bounce chunk) ->
// copy-in. One thread per transfer drives it; copies and fabric completions move it on.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/engine/bounce_pools.h"
#include "server/engine/leg_planner.h"
#include "server/engine/transfer.h"
#include "server/gpu_pools.h"
#include "server/peers/peer_directory.h"

namespace ferry::server {

struct StagedOp {
  size_t index = 0;  // in the transfer
  LegPlan local;
  PeerEndpoint peer;
};

class StageSender : public std::enable_shared_from_this<StageSender> {
 public:
  class Session;

  struct Deps {
    GpuPools* gpus;
    BouncePools* bounce;
    PeerDirectory* peers;
    // Settles op `index` of the transfer (the engine's bookkeeping).
    std::function<void(size_t index, const absl::Status& status, const std::string& provider)> settle;
  };

  // `planned`: the transfer's ops, held while the pipeline may touch their buffers.
  StageSender(std::shared_ptr<Transfer> transfer, PlannedOps planned, std::vector<StagedOp> ops,
              Deps deps);
  ~StageSender();

  // Moves every op; returns when each has settled (or the transfer's deadline passed).
  // Completions hold a reference, so the sender must be owned by a shared_ptr.
  void Run();
  // Stops early (agent shutdown): no new chunks start and the Stage calls are cancelled.
  void Cancel();
  // The peer copied a chunk of the op in `token` into its GPU.
  void OnCopied(uint64_t token, uint64_t bytes);
  // A Stage call ended badly: its ops with chunks in flight fail with `why`.
  void OnSessionFailed(const Session* session, const absl::Status& why);

 private:

  absl::Status RunOp(const StagedOp& staged);
  // Starts one chunk; its completion settles the op when it is the op's last.
  void Launch(const StagedOp& staged, uint64_t offset, uint64_t length,
              std::shared_ptr<Session> session, std::shared_ptr<StagingPool> local_pool);
  // A chunk of op `op_slot` ended (`launched`: it held a window slot).
  void UnitDone(size_t op_slot, uint64_t bytes, const absl::Status& status, bool launched = true);
  // The Stage call for the op's remote buffer (and direction), opened on first use.
  absl::StatusOr<std::shared_ptr<Session>> SessionFor(const StagedOp& staged);
  // Takes one of `window` slots for a chunk of op `slot`; false at the deadline.
  bool WaitWindow(size_t slot, uint32_t window);

  const std::shared_ptr<Transfer> transfer_;
  const PlannedOps planned_;
  const std::vector<StagedOp> ops_;
  const Deps deps_;
  const uint32_t depth_;
  const uint64_t chunk_;

  absl::Mutex mu_;
  uint32_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint64_t> done_bytes_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> chunks_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> failed_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> units_in_flight_ ABSL_GUARDED_BY(mu_);
  std::vector<const Session*> session_of_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex sessions_mu_;
  // Shared with the completions that still report through them.
  std::vector<std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(sessions_mu_);
};

}  // namespace ferry::server
