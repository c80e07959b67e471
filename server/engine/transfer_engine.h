#pragma once
// Turns a client's batch into validated ops, posts them on the fabric endpoints to the
// peers, and keeps each transfer until the client has had its result.

#include <cstdint>
#include <atomic>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "ferry/v1/agent.pb.h"
#include "server/buffers/bounce_pools.h"
#include "server/buffers/buffer_registry.h"
#include "server/buffers/gpu_pools.h"
#include "server/engine/fair_queue.h"
#include "server/engine/leg_planner.h"
#include "server/engine/rail_ledger.h"
#include "server/engine/striped_op.h"
#include "server/engine/transfer_stats.h"
#include "server/engine/transfer.h"
#include "server/peers/peer_directory.h"
#include "server/peers/stage_call.h"
#include "server/policy/policy_store.h"

namespace ferry::server {

struct EngineLimits {
  uint64_t max_op_bytes = 1ull << 30;
  uint32_t max_ops_per_submit = 65536;
  absl::Duration default_timeout = absl::Seconds(60);
  // No transfer runs longer than this, whatever its timeout_ms asks.
  absl::Duration max_timeout = absl::Minutes(10);
  // Finished transfers kept for Wait/Watch after they end: at most `history` of them, and of
  // at most `history_ops` ops in all (each op keeps its outcome, legs and rails, ~90 bytes:
  // 4096 KV batches of 4096 blocks would have kept 1.4 GiB), the newest always.
  size_t history = 4096;
  size_t history_ops = 256 << 10;
  // Direct ops are cut into slices of at most this, and at most peer_window_bytes of them
  // are on the wire to one peer at once, transfers taking turns (server/engine/fair_queue).
  uint64_t slice_bytes = 1 << 20;
  uint64_t peer_window_bytes = 16 << 20;
  // ...and kSoloWindows of them while one transfer has the peer to itself (FairQueueWindows).
  static constexpr uint64_t kSoloWindows = 4;
  // How long a drain (SIGTERM) lets running transfers finish before it cancels them.
  absl::Duration shutdown_grace = absl::Seconds(30);
  // Transfers one local uid may have running at once (limits.per_uid_transfers): past it
  // Submit is RESOURCE_EXHAUSTED naming the limit and the use, so that one client's
  // thousands of handles cannot take the engine's memory from the others (10k held 460 MB).
  // Above one transfer-socket connection's window (1024). 0: no limit.
  size_t per_uid_transfers = 4096;
};

// What a Submit made while the agent drains is told (UNAVAILABLE).
inline constexpr char kDrainingMessage[] =
    "agent is draining (it received SIGTERM): it accepts no new transfers, finishes the "
    "running ones and exits; retry on another node or after it restarts";

class StageSender;
struct StagedOp;

// What the engine plans and moves with; all owned by the agent and outliving the engine.
struct EngineDeps {
  BufferRegistry* buffers = nullptr;
  PeerDirectory* peers = nullptr;
  PolicyStore* policies = nullptr;
  GpuPools* gpus = nullptr;           // may be null: no GPUs
  BouncePools* bounce = nullptr;
  // Opens Stage calls to peers whose side of an op is staged (server/peers/stage_client.h).
  StageCallFactory stage_calls;
  // How this agent moves bytes in or out of a buffer (PlanLeg with its topology).
  std::function<LegPlan(const Buffer&, const PolicySnapshot&, const fabric::RailId& rail)> plan;
};

class TransferEngine {
 public:
  TransferEngine(EngineDeps deps, EngineLimits limits);
  // Fails what is still running (UNAVAILABLE: agent stopping) and stops the reaper.
  ~TransferEngine();

  // Transfer ids count from `first` (base/run_ids.h: this run's own range, so that an id a
  // client of an earlier run still names, to wait for or cancel, is not a new client's
  // transfer); from 1 unless set. Set once, before the first Submit.
  void StartIdsAt(uint64_t first) {
    absl::MutexLock lock(&mu_);
    first_id_ = next_id_ = first;
  }

  // Runs once when a transfer finished (every op settled, however: done, failed, cancelled,
  // timed out, or the agent stopping), on the thread that settled its last op: it must not
  // block (hand slow work, a peer call, to a thread of its own).
  using FinishedHook = std::function<void(const Transfer&)>;
  // Runs once when every op settled, before the transfer counts as finished (MoveBlocks'
  // verify), on the thread that settled the last op: it must not block, and must call
  // `done` exactly once, from any thread, with what the check found (Transfer::EndCheck).
  // Until then waiters see the transfer RUNNING and Cancel leaves it be. `done` after the
  // engine is gone ends the check and nothing else.
  using CheckDone = absl::AnyInvocable<void(std::vector<Transfer::CheckFailure> failed,
                                            absl::Status rest) &&>;
  using CheckHook = std::function<void(std::shared_ptr<const Transfer>, CheckDone done)>;
  // Validates the whole batch (nothing moves if any op is bad; the status names the field,
  // e.g. "ops[3].remote_offset"), then posts every op. Returns the transfer id.
  // `on_finished` runs when it finished (never when Submit fails), after `check` if given.
  // `owner_uid`: the local uid it is made for (Transfer::owner_uid; kUnknownOwner for none).
  absl::StatusOr<uint64_t> Submit(const ferry::v1::SubmitRequest& request,
                                  FinishedHook on_finished = {}, CheckHook check = {},
                                  int64_t owner_uid = Transfer::kUnknownOwner);
  // NOT_FOUND for an unknown (or long forgotten) transfer id.
  absl::StatusOr<std::shared_ptr<Transfer>> Find(uint64_t id) const;
  // Ends a running transfer: its open ops settle CANCELLED now, its staging pipeline stops
  // starting chunks. Ops already on the wire finish or fail on their own; their buffers stay
  // held until they do. A finished transfer is left as it was. NOT_FOUND as Find.
  absl::StatusOr<std::shared_ptr<Transfer>> Cancel(uint64_t id);

  // The limits new Submits are checked against; SetLimits applies a SIGHUP reload (running
  // transfers keep the deadline they were given).
  EngineLimits limits() const;
  void SetLimits(const EngineLimits& limits);

  size_t active() const;
  uint64_t finished() const;

  // Graceful drain (server/agent/drain.h). From BeginDrain on, Submit refuses with UNAVAILABLE
  // (kDrainingMessage); transfers already running go on. Idempotent.
  void BeginDrain();
  bool draining() const;
  // Blocks until no transfer runs or `deadline` passed; true when none is left.
  bool AwaitIdle(absl::Time deadline) const;
  // Ends every running transfer as Cancel does, its open ops settling with `why`. Returns
  // how many it ended.
  size_t EndAll(const absl::Status& why);
  // What each rail carried to each peer, and which are paused (GetInfo, `ferryctl nics`).
  const RailLedger& ledger() const { return *ledger_; }
  // Finished transfers added up (GetStats, metrics).
  const TransferStats& stats() const { return stats_; }
  // The running transfers and the most recent finished ones (newest first), at most
  // `recent` of those: `ferryctl transfers`.
  std::vector<std::shared_ptr<Transfer>> Running() const;
  std::vector<std::shared_ptr<Transfer>> Recent(size_t recent) const;

 private:
  // Post's steps, one batch at a time (server/engine/batch_post.h).
  class BatchPost;

  absl::StatusOr<PlannedBatch> Plan(const ferry::v1::SubmitRequest& request,
                                    const EngineLimits& limits, absl::Time deadline);
  // Puts every op of a transfer Submit made on its way: slices to the peers' queues, staged
  // ops to a thread; an op that cannot go settles with why.
  void Post(const std::shared_ptr<Transfer>& transfer, absl::Time deadline);
  void OnFinished(uint64_t id);
  // The queue of direct slices to `node`, made on first use, with a window for `routes`.
  std::shared_ptr<FairQueue> QueueFor(const std::string& node, const EngineLimits& limits,
                                      size_t routes);
  void ReapExpired();
  // Cancel and EndAll: stops the transfer's staging pipelines, settles its open ops.
  void End(const std::shared_ptr<Transfer>& transfer, const absl::Status& why);

  // Runs a transfer's staged ops on a thread of its own.
  void StartStaging(const std::shared_ptr<Transfer>& transfer, PlannedOps planned,
                    std::vector<StagedOp> ops);
  // Copies a transfer's ops between this node's buffers (`ops`: their indexes): on this
  // thread when they are few host bytes, else on a thread of their own.
  void StartLocalCopies(const std::shared_ptr<Transfer>& transfer, PlannedOps planned,
                        std::vector<size_t> ops);
  // Runs `work` on a thread of its own, kept in workers_ (joined when finished, or by the
  // destructor); `sender`: the staging pipeline Cancel and the destructor stop, if any.
  void StartWorker(uint64_t transfer_id, std::weak_ptr<StageSender> sender,
                   absl::AnyInvocable<void() &&> work);
  void Settle(const std::shared_ptr<Transfer>& transfer, size_t index, const absl::Status& status,
              const std::string& provider);
  // Settles ops first..last, which rode as one fabric op, with its outcome.
  void SettleRun(const std::shared_ptr<Transfer>& transfer, size_t first, size_t last,
                 const absl::Status& status, const std::string& provider,
                 StripedOutcome& outcome);

  const EngineDeps deps_;
  BufferRegistry* const buffers_;
  PeerDirectory* const peers_;
  // Shared with the striped ops and staging senders, whose completions may come after the
  // engine is gone.
  const std::shared_ptr<RailLedger> ledger_ = std::make_shared<RailLedger>();
  TransferStats stats_;
  std::atomic<size_t> next_lane_{0};

  struct Worker {
    uint64_t transfer_id = 0;
    // The thread owns the sender while it runs; shutdown and Cancel reach it through here.
    std::weak_ptr<StageSender> sender;
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  absl::Mutex workers_mu_;
  std::list<Worker> workers_ ABSL_GUARDED_BY(workers_mu_);

  mutable absl::Mutex mu_;
  EngineLimits limits_ ABSL_GUARDED_BY(mu_);
  uint64_t first_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t finished_count_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Transfer>> transfers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<Transfer>> active_ ABSL_GUARDED_BY(mu_);
  // How many of active_ each local uid owns (Transfer::owner_uid >= 0).
  absl::flat_hash_map<int64_t, size_t> active_by_owner_ ABSL_GUARDED_BY(mu_);
  // Submit's on_finished and check of the active transfers that have one; a check is taken
  // out when it starts.
  absl::flat_hash_map<uint64_t, FinishedHook> finished_hooks_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, CheckHook> check_hooks_ ABSL_GUARDED_BY(mu_);
  // What completions (a direct op's, a check's `done`) reach the engine through: they may
  // run after it is gone (a fabric finishing ops at teardown, a peer answering late). A
  // visit counts itself in and finds out whether the engine is still there; the destructor
  // says it is going and waits for the visits in progress.
  struct Life {
    explicit Life(TransferEngine* e) : engine(e) {}
    TransferEngine* const engine;
    std::atomic<int> visits{0};
    std::atomic<bool> going{false};
  };
  class Visit {
   public:
    explicit Visit(Life& life);
    ~Visit();
    Visit(const Visit&) = delete;
    Visit& operator=(const Visit&) = delete;
    // The engine, or null once it is going (what the completion settles, it settled).
    TransferEngine* engine() const { return entered_ ? life_.engine : nullptr; }

   private:
    Life& life_;
    bool entered_;
  };
  const std::shared_ptr<Life> life_;
  std::deque<uint64_t> history_ ABSL_GUARDED_BY(mu_);
  size_t history_ops_ ABSL_GUARDED_BY(mu_) = 0;  // the ops of the transfers in history_
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<std::string, std::shared_ptr<FairQueue>> queues_ ABSL_GUARDED_BY(mu_);
  std::thread reaper_;
};

}  // namespace ferry::server
