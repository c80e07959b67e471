#pragma once
// One submitted batch: its validated ops and what has become of each. Completions from the
// fabric and the deadline reaper both land here; whichever comes first settles an op.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ferry/v1/agent.pb.h"
#include "server/buffers/buffer_registry.h"
#include "server/peers/peer_directory.h"
#include "server/policy/policy_store.h"

namespace ferry::server {

// An op after validation: every buffer resolved, every range checked. Its buffers are held
// by its batch (PlannedBatch), not by the op: 4096 ops each copying and dropping two
// shared_ptrs to the same two buffers cost a third of the engine's own time per op.
struct PlannedOp {
  ferry::v1::OpType type = ferry::v1::WRITE;
  Buffer* local = nullptr;
  uint64_t local_offset = 0;
  uint64_t length = 0;
  const RemoteBuffer* remote = nullptr;
  uint64_t remote_offset = 0;
  // The remote buffer itself when the op's peer is this node: the agent copies between the
  // two (server/engine/local_copy.h) instead of sending the bytes to itself.
  Buffer* here = nullptr;
};

// A batch's ops, and one reference to each buffer they name: whoever holds the batch keeps
// every buffer an op may touch alive.
struct PlannedBatch {
  std::vector<PlannedOp> ops;
  std::vector<std::shared_ptr<Buffer>> locals;
  std::vector<std::shared_ptr<const RemoteBuffer>> remotes;

  // Keeps `buffer` for the batch's ops: the pointer they hold.
  Buffer* Keep(std::shared_ptr<Buffer> buffer) {
    return locals.emplace_back(std::move(buffer)).get();
  }
  const RemoteBuffer* Keep(std::shared_ptr<const RemoteBuffer> remote) {
    return remotes.emplace_back(std::move(remote)).get();
  }
  size_t size() const { return ops.size(); }
  const PlannedOp& operator[](size_t index) const { return ops[index]; }
};

// An op's result has two legs, in this order: how our side moved the bytes, and the peer's.
inline constexpr size_t kLocalLeg = 0;
inline constexpr size_t kRemoteLeg = 1;

// The ops of a transfer, shared by everything that may still touch their buffers: the
// transfer until it finishes, and each fabric completion and staging pipeline until it ran.
using PlannedOps = std::shared_ptr<const PlannedBatch>;

// Which per-op results Result() returns: a page, so that a huge batch's result fits a
// default client's 4 MiB message limit.
struct ResultPage {
  bool include_ops = false;
  uint64_t from = 0;
  uint32_t limit = 0;           // 0: as many as fit in `max_bytes`
  bool failed_only = false;
  uint64_t max_bytes = 2 << 20;
};

class Transfer {
 public:
  // `owner_uid`: the local uid that submitted it (kUnknownOwner: a peer's, or a caller
  // authenticated by TLS, not by the kernel).
  Transfer(uint64_t id, PlannedBatch ops, absl::Time deadline,
           std::shared_ptr<const PolicySnapshot> policy, int64_t owner_uid = kUnknownOwner);

  static constexpr int64_t kUnknownOwner = -1;

  uint64_t id() const { return id_; }
  // Who may Wait on, Watch, Cancel and list it (server/local/local_callers.h MayUse).
  int64_t owner_uid() const { return owner_uid_; }
  absl::Time deadline() const { return deadline_; }
  size_t op_count() const { return lengths_.size(); }
  // The ops while the transfer runs; null once it finished. The transfer lets go of them
  // when its last op settles, so a finished transfer (kept for Wait) holds no buffer:
  // whoever still touches a buffer (a posted op, a staging pipeline) holds them itself.
  PlannedOps ops() const;
  // The policy the transfer runs under from Submit to the end, whatever changes meanwhile.
  const PolicySnapshot& policy() const { return *policy_; }

  // Records how op `index` moved, for its result. Ops planned alike share one set of legs
  // (ShareLegs): a batch of 4096 blocks between the same two buffers builds its legs once.
  using Legs = std::shared_ptr<const std::vector<ferry::v1::Leg>>;
  void ShareLegs(size_t index, Legs legs);
  void SetLegs(size_t index, std::vector<ferry::v1::Leg> legs);
  // The legs as planned: without the rails, bytes and duration the result adds.
  std::vector<ferry::v1::Leg> LegsOf(size_t index) const;

  // Which rails carried op `index` on each side (its legs' `rails`) and the slices that
  // moved to another route (its result's `retries`).
  void SetRails(size_t index, std::vector<std::string> ours, std::vector<std::string> theirs,
                std::vector<std::string> retries);
  // Ops first .. first + count - 1 went to the fabric now (their duration starts).
  void MarkPosted(size_t first, size_t count = 1);
  // Settles op `index` (first call wins; later ones are ignored). Returns true when this
  // settled the last op.
  bool Settle(size_t index, const absl::Status& status, const std::string& provider);
  // Rails by name, shared by the ops that took the same ones (null: none carried bytes).
  using Names = std::shared_ptr<const std::vector<std::string>>;
  // Settles ops first..last (inclusive), which rode as one fabric op, alike: one lock, the
  // rails recorded for each, the retries on `first` (they moved the run's slices), each op's
  // duration the run's. Returns true when this settled the last op.
  bool SettleRun(size_t first, size_t last, const absl::Status& status,
                 const std::string& provider, Names ours, Names theirs,
                 std::vector<std::string> retries);
  // Settles every op still open with `why` (deadline, shutdown).
  void SettleAll(const absl::Status& why);

  // A check (MoveBlocks' verify) follows the last op: until EndCheck the transfer runs on,
  // so that no waiter sees it finished before its bytes were checked. Called before any op
  // settles. EndCheck fails the listed ops that had succeeded (whatever failed stays failed)
  // and every other op that had succeeded with `rest` unless it is OK (a check that could
  // not be made).
  struct CheckFailure {
    size_t index;
    absl::Status status;
  };
  void ExpectCheck();
  // Every op settled and the check has not ended.
  bool checking() const;
  void EndCheck(const std::vector<CheckFailure>& failed, const absl::Status& rest);

  bool finished() const;
  // Every op settled (a check may still run): nothing more of it should go to the fabric.
  bool all_settled() const;
  // Blocks until the transfer finished or `deadline`; false on timeout.
  bool AwaitFinished(absl::Time deadline) const;
  // Blocks until the progress version differs from `seen` or `deadline`.
  uint64_t AwaitChange(uint64_t seen, absl::Time deadline) const;

  ferry::v1::TransferResult Result(const ResultPage& page = {}) const;
  // One op as it stands, read in place (no result message is built): what statistics and
  // listings need of every op.
  struct OpView {
    const std::string& peer;
    bool read;
    int code;                                // 0 until settled, and when it succeeded
    uint64_t bytes;                          // moved: the op's length once it succeeded
    uint64_t duration_us;
    const std::string& provider;
    const std::string& mode;                 // the local leg's, "" before it was planned
    const std::vector<std::string>& rails;   // the local leg's
    size_t retries;
  };
  // Every op so far, in order (statistics, listings).
  void VisitOps(const std::function<void(const OpView& op)>& visit) const;
  // The peers of the ops, each once, in order of first use.
  const std::vector<std::string>& peers() const { return peers_; }
  ferry::v1::TransferProgress Progress(uint64_t* version) const;

 private:
  // What becomes of one op, kept small (72 bytes): the result message is built only when
  // asked for (Result with include_ops), since most callers never ask for 4096 of them, and
  // a finished transfer stays in the history. Its bytes are its length once it succeeded;
  // what few ops have (an error message, retried slices) is kept beside, by index.
  struct OpState {
    bool settled = false;
    uint8_t provider = 0;      // index in providers_
    int32_t code = 0;
    int64_t posted_us = -1;    // since start_; -1 until posted
    uint64_t duration_us = 0;
    Legs legs;                 // null until planned
    Names ours, theirs;        // rails of the local and remote leg; null until known
  };
  static_assert(sizeof(OpState) <= 72, "a transfer of 4096 ops keeps 4096 of these");
  uint64_t BytesLocked(size_t index) const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return states_[index].settled && states_[index].code == 0 ? lengths_[index] : 0;
  }
  uint8_t ProviderIndexLocked(const std::string& provider) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool SettleLocked(size_t index, const absl::Status& status, const std::string& provider,
                    absl::Time now = absl::Now()) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ferry::v1::OpResult ResultOfLocked(size_t index) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  bool DoneLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return settled_ == lengths_.size() && !check_pending_;
  }
  // Fails op `index`, which had settled OK (EndCheck).
  void FailSettledLocked(size_t index, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NoteErrorLocked(size_t index, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `names` as a shared list, the one the previous op stored when equal (ops of a batch
  // mostly take the same rails).
  Names Intern(std::vector<std::string> names, Names& last) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t id_;
  const int64_t owner_uid_;
  const std::vector<uint64_t> lengths_;  // of each op, for the result after ops_ is gone
  std::vector<std::string> peers_;        // each peer once
  std::vector<uint32_t> op_peer_;         // op -> index in peers_
  std::vector<bool> op_read_;
  const absl::Time start_;
  const absl::Time deadline_;
  const std::shared_ptr<const PolicySnapshot> policy_;
  uint64_t bytes_total_ = 0;

  mutable absl::Mutex mu_;
  PlannedOps ops_ ABSL_GUARDED_BY(mu_);
  std::vector<OpState> states_ ABSL_GUARDED_BY(mu_);
  size_t failed_ ABSL_GUARDED_BY(mu_) = 0;
  size_t settled_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_done_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  absl::Time end_ ABSL_GUARDED_BY(mu_);
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  bool check_pending_ ABSL_GUARDED_BY(mu_) = false;
  Names last_ours_ ABSL_GUARDED_BY(mu_), last_theirs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> providers_ ABSL_GUARDED_BY(mu_) = {""};  // each once
  absl::flat_hash_map<size_t, std::string> messages_ ABSL_GUARDED_BY(mu_);  // failed ops'
  absl::flat_hash_map<size_t, std::vector<std::string>> retries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry::server
