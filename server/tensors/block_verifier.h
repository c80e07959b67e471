#pragma once
// MoveBlocks' verify: once a transfer's bytes moved, each pair's local block is checksummed
// here (CRC32C) and its remote block by the peer (TensorPeer.ChecksumBlocks); a pair whose
// two differ fails DATA_LOSS. It runs as the transfer's check (TransferEngine::CheckHook),
// before the transfer counts as finished, on a few threads of its own (started by the first
// verified transfers): no engine thread reads memory or waits for a peer.

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "server/buffers/buffer_registry.h"
#include "server/engine/transfer_engine.h"
#include "server/peers/peer_directory.h"

namespace ferry::server {

// More blocks than one ChecksumBlocks call may name (its request stays under 1 MiB).
inline constexpr int kMaxChecksumBlocks = 65536;
// Checks made at once at most.
inline constexpr size_t kVerifyWorkers = 4;

// What checking one MoveBlocks needs: pair i is local block `local_ids[i]` (held in
// `local[i]`: the check reads it after the transfer let its buffers go) and the peer's
// block `remote_ids[i]` of the list it exported as `remote_list`.
struct VerifyPlan {
  struct Held {
    std::shared_ptr<const Buffer> buffer;
    uint64_t offset = 0;
    uint64_t length = 0;
  };
  std::string peer, remote_list;
  std::vector<uint64_t> local_ids, remote_ids;
  std::vector<Held> local;
};

class BlockVerifier {
 public:
  BlockVerifier(PeerDirectory* peers, GpuPools* gpus);
  ~BlockVerifier() { Stop(); }

  // The check for one transfer, to hand to TransferEngine::Submit. Only pairs whose op
  // succeeded are checked; the rest keep their failure.
  TransferEngine::CheckHook Hook(std::shared_ptr<const VerifyPlan> plan);
  // Checks not started end UNAVAILABLE (their bytes were not verified), the running ones'
  // peer calls are cancelled; later hooks end at once. Idempotent.
  void Stop();

 private:
  struct Job {
    std::shared_ptr<const VerifyPlan> plan;
    std::shared_ptr<const Transfer> transfer;
    TransferEngine::CheckDone done;
  };
  // Shared with the hooks, which the engine may run after this is gone.
  struct State {
    absl::Mutex mu;
    std::deque<Job> queue ABSL_GUARDED_BY(mu);
    bool stopping ABSL_GUARDED_BY(mu) = false;
    absl::flat_hash_set<grpc::ClientContext*> calls ABSL_GUARDED_BY(mu);  // running checks'
  };

  void Run();
  void Check(Job job);
  // The peer's checksums of remote_ids[pairs[k]], k in [first, last).
  absl::StatusOr<std::vector<uint32_t>> AskPeer(const VerifyPlan& plan,
                                                const std::vector<size_t>& pairs, size_t first,
                                                size_t last, absl::Time deadline);

  PeerDirectory* const peers_;
  GpuPools* const gpus_;
  const std::shared_ptr<State> state_ = std::make_shared<State>();
  // Started by the first Hooks, up to kVerifyWorkers (under state_->mu): a peer slow to
  // answer holds up one worker, not every verified transfer.
  std::vector<std::thread> threads_;
};

}  // namespace ferry::server
