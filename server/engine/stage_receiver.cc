#include "server/engine/stage_receiver.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/grpc_status.h"
#include "spdlog/spdlog.h"

namespace ferry::server {
namespace {

class StageCall {
 public:
  StageCall(grpc::ServerContext* ctx,
            grpc::ServerReaderWriter<ferry::v1::StageReply, ferry::v1::StageRequest>* stream)
      : ctx_(ctx), stream_(stream) {}

  grpc::Status Serve(const StageReceiverDeps& deps) {
    ferry::v1::StageRequest first;
    if (!stream_->Read(&first) || !first.has_open()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "open: the first message must be StageOpen");
    }
    const auto& open = first.open();
    auto buffer = deps.buffers->FindByName(open.buffer());
    if (!buffer.ok()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("open.buffer: no buffer named '", open.buffer(), "'"));
    }
    buffer_ = *buffer;
    if (buffer_->gpu() < 0) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrCat("open.buffer: '", open.buffer(), "' is host memory; write it directly"));
    }
    gpu_ = &deps.gpus->device(buffer_->gpu());
    provider_ = open.provider();
    auto snapshot = deps.policies->Current();
    LegPlan leg = deps.plan(*buffer_, *snapshot, provider_);
    auto pool = deps.bounce->Get(leg.bounce_numa, *snapshot);
    if (!pool.ok()) return ToGrpcStatus(pool.status());
    pool_ = *pool;
    absl::Time deadline = absl::FromChrono(ctx_->deadline());
    if (open.read()) return ServeRead(deadline);
    // Our memory bound, whatever the writer asked for.
    const uint32_t depth = std::max<uint32_t>(1, std::min(open.depth(), snapshot->policy.staging_depth));
    for (uint32_t i = 0; i < depth; ++i) {
      auto chunk = pool_->pool().Acquire(deadline);
      if (!chunk) break;
      if (!Grant(*chunk)) return Abort("the writer went away");
    }
    {
      absl::MutexLock lock(&mu_);
      if (granted_.empty()) {
        return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "no bounce chunk came free before the deadline");
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
    hello.mutable_grant()->set_length(pool_->pool().chunk_bytes());
    {
      absl::MutexLock write_lock(&write_mu_);
      if (!stream_->Write(hello)) return Abort("the reader went away");
    }
    ferry::v1::StageRequest req;
    absl::Status failure;
    while (failure.ok() && stream_->Read(&req)) {
      if (req.has_close()) break;
      if (req.has_fetch()) {
        failure = CopyOut(req.fetch(), deadline);
      } else if (req.kind_case() == ferry::v1::StageRequest::kRelease) {
        failure = ReleaseGrant(req.release());
      } else {
        failure = absl::InvalidArgumentError("expected fetch, release or close");
      }
    }
    return Finish(failure);
  }

  absl::Status CopyOut(const ferry::v1::StageFetch& f, absl::Time deadline) {
    if (f.length() == 0 || f.length() > pool_->pool().chunk_bytes() || f.offset() > buffer_->size() ||
        f.length() > buffer_->size() - f.offset()) {
      return absl::OutOfRangeError(absl::StrCat("fetch: [", f.offset(), ", +", f.length(), ") is outside '",
                                                buffer_->name(), "' (", buffer_->size(), " bytes) or a chunk"));
    }
    auto chunk = pool_->pool().Acquire(deadline);
    if (!chunk) return absl::DeadlineExceededError("no bounce chunk came free before the deadline");
    uint64_t grant;
    {
      absl::MutexLock lock(&mu_);
      grant = next_grant_++;
      granted_[grant] = *chunk;
      ++copies_;
    }
    uint32_t c = *chunk;
    uint64_t token = f.token(), length = f.length();
    absl::Status s = gpu_->CopyToHost(pool_->pool().chunk_data(c), buffer_->data() + f.offset(), length,
                                      [this, c, grant, token, length](absl::Status s) {
                                        CopiedOut(c, grant, token, length, s);
                                      });
    if (!s.ok()) {
      absl::MutexLock lock(&mu_);
      --copies_;
    }
    return s;
  }

  // Runs on the GPU's copy thread: the chunk is ready for the reader.
  void CopiedOut(uint32_t chunk, uint64_t grant, uint64_t token, uint64_t length, absl::Status s) {
    if (s.ok()) {
      const fabric::MemoryRegion* region = pool_->region(chunk, provider_);
      ferry::v1::StageReply reply;
      auto* g = reply.mutable_grant();
      g->set_grant(grant);
      g->set_address(region ? region->remote_address() : 0);
      g->set_key(region ? region->key() : 0);
      g->set_length(length);
      g->set_token(token);
      absl::MutexLock write_lock(&write_mu_);
      stream_->Write(reply);
    }
    absl::MutexLock lock(&mu_);
    if (!s.ok() && copy_error_.ok()) copy_error_ = s;
    --copies_;
  }

  absl::Status ReleaseGrant(uint64_t grant) {
    absl::MutexLock lock(&mu_);
    auto it = granted_.find(grant);
    if (it == granted_.end()) return absl::InvalidArgumentError(absl::StrCat("release: ", grant, " is not granted"));
    pool_->pool().Release(it->second);
    granted_.erase(it);
    return absl::OkStatus();
  }

  // Waits for every copy, gives back what is still granted, and sends the verdict.
  grpc::Status Finish(absl::Status failure) {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return copies_ == 0; };
    mu_.Await(absl::Condition(&idle));
    for (auto& [grant, chunk] : granted_) pool_->pool().Release(chunk);
    granted_.clear();
    if (failure.ok()) failure = copy_error_;
    ferry::v1::StageReply done;
    done.mutable_done()->set_code(static_cast<int>(failure.code()));
    done.mutable_done()->set_message(std::string(failure.message()));
    {
      absl::MutexLock write_lock(&write_mu_);
      stream_->Write(done);
    }
    return grpc::Status::OK;
  }

  // Sends a grant for `chunk`; false when the writer is gone.
  bool Grant(uint32_t chunk) {
    const fabric::MemoryRegion* region = pool_->region(chunk, provider_);
    uint64_t id;
    {
      absl::MutexLock lock(&mu_);
      id = next_grant_++;
      granted_[id] = chunk;
    }
    ferry::v1::StageReply reply;
    auto* g = reply.mutable_grant();
    g->set_grant(id);
    g->set_address(region ? region->remote_address() : 0);
    g->set_key(region ? region->key() : 0);
    g->set_length(pool_->pool().chunk_bytes());
    absl::MutexLock write_lock(&write_mu_);
    return stream_->Write(reply);
  }

  absl::Status CopyIn(const ferry::v1::StageChunk& c) {
    uint32_t chunk;
    {
      absl::MutexLock lock(&mu_);
      auto it = granted_.find(c.grant());
      if (it == granted_.end()) return absl::InvalidArgumentError(absl::StrCat("chunk.grant: ", c.grant(), " is not granted"));
      chunk = it->second;
      granted_.erase(it);
      ++copies_;
    }
    if (c.length() > pool_->pool().chunk_bytes() || c.offset() > buffer_->size() ||
        c.length() > buffer_->size() - c.offset()) {
      absl::MutexLock lock(&mu_);
      --copies_;
      pool_->pool().Release(chunk);
      return absl::OutOfRangeError(absl::StrCat("chunk: [", c.offset(), ", +", c.length(), ") is outside '",
                                                buffer_->name(), "' (", buffer_->size(), " bytes)"));
    }
    uint64_t grant = c.grant(), token = c.token(), length = c.length();
    absl::Status s = gpu_->CopyToDevice(buffer_->data() + c.offset(), pool_->pool().chunk_data(chunk), length,
                                        [this, chunk, grant, token, length](absl::Status s) {
                                          Copied(chunk, grant, token, length, s);
                                        });
    if (!s.ok()) {
      absl::MutexLock lock(&mu_);
      --copies_;
      pool_->pool().Release(chunk);
    }
    return s;
  }

  // Runs on the GPU's copy thread.
  void Copied(uint32_t chunk, uint64_t grant, uint64_t token, uint64_t length, absl::Status s) {
    if (s.ok()) {
      ferry::v1::StageReply reply;
      auto* c = reply.mutable_copied();
      c->set_grant(grant);
      c->set_token(token);
      c->set_bytes(length);
      absl::MutexLock write_lock(&write_mu_);
      stream_->Write(reply);
    }
    bool regrant;
    {
      absl::MutexLock lock(&mu_);
      if (!s.ok() && copy_error_.ok()) copy_error_ = s;
      regrant = !closing_ && s.ok();
      if (!regrant) pool_->pool().Release(chunk);
    }
    // The chunk is free again: it becomes the writer's next credit.
    if (regrant) Grant(chunk);
    absl::MutexLock lock(&mu_);
    --copies_;
  }

  grpc::Status Abort(const std::string& why) {
    absl::MutexLock lock(&mu_);
    for (auto& [grant, chunk] : granted_) pool_->pool().Release(chunk);
    granted_.clear();
    return grpc::Status(grpc::StatusCode::CANCELLED, why);
  }

  grpc::ServerContext* ctx_;
  grpc::ServerReaderWriter<ferry::v1::StageReply, ferry::v1::StageRequest>* stream_;
  std::shared_ptr<Buffer> buffer_;
  memory::GpuDevice* gpu_ = nullptr;
  std::string provider_;
  std::shared_ptr<StagingPool> pool_;
  absl::Mutex write_mu_;  // one Write at a time on the stream
  absl::Mutex mu_;
  std::map<uint64_t, uint32_t> granted_ ABSL_GUARDED_BY(mu_);  // grant -> chunk
  uint64_t next_grant_ ABSL_GUARDED_BY(mu_) = 1;
  int copies_ ABSL_GUARDED_BY(mu_) = 0;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status copy_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

grpc::Status ServeStage(grpc::ServerContext* ctx,
                        grpc::ServerReaderWriter<ferry::v1::StageReply, ferry::v1::StageRequest>* stream,
                        const StageReceiverDeps& deps) {
  StageCall call(ctx, stream);
  return call.Serve(deps);
}

}  // namespace ferry::server
