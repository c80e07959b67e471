#include "transport/tcp/tcp_connection.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "transport/tcp/socket.h"

namespace ferry::tcp {
namespace {

// Several queued requests leave in one sendmsg: headers and payloads interleaved, the
// payloads still straight from their regions.
constexpr size_t kMaxBatch = 32;
constexpr uint64_t kMaxBatchBytes = 1 << 20;
// The largest request a posting thread sends itself when the connection is idle
// (SendNowLocked): a small op's latency without the hop to the loop.
constexpr uint64_t kSendNowBytes = 64 << 10;

bool WouldBlock(int err) { return err == EAGAIN || err == EWOULDBLOCK; }

}  // namespace

absl::StatusOr<std::shared_ptr<TcpConnection>> TcpConnection::Start(UniqueFd fd, std::string peer,
                                                                    EventLoop* loop) {
  absl::Status nonblocking = SetNonBlocking(fd.get());
  if (!nonblocking.ok()) return nonblocking;
  std::shared_ptr<TcpConnection> conn(new TcpConnection(std::move(fd), std::move(peer), loop));
  // Registration happens on the loop thread, which owns the loop's table; requests queued
  // meanwhile are sent by a Pump posted after this task.
  bool posted = loop->Post([conn] {
    Finished finished;
    {
      absl::MutexLock lock(&conn->mu_);
      if (conn->failed_) return;
      auto token = conn->loop_->Add(conn->fd_.get(), EPOLLIN, conn);
      if (token.ok()) {
        conn->token_ = *token;
      } else {
        conn->FailLocked(absl::UnavailableError(absl::StrCat("tcp: connection to ", conn->peer_,
                                                             ": ", token.status().message())),
                         finished);
        if (!finished.empty()) ++conn->delivering_;
      }
    }
    conn->Deliver(finished);
  });
  if (!posted) return absl::UnavailableError("tcp: the fabric's event loops have stopped");
  return conn;
}

TcpConnection::TcpConnection(UniqueFd fd, std::string peer, EventLoop* loop)
    : peer_(std::move(peer)), loop_(loop), fd_(std::move(fd)) {
  // Never grows past kMaxBatch, so the iovecs pointing into it stay valid.
  headers_.reserve(kMaxBatch);
}

TcpConnection::~TcpConnection() {
  Finished finished;
  {
    absl::MutexLock lock(&mu_);
    FailLocked(absl::UnavailableError(absl::StrCat("tcp: connection to ", peer_, " closed")),
               finished);
  }
  for (auto& [done, status] : finished) std::move(done)(std::move(status));
}

bool TcpConnection::failed() const {
  absl::MutexLock lock(&mu_);
  return failed_;
}

absl::Status TcpConnection::failure() const {
  absl::MutexLock lock(&mu_);
  return failure_;
}

uint64_t TcpConnection::ops_queued() const {
  absl::MutexLock lock(&mu_);
  return ops_queued_;
}

absl::Status TcpConnection::Enqueue(Request request) {
  absl::MutexLock lock(&mu_);
  if (failed_) {
    return absl::UnavailableError(absl::StrCat("tcp: connection to ", peer_, " is broken"));
  }
  load_bytes_.fetch_add(request.header.length, std::memory_order_relaxed);
  ++ops_queued_;
  queue_.push_back(std::move(request));
  if (sending_) return absl::OkStatus();
  sending_ = true;
  // Nothing is being sent: this thread sends now, without waking the loop (a lone op's
  // latency). What the socket does not take, or an error, is left to the loop.
  if (SendNowLocked()) return absl::OkStatus();
  if (!loop_->Post([self = shared_from_this()] { self->OnEvents(EPOLLOUT); })) {
    // Sent in part already (outstanding, not queued): it fails when the endpoint closes,
    // as every outstanding op does.
    if (queue_.empty()) return absl::OkStatus();
    load_bytes_.fetch_sub(queue_.back().header.length, std::memory_order_relaxed);
    queue_.pop_back();
    sending_ = false;
    return absl::UnavailableError("tcp: the fabric's event loops have stopped");
  }
  return absl::OkStatus();
}

void TcpConnection::Close(const absl::Status& why) {
  auto delivered = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return delivering_ == 0; };
  {
    // Failed already: every op went to whoever failed it, counted in delivering_. Nothing is
    // posted, so a closed endpoint may be dropped after its fabric (and its loops) are gone.
    absl::MutexLock lock(&mu_);
    if (failed_) {
      if (EventLoop::Current() == nullptr) mu_.Await(absl::Condition(&delivered));
      return;
    }
  }
  if (EventLoop::Current() != nullptr) {
    // A loop thread (a completion closing its endpoint) must not wait for a loop: fail here.
    Fail(why);
    return;
  }
  // Completions run on the loop, between its rounds of I/O on this connection.
  absl::Notification failed;
  if (loop_->Post([self = shared_from_this(), &why, &failed] {
        self->Fail(why);
        failed.Notify();
      })) {
    failed.WaitForNotification();
  } else {
    Fail(why);
  }
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&delivered));
}

void TcpConnection::Fail(const absl::Status& why) {
  Finished finished;
  {
    absl::MutexLock lock(&mu_);
    FailLocked(why, finished);
    if (!finished.empty()) ++delivering_;
  }
  Deliver(finished);
}

void TcpConnection::FailLocked(const absl::Status& why, Finished& finished) {
  if (failed_) return;
  failed_ = true;
  failure_ = why;
  // The peer sees the end at once; the fd itself closes once the loop forgot it.
  if (fd_.valid()) shutdown(fd_.get(), SHUT_RDWR);
  for (auto& r : queue_) finished.emplace_back(std::move(r.done), why);
  for (auto& r : outstanding_) finished.emplace_back(std::move(r.done), why);
  queue_.clear();
  outstanding_.clear();
  load_bytes_.store(0, std::memory_order_relaxed);
  headers_.clear();
  wire_.Clear();
  have_ = 0;
  read_into_ = nullptr;
  read_left_ = 0;
  read_faulted_ = false;
  one_at_a_time_ = false;
  // Not from the destructor: then the loop holds no reference, so it no longer watches us.
  if (auto self = weak_from_this().lock()) {
    loop_->Post([self] {
      absl::MutexLock lock(&self->mu_);
      if (self->token_) self->loop_->Remove(*self->token_);
      self->token_.reset();
      self->fd_.Reset();
    });
  }
}

void TcpConnection::Deliver(Finished& finished) {
  if (finished.empty()) return;
  for (auto& [done, status] : finished) std::move(done)(std::move(status));
  absl::MutexLock lock(&mu_);
  --delivering_;
}

void TcpConnection::OnEvents(uint32_t events) {
  Finished finished;
  {
    absl::MutexLock lock(&mu_);
    if (failed_) return;
    if (events & (EPOLLIN | EPOLLERR | EPOLLHUP)) ReceiveLocked(finished);
    if ((events & EPOLLOUT) && !failed_) SendLocked(finished);
    if (!finished.empty()) ++delivering_;
  }
  Deliver(finished);
}

void TcpConnection::SetWantOutLocked(bool want) {
  if (want == want_out_ || !token_) return;
  const uint32_t events = want ? (EPOLLIN | EPOLLOUT) : EPOLLIN;
  absl::Status s = loop_->Modify(*token_, events);
  if (s.ok()) want_out_ = want;
}

void TcpConnection::TakeBatchLocked() {
  // wire_ is done: no iovec points into headers_ any more.
  headers_.clear();
  wire_.Clear();
  one_at_a_time_ = false;  // a fault isolated in the last batch stays there
  uint64_t bytes = 0;
  while (!queue_.empty() && headers_.size() < kMaxBatch && bytes < kMaxBatchBytes) {
    Request request = std::move(queue_.front());
    queue_.pop_front();
    request.header.id = next_id_++;
    headers_.push_back(request.header);
    wire_.Add(&headers_.back(), sizeof(RequestHeader));
    if (request.pieces) {
      PieceList& list = *request.pieces;
      wire_.Add(list.table.data(), list.table.size() * sizeof(WirePiece));
      for (size_t i = 0; i < list.table.size(); ++i) wire_.Add(list.from[i], list.table[i].length);
      bytes += request.header.length;
    } else if (request.header.op != WireOp::kRead && request.header.length > 0) {
      wire_.Add(request.local, request.header.length);
      bytes += request.header.length;
    }
    // Outstanding before the bytes leave, so the answer always finds it.
    outstanding_.push_back(std::move(request));
  }
}

bool TcpConnection::SendNowLocked() {
  // Only a lone small request: large ones are copied into the socket by the loops, several
  // connections in parallel, not by the posting thread one after the other.
  if (!wire_.done() || !fd_.valid() || queue_.size() != 1 ||
      queue_.front().header.length > kSendNowBytes) {
    return false;
  }
  TakeBatchLocked();
  // Full, or broken: the loop sends the rest, or fails the ops.
  if (SendWireLocked() < 0 || !wire_.done()) return false;
  sending_ = false;
  return true;
}

ssize_t TcpConnection::SendWireLocked() {
  msghdr msg = {};
  msg.msg_iov = wire_.next();
  msg.msg_iovlen = one_at_a_time_ ? 1 : wire_.next_count();
  ssize_t n;
  do {
    n = sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n > 0) wire_.Consume(static_cast<size_t>(n));
  return n;
}

void TcpConnection::SendLocked(Finished& finished) {
  uint64_t sent = 0;
  while (!failed_) {
    if (sent >= kLoopRoundBytes) {
      SetWantOutLocked(true);
      return;
    }
    if (wire_.done()) {
      TakeBatchLocked();
      if (wire_.empty()) {
        sending_ = false;
        SetWantOutLocked(false);
        return;
      }
    }
    const ssize_t n = SendWireLocked();
    if (n < 0) {
      if (WouldBlock(errno)) {
        SetWantOutLocked(true);  // the rest when the socket has room
        return;
      }
      if (errno == EFAULT) {
        // The kernel copies a send's iovecs in chunks and takes none of a chunk that faults,
        // so a fault in several iovecs names none of them (the first may be another client's
        // good payload): the next sends go one iovec at a time, and the one that faults alone
        // is the payload whose memory went, padded.
        if (!one_at_a_time_) {
          one_at_a_time_ = true;
          continue;
        }
        if (PadFaultedLocked()) continue;
      }
      FailLocked(absl::UnavailableError(absl::StrCat("tcp: send to ", peer_, ": ",
                                                     SocketError(errno, "sendmsg()").message())),
                 finished);
      return;
    }
    sent += static_cast<uint64_t>(n);
  }
}

void TcpConnection::ReceiveLocked(Finished& finished) {
  char* buf = reinterpret_cast<char*>(acks_.data());
  uint64_t received = 0;
  while (!failed_ && received < kLoopRoundBytes) {
    ssize_t n;
    if (read_left_ > 0 && read_faulted_) {
      n = recv(fd_.get(), sink_.data(), std::min<uint64_t>(read_left_, sink_.size()),
               MSG_DONTWAIT);
    } else if (read_left_ > 0) {
      // READ payload goes straight into the destination region.
      n = recv(fd_.get(), read_into_, read_left_, MSG_DONTWAIT);
    } else {
      // The target answers in request order, so the kind of each coming answer is known:
      // read at most the WRITE acks known to be next, never into a READ's payload.
      size_t writes_ahead = 0;
      for (const Request& r : outstanding_) {
        if (r.header.op == WireOp::kRead || writes_ahead == kMaxAcks) break;
        ++writes_ahead;
      }
      size_t want = std::max<size_t>(writes_ahead, 1) * sizeof(ResponseHeader);
      n = recv(fd_.get(), buf + have_, want - have_, MSG_DONTWAIT);
    }
    if (n == 0) {
      FailLocked(absl::UnavailableError(
                     absl::StrCat("tcp: connection to ", peer_, ": recv(): closed by peer")),
                 finished);
      return;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (WouldBlock(errno)) return;
      if (errno == EFAULT && read_left_ > 0 && !read_faulted_) {
        // The destination went away (a client's file shrank): this READ fails, the rest of
        // its payload is drained, the connection goes on. recv took none of those bytes.
        read_faulted_ = true;
        if (sink_.empty()) sink_.resize(64 << 10);
        continue;
      }
      FailLocked(absl::UnavailableError(absl::StrCat("tcp: connection to ", peer_, ": ",
                                                     SocketError(errno, "recv()").message())),
                 finished);
      return;
    }
    received += static_cast<uint64_t>(n);
    if (read_left_ > 0) {
      if (!read_faulted_) read_into_ += n;
      read_left_ -= static_cast<uint64_t>(n);
      if (read_left_ == 0) {
        absl::Status landed = absl::OkStatus();
        if (read_faulted_) landed = LocalFault(outstanding_.front().header);
        read_faulted_ = false;
        finished.emplace_back(PopOutstandingLocked(), std::move(landed));
      }
      continue;
    }
    have_ += static_cast<size_t>(n);
    size_t complete = have_ / sizeof(ResponseHeader);
    for (size_t i = 0; i < complete; ++i) {
      absl::Status s = AnswerLocked(acks_[i], finished);
      if (s.ok() && read_left_ > 0 && i + 1 < complete) {
        s = absl::DataLossError("answers after a READ header arrived with it");
      }
      if (!s.ok()) {
        FailLocked(
            absl::UnavailableError(absl::StrCat("tcp: connection to ", peer_, ": ", s.message())),
            finished);
        return;
      }
    }
    // Keep a partial header for the next round.
    size_t rest = have_ - complete * sizeof(ResponseHeader);
    std::memmove(buf, buf + complete * sizeof(ResponseHeader), rest);
    have_ = rest;
  }
}

absl::Status TcpConnection::AnswerLocked(const ResponseHeader& resp, Finished& finished) {
  if (resp.magic != kResponseMagic) return absl::DataLossError("bad response header");
  if (resp.id == 0 && resp.refusal == Refusal::kBusy) {
    return absl::ResourceExhaustedError(
        "the peer refused this connection: it has as many connections from this node as "
        "its limits.tcp_max_connections_per_peer allows");
  }
  if (outstanding_.empty() || outstanding_.front().header.id != resp.id) {
    return absl::DataLossError(absl::StrCat("answer for unexpected request ", resp.id));
  }
  Request& front = outstanding_.front();
  if (resp.refusal == Refusal::kFault) {
    // The target's memory went away under this op; the connection goes on (wire.h).
    finished.emplace_back(PopOutstandingLocked(), Refused(resp.refusal, front.header));
    return absl::OkStatus();
  }
  if (resp.refusal != Refusal::kNone) {
    absl::Status refused = Refused(resp.refusal, front.header);
    finished.emplace_back(PopOutstandingLocked(), std::move(refused));
    // The target ends the connection after a refusal (wire.h), as an RC QP enters the error
    // state after IBV_WC_REM_ACCESS_ERR and flushes the work requests behind it: the ops
    // behind this one fail UNAVAILABLE, and the endpoint's owner connects again.
    return absl::AbortedError("the peer refused an op and ends the connection");
  }
  if (front.header.op == WireOp::kRead) {
    // Exactly what was asked: more would run past the destination slice.
    if (resp.length != front.header.length) {
      return absl::DataLossError(absl::StrCat("READ answer of ", resp.length, " bytes for ",
                                              front.header.length, " asked"));
    }
    if (resp.length > 0) {
      read_into_ = front.local;
      read_left_ = resp.length;
      return absl::OkStatus();  // completes once its payload is in
    }
  }
  absl::Status landed = front.faulted ? LocalFault(front.header) : absl::OkStatus();
  finished.emplace_back(PopOutstandingLocked(), std::move(landed));
  return absl::OkStatus();
}

bool TcpConnection::PadFaultedLocked() {
  // As large as any piece needs (fewer iovecs): what a faulted payload is sent as.
  static const char kZeros[64 << 10] = {};
  const char* at = static_cast<const char*>(wire_.next()->iov_base);
  auto inside = [at](const char* from, uint64_t length) {
    return at >= from && at < from + length;
  };
  for (Request& r : outstanding_) {
    bool holds = false;
    if (r.pieces) {
      for (size_t i = 0; i < r.pieces->table.size() && !holds; ++i) {
        holds = inside(r.pieces->from[i], r.pieces->table[i].length);
      }
    } else if (r.header.op != WireOp::kRead) {
      holds = inside(r.local, r.header.length);
    }
    if (!holds) continue;
    r.faulted = true;
    wire_.ZeroNext(kZeros, sizeof(kZeros));
    return true;
  }
  return false;
}

absl::Status TcpConnection::LocalFault(const RequestHeader& h) const {
  return absl::DataLossError(absl::StrFormat(
      "%s of %d bytes on %s: the local memory could not be %s (EFAULT: a client's file shrank "
      "under the op?); the op failed, the connection goes on",
      h.op == WireOp::kRead ? "READ" : "WRITE", h.length, peer_,
      h.op == WireOp::kRead ? "written" : "read"));
}

fabric::Completion TcpConnection::PopOutstandingLocked() {
  Request& front = outstanding_.front();
  load_bytes_.fetch_sub(front.header.length, std::memory_order_relaxed);
  fabric::Completion done = std::move(front.done);
  outstanding_.pop_front();
  return done;
}

absl::Status TcpConnection::Refused(Refusal refusal, const RequestHeader& h) const {
  std::string what =
      absl::StrFormat("%s of %d bytes at 0x%x key 0x%x on %s",
                      h.op == WireOp::kRead ? "READ" : "WRITE", h.length, h.address, h.key, peer_);
  switch (refusal) {
    case Refusal::kRefused:
      // The target does not say which (so that answers do not reveal which keys exist); its
      // own log and ListenerStats do.
      return absl::PermissionDeniedError(
          absl::StrCat("remote access refused: key, bounds or access rights: ", what));
    case Refusal::kBadOp:
      return absl::InternalError(absl::StrCat("peer does not know the op: ", what));
    case Refusal::kFault:
      return absl::DataLossError(absl::StrCat(
          "the target's memory went away under the op (a client's file shrank?): ", what));
    default:
      return absl::InternalError(absl::StrCat("peer refused the op: ", what));
  }
}

}  // namespace ferry::tcp
