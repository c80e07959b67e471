#include "server/peers/stage_client.h"

#include <deque>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "ferry/v1/peer.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace ferry::server {
namespace {

StageGrant FromProto(const ferry::v1::StageGrant& g) {
  return {g.grant(), g.address(), g.key(), g.length(), g.token()};
}

// One Stage call to a peer's buffer: the grants it sent, the copy-ins it reported.
class GrpcStageCall final : public StageCall {
 public:
  GrpcStageCall(std::shared_ptr<ferry::v1::Peer::Stub> stub, std::string self, StageCallSpec spec,
                StageEvents* events)
      : stub_(std::move(stub)), self_(std::move(self)), spec_(std::move(spec)), events_(events),
        node_(spec_.node), read_(spec_.read) {}

  // The reader thread holds the call while it runs, so the last reference goes either here
  // on another thread once the reader is done, or with the reader itself, at its very end.
  // The reader joins the writer before it ends; a writer is left only if the reader never ran.
  ~GrpcStageCall() override {
    StopWriter();
    if (writer_.joinable()) writer_.join();
    if (!reader_.joinable()) return;
    if (reader_.get_id() == std::this_thread::get_id()) {
      reader_.detach();
    } else {
      reader_.join();
    }
  }

  const StageCallSpec& spec() const override { return spec_; }
  void Cancel() override { ctx_.TryCancel(); }

  absl::Status Open() override {
    const absl::Time deadline = spec_.deadline;
    ctx_.set_deadline(absl::ToChronoTime(deadline));
    stream_ = stub_->Stage(&ctx_);
    ferry::v1::StageRequest open;
    open.mutable_open()->set_buffer(spec_.buffer);
    open.mutable_open()->set_from_node(self_);
    open.mutable_open()->set_chunk_bytes(spec_.chunk_bytes);
    open.mutable_open()->set_depth(spec_.depth);
    open.mutable_open()->set_provider(spec_.provider);
    open.mutable_open()->set_nic(spec_.nic);
    open.mutable_open()->set_read(read_);
    if (!stream_->Write(open)) return Finish("Stage: the peer closed the call");
    writer_ = std::thread([this] { WriteLoop(); });
    reader_ = std::thread([self = std::static_pointer_cast<GrpcStageCall>(shared_from_this())] {
      self->Read();
    });
    // The first grant tells the chunk size the peer uses.
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(AwaitGrant(deadline, "no grant"));
    grant_length_ = grants_.front().length;
    // In read mode the first reply only says the chunk size.
    if (read_) grants_.clear();
    return absl::OkStatus();
  }

  uint64_t grant_length() const override { return grant_length_; }

  void Fetch(uint64_t offset, uint64_t length, Ready ready) override {
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
    Send(std::move(req));  // a failed write ends the call; the reader then fails the fetch
  }

  void Release(uint64_t grant) override {
    ferry::v1::StageRequest req;
    req.set_release(grant);
    Send(std::move(req));
  }

  absl::StatusOr<StageGrant> TakeGrant(absl::Time deadline) override {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(AwaitGrant(deadline, "no free chunk"));
    auto g = grants_.front();
    grants_.pop_front();
    return g;
  }

  bool Report(uint64_t grant, uint64_t offset, uint64_t length, uint64_t token) override {
    ferry::v1::StageRequest req;
    auto* c = req.mutable_chunk();
    c->set_grant(grant);
    c->set_offset(offset);
    c->set_length(length);
    c->set_token(token);
    return Send(std::move(req));
  }

  absl::Status Close(absl::Time deadline) override {
    ferry::v1::StageRequest req;
    req.set_close(true);
    Send(std::move(req));  // the writer then half-closes the stream
    absl::MutexLock lock(&mu_);
    auto ended = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return ended_; };
    mu_.AwaitWithDeadline(absl::Condition(&ended), deadline);
    return ended_ ? verdict_
                  : absl::DeadlineExceededError("Stage: no verdict before the deadline");
  }

 private:
  // Queues `req` for the writer thread, so that no caller blocks on the stream: Report and
  // Release run on fabric completion threads, which must never wait for a peer. False once
  // the call can take no more (it ended, or a write failed).
  bool Send(ferry::v1::StageRequest req) {
    absl::MutexLock lock(&out_mu_);
    if (out_closed_) return false;
    outbox_.push_back(std::move(req));
    return true;
  }

  // The writer thread: writes queued messages in order; after `close`, half-closes the
  // stream. A failed write means the call ended (the reader sees it and fails what waits).
  void WriteLoop() {
    for (;;) {
      ferry::v1::StageRequest req;
      {
        absl::MutexLock lock(&out_mu_);
        auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(out_mu_) {
          return !outbox_.empty() || out_closed_;
        };
        out_mu_.Await(absl::Condition(&ready));
        if (outbox_.empty()) return;
        req = std::move(outbox_.front());
        outbox_.pop_front();
      }
      const bool close = req.kind_case() == ferry::v1::StageRequest::kClose;
      const bool written = stream_->Write(req);
      if (written && close) stream_->WritesDone();
      if (!written || close) return StopWriter();
    }
  }

  void StopWriter() {
    absl::MutexLock lock(&out_mu_);
    out_closed_ = true;
    outbox_.clear();
  }

  // Waits for a grant in the queue; why none will come (the call ended, or `deadline`).
  absl::Status AwaitGrant(absl::Time deadline, const char* what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !grants_.empty() || ended_; };
    if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
      return absl::DeadlineExceededError(
          absl::StrCat("Stage to ", node_, ": ", what, " before the deadline"));
    }
    return grants_.empty() ? error_ : absl::OkStatus();
  }

  void Read() {
    ferry::v1::StageReply reply;
    absl::Status verdict =
        absl::UnavailableError(absl::StrCat("Stage to ", node_, " ended early"));
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
        if (ready) std::move(ready)(FromProto(reply.grant()));
      } else if (reply.has_grant()) {
        absl::MutexLock lock(&mu_);
        grants_.push_back(FromProto(reply.grant()));
      } else if (reply.has_copied()) {
        events_->OnCopied(reply.copied().token(), reply.copied().bytes());
      } else if (reply.has_done()) {
        verdict = absl::Status(static_cast<absl::StatusCode>(reply.done().code()),
                               reply.done().message());
      }
    }
    // Nothing more goes out on an ended call; the writer leaves before Finish, which must not
    // run beside a Write.
    StopWriter();
    writer_.join();
    absl::Status end = Finish("Stage");
    if (!end.ok() && verdict.code() == absl::StatusCode::kUnavailable) verdict = end;
    if (!verdict.ok()) events_->OnCallFailed(this, verdict);
    absl::flat_hash_map<uint64_t, Ready> orphans;
    {
      absl::MutexLock lock(&mu_);
      ended_ = true;
      error_ = verdict.ok()
                   ? absl::UnavailableError(absl::StrCat("Stage to ", node_, " has ended"))
                   : verdict;
      verdict_ = verdict;
      orphans.swap(fetches_);
    }
    // Fetches that will never be answered still give back what they hold.
    for (auto& [token, ready] : orphans) std::move(ready)(error_for_orphans(verdict));
  }

  absl::Status error_for_orphans(const absl::Status& verdict) const {
    return verdict.ok() ? absl::UnavailableError(absl::StrCat(
                              "Stage to ", node_, " ended before a fetch was answered"))
                        : verdict;
  }

  absl::Status Finish(const std::string& what) {
    grpc::Status s = stream_->Finish();
    if (s.ok()) return absl::OkStatus();
    auto code = s.error_code() == grpc::StatusCode::CANCELLED
                    ? absl::StatusCode::kUnavailable
                    : static_cast<absl::StatusCode>(s.error_code());
    return absl::Status(code, absl::StrCat(what, " on ", node_, ": ", s.error_message()));
  }

  const std::shared_ptr<ferry::v1::Peer::Stub> stub_;
  const std::string self_;
  const StageCallSpec spec_;
  StageEvents* const events_;
  const std::string& node_;
  const bool read_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<ferry::v1::StageRequest, ferry::v1::StageReply>> stream_;
  std::thread reader_;
  uint64_t grant_length_ = 0;
  std::thread writer_;
  absl::Mutex out_mu_;
  std::deque<ferry::v1::StageRequest> outbox_ ABSL_GUARDED_BY(out_mu_);
  bool out_closed_ ABSL_GUARDED_BY(out_mu_) = false;
  absl::Mutex mu_;
  std::deque<StageGrant> grants_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Ready> fetches_ ABSL_GUARDED_BY(mu_);  // read mode, by token
  uint64_t next_token_ ABSL_GUARDED_BY(mu_) = 1;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);    // why no more grants will come
  absl::Status verdict_ ABSL_GUARDED_BY(mu_);  // the peer's final word
};

}  // namespace

StageCallFactory GrpcStageCalls(PeerDirectory* peers) {
  return [peers](const StageCallSpec& spec,
                 StageEvents* events) -> absl::StatusOr<std::shared_ptr<StageCall>> {
    ASSIGN_OR_RETURN(std::shared_ptr<ferry::v1::Peer::Stub> stub, peers->Stub(spec.node));
    return std::make_shared<GrpcStageCall>(std::move(stub), peers->self(), spec, events);
  };
}

}  // namespace ferry::server
