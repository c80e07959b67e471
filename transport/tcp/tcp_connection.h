#pragma once
// One TCP connection of an endpoint, driven by one of the fabric's outgoing event loops: a
// queue of requests, the ops awaiting their answer, and the state of a send or a READ
// payload that spans several wakeups. No thread of its own.

#include <sys/uio.h>

#include <array>
#include <atomic>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "base/unique_fd.h"
#include "transport/fabric.h"
#include "transport/tcp/event_loop.h"
#include "transport/tcp/iov_cursor.h"
#include "transport/tcp/wire.h"

namespace ferry::tcp {

class TcpConnection : public EventLoop::Handler,
                      public std::enable_shared_from_this<TcpConnection> {
 public:
  // A kWriteList's frame table and where each piece's bytes are; held by its request until
  // the answer, so the iovecs of a send in progress stay valid.
  struct PieceList {
    std::vector<WirePiece> table;
    std::vector<char*> from;  // by piece
  };
  struct Request {
    RequestHeader header;
    char* local;  // source (WRITE) or destination (READ) bytes; unused by a kWriteList
    fabric::Completion done;
    std::unique_ptr<PieceList> pieces;  // a kWriteList's
    // Its source could not be read (EFAULT): zeros went in its place, and it fails.
    bool faulted = false;
  };

  // Takes a connected socket that has sent its hello and serves it on `loop`.
  static absl::StatusOr<std::shared_ptr<TcpConnection>> Start(UniqueFd fd, std::string peer,
                                                              EventLoop* loop);
  // Close() must have run (TcpEndpoint does it); fails whatever is left, on this thread.
  ~TcpConnection() override;

  // Any thread. Queues a request; UNAVAILABLE (and `request.done` is not run) once the
  // connection failed.
  absl::Status Enqueue(Request request);
  // Any thread. Fails every queued and outstanding request with `why` and closes the socket.
  // Idempotent. The completions run on a loop thread: this connection's loop, or the calling
  // thread when that is a loop thread (a completion), since a loop must never wait for
  // another. Off the loops it returns after every completion of this connection has run; on
  // a loop thread after those it failed (another loop may still be finishing a completion of
  // an op that succeeded just before).
  void Close(const absl::Status& why);
  bool failed() const;
  // Why it failed (OK while it has not): the endpoint's errors name the cause.
  absl::Status failure() const;
  // Any thread: payload bytes of the requests queued or awaiting their answer (read without
  // the lock: a hint that may be a moment old).
  uint64_t load_bytes() const { return load_bytes_.load(std::memory_order_relaxed); }
  // Any thread: requests ever queued here (tests: which socket an op took).
  uint64_t ops_queued() const;

  void OnEvents(uint32_t events) override;

 private:
  using Finished = std::vector<std::pair<fabric::Completion, absl::Status>>;

  TcpConnection(UniqueFd fd, std::string peer, EventLoop* loop);
  // Fails now, on the calling thread. mu_ is held by the loop while it moves bytes, so no
  // syscall is reading or writing a request's memory when its completion runs.
  void Fail(const absl::Status& why);
  void FailLocked(const absl::Status& why, Finished& finished) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Loop thread: sends queued requests until the socket is full, the queue is empty or this
  // round's share is spent.
  void SendLocked(Finished& finished) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Any thread, when nothing is being sent and one small request waits: sends it now,
  // without a hop to the loop. True when all of it went (sending_ is false again); false
  // leaves it (or the rest of it) to the loop, which must then be woken.
  bool SendNowLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One sendmsg of what wire_ holds (retried on EINTR), consumed from wire_: the bytes sent,
  // or -1 with errno set.
  ssize_t SendWireLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the next batch of queued requests into wire_ (the loop, or SendNowLocked).
  void TakeBatchLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Loop thread: reads answers (and READ payloads) until the socket is empty or this round's
  // share is spent.
  void ReceiveLocked(Finished& finished) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Completes the oldest outstanding request with its answer, or starts reading its READ
  // payload. Errors mean the stream is unusable.
  absl::Status AnswerLocked(const ResponseHeader& resp, Finished& finished)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetWantOutLocked(bool want) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Refused(Refusal refusal, const RequestHeader& header) const;
  // Runs completions gathered under mu_, after it is released.
  void Deliver(Finished& finished);

  // Takes the oldest outstanding request off, and its bytes off the load: its completion.
  fabric::Completion PopOutstandingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A sendmsg of one iovec failed EFAULT (one_at_a_time_): that iovec is a request's payload
  // whose memory went away; its rest goes as zeros and the request fails once answered.
  // False when it is no payload (the connection then fails).
  bool PadFaultedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The DATA_LOSS a request whose local memory went away fails with.
  absl::Status LocalFault(const RequestHeader& h) const;

  const std::string peer_;
  EventLoop* const loop_;
  std::atomic<uint64_t> load_bytes_{0};

  mutable absl::Mutex mu_;
  UniqueFd fd_ ABSL_GUARDED_BY(mu_);
  std::optional<uint64_t> token_ ABSL_GUARDED_BY(mu_);  // registered with loop_
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  int delivering_ ABSL_GUARDED_BY(mu_) = 0;  // rounds running completions now
  std::deque<Request> queue_ ABSL_GUARDED_BY(mu_);
  // Sent (or being sent) and not yet answered, in id order: the target answers in that order.
  std::deque<Request> outstanding_ ABSL_GUARDED_BY(mu_);
  // A Pump task is posted or EPOLLOUT is armed: the loop will send what is queued.
  bool sending_ ABSL_GUARDED_BY(mu_) = false;
  bool want_out_ ABSL_GUARDED_BY(mu_) = false;  // EPOLLOUT armed
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t ops_queued_ ABSL_GUARDED_BY(mu_) = 0;

  // The batch being sent: headers, and iovecs of header i then payload i (straight from the
  // region; a kWriteList's frame table, then its pieces), consumed as sendmsg takes them.
  std::vector<RequestHeader> headers_ ABSL_GUARDED_BY(mu_);
  IovCursor wire_ ABSL_GUARDED_BY(mu_);

  // Answers being received: a run of WRITE acks in one recv; a READ answer's payload goes
  // straight into outstanding_.front()'s destination (never through this buffer).
  static constexpr size_t kMaxAcks = 64;
  std::array<ResponseHeader, kMaxAcks> acks_ ABSL_GUARDED_BY(mu_);
  size_t have_ ABSL_GUARDED_BY(mu_) = 0;  // bytes of acks_ received
  char* read_into_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint64_t read_left_ ABSL_GUARDED_BY(mu_) = 0;  // READ payload bytes still to come
  // The READ's destination went away (recv EFAULT): the rest of its payload is drained into
  // sink_, and it fails.
  bool read_faulted_ ABSL_GUARDED_BY(mu_) = false;
  // A send failed EFAULT: iovecs go one per sendmsg until the faulting payload is found.
  bool one_at_a_time_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<char> sink_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry::tcp
