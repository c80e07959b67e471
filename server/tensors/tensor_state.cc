#include "server/tensors/tensor_state.h"

#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/grpc_status.h"
#include "base/byte_range.h"
#include "base/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "server/tensors/peer_call.h"
#include "server/tensors/tensor_meta.h"
#include "spdlog/spdlog.h"

namespace ferry::server {
namespace {

// One tensor is split into ops of at most this size, so the provider can spread it over its
// connections (tcp runs several) instead of streaming it through one.
constexpr uint64_t kSendChunk = 16ull << 20;
// How long one Match call waits at the receiver before the sender asks again; bounds how
// late a cancelled send notices.
constexpr absl::Duration kMatchPoll = absl::Milliseconds(500);
// Messages that release the peer's state go out even when our own deadline has passed.
constexpr absl::Duration kCleanupTimeout = absl::Seconds(5);


// The engine names ops; callers of WriteBlocks think in blocks.
absl::Status RenameOps(const absl::Status& s) {
  std::string msg(s.message());
  if (absl::StartsWith(msg, "ops")) msg = "blocks" + msg.substr(3);
  return absl::Status(s.code(), msg);
}

}  // namespace

TensorState::TensorState(PeerDirectory* peers, BufferRegistry* buffers, TransferEngine* engine,
                         uint64_t max_op_bytes, size_t notifications_per_receiver)
    : peers_(peers),
      node_(peers->self()),
      buffers_(buffers),
      engine_(engine),
      max_op_bytes_(max_op_bytes),
      matcher_(node_, buffers),
      board_(notifications_per_receiver),
      blocks_(std::make_shared<BlockLists>(buffers)),
      mover_(peers, buffers, engine, blocks_.get()) {
  // Send ids only need to be unique per sending agent; a random start keeps a restarted
  // agent's ids from colliding with offers its previous life left at a peer.
  std::random_device rd;
  next_send_id_ = ((static_cast<uint64_t>(rd()) << 32) | rd()) & ((1ull << 62) - 1);
}

uint32_t TensorState::EngineTimeoutMs(absl::Time deadline) const {
  int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
  int64_t cap_ms = absl::ToInt64Milliseconds(engine_->limits().max_timeout);
  return static_cast<uint32_t>(
      std::clamp<int64_t>(left_ms, 1, std::min<int64_t>(cap_ms, UINT32_MAX)));
}

absl::StatusOr<std::unique_ptr<ferry::v1::TensorPeer::Stub>> TensorState::Stub(
    const std::string& node) {
  // A stub is only the channel and its method names, cheap next to the call it makes; made
  // per use, it follows the directory's reloads (a moved peer's new channel) by itself.
  auto channel = peers_->Channel(node);
  if (absl::IsNotFound(channel.status())) {
    return absl::NotFoundError(absl::StrCat("peer: unknown node '", node, "'"));
  }
  if (!channel.ok()) return channel.status();
  return ferry::v1::TensorPeer::NewStub(*std::move(channel));
}

absl::Status TensorState::AwaitTransfer(uint64_t id) {
  ASSIGN_OR_RETURN(std::shared_ptr<Transfer> transfer, engine_->Find(id));
  // The engine ends every transfer at its deadline, so this wait is bounded.
  transfer->AwaitFinished(absl::InfiniteFuture());
  ferry::v1::TransferResult result = transfer->Result();
  if (result.state() == ferry::v1::SUCCEEDED) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(result.code()), result.message());
}

void TensorState::Withdraw(ferry::v1::TensorPeer::Stub* stub, uint64_t send_id,
                           const std::string& reason) {
  ferry::v1::CancelSendRequest req;
  req.set_from_node(node_);
  req.set_send_id(send_id);
  req.set_reason(reason);
  ferry::v1::CancelSendResponse resp;
  auto ctx = PeerContext(absl::Now() + kCleanupTimeout);
  grpc::Status s = stub->CancelSend(ctx.get(), req, &resp);
  if (!s.ok()) spdlog::warn("CancelSend({}) failed: {}", send_id, s.error_message());
}

absl::Status TensorState::CompleteOnPeer(ferry::v1::TensorPeer::Stub* stub, uint64_t send_id,
                                         const absl::Status& status) {
  ferry::v1::CompleteRequest req;
  req.set_from_node(node_);
  req.set_send_id(send_id);
  req.set_code(static_cast<int>(status.code()));
  req.set_message(std::string(status.message()));
  ferry::v1::CompleteResponse resp;
  auto ctx = PeerContext(absl::Now() + kCleanupTimeout);
  return FromGrpcStatus(stub->Complete(ctx.get(), req, &resp));
}

absl::Status TensorState::NotifyPeer(ferry::v1::TensorPeer::Stub* stub, ferry::v1::Notification n) {
  n.set_from_node(node_);
  ferry::v1::NotifyResponse resp;
  auto ctx = PeerContext(absl::Now() + kCleanupTimeout);
  return FromGrpcStatus(stub->Notify(ctx.get(), n, &resp));
}

absl::StatusOr<ferry::v1::SendResponse> TensorState::Send(const ferry::v1::SendRequest& req,
                                                          int64_t owner_uid,
                                                          absl::Time deadline,
                                                          const CancelledFn& client_gone) {
  const absl::Time start = absl::Now();
  ferry::v1::TensorMeta meta = req.meta();
  RETURN_IF_ERROR(CheckName(req.peer(), "peer"));
  RETURN_IF_ERROR(CheckName(meta.tag(), "meta.tag"));
  ASSIGN_OR_RETURN(uint64_t bytes, tensors::TensorSpanBytes(meta, "meta"));
  ASSIGN_OR_RETURN(std::unique_ptr<ferry::v1::TensorPeer::Stub> peer_stub, Stub(req.peer()));
  ferry::v1::TensorPeer::Stub* const stub = peer_stub.get();
  ASSIGN_OR_RETURN(std::shared_ptr<Buffer> buffer, buffers_->Get(req.buffer(), "buffer"));
  // The buffer says where the bytes live ("host" now, "cuda:N" with GPU pools); a client
  // that claims otherwise is told rather than trusted.
  ASSIGN_OR_RETURN(int claimed, tensors::ParseDevice(meta.device(), "meta.device"));
  ASSIGN_OR_RETURN(int actual, tensors::ParseDevice(buffer->device(), "buffer device"));
  if (!meta.device().empty() && claimed != actual) {
    return absl::InvalidArgumentError(absl::StrCat("meta.device: '", meta.device(), "' but buffer ",
                                                   req.buffer(), " is on ", buffer->device()));
  }
  meta.set_device(buffer->device());
  if (!RangeFits(req.offset(), bytes, buffer->size())) {
    return absl::OutOfRangeError(absl::StrCat(
        "meta.shape: the tensor ", tensors::DescribeTensor(meta), " needs ", bytes,
        " bytes but buffer ", req.buffer(), " has ",
        req.offset() <= buffer->size() ? buffer->size() - req.offset() : 0,
        " bytes from offset ", req.offset()));
  }

  const auto key = std::make_pair(req.peer(), meta.tag());
  auto active = std::make_shared<ActiveSend>();
  active->bytes = bytes;
  active->owner_uid = owner_uid;
  uint64_t send_id;
  {
    absl::MutexLock lock(&mu_);
    if (sends_.contains(key)) {
      return absl::AlreadyExistsError(absl::StrCat("meta.tag: a send of '", meta.tag(), "' to ",
                                                   req.peer(), " is already pending (a tag can "
                                                   "be reused once it completes)"));
    }
    sends_.emplace(key, active);
    send_id = next_send_id_++;
  }
  // Whatever happens below, the tag is free again when this returns.
  struct Release {
    TensorState* self;
    std::pair<std::string, std::string> key;
    ~Release() {
      absl::MutexLock lock(&self->mu_);
      self->sends_.erase(key);
    }
  } release{this, key};
  auto cancelled = [&] { return active->cancelled.load() || (client_gone && client_gone()); };
  const std::string what = absl::StrCat("send of '", meta.tag(), "' to ", req.peer());

  // 1. Offer it until a receive matches.
  ferry::v1::MatchResponse match;
  while (true) {
    if (cancelled() || absl::Now() >= deadline) {
      // A call past its deadline also looks cancelled to gRPC: the deadline is the reason.
      absl::Status why = absl::Now() < deadline
                             ? absl::CancelledError(absl::StrCat(what, " was cancelled"))
                             : absl::DeadlineExceededError(absl::StrCat(
                                   what, ": no matching receive before the deadline"));
      Withdraw(stub, send_id, std::string(why.message()));
      return why;
    }
    ferry::v1::MatchRequest m;
    m.set_from_node(node_);
    m.set_send_id(send_id);
    *m.mutable_meta() = meta;
    m.set_bytes(bytes);
    absl::Duration wait = std::min(kMatchPoll, deadline - absl::Now());
    m.set_wait_ms(static_cast<uint32_t>(std::max<int64_t>(absl::ToInt64Milliseconds(wait), 1)));
    m.set_deadline_unix_ms(absl::ToUnixMillis(deadline));
    // The answer may come a little after `wait` (the peer waits that long first), but not
    // past the send's own deadline by more than kMatchPoll: a peer that says nothing costs
    // the caller its timeout, not kCleanupTimeout more.
    const absl::Time asked = absl::Now();
    const absl::Time answer_by = std::min(asked + wait + kCleanupTimeout, deadline + kMatchPoll);
    auto ctx = PeerContext(answer_by);
    grpc::Status s = stub->Match(ctx.get(), m, &match);
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      // Not a word from the peer (the deadline is our clock's). No CancelSend: it would wait
      // on the same silent peer, and the offer ends there by itself at deadline_unix_ms.
      return PeerCallError(s, what, req.peer(), "Match", answer_by - asked);
    }
    if (!s.ok() && absl::Now() >= deadline) {
      // The peer dropped the offer because it expired: that is the deadline, not a cancel.
      absl::Status why = absl::DeadlineExceededError(
          absl::StrCat(what, ": no matching receive before the deadline"));
      Withdraw(stub, send_id, std::string(why.message()));
      return why;
    }
    if (!s.ok()) {
      absl::Status err = PeerCallError(s, what, req.peer(), "Match", answer_by - asked);
      if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
          s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
        Withdraw(stub, send_id, std::string(err.message()));
      }
      return err;
    }
    if (match.matched()) break;
  }

  // 2. WRITE the span straight into the landing buffer.
  active->state = "writing";
  absl::Status written = absl::OkStatus();
  if (bytes > 0) {
    ferry::v1::SubmitRequest submit;
    const uint64_t chunk = std::min(kSendChunk, max_op_bytes_);
    for (uint64_t done = 0; done < bytes; done += chunk) {
      ferry::v1::Op* op = submit.add_ops();
      op->set_type(ferry::v1::WRITE);
      op->set_local_buffer(req.buffer());
      op->set_local_offset(req.offset() + done);
      op->set_peer(req.peer());
      op->set_remote_buffer(match.landing_buffer());
      op->set_remote_offset(match.landing_offset() + done);
      op->set_length(std::min(chunk, bytes - done));
    }
    submit.set_timeout_ms(EngineTimeoutMs(deadline));
    auto id = engine_->Submit(submit, {}, {}, owner_uid);
    // Bytes in flight land in the peer's buffer whatever the client does now, so the send
    // is settled (and the peer told) only after the transfer itself ended.
    written = id.ok() ? AwaitTransfer(*id) : id.status();
    if (written.ok() && cancelled())
      written = absl::CancelledError(absl::StrCat(what, " was cancelled"));
  }

  // 3. Tell the receiver.
  active->state = "completing";
  absl::Status completed = CompleteOnPeer(stub, send_id, written);
  if (!written.ok()) return written;
  if (!completed.ok()) {
    return absl::Status(completed.code(), absl::StrCat(what, ": ", completed.message()));
  }
  ferry::v1::SendResponse resp;
  resp.set_bytes(bytes);
  resp.set_duration_us(absl::ToInt64Microseconds(absl::Now() - start));
  resp.set_landing_buffer(match.landing_buffer());
  return resp;
}

absl::StatusOr<ferry::v1::RecvResponse> TensorState::Recv(const ferry::v1::RecvRequest& req,
                                                          int64_t owner_uid,
                                                          absl::Time deadline,
                                                          const CancelledFn& client_gone) {
  RETURN_IF_ERROR(CheckName(req.peer(), "peer"));
  RETURN_IF_ERROR(CheckName(req.tag(), "tag"));
  if (!peers_->Known(req.peer())) {
    return absl::NotFoundError(absl::StrCat("peer: unknown node '", req.peer(), "'"));
  }
  const auto& expect = req.expect();
  if (expect.dtype() != ferry::v1::DTYPE_UNSPECIFIED && tensors::DTypeSize(expect.dtype()) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("expect.dtype: unknown dtype value ", expect.dtype()));
  }
  for (int i = 0; i < expect.shape_size(); ++i) {
    if (expect.shape(i) < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("expect.shape[", i, "]: ", expect.shape(i), " is negative"));
    }
  }
  RecvSpec spec;
  spec.peer = req.peer();
  spec.tag = req.tag();
  spec.offset = req.offset();
  spec.expect = expect;
  spec.owner_uid = owner_uid;
  if (req.buffer() != 0) {
    ASSIGN_OR_RETURN(spec.buffer, buffers_->Get(req.buffer(), "buffer"));
    if (spec.buffer->name().empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "buffer: buffer ", req.buffer(),
          " has no name, so peers cannot write into it; allocate the landing buffer with a name"));
    }
    if (req.offset() > spec.buffer->size()) {
      return absl::OutOfRangeError(absl::StrCat("offset: ", req.offset(),
                                                " is past the end of buffer ", req.buffer(), " (",
                                                spec.buffer->size(), " bytes)"));
    }
  }
  ASSIGN_OR_RETURN(RecvMatcher::Ticket ticket, matcher_.Post(std::move(spec)));
  ASSIGN_OR_RETURN(RecvOutcome outcome, matcher_.Await(ticket, deadline, client_gone));
  ferry::v1::RecvResponse resp;
  *resp.mutable_meta() = outcome.meta;
  resp.set_offset(outcome.offset);
  resp.set_bytes(outcome.bytes);
  resp.set_allocated(outcome.allocated);
  if (outcome.buffer) {
    auto* b = resp.mutable_buffer();
    b->set_id(outcome.buffer->id());
    b->set_name(outcome.buffer->name());
    b->set_size(outcome.buffer->size());
    b->set_device(outcome.buffer->device());
  }
  return resp;
}

absl::StatusOr<ferry::v1::WriteBlocksResponse> TensorState::WriteBlocks(
    const ferry::v1::WriteBlocksRequest& req, int64_t owner_uid, absl::Time deadline,
    const CancelledFn& client_gone) {
  const absl::Time start = absl::Now();
  RETURN_IF_ERROR(CheckName(req.peer(), "peer"));
  RETURN_IF_ERROR(CheckName(req.remote_buffer(), "remote_buffer"));
  if (req.notification().size() > kMaxNameLength) {
    return absl::InvalidArgumentError(absl::StrCat("notification: ", req.notification().size(),
                                                   " characters is more than ", kMaxNameLength));
  }
  RETURN_IF_ERROR(CheckNotificationPayload(req.notification_payload(), req.notification(),
                                           "notification_payload"));
  if (req.blocks_size() == 0) return absl::InvalidArgumentError("blocks: the batch is empty");
  ASSIGN_OR_RETURN(std::unique_ptr<ferry::v1::TensorPeer::Stub> peer_stub, Stub(req.peer()));
  ferry::v1::TensorPeer::Stub* const stub = peer_stub.get();

  ferry::v1::SubmitRequest submit;
  submit.mutable_ops()->Reserve(req.blocks_size());
  uint64_t bytes = 0;
  for (const auto& b : req.blocks()) {
    ferry::v1::Op* op = submit.add_ops();
    op->set_type(ferry::v1::WRITE);
    op->set_local_buffer(req.local_buffer());
    op->set_local_offset(b.local_offset());
    op->set_peer(req.peer());
    op->set_remote_buffer(req.remote_buffer());
    op->set_remote_offset(b.remote_offset());
    op->set_length(b.length());
    bytes += b.length();
  }
  submit.set_timeout_ms(EngineTimeoutMs(deadline));
  auto id = engine_->Submit(submit, {}, {}, owner_uid);
  absl::Status written = id.ok() ? AwaitTransfer(*id) : RenameOps(id.status());
  if (written.ok() && client_gone && client_gone()) {
    written = absl::CancelledError("the batch was cancelled by its sender");
  }

  if (!req.notification().empty()) {
    // Sent only now that every WRITE of the batch completed (or the batch failed): the
    // receiver never sees "landed" before the last block has.
    ferry::v1::Notification n;
    n.set_name(req.notification());
    n.set_buffer(req.remote_buffer());  // its owner there is who the notification is for
    n.set_bytes(written.ok() ? bytes : 0);
    n.set_blocks(static_cast<uint32_t>(req.blocks_size()));
    n.set_code(static_cast<int>(written.code()));
    n.set_message(std::string(written.message()));
    n.set_payload(req.notification_payload());
    absl::Status notified = NotifyPeer(stub, n);
    if (written.ok() && !notified.ok()) {
      return absl::Status(notified.code(),
                          absl::StrCat("the blocks landed but notification '", req.notification(),
                                       "' could not be delivered: ", notified.message()));
    }
  }
  if (!written.ok()) return written;
  ferry::v1::WriteBlocksResponse resp;
  resp.set_bytes(bytes);
  resp.set_duration_us(absl::ToInt64Microseconds(absl::Now() - start));
  return resp;
}

absl::StatusOr<ferry::v1::CancelResponse> TensorState::Cancel(const std::string& peer,
                                                              const std::string& tag,
                                                              int64_t taker) {
  ferry::v1::CancelResponse resp;
  bool others = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = sends_.find({peer, tag});
    if (it != sends_.end()) {
      const int64_t owner = it->second->owner_uid;
      if (taker < 0 || owner < 0 || owner == taker) {
        it->second->cancelled = true;
        resp.set_sends(1);
      } else {
        others = true;
      }
    }
  }
  resp.set_recvs(matcher_.CancelRecv(peer, tag, taker, &others));
  if (resp.sends() == 0 && resp.recvs() == 0) {
    if (others) {
      return absl::PermissionDeniedError(
          absl::StrCat("tag: what is pending for tag '", tag, "' with ", peer,
                       " belongs to another uid; uid ", taker, " may not cancel it"));
    }
    return absl::NotFoundError(absl::StrCat("nothing pending for tag '", tag, "' with ", peer));
  }
  return resp;
}

void TensorState::ListPending(ferry::v1::ListPendingResponse* out, int64_t taker) {
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, send] : sends_) {
      if (taker >= 0 && send->owner_uid >= 0 && send->owner_uid != taker) continue;
      auto* p = out->add_sends();
      p->set_peer(key.first);
      p->set_tag(key.second);
      p->set_state(send->state.load());
      p->set_bytes(send->bytes);
    }
  }
  matcher_.List(out, taker);
  out->set_notifications(board_.size_for(taker));
}

}  // namespace ferry::server
