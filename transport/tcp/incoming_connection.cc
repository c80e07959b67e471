#include "transport/tcp/incoming_connection.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/fault_guard.h"
#include "spdlog/spdlog.h"
#include "transport/fabric.h"

namespace ferry::tcp {
namespace {

constexpr size_t kSinkBytes = 64 << 10;
// After a refusal: how long the peer has to read it and close before we close anyway.
constexpr absl::Duration kDiscardTimeout = absl::Seconds(2);

bool WouldBlock(int err) { return err == EAGAIN || err == EWOULDBLOCK; }

uint32_t NeededAccess(WireOp op) {
  return op == WireOp::kRead ? fabric::kRemoteRead : fabric::kRemoteWrite;
}

// A flood of bad connections or requests is logged now and then, not once per frame.
bool LogThis(uint64_t count) { return count % 1000 == 1; }

const char* RefusedHelloReason(SessionSecrets::Refused why) {
  switch (why) {
    case SessionSecrets::Refused::kUnknown:
      return "an unknown or spent session";
    case SessionSecrets::Refused::kWrongSecret:
      return "a wrong secret";
    case SessionSecrets::Refused::kExpired:
      return "an expired session";
  }
  return "?";
}

const char* RegionCheckReason(RegionCheck check) {
  switch (check) {
    case RegionCheck::kOk:
      return "ok";
    case RegionCheck::kUnknownKey:
      return "unknown or revoked key";
    case RegionCheck::kOutOfBounds:
      return "range outside the region";
    case RegionCheck::kAccess:
      return "access the region does not give";
    case RegionCheck::kPeer:
      return "region not exported to this peer";
    case RegionCheck::kFaulted:
      return "the region's memory went away under an earlier op";
  }
  return "?";
}

}  // namespace

IncomingConnection::IncomingConnection(UniqueFd fd, std::string source, EventLoop* loop,
                                       Target target)
    : fd_(std::move(fd)), source_(std::move(source)), loop_(loop), target_(std::move(target)) {
  acks_.reserve(kMaxCoalescedAcks + 1);
}

void IncomingConnection::Start(absl::Duration handshake) {
  if (phase_ == Phase::kClosed) return;
  auto token = loop_->Add(fd_.get(), EPOLLIN, shared_from_this());
  if (!token.ok()) {
    spdlog::warn("tcp: cannot serve a connection from {}: {}", source_, token.status().ToString());
    Close();
    return;
  }
  token_ = *token;
  interest_ = EPOLLIN;
  // A timer in the loop, not SO_RCVTIMEO: the socket is non-blocking and shares the thread.
  loop_->RunAfter(handshake, [weak = weak_from_this(), handshake] {
    auto self = weak.lock();
    if (self == nullptr || self->phase_ != Phase::kHello) return;
    uint64_t count = self->target_.admission->unauthenticated.fetch_add(1) + 1;
    if (LogThis(count)) {
      spdlog::warn("tcp: closing a connection from {} that sent no hello within {} ({} "
                   "unauthenticated so far)",
                   self->source_, absl::FormatDuration(handshake), count);
    }
    self->Close();
  });
}

void IncomingConnection::CloseSoon() {
  loop_->Post([self = shared_from_this()] { self->Close(); });
}

void IncomingConnection::Close() {
  if (phase_ == Phase::kClosed) return;
  phase_ = Phase::kClosed;
  if (token_) loop_->Remove(*token_);
  token_.reset();
  fd_.Reset();
  // Regions are free to go once nothing of ours is inside them.
  write_pin_.reset();
  out_pin_.reset();
  target_.closed(this);
}

void IncomingConnection::OnEvents(uint32_t /*events*/) {
  // Level-triggered and one state machine: what to do next follows from the state alone.
  if (phase_ == Phase::kClosed) return;
  if (output_pending()) Flush();
  if (phase_ != Phase::kClosed && !output_pending()) ReadRequests();
  UpdateInterest();
}

void IncomingConnection::UpdateInterest() {
  if (phase_ == Phase::kClosed || !token_) return;
  // Reading waits while an answer is going out: answers keep request order, and a peer that
  // does not read its answers cannot make us buffer without bound.
  uint32_t want = output_pending() ? EPOLLOUT : EPOLLIN;
  if (want == interest_) return;
  absl::Status s = loop_->Modify(*token_, want);
  if (!s.ok()) {
    spdlog::warn("tcp: closing a connection from {}: {}", source_, s.ToString());
    Close();
    return;
  }
  interest_ = want;
}

void IncomingConnection::ReadRequests() {
  uint64_t received = 0;
  while (phase_ != Phase::kClosed && !output_pending() && received < kLoopRoundBytes) {
    ssize_t n;
    if (phase_ == Phase::kDiscard) {
      n = recv(fd_.get(), sink_.data(), sink_.size(), MSG_DONTWAIT);
    } else if (phase_ == Phase::kSkip) {
      n = recv(fd_.get(), sink_.data(), std::min<uint64_t>(sink_.size(), write_left_),
               MSG_DONTWAIT);
    } else if (phase_ == Phase::kPayload) {
      // Into the pinned region, each piece at its place (a WRITE is one piece; a refused one
      // never gets here: it ends the connection).
      msghdr msg = {};
      msg.msg_iov = write_into_.next();
      msg.msg_iovlen = write_into_.next_count();
      n = recvmsg(fd_.get(), &msg, MSG_DONTWAIT);
    } else if (phase_ == Phase::kTable) {
      n = recv(fd_.get(), reinterpret_cast<char*>(table_.data()) + table_have_,
               table_.size() * sizeof(WirePiece) - table_have_, MSG_DONTWAIT);
    } else {
      n = recv(fd_.get(), reinterpret_cast<char*>(&header_) + header_have_,
               sizeof(header_) - header_have_, MSG_DONTWAIT);
    }
    if (n == 0) {
      Close();  // the peer left
      return;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (WouldBlock(errno)) break;
      if (errno == EFAULT && phase_ == Phase::kPayload) {
        // The target memory went away (a client's file shrank): this WRITE fails, the
        // connection goes on. recvmsg took none of the bytes it could not place.
        StartSkip();
        continue;
      }
      spdlog::debug("tcp: connection from {}: recv(): {}", source_, strerror(errno));
      Close();
      return;
    }
    received += static_cast<uint64_t>(n);
    if (phase_ == Phase::kDiscard) continue;
    if (phase_ == Phase::kPayload || phase_ == Phase::kSkip) {
      if (phase_ == Phase::kPayload) write_into_.Consume(static_cast<size_t>(n));
      write_left_ -= static_cast<uint64_t>(n);
      if (write_left_ == 0) FinishWrite();
      continue;
    }
    if (phase_ == Phase::kTable) {
      table_have_ += static_cast<size_t>(n);
      if (table_have_ == table_.size() * sizeof(WirePiece)) OnTable();
      continue;
    }
    header_have_ += static_cast<size_t>(n);
    if (header_have_ == sizeof(header_)) {
      header_have_ = 0;
      OnHeader();
    }
  }
  // The socket is empty, or this round's share is spent (and nothing more may come to wake
  // us): the waiting acks go now.
  if (phase_ != Phase::kClosed && phase_ != Phase::kDiscard && !acks_.empty() &&
      !output_pending()) {
    QueueOutput(nullptr, 0, std::nullopt);
    Flush();
  }
}

void IncomingConnection::OnHeader() {
  if (phase_ == Phase::kHello) {
    OnHello();
    return;
  }
  OnRequest();
}

void IncomingConnection::OnHello() {
  // Nothing but this one header is read before the secret is checked, and nothing is
  // answered to a connection without one: a scanner learns only that the port is open.
  const char* why = "a first frame that is not a version 4 hello";
  static_assert(kWireVersion == 4, "update the message above");
  if (header_.magic == kRequestMagic && header_.op == WireOp::kHello &&
      header_.imm == kWireVersion) {
    SessionTicket ticket = TicketOfHello(header_);
    SessionSecrets::Refused refused = SessionSecrets::Refused::kUnknown;
    auto admitted = target_.sessions->Admit(ticket.session, ticket.secret, &refused);
    if (admitted) {
      peer_ = std::move(admitted->peer);
      // A connection of no named node (a test's direct connect) keeps its address's slot.
      if (!peer_.node.empty() && target_.authenticated &&
          !target_.authenticated(this, peer_.node)) {
        const uint64_t busy = target_.admission->busy.fetch_add(1) + 1;
        if (LogThis(busy)) {
          spdlog::warn("tcp: refused a connection from node {} ({}): it has as many here as "
                       "limits.tcp_max_connections_per_peer allows ({} such so far)",
                       peer_.node, source_, busy);
        }
        RefuseAndEnd({kResponseMagic, Refusal::kBusy, 0, 0});
        return;
      }
      counted_node_ = peer_.node;
      phase_ = Phase::kHeader;
      return;
    }
    why = RefusedHelloReason(refused);
  }
  uint64_t count = target_.admission->unauthenticated.fetch_add(1) + 1;
  if (LogThis(count)) {
    spdlog::warn("tcp: closing a connection from {} with {} ({} unauthenticated so far)",
                 source_, why, count);
  }
  Close();
}

void IncomingConnection::OnRequest() {
  const RequestHeader& req = header_;
  if (req.magic != kRequestMagic) {
    spdlog::warn("tcp: dropping a connection from {} that sent a bad request header", source_);
    Close();
    return;
  }
  ResponseHeader resp = {kResponseMagic, Refusal::kNone, req.id, 0};
  if (req.op == WireOp::kWriteList) {
    if (req.imm == 0 || req.imm > kMaxWirePieces) {
      // The table's size cannot be trusted: answer, then end.
      resp.refusal = Refusal::kBadOp;
      RefuseAndEnd(resp);
      return;
    }
    table_.resize(req.imm);
    table_have_ = 0;
    phase_ = Phase::kTable;
    return;
  }
  bool is_write = req.op == WireOp::kWrite || req.op == WireOp::kWriteImm;
  if (!is_write && req.op != WireOp::kRead) {
    // The payload length of an unknown op cannot be trusted: answer, then end.
    resp.refusal = Refusal::kBadOp;
    RefuseAndEnd(resp);
    return;
  }
  std::optional<RegionTable::Access> access;
  RegionCheck check = target_.regions->Acquire(req.key, req.address, req.length,
                                               NeededAccess(req.op), peer_.node, access);
  if (check != RegionCheck::kOk) {
    RefuseChecked(check, req);
    return;
  }
  if (is_write) {
    write_into_.Clear();
    write_into_.Add(access->data(), req.length);
    StartWrite(req, std::move(*access));
    return;
  }
  // A READ answer goes out at once, behind the acks that were waiting, its payload straight
  // from the pinned region.
  resp.length = req.length;
  char* payload = access->data();
  if (access->may_shrink()) {
    // sendmsg would fail EFAULT half way through a payload whose header already went, which
    // only closing the connection could undo: memory that may go away is read first, by the
    // CPU under a FaultGuard, and sent from the copy (one copy more, for such memory only).
    read_copy_.resize(req.length);
    bool faulted = false;
    {
      FaultGuard guard(payload, req.length);
      std::memcpy(read_copy_.data(), payload, req.length);
      faulted = guard.faulted();
    }
    if (faulted) {
      access->MarkFaulted();
      AnswerFault(req, "READ");
      return;
    }
    payload = read_copy_.data();
  }
  target_.served->read.fetch_add(req.length, std::memory_order_relaxed);
  target_.served->ops.fetch_add(1, std::memory_order_relaxed);
  acks_.push_back(resp);
  QueueOutput(payload, resp.length, std::move(access));
  Flush();
}

void IncomingConnection::AnswerFault(const RequestHeader& req, const char* what) {
  uint64_t count = target_.admission->faulted.fetch_add(1) + 1;
  if (LogThis(count)) {
    spdlog::warn("tcp: a {} of {} bytes at 0x{:x} key 0x{:x} from {} found the region's memory "
                 "gone (a client's file shrank?): that op fails, the connection goes on ({} such "
                 "so far)",
                 what, req.length, req.address, req.key, peer_.node, count);
  }
  acks_.push_back({kResponseMagic, Refusal::kFault, req.id, 0});
  if (req.op == WireOp::kRead) {
    QueueOutput(nullptr, 0, std::nullopt);
    Flush();
    return;
  }
  // A WRITE's payload follows its header (and table): drained, then answered.
  acks_.pop_back();
  write_answer_ = {kResponseMagic, Refusal::kFault, req.id, 0};
  write_left_ = req.length;
  write_notify_ = false;
  phase_ = Phase::kSkip;
  if (sink_.empty()) sink_.resize(kSinkBytes);
  if (write_left_ == 0) FinishWrite();
}

void IncomingConnection::StartSkip() {
  if (write_pin_) write_pin_->MarkFaulted();
  const RequestHeader req = {kRequestMagic, WireOp::kWrite, write_answer_.id, 0, write_left_, 0,
                             0};
  write_pin_.reset();
  write_into_.Clear();
  AnswerFault(req, "WRITE");
}

void IncomingConnection::OnTable() {
  const RequestHeader& req = header_;
  // Every piece non-empty, inside 2^64 from the request's address, the lengths adding up to
  // the payload: else the payload's framing cannot be trusted (kBadOp). Written so that no
  // sum can overflow.
  uint64_t total = 0, low = UINT64_MAX, high = 0;
  bool framed = true;
  for (const WirePiece& p : table_) {
    if (p.length == 0 || p.length > req.length - total || p.offset > UINT64_MAX - p.length ||
        p.offset + p.length > UINT64_MAX - req.address) {
      framed = false;
      break;
    }
    total += p.length;
    low = std::min(low, p.offset);
    high = std::max(high, p.offset + p.length);
  }
  if (!framed || total != req.length) {
    RefuseAndEnd({kResponseMagic, Refusal::kBadOp, req.id, 0});
    return;
  }
  // The span from the lowest piece to the end of the highest lies in the region exactly when
  // every piece does: one check, one pin.
  std::optional<RegionTable::Access> access;
  RegionCheck check = target_.regions->Acquire(req.key, req.address + low, high - low,
                                               fabric::kRemoteWrite, peer_.node, access);
  if (check != RegionCheck::kOk) {
    RefuseChecked(check, req);
    return;
  }
  write_into_.Clear();
  for (const WirePiece& p : table_) write_into_.Add(access->data() + (p.offset - low), p.length);
  StartWrite(req, std::move(*access));
}

void IncomingConnection::RefuseChecked(RegionCheck check, const RequestHeader& req) {
  if (check == RegionCheck::kFaulted) {
    AnswerFault(req, req.op == WireOp::kRead ? "READ" : "WRITE");
    return;
  }
  std::atomic<uint64_t>& counter =
      check == RegionCheck::kUnknownKey    ? target_.admission->refused_key
      : check == RegionCheck::kOutOfBounds ? target_.admission->refused_bounds
      : check == RegionCheck::kAccess      ? target_.admission->refused_access
                                           : target_.admission->refused_peer;
  uint64_t count = counter.fetch_add(1) + 1;
  if (LogThis(count)) {
    spdlog::warn("tcp: refused a {} of {} bytes at 0x{:x} key 0x{:x} from {} ({}): {}; closing "
                 "the connection ({} such so far)",
                 req.op == WireOp::kRead        ? "READ"
                 : req.op == WireOp::kWriteList ? "WRITE list"
                                                : "WRITE",
                 req.length, req.address, req.key, peer_.node, source_, RegionCheckReason(check),
                 count);
  }
  // One answer whatever the reason (wire.h). A refused WRITE's payload is not read into
  // anything: the connection only drains from here on.
  RefuseAndEnd({kResponseMagic, Refusal::kRefused, req.id, 0});
}

void IncomingConnection::StartWrite(const RequestHeader& req, RegionTable::Access access) {
  write_answer_ = {kResponseMagic, Refusal::kNone, req.id, 0};
  write_left_ = req.length;
  write_imm_ = req.imm;
  write_notify_ = req.op == WireOp::kWriteImm;
  target_.served->written.fetch_add(req.length, std::memory_order_relaxed);
  target_.served->ops.fetch_add(1, std::memory_order_relaxed);
  write_pin_.emplace(std::move(access));
  phase_ = Phase::kPayload;
  if (write_left_ == 0) FinishWrite();
}

void IncomingConnection::RefuseAndEnd(const ResponseHeader& resp) {
  acks_.push_back(resp);
  end_after_output_ = true;
  QueueOutput(nullptr, 0, std::nullopt);
  Flush();
}

void IncomingConnection::StartDiscard() {
  // Our side ends (the peer reads the refusal, then EOF) while unread bytes stay unread: a
  // close() now would make the kernel send a reset and drop the refusal if it has not left.
  if (shutdown(fd_.get(), SHUT_WR) != 0) {
    spdlog::debug("tcp: connection from {}: shutdown(SHUT_WR): {}", source_, strerror(errno));
    Close();
    return;
  }
  phase_ = Phase::kDiscard;
  if (sink_.empty()) sink_.resize(kSinkBytes);
  loop_->RunAfter(kDiscardTimeout, [weak = weak_from_this()] {
    if (auto self = weak.lock()) self->Close();
  });
}

void IncomingConnection::FinishWrite() {
  write_pin_.reset();
  write_into_.Clear();
  phase_ = Phase::kHeader;
  if (write_notify_) target_.notify(write_imm_);
  acks_.push_back(write_answer_);
  if (acks_.size() >= kMaxCoalescedAcks) {
    QueueOutput(nullptr, 0, std::nullopt);
    Flush();
  }
}

void IncomingConnection::QueueOutput(char* payload, uint64_t length,
                                     std::optional<RegionTable::Access> pin) {
  out_headers_.assign(acks_.begin(), acks_.end());
  acks_.clear();
  out_payload_ = payload;
  if (pin) out_pin_.emplace(std::move(*pin));
  out_sent_ = 0;
  out_total_ = out_headers_.size() * sizeof(ResponseHeader) + length;
}

void IncomingConnection::Flush() {
  const uint64_t header_bytes = out_headers_.size() * sizeof(ResponseHeader);
  uint64_t sent = 0;
  while (output_pending() && sent < kLoopRoundBytes) {
    iovec iov[2];
    size_t count = 0;
    if (out_sent_ < header_bytes) {
      iov[count++] = {reinterpret_cast<char*>(out_headers_.data()) + out_sent_,
                      header_bytes - out_sent_};
    }
    uint64_t payload_sent = out_sent_ > header_bytes ? out_sent_ - header_bytes : 0;
    uint64_t payload_bytes = out_total_ - header_bytes;
    if (payload_sent < payload_bytes) {
      iov[count++] = {out_payload_ + payload_sent, payload_bytes - payload_sent};
    }
    msghdr msg = {};
    msg.msg_iov = iov;
    msg.msg_iovlen = count;
    ssize_t n = sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (WouldBlock(errno)) return;  // the rest when the socket has room
      spdlog::debug("tcp: connection from {}: sendmsg(): {}", source_, strerror(errno));
      Close();
      return;
    }
    out_sent_ += static_cast<uint64_t>(n);
    sent += static_cast<uint64_t>(n);
  }
  if (output_pending()) return;  // this round's share is spent
  out_headers_.clear();
  out_payload_ = nullptr;
  out_pin_.reset();
  if (!read_copy_.empty()) std::vector<char>().swap(read_copy_);  // not kept between READs
  out_sent_ = out_total_ = 0;
  if (end_after_output_) {
    end_after_output_ = false;
    StartDiscard();
  }
}

}  // namespace ferry::tcp
