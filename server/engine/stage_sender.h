#pragma once
// Runs the staged ops of one transfer as a pipeline of chunks, at most `staging_depth` in
// flight per staged side. For each op: open the peer's Stage call when its side is staged
// (CallFor), then cut the op into chunks; each chunk takes a window slot and, when our side
// is staged, one of our bounce chunks (a lease), and runs as a StagedWrite or StagedRead
// (staged_write.h, staged_read.h name the steps). Chunk completions and the peer's copy
// reports settle the op when all its bytes are in. One thread per transfer drives it.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/buffers/bounce_pools.h"
#include "server/buffers/gpu_pools.h"
#include "server/engine/leg_planner.h"
#include "server/engine/rail_ledger.h"
#include "server/engine/transfer.h"
#include "server/peers/peer_directory.h"
#include "server/peers/stage_call.h"

namespace ferry::server {

struct StagedOp {
  size_t index = 0;  // in the transfer
  LegPlan local;
  PeerEndpoint peer;
};

class StageSender : public std::enable_shared_from_this<StageSender>, public StageEvents {
 public:
  struct Deps {
    GpuPools* gpus;
    BouncePools* bounce;
    StageCallFactory stage_calls;
    // Settles op `index` of the transfer (the engine's bookkeeping).
    std::function<void(size_t index, const absl::Status& status, const std::string& provider)>
        settle;
    // Counts each chunk against its rail (per-NIC counters); may be null.
    std::shared_ptr<RailLedger> ledger;  // may outlive the engine, as StripedOp's
  };

  // `planned`: the transfer's ops, held while the pipeline may touch their buffers.
  StageSender(std::shared_ptr<Transfer> transfer, PlannedOps planned, std::vector<StagedOp> ops,
              Deps deps);
  ~StageSender() override;

  // Moves every op; returns when each has settled (or the transfer's deadline passed).
  // Completions hold a reference, so the sender must be owned by a shared_ptr.
  void Run();
  // Stops early (agent shutdown, cancel): no new chunks start and the Stage calls end.
  void Cancel();

  // StageEvents: the peer copied a chunk of the op in `token`; a Stage call failed (its
  // ops with chunks in flight fail with `why`).
  void OnCopied(uint64_t token, uint64_t bytes) override;
  void OnCallFailed(const StageCall* call, const absl::Status& why) override;

 private:
  absl::Status RunOp(size_t slot);
  // Takes what one chunk needs (our bounce chunk) and starts it.
  void StartChunk(size_t slot, uint64_t offset, uint64_t length,
                  const std::shared_ptr<StageCall>& call,
                  const std::shared_ptr<StagingPool>& local_pool);
  // A chunk of op `slot` ended (`launched`: it held a window slot).
  void ChunkEnded(size_t slot, uint64_t bytes, const absl::Status& status, bool launched = true);
  // The Stage call for the op's remote buffer (and direction), opened on first use.
  absl::StatusOr<std::shared_ptr<StageCall>> CallFor(const StagedOp& staged);
  // Takes one of `window` slots for a chunk of op `slot`; false at the deadline.
  bool WaitWindow(size_t slot, uint32_t window);
  // Closes every call once the chunks are done, and logs the peers' verdicts.
  void CloseCalls();

  const std::shared_ptr<Transfer> transfer_;
  const PlannedOps planned_;
  const std::vector<StagedOp> ops_;
  const Deps deps_;
  const uint32_t depth_;
  const uint64_t chunk_;

  // Per op (by slot), what its chunks did so far.
  struct OpProgress {
    uint64_t done_bytes = 0;
    uint32_t chunks = 0;
    uint32_t in_flight = 0;
    bool failed = false;
    const StageCall* call = nullptr;
  };
  absl::Mutex mu_;
  uint32_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<OpProgress> progress_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex calls_mu_;
  std::vector<std::shared_ptr<StageCall>> calls_ ABSL_GUARDED_BY(calls_mu_);
};

}  // namespace ferry::server
