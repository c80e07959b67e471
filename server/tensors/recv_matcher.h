#pragma once
// The receiving agent's half of two-sided Send/Recv: receives posted by local clients and
// send offers made by peers' agents, matched by (peer, tag) whichever arrives first.
//
// A match picks the landing buffer (the receive's own, or one allocated here) and hands its
// name to the sender's agent, which WRITEs straight into it and then reports Complete. Until
// then the landing buffer is pinned by this matcher, so a receiver that gives up (deadline,
// cancel) while the sender is writing never frees memory under an incoming WRITE: the
// buffer is released when the sender completes, withdraws, or its deadline passes.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ferry/v1/tensor.pb.h"
#include "server/buffers/buffer_registry.h"

namespace ferry::server {

// True when the caller gave up (its client hung up, or an explicit Cancel).
using CancelledFn = std::function<bool()>;

// Where a matched send lands on this node.
struct Landing {
  std::string buffer_name;  // empty for a zero-byte tensor: nothing to write
  uint64_t offset = 0;
};

// What a completed receive hands the client.
struct RecvOutcome {
  ferry::v1::TensorMeta meta;
  std::shared_ptr<Buffer> buffer;  // null for a zero-byte tensor received without a buffer
  uint64_t offset = 0;
  uint64_t bytes = 0;
  bool allocated = false;
};

struct RecvSpec {
  std::string peer;
  std::string tag;
  std::shared_ptr<Buffer> buffer;  // null: allocate at match time, once the size is known
  uint64_t offset = 0;
  ferry::v1::TensorMeta expect;
  // The local uid that posted it (-1: not known): only it, root or the admin group cancel or
  // list it (server/local/call_rules.h).
  int64_t owner_uid = -1;
};

class RecvMatcher {
 public:
  struct Recv;
  struct PendingOffer;
  using Ticket = std::shared_ptr<Recv>;

  // `node` is this agent's name (for messages).
  RecvMatcher(std::string node, BufferRegistry* buffers);
  ~RecvMatcher();

  // --- local receives ---
  // Posts a receive; it may match a waiting offer at once. ALREADY_EXISTS when a receive
  // for (peer, tag) is already pending.
  absl::StatusOr<Ticket> Post(RecvSpec spec);
  // Waits until the receive completes or fails. At `deadline` or when `cancelled()` turns
  // true the receive is cancelled: a waiting one is dropped, a matched one is abandoned
  // (its sender learns at Complete), and the status says which.
  absl::StatusOr<RecvOutcome> Await(const Ticket& ticket, absl::Time deadline,
                                    const CancelledFn& cancelled);
  // Cancels the pending receive for (peer, tag) when `taker` may (its owner_uid, or -1 for
  // every one); returns how many (0 or 1), and in `others` whether one of another uid was left.
  int CancelRecv(const std::string& peer, const std::string& tag, int64_t taker = -1,
                 bool* others = nullptr);

  // --- offers from peers' agents (TensorPeer) ---
  // Registers (or re-asks about) offer `send_id` and waits until `wait_until` for a match.
  // nullopt: still waiting. Errors: ALREADY_EXISTS (another send of that tag is in flight),
  // the match's validation error (the receive fails with it too), CANCELLED (withdrawn).
  absl::StatusOr<std::optional<Landing>> Offer(const std::string& from_node, uint64_t send_id,
                                               const ferry::v1::TensorMeta& meta, uint64_t bytes,
                                               absl::Time sender_deadline, absl::Time wait_until);
  // The sender's WRITE ended with `status`. CANCELLED when the receiver gave up meanwhile.
  absl::Status Complete(const std::string& from_node, uint64_t send_id, const absl::Status& status);
  // The sender gave up; a matched receive fails with CANCELLED and `reason`.
  void Withdraw(const std::string& from_node, uint64_t send_id, const std::string& reason);

  // The pending receives and arrived offers; of `taker`'s receives only (-1: all).
  void List(ferry::v1::ListPendingResponse* out, int64_t taker = -1) const;

 private:
  using Key = std::pair<std::string, std::string>;  // (node, tag)
  using OfferKey = std::pair<std::string, uint64_t>;  // (from node, send id)

  absl::Status MatchLocked(PendingOffer& offer, Recv& recv) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends `recv` with `status`, unpins (and frees, if allocated here) a landing buffer that
  // the client will not get.
  void FinishLocked(Recv& recv, const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseOfferLocked(const OfferKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReapLoop();

  const std::string node_;
  BufferRegistry* const buffers_;

  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  uint64_t next_recv_id_ ABSL_GUARDED_BY(mu_) = 1;
  // Receives posted and not yet done, by (peer, tag).
  std::map<Key, Ticket> recvs_ ABSL_GUARDED_BY(mu_);
  // Offers until Complete / Withdraw / expiry, by (from, send id) and by (from, tag).
  std::map<OfferKey, std::shared_ptr<PendingOffer>> offers_ ABSL_GUARDED_BY(mu_);
  std::map<Key, uint64_t> offer_by_tag_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reaper_;
};

}  // namespace ferry::server
