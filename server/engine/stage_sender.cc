#include "server/engine/stage_sender.h"

#include <algorithm>
#include <deque>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/grpc_status.h"
#include "base/status_macros.h"
#include "ferry/v1/peer.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "spdlog/spdlog.h"

namespace ferry::server {

// One Stage call to a peer's buffer: the grants it sent, the copy-ins it reported.
class StageSender::Session : public std::enable_shared_from_this<StageSender::Session> {
 public:
  Session(StageSender* owner, std::string node, std::string buffer, bool read)
      : owner_(owner), node_(std::move(node)), buffer_(std::move(buffer)), read_(read) {}

  ~Session() {
    if (reader_.joinable()) {
      ctx_.TryCancel();
      // The last reference may go with a callback on the reader itself, at its very end.
      if (reader_.get_id() == std::this_thread::get_id()) {
        reader_.detach();
      } else {
        reader_.join();
      }
    }
  }

  void Cancel() { ctx_.TryCancel(); }

  absl::Status Open(ferry::v1::Peer::Stub* stub, const std::string& self, const std::string& provider,
                    uint64_t chunk, uint32_t depth, absl::Time deadline) {
    ctx_.set_deadline(absl::ToChronoTime(deadline));
    stream_ = stub->Stage(&ctx_);
    ferry::v1::StageRequest open;
    open.mutable_open()->set_buffer(buffer_);
    open.mutable_open()->set_from_node(self);
    open.mutable_open()->set_chunk_bytes(chunk);
    open.mutable_open()->set_depth(depth);
    open.mutable_open()->set_provider(provider);
    open.mutable_open()->set_read(read_);
    if (!stream_->Write(open)) return Finish("Stage: the peer closed the call");
    reader_ = std::thread([this] { Read(); });
    // The first grant tells the chunk size the peer uses.
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !grants_.empty() || ended_; };
    if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
      return absl::DeadlineExceededError(absl::StrCat("Stage to ", node_, ": no grant before the deadline"));
    }
    if (grants_.empty()) return error_;
    grant_length_ = grants_.front().length();
    // In read mode the first reply only says the chunk size.
    if (read_) grants_.clear();
    return absl::OkStatus();
  }

  uint64_t grant_length() const { return grant_length_; }
  bool Is(const std::string& node, const std::string& buffer, bool read) const {
    return node == node_ && buffer == buffer_ && read == read_;
  }

  // Read mode: asks the peer to copy [offset, offset+length) out of its GPU; `ready` runs
  // (on this call's reader thread) with the chunk to READ, or with why it will not come.
  using Ready = absl::AnyInvocable<void(absl::StatusOr<ferry::v1::StageGrant>) &&>;
  void Fetch(uint64_t offset, uint64_t length, Ready ready) {
    uint64_t token = 0;
    absl::Status gone;
    {
      absl::MutexLock lock(&mu_);
      if (ended_) {
        gone = error_;
      } else {
        token = next_token_++;
        fetches_.emplace(token, std::move(ready));
      }
    }
    if (!gone.ok()) return std::move(ready)(gone);
    ferry::v1::StageRequest req;
    auto* f = req.mutable_fetch();
    f->set_offset(offset);
    f->set_length(length);
    f->set_token(token);
    absl::MutexLock lock(&write_mu_);
    stream_->Write(req);  // a failed write ends the call; the reader then fails the fetch
  }

  // Read mode: the chunk of `grant` may be reused.
  void Release(uint64_t grant) {
    ferry::v1::StageRequest req;
    req.set_release(grant);
    absl::MutexLock lock(&write_mu_);
    stream_->Write(req);
  }

  // A granted chunk, or an error (the call ended, or the deadline passed).
  absl::StatusOr<ferry::v1::StageGrant> TakeGrant(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !grants_.empty() || ended_; };
    if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
      return absl::DeadlineExceededError(absl::StrCat("Stage to ", node_, ": no free chunk before the deadline"));
    }
    if (grants_.empty()) return error_;
    auto g = grants_.front();
    grants_.pop_front();
    return g;
  }

  // Tells the peer a chunk holds `length` bytes for `offset` of its buffer.
  bool Report(uint64_t grant, uint64_t offset, uint64_t length, uint64_t token) {
    ferry::v1::StageRequest req;
    auto* c = req.mutable_chunk();
    c->set_grant(grant);
    c->set_offset(offset);
    c->set_length(length);
    c->set_token(token);
    absl::MutexLock lock(&write_mu_);
    return stream_->Write(req);
  }

  // No more chunks: waits for the peer's verdict once every copy-in is done.
  absl::Status Close(absl::Time deadline) {
    {
      ferry::v1::StageRequest req;
      req.set_close(true);
      absl::MutexLock lock(&write_mu_);
      stream_->Write(req);
      stream_->WritesDone();
    }
    absl::MutexLock lock(&mu_);
    auto ended = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return ended_; };
    mu_.AwaitWithDeadline(absl::Condition(&ended), deadline);
    return ended_ ? verdict_ : absl::DeadlineExceededError("Stage: no verdict before the deadline");
  }

 private:
  void Read() {
    ferry::v1::StageReply reply;
    absl::Status verdict = absl::UnavailableError(absl::StrCat("Stage to ", node_, " ended early"));
    while (stream_->Read(&reply)) {
      if (reply.has_grant() && read_ && reply.grant().grant() != 0) {
        Ready ready;
        {
          absl::MutexLock lock(&mu_);
          auto it = fetches_.find(reply.grant().token());
          if (it != fetches_.end()) {
            ready = std::move(it->second);
            fetches_.erase(it);
          }
        }
        if (ready) std::move(ready)(reply.grant());
      } else if (reply.has_grant()) {
        absl::MutexLock lock(&mu_);
        grants_.push_back(reply.grant());
      } else if (reply.has_copied()) {
        owner_->OnCopied(reply.copied().token(), reply.copied().bytes());
      } else if (reply.has_done()) {
        verdict = absl::Status(static_cast<absl::StatusCode>(reply.done().code()), reply.done().message());
      }
    }
    absl::Status end = Finish("Stage");
    if (!end.ok() && verdict.code() == absl::StatusCode::kUnavailable) verdict = end;
    if (!verdict.ok()) owner_->OnSessionFailed(this, verdict);
    absl::flat_hash_map<uint64_t, Ready> orphans;
    {
      absl::MutexLock lock(&mu_);
      ended_ = true;
      error_ = verdict.ok() ? absl::UnavailableError(absl::StrCat("Stage to ", node_, " has ended"))
                            : verdict;
      verdict_ = verdict;
      orphans.swap(fetches_);
    }
    // Fetches that will never be answered still give back what they hold.
    for (auto& [token, ready] : orphans) std::move(ready)(error_for_orphans(verdict));
  }

  absl::Status error_for_orphans(const absl::Status& verdict) const {
    return verdict.ok() ? absl::UnavailableError(absl::StrCat("Stage to ", node_, " ended before a fetch was answered"))
                        : verdict;
  }

  absl::Status Finish(const std::string& what) {
    grpc::Status s = stream_->Finish();
    if (s.ok()) return absl::OkStatus();
    auto code = s.error_code() == grpc::StatusCode::CANCELLED ? absl::StatusCode::kUnavailable
                                                               : static_cast<absl::StatusCode>(s.error_code());
    return absl::Status(code, absl::StrCat(what, " on ", node_, ": ", s.error_message()));
  }

  StageSender* const owner_;
  const std::string node_;
  const std::string buffer_;
  const bool read_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<ferry::v1::StageRequest, ferry::v1::StageReply>> stream_;
  std::thread reader_;
  uint64_t grant_length_ = 0;
  absl::Mutex write_mu_;
  absl::Mutex mu_;
  std::deque<ferry::v1::StageGrant> grants_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Ready> fetches_ ABSL_GUARDED_BY(mu_);  // read mode, by token
  uint64_t next_token_ ABSL_GUARDED_BY(mu_) = 1;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);    // why no more grants will come
  absl::Status verdict_ ABSL_GUARDED_BY(mu_);  // the peer's final word
};

StageSender::StageSender(std::shared_ptr<Transfer> transfer, PlannedOps planned,
                         std::vector<StagedOp> ops, Deps deps)
    : transfer_(std::move(transfer)), planned_(std::move(planned)), ops_(std::move(ops)),
      deps_(std::move(deps)),
      depth_(transfer_->policy().policy.staging_depth),
      chunk_(transfer_->policy().policy.staging_chunk_bytes) {
  absl::MutexLock lock(&mu_);
  done_bytes_.assign(ops_.size(), 0);
  chunks_.assign(ops_.size(), 0);
  failed_.assign(ops_.size(), false);
  units_in_flight_.assign(ops_.size(), 0);
  session_of_.assign(ops_.size(), nullptr);
}

StageSender::~StageSender() = default;

void StageSender::Run() {
  for (size_t slot = 0; slot < ops_.size(); ++slot) {
    absl::Status s = RunOp(ops_[slot]);
    if (!s.ok()) UnitDone(slot, 0, s, /*launched=*/false);
  }
  // Every chunk in flight ends one way or another: wait for them (bounded by the deadline,
  // after which the reaper has settled the ops anyway).
  {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return in_flight_ == 0; };
    mu_.AwaitWithDeadline(absl::Condition(&idle), transfer_->deadline() + absl::Seconds(5));
  }
  std::vector<std::shared_ptr<Session>> sessions;
  {
    absl::MutexLock lock(&sessions_mu_);
    sessions.swap(sessions_);
  }
  for (auto& session : sessions) {
    absl::Status verdict = session->Close(transfer_->deadline());
    if (!verdict.ok()) spdlog::warn("transfer {}: {}", transfer_->id(), verdict.ToString());
  }
}

void StageSender::Cancel() {
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }
  absl::MutexLock lock(&sessions_mu_);
  for (auto& session : sessions_) session->Cancel();
}

bool StageSender::WaitWindow(size_t slot, uint32_t window) {
  absl::MutexLock lock(&mu_);
  auto room = [this, window]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return in_flight_ < window || cancelled_; };
  if (!mu_.AwaitWithDeadline(absl::Condition(&room), transfer_->deadline()) || cancelled_) return false;
  ++in_flight_;
  ++units_in_flight_[slot];
  return true;
}

absl::StatusOr<std::shared_ptr<StageSender::Session>> StageSender::SessionFor(const StagedOp& staged) {
  const PlannedOp& op = (*planned_)[staged.index];
  // One Stage call per remote buffer for the whole transfer.
  {
    absl::MutexLock lock(&sessions_mu_);
    for (auto& session : sessions_) {
      if (session->Is(op.remote->node, op.remote->name, op.type == ferry::v1::READ)) return session;
    }
  }
  ASSIGN_OR_RETURN(std::shared_ptr<ferry::v1::Peer::Stub> stub, deps_.peers->Stub(op.remote->node));
  auto session = std::make_shared<Session>(this, op.remote->node, op.remote->name,
                                           op.type == ferry::v1::READ);
  {
    // Listed before it opens, so Cancel() reaches an Open that waits for its first grant.
    absl::MutexLock lock(&sessions_mu_);
    sessions_.push_back(session);
  }
  absl::Status opened = session->Open(stub.get(), deps_.peers->self(), staged.peer.provider, chunk_,
                                      depth_, transfer_->deadline());
  if (!opened.ok()) {
    // A call that never opened is not closed later: drop it (its destructor cancels it).
    absl::MutexLock lock(&sessions_mu_);
    sessions_.erase(std::find(sessions_.begin(), sessions_.end(), session));
    return opened;
  }
  return session;
}

absl::Status StageSender::RunOp(const StagedOp& staged) {
  const PlannedOp& op = (*planned_)[staged.index];
  const bool remote_staged = op.remote->mode == "staged";
  const bool local_staged = staged.local.mode == "staged";
  std::shared_ptr<Session> session;
  uint64_t unit = chunk_;
  size_t slot = &staged - ops_.data();
  if (remote_staged) {
    ASSIGN_OR_RETURN(session, SessionFor(staged));
    unit = std::min(unit, session->grant_length());
    absl::MutexLock lock(&mu_);
    session_of_[slot] = session.get();
  }
  std::shared_ptr<StagingPool> local_pool;
  if (local_staged) {
    ASSIGN_OR_RETURN(local_pool, deps_.bounce->Get(staged.local.bounce_numa, transfer_->policy()));
    unit = std::min(unit, local_pool->pool().chunk_bytes());
  }
  // At most `depth` chunks in flight per staged leg: with both legs staged, `depth` of ours
  // in copy-out and `depth` of the peer's granted chunks.
  const uint32_t window = depth_ * std::max(1, int{local_staged} + int{remote_staged});
  transfer_->MarkPosted(staged.index);
  for (uint64_t offset = 0; offset < op.length; offset += unit) {
    {
      absl::MutexLock lock(&mu_);
      if (failed_[slot]) break;
    }
    if (!WaitWindow(slot, window)) {
      return absl::DeadlineExceededError(
          absl::StrCat("transfer ", transfer_->id(), " did not finish before its deadline (or the agent is stopping)"));
    }
    Launch(staged, offset, std::min(unit, op.length - offset), session, local_pool);
  }
  return absl::OkStatus();
}

void StageSender::Launch(const StagedOp& staged, uint64_t offset, uint64_t length,
                         std::shared_ptr<Session> session, std::shared_ptr<StagingPool> local_pool) {
  const PlannedOp& op = (*planned_)[staged.index];
  const size_t slot = &staged - ops_.data();
  const std::string& provider = staged.peer.provider;
  const absl::Time deadline = transfer_->deadline();

  // Resources for this chunk: one of our bounce chunks and/or the peer's granted chunk.
  // Ours first: its copy-out then runs while we wait for the peer's grant, so a chunk is
  // ready to go on the wire the moment a credit comes back.
  std::optional<uint32_t> bounce;
  if (local_pool) {
    bounce = local_pool->pool().Acquire(deadline);
    if (!bounce) return UnitDone(slot, 0, absl::DeadlineExceededError("no free bounce chunk before the deadline"));
  }
  auto release = [local_pool, bounce]() {
    if (local_pool && bounce) local_pool->pool().Release(*bounce);
  };
  // The local side of the wire stage: our bounce chunk, or the buffer itself.
  fabric::LocalSlice local;
  if (bounce) {
    local = {local_pool->region(*bounce, provider), 0, length};
  } else {
    local = {op.local->region(provider), op.local_offset + offset, length};
  }
  char* gpu_bytes = op.local->data() + op.local_offset + offset;
  memory::GpuDevice* gpu = op.local->gpu() >= 0 ? &deps_.gpus->device(op.local->gpu()) : nullptr;
  const uint64_t token = slot;  // echoed in StageCopied
  fabric::Endpoint& endpoint = *staged.peer.endpoint;
  // Where the wire stage writes to without a grant (READ: reads from).
  fabric::RemoteSlice direct;
  if (session == nullptr) {
    const auto& key = op.remote->keys.at(provider);
    direct = {key.address + op.remote_offset + offset, key.key};
  }

  if (op.type == ferry::v1::WRITE) {
    // The wire stage starts when both the copy-out (if any) and the grant (if any) are in:
    // whichever arrives last posts the WRITE.
    struct Gate {
      absl::Mutex mu;
      int waiting = 2;
      absl::Status status;
      std::optional<ferry::v1::StageGrant> grant;
    };
    auto gate = std::make_shared<Gate>();
    auto arrive = [this, self = shared_from_this(), gate, &endpoint, local, direct, slot, length,
                   release, session, token,
                   remote_offset = op.remote_offset + offset](absl::Status s) {
      {
        absl::MutexLock lock(&gate->mu);
        if (!s.ok() && gate->status.ok()) gate->status = s;
        if (--gate->waiting > 0) return;
      }
      if (!gate->status.ok()) {
        release();
        return UnitDone(slot, 0, gate->status);
      }
      fabric::RemoteSlice remote = direct;
      if (gate->grant) remote = {gate->grant->address(), gate->grant->key()};
      uint64_t grant = gate->grant ? gate->grant->grant() : 0;
      auto wire_done = [this, self, slot, length, release, session, grant, token,
                        remote_offset](absl::Status s) {
        release();
        if (!s.ok() || session == nullptr) return UnitDone(slot, s.ok() ? length : 0, s);
        // The bytes are in the peer's chunk; it copies them in and reports (OnCopied).
        if (!session->Report(grant, remote_offset, length, token)) {
          UnitDone(slot, 0, absl::UnavailableError("Stage: the peer closed the call"));
        }
      };
      absl::Status posted = endpoint.PostWrite(local, remote, std::move(wire_done));
      if (!posted.ok()) {
        release();
        UnitDone(slot, 0, posted);
      }
    };
    if (bounce) {
      // Copy-out: GPU -> our bounce chunk.
      absl::Status s = gpu->CopyToHost(local_pool->pool().chunk_data(*bounce), gpu_bytes, length, arrive);
      if (!s.ok()) arrive(s);
    } else {
      arrive(absl::OkStatus());
    }
    if (session == nullptr) {
      arrive(absl::OkStatus());
      return;
    }
    auto g = session->TakeGrant(deadline);
    if (g.ok()) {
      absl::MutexLock lock(&gate->mu);
      gate->grant = *g;
    }
    arrive(g.status());
    return;
  }
  // READ. After the wire stage, a staged local GPU copies the chunk in.
  auto landed = [this, self = shared_from_this(), gpu, gpu_bytes, length, slot, release,
                 chunk = bounce ? local_pool->pool().chunk_data(*bounce) : nullptr](absl::Status s) {
    if (!s.ok() || chunk == nullptr) {
      release();
      return UnitDone(slot, s.ok() ? length : 0, s);
    }
    absl::Status c = gpu->CopyToDevice(gpu_bytes, chunk, length,
                                       [this, self, slot, length, release](absl::Status s) {
                                         release();
                                         UnitDone(slot, s.ok() ? length : 0, s);
                                       });
    if (!c.ok()) {
      release();
      UnitDone(slot, 0, c);
    }
  };
  if (session == nullptr) {
    absl::Status posted = endpoint.PostRead(local, direct, landed);
    if (!posted.ok()) landed(posted);
    return;
  }
  // The peer stages its GPU: it copies the range out into a chunk and says when it is ready.
  // The callback runs on the call's reader thread, so it holds the call by a plain pointer;
  // the READ's completion, on a fabric thread, keeps it alive by reference count.
  Session* call = session.get();
  session->Fetch(op.remote_offset + offset, length,
                 [self = shared_from_this(), &endpoint, local, landed,
                  call](absl::StatusOr<ferry::v1::StageGrant> ready) {
                   if (!ready.ok()) return landed(ready.status());
                   uint64_t grant = ready->grant();
                   absl::Status posted = endpoint.PostRead(
                       local, {ready->address(), ready->key()},
                       [keep = call->shared_from_this(), grant, landed](absl::Status s) {
                         keep->Release(grant);
                         landed(s);
                       });
                   if (!posted.ok()) {
                     call->Release(grant);
                     landed(posted);
                   }
                 });
}

void StageSender::OnCopied(uint64_t token, uint64_t bytes) {
  if (token >= ops_.size()) {
    spdlog::error("transfer {}: Stage reported an unknown op {}", transfer_->id(), token);
    return;
  }
  UnitDone(static_cast<size_t>(token), bytes, absl::OkStatus());
}

void StageSender::OnSessionFailed(const Session* session, const absl::Status& why) {
  std::vector<size_t> victims;
  {
    absl::MutexLock lock(&mu_);
    for (size_t slot = 0; slot < ops_.size(); ++slot) {
      if (session_of_[slot] != session || failed_[slot] || units_in_flight_[slot] == 0) continue;
      // Their copy-ins will never be reported: give their window slots back now.
      in_flight_ -= units_in_flight_[slot];
      units_in_flight_[slot] = 0;
      victims.push_back(slot);
    }
  }
  for (size_t slot : victims) UnitDone(slot, 0, why, /*launched=*/false);
}

void StageSender::UnitDone(size_t slot, uint64_t bytes, const absl::Status& status, bool launched) {
  const StagedOp& staged = ops_[slot];
  const PlannedOp& op = (*planned_)[staged.index];
  bool settle = false;
  absl::Status verdict = status;
  uint32_t chunks = 0;
  {
    absl::MutexLock lock(&mu_);
    if (launched && units_in_flight_[slot] > 0) {
      --units_in_flight_[slot];
      --in_flight_;
    }
    if (failed_[slot]) return;
    if (!status.ok()) {
      failed_[slot] = true;
      settle = true;
    } else {
      done_bytes_[slot] += bytes;
      ++chunks_[slot];
      settle = done_bytes_[slot] >= op.length;
    }
    chunks = chunks_[slot];
  }
  if (!settle) return;
  std::vector<ferry::v1::Leg> legs = transfer_->LegsOf(staged.index);
  for (auto& leg : legs) {
    if (leg.mode() == "staged") leg.set_chunks(chunks);
  }
  transfer_->SetLegs(staged.index, std::move(legs));
  deps_.settle(staged.index, verdict, staged.peer.provider);
}

}  // namespace ferry::server
