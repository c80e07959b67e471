#include "server/api/stage_service.h"

#include <algorithm>
#include <deque>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/grpc_status.h"
#include "base/status_macros.h"
#include "server/peers/caller_identity.h"
#include "spdlog/spdlog.h"

namespace ferry::server {
namespace {

using StageStream = grpc::ServerReaderWriter<ferry::v1::StageReply, ferry::v1::StageRequest>;

class StageCallServer {
 public:
  StageCallServer(grpc::ServerContext* ctx, StageStream* stream) : ctx_(ctx), stream_(stream) {}
  ~StageCallServer() { StopFetcher(); }

  grpc::Status Serve(const StageServiceDeps& deps) {
    ferry::v1::StageRequest first;
    if (!stream_->Read(&first) || !first.has_open()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "open: the first message must be StageOpen");
    }
    const auto& open = first.open();
    // Who opens the stream is the certificate's node, not StageOpen.from_node.
    absl::StatusOr<std::string> caller = CallerNode(*ctx_, open.from_node());
    if (!caller.ok()) return ToGrpcStatus(caller.status());
    caller_ = *caller;
    auto buffer = deps.buffers->FindByName(open.buffer());
    // Not exported to the caller: the same answer as no such buffer (as ResolveBuffer).
    if (!buffer.ok() || !(*buffer)->ExportedTo(caller_)) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          absl::StrCat("open.buffer: no buffer named '", open.buffer(), "'"));
    }
    buffer_ = *buffer;
    if (buffer_->gpu() < 0) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrCat("open.buffer: '", open.buffer(),
                                       "' is host memory; write it directly"));
    }
    bool found = false;
    for (const fabric::RailId& rail : deps.rails) {
      if (rail.provider == open.provider() && (open.nic().empty() || rail.nic == open.nic())) {
        rail_ = rail;
        found = true;
        break;
      }
    }
    if (!found) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrCat("open.provider: this agent does not run '",
                                       open.provider(), "'"));
    }
    gpu_ = &deps.gpus->device(buffer_->gpu());
    auto snapshot = deps.policies->Current();
    auto pool = deps.bounce->Get(deps.bounce_numa(*buffer_, *snapshot, rail_), *snapshot);
    if (!pool.ok()) return ToGrpcStatus(pool.status());
    pool_ = *pool;
    absl::Time deadline = absl::FromChrono(ctx_->deadline());
    if (open.read()) return ServeRead(deadline);
    // Our memory bound, whatever the writer asked for.
    const uint32_t depth =
        std::max<uint32_t>(1, std::min(open.depth(), snapshot->policy.staging_depth));
    for (uint32_t i = 0; i < depth; ++i) {
      ChunkLease chunk = pool_->Acquire(deadline);
      if (!chunk) break;
      if (!Grant(std::move(chunk))) return Abort("the writer went away");
    }
    {
      absl::MutexLock lock(&mu_);
      if (granted_.empty()) {
        return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                            "no bounce chunk came free before the deadline");
      }
    }

    ferry::v1::StageRequest req;
    absl::Status failure;
    while (failure.ok() && stream_->Read(&req)) {
      if (req.has_close()) break;
      if (!req.has_chunk()) {
        failure = absl::InvalidArgumentError("expected a chunk or close");
        break;
      }
      failure = CopyIn(req.chunk());
    }
    return Finish(failure);
  }

 private:
  // Read mode: the reader paces us with its fetches (at most `depth` outstanding).
  grpc::Status ServeRead(absl::Time deadline) {
    ferry::v1::StageReply hello;
    hello.mutable_grant()->set_length(pool_->chunk_bytes());
    if (!Write(hello)) return Abort("the reader went away");
    deadline_ = deadline;
    ferry::v1::StageRequest req;
    absl::Status failure;
    while (failure.ok() && stream_->Read(&req)) {
      if (req.has_close()) break;
      if (req.has_fetch()) {
        failure = Fetch(req.fetch());
      } else if (req.kind_case() == ferry::v1::StageRequest::kRelease) {
        failure = ReleaseGrant(req.release());
      } else {
        failure = absl::InvalidArgumentError("expected fetch, release or close");
      }
    }
    return Finish(failure);
  }

  absl::Status CheckRange(const char* field, uint64_t offset, uint64_t length) const {
    if (length <= pool_->chunk_bytes() && offset <= buffer_->size() &&
        length <= buffer_->size() - offset) {
      return absl::OkStatus();
    }
    return absl::OutOfRangeError(absl::StrCat(field, ": [", offset, ", +", length,
                                              ") is outside '", buffer_->name(), "' (",
                                              buffer_->size(), " bytes) or a chunk"));
  }

  // A fetch is served at once when a chunk is free; otherwise it waits in line for the
  // fetcher thread while this one goes on reading the stream. Blocking here instead would
  // also hold up the reader's releases queued behind the fetch, and with several readers
  // sharing the pool, each waiting for a chunk that only its own unread releases would free,
  // no stream moves again (4 staged READs of 512 blocks each between two simulated GPUs
  // stopped until their deadline that way).
  absl::Status Fetch(const ferry::v1::StageFetch& f) {
    if (f.length() == 0) return absl::OutOfRangeError("fetch.length: must be positive");
    RETURN_IF_ERROR(CheckRange("fetch", f.offset(), f.length()));
    {
      absl::MutexLock lock(&mu_);
      if (!waiting_.empty()) {  // in line behind the others
        waiting_.push_back(f);
        return absl::OkStatus();
      }
    }
    ChunkLease chunk = pool_->Acquire(absl::Now());
    if (chunk) return CopyOut(f, std::move(chunk));
    absl::MutexLock lock(&mu_);
    waiting_.push_back(f);
    if (!fetcher_.joinable()) fetcher_ = std::thread([this] { ServeWaiting(); });
    return absl::OkStatus();
  }

  // The fetcher thread: the waiting fetches in order, each as a chunk comes free.
  void ServeWaiting() {
    while (true) {
      ferry::v1::StageFetch f;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
          return closing_ || !waiting_.empty();
        };
        mu_.Await(absl::Condition(&ready));
        if (closing_) return;
        f = waiting_.front();
      }
      ChunkLease chunk;
      // In slices, so that the call's end is noticed while the pool is empty.
      while (!chunk && absl::Now() < deadline_) {
        chunk = pool_->Acquire(std::min(deadline_, absl::Now() + absl::Milliseconds(100)));
        absl::MutexLock lock(&mu_);
        if (closing_) return;
      }
      absl::Status s = chunk ? CopyOut(f, std::move(chunk))
                             : absl::DeadlineExceededError(
                                   "no bounce chunk came free before the deadline");
      absl::MutexLock lock(&mu_);
      waiting_.pop_front();
      if (!s.ok()) {
        if (copy_error_.ok()) copy_error_ = s;
        waiting_.clear();
        // The fetches dropped here are never answered: end the call, so that the reader
        // learns now rather than at its deadline (and no later fetch waits for this thread).
        ctx_->TryCancel();
        return;
      }
    }
  }

  // Stops the fetcher thread (fetches still waiting are dropped: the call is ending).
  void StopFetcher() {
    {
      absl::MutexLock lock(&mu_);
      closing_ = true;
    }
    if (fetcher_.joinable()) fetcher_.join();
  }

  absl::Status CopyOut(const ferry::v1::StageFetch& f, ChunkLease chunk) {
    char* host = chunk.data();
    {
      absl::MutexLock lock(&mu_);
      ++copies_;
    }
    uint64_t token = f.token(), length = f.length();
    absl::Status s = gpu_->CopyToHost(
        host, buffer_->data() + f.offset(), length,
        [this, chunk = std::move(chunk), token, length](absl::Status s) mutable {
          CopiedOut(std::move(chunk), token, length, s);
        });
    if (!s.ok()) CopyEnded(absl::OkStatus());  // refused now: the chunk went with the callback
    return s;
  }

  // Runs on the GPU's copy thread: the chunk is ready for the reader.
  void CopiedOut(ChunkLease chunk, uint64_t token, uint64_t length, const absl::Status& s) {
    if (s.ok()) {
      const fabric::MemoryRegion* region = chunk.region(rail_);
      ferry::v1::StageReply reply;
      auto* g = reply.mutable_grant();
      g->set_address(region ? region->remote_address() : 0);
      g->set_key(region ? region->key() : 0);
      g->set_length(length);
      g->set_token(token);
      {
        absl::MutexLock lock(&mu_);
        uint64_t grant = next_grant_++;
        g->set_grant(grant);
        granted_.emplace(grant, std::move(chunk));
      }
      Write(reply);
    }
    CopyEnded(s);
  }

  absl::Status ReleaseGrant(uint64_t grant) {
    absl::MutexLock lock(&mu_);
    if (granted_.erase(grant) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("release: ", grant, " is not granted"));
    }
    return absl::OkStatus();
  }

  // Waits for every copy, gives back what is still granted, and sends the verdict.
  grpc::Status Finish(absl::Status failure) {
    StopFetcher();
    std::map<uint64_t, ChunkLease> granted;
    {
      absl::MutexLock lock(&mu_);
      closing_ = true;
      auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return copies_ == 0; };
      mu_.Await(absl::Condition(&idle));
      granted.swap(granted_);
      if (failure.ok()) failure = copy_error_;
    }
    ferry::v1::StageReply done;
    done.mutable_done()->set_code(static_cast<int>(failure.code()));
    done.mutable_done()->set_message(std::string(failure.message()));
    Write(done);
    return grpc::Status::OK;
  }

  // Grants `chunk` to the writer as a credit; false when the writer is gone.
  bool Grant(ChunkLease chunk) {
    const fabric::MemoryRegion* region = chunk.region(rail_);
    ferry::v1::StageReply reply;
    auto* g = reply.mutable_grant();
    g->set_address(region ? region->remote_address() : 0);
    g->set_key(region ? region->key() : 0);
    g->set_length(pool_->chunk_bytes());
    {
      absl::MutexLock lock(&mu_);
      uint64_t id = next_grant_++;
      g->set_grant(id);
      granted_.emplace(id, std::move(chunk));
    }
    return Write(reply);
  }

  absl::Status CopyIn(const ferry::v1::StageChunk& c) {
    ChunkLease chunk;
    {
      absl::MutexLock lock(&mu_);
      auto it = granted_.find(c.grant());
      if (it == granted_.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("chunk.grant: ", c.grant(), " is not granted"));
      }
      chunk = std::move(it->second);
      granted_.erase(it);
    }
    // A bad range drops the chunk here (the call fails: nothing is granted again).
    RETURN_IF_ERROR(CheckRange("chunk", c.offset(), c.length()));
    {
      absl::MutexLock lock(&mu_);
      ++copies_;
    }
    const char* host = chunk.data();
    uint64_t grant = c.grant(), token = c.token(), length = c.length();
    absl::Status s = gpu_->CopyToDevice(
        buffer_->data() + c.offset(), host, length,
        [this, chunk = std::move(chunk), grant, token, length](absl::Status s) mutable {
          Copied(std::move(chunk), grant, token, length, s);
        });
    if (!s.ok()) CopyEnded(absl::OkStatus());
    return s;
  }

  // Runs on the GPU's copy thread.
  void Copied(ChunkLease chunk, uint64_t grant, uint64_t token, uint64_t length,
              const absl::Status& s) {
    if (s.ok()) {
      ferry::v1::StageReply reply;
      auto* c = reply.mutable_copied();
      c->set_grant(grant);
      c->set_token(token);
      c->set_bytes(length);
      Write(reply);
    }
    bool regrant;
    {
      absl::MutexLock lock(&mu_);
      regrant = !closing_ && s.ok();
    }
    // The chunk is free again: it becomes the writer's next credit (or goes back now).
    if (regrant) Grant(std::move(chunk));
    CopyEnded(s);
  }

  // A copy started with ++copies_ is over.
  void CopyEnded(const absl::Status& s) {
    absl::MutexLock lock(&mu_);
    if (!s.ok() && copy_error_.ok()) copy_error_ = s;
    --copies_;
  }

  bool Write(const ferry::v1::StageReply& reply) {
    absl::MutexLock lock(&write_mu_);
    return stream_->Write(reply);
  }

  grpc::Status Abort(const std::string& why) {
    StopFetcher();
    std::map<uint64_t, ChunkLease> granted;
    {
      absl::MutexLock lock(&mu_);
      granted.swap(granted_);
    }
    return grpc::Status(grpc::StatusCode::CANCELLED, why);
  }

  grpc::ServerContext* ctx_;
  std::string caller_;  // the node on the other end
  StageStream* stream_;
  std::shared_ptr<Buffer> buffer_;
  memory::GpuDevice* gpu_ = nullptr;
  fabric::RailId rail_;
  std::shared_ptr<StagingPool> pool_;
  absl::Mutex write_mu_;  // one Write at a time on the stream
  absl::Mutex mu_;
  std::map<uint64_t, ChunkLease> granted_ ABSL_GUARDED_BY(mu_);  // grant -> chunk
  uint64_t next_grant_ ABSL_GUARDED_BY(mu_) = 1;
  int copies_ ABSL_GUARDED_BY(mu_) = 0;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status copy_error_ ABSL_GUARDED_BY(mu_);
  // Read mode: fetches that found no free chunk, in order, and the thread that serves them.
  std::deque<ferry::v1::StageFetch> waiting_ ABSL_GUARDED_BY(mu_);
  std::thread fetcher_;
  absl::Time deadline_;
};

}  // namespace

grpc::Status ServeStage(grpc::ServerContext* ctx, StageStream* stream,
                        const StageServiceDeps& deps) {
  StageCallServer call(ctx, stream);
  return call.Serve(deps);
}

}  // namespace ferry::server
