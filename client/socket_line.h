// A client's small transfers and block moves over the agent's transfer socket
// (server/api/transfer_socket.h): TransferStream's messages in frames on a Unix socket, without
// gRPC, for a client on the agent's node. What TransferLine does over a gRPC call, with the
// same Outcome: a lone transfer costs a write, the agent's work and a read, with no thread
// of the client's or of gRPC's between them.
//
// No thread of its own: callers take turns reading the socket (one reads while the others
// wait for it to hand them their answer or the turn), as on a TransferLine.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/unique_fd.h"
#include "client/ferry_client.h"
#include "client/transfer_line.h"
#include "ferry/v1/transfer_socket.pb.h"

namespace ferry {

// A connection to the transfer socket at `path` (GetInfo.transfer_socket), non-blocking,
// its hello ("ferryxf2") sent and accepted. Else the agent's refusal (RESOURCE_EXHAUSTED:
// past its connection limits), DEADLINE_EXCEEDED when it did not answer within 2 s, or the
// call that failed and errno.
absl::StatusOr<UniqueFd> ConnectTransferSocket(const std::string& path);

class SocketLine {
 public:
  // Connects to the transfer socket at `path` (GetInfo.transfer_socket) and says hello.
  // Errors name the call and errno.
  static absl::StatusOr<std::unique_ptr<SocketLine>> Connect(const std::string& path);
  // Closes the connection; transfers still running end as they would. No Run may be running.
  ~SocketLine() = default;

  using Outcome = TransferLine::Outcome;
  // Any thread: sends the transfer and waits for its answer, at most `wait`. `sent` is false
  // when the request did not go whole (the agent cannot have started it). Calls from
  // several threads run at once.
  Outcome Run(const std::vector<OpSpec>& ops, absl::Duration timeout, bool include_ops,
              absl::Duration wait);
  // Any thread: a block move (Tensors.MoveBlocks with `wait`, client/block_client.h) in
  // session `session` (the client's: the agent checks it is this process's uid's), answered
  // once it ended, as Run is; `move.wait` is not read.
  Outcome Move(uint64_t session, const ferry::v1::MoveBlocksRequest& move, absl::Duration wait);
  // Any thread: Tensors.PollNotifications (to an agent whose GetInfo says
  // transfer_socket_polls), answered at once by the agent; `sent` as Outcome's. A poll sent and
  // not answered within `wait` may have taken notifications that are then lost: ask it with
  // a `wait` far above a round trip.
  struct Polled {
    absl::StatusOr<ferry::v1::PollNotificationsResponse> notifications;
    bool sent = false;
  };
  Polled Poll(const ferry::v1::PollNotificationsRequest& poll, absl::Duration wait);
  // Whether the connection has ended (the agent closed it, or it broke).
  bool ended() const;

 private:
  // A waiting caller's answer, filled in by whoever reads it: OK answers whole, a refusal
  // or the connection's end as a status.
  using Answer = std::optional<absl::StatusOr<ferry::v1::SocketAnswer>>;
  struct Exchanged {
    absl::StatusOr<ferry::v1::SocketAnswer> answer;
    bool sent = false;
  };
  explicit SocketLine(UniqueFd fd) : fd_(std::move(fd)) {}

  // Sends `request` (its tag set here) and waits for its answer, at most `wait` (what that
  // is, `wait_is`, for the message when none came).
  Exchanged Exchange(ferry::v1::SocketRequest& request, absl::Duration wait,
                     absl::string_view wait_is);
  // A transfer's or a move's answer as Run returns it.
  static Outcome TransferOutcome(Exchanged exchanged);
  // Writes `frame` whole by `deadline`; how many bytes went, and why not all.
  absl::Status WriteFrame(const std::string& frame, absl::Time deadline, size_t* written);
  // Reads what comes by `deadline` and hands out the answers in it; false at the deadline.
  bool ReadLocked(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Answers the waiters of the whole frames read so far.
  void DeliverLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The connection is over: every waiter left gets `why`, and no Run sends again.
  void EndLocked(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const UniqueFd fd_;
  absl::Mutex write_mu_;  // frames go whole, one at a time

  mutable absl::Mutex mu_;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;  // a caller is reading the socket
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_tag_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, Answer*> waiters_ ABSL_GUARDED_BY(mu_);
  // What was read and not yet delivered: in_[in_begin_, in_end_). The reading caller fills
  // it outside mu_ (only one reads at a time) and delivers it under mu_.
  std::vector<char> in_ ABSL_GUARDED_BY(mu_);
  size_t in_begin_ ABSL_GUARDED_BY(mu_) = 0;
  size_t in_end_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ferry
