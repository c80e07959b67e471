#include "server/engine/local_copy.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include <thread>

#include "absl/synchronization/mutex.h"
#include "base/stream_copy.h"
#include "server/buffers/guarded_touch.h"

namespace ferry::server {
namespace {

// Ops below this many bytes in all, host on both sides, copy on the posting thread: a
// thread of their own would cost more than the copy.
constexpr uint64_t kInlineBytes = 1 << 20;

// The bytes of `local`'s ops when every one is host memory on both sides; nullopt else.
std::optional<uint64_t> HostOnlyBytes(const PlannedBatch& ops, const std::vector<size_t>& local) {
  uint64_t bytes = 0;
  for (size_t i : local) {
    const PlannedOp& op = ops[i];
    if (op.local->gpu() >= 0 || op.here->gpu() >= 0) return std::nullopt;
    bytes += op.length;
  }
  return bytes;
}

bool Shrinkable(const Buffer& buffer) {
  return buffer.memory().shrinkable_range().second > 0;
}

// The op's source and destination, by direction: a WRITE copies ours into the one named
// here, a READ the other way.
struct Ends {
  const Buffer* src;
  uint64_t src_offset;
  const Buffer* dst;
  uint64_t dst_offset;
};
Ends EndsOf(const PlannedOp& op) {
  if (op.type == ferry::v1::READ) return {op.here, op.remote_offset, op.local, op.local_offset};
  return {op.local, op.local_offset, op.here, op.remote_offset};
}

// Waits for a window of GPU copies; the first error any of them reported.
class CopiesInFlight {
 public:
  memory::CopyDone Done() {
    absl::MutexLock lock(&mu_);
    ++pending_;
    return [this](absl::Status s) {
      absl::MutexLock lock(&mu_);
      if (!s.ok() && error_.ok()) error_ = std::move(s);
      --pending_;
    };
  }
  // A copy that was not queued: its Done never runs.
  void NotQueued(absl::Status why) {
    absl::MutexLock lock(&mu_);
    --pending_;
    if (error_.ok()) error_ = std::move(why);
  }
  // Blocks until at most `most` copies are pending; the first error so far.
  absl::Status AwaitAtMost(int most) {
    absl::MutexLock lock(&mu_);
    auto room = [this, most]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return pending_ <= most; };
    mu_.Await(absl::Condition(&room));
    return error_;
  }

 private:
  absl::Mutex mu_;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::string> LocalCopier::EngineFor(const PlannedOp& op, GpuPools* gpus) {
  const Ends e = EndsOf(op);
  const bool src_gpu = e.src->gpu() >= 0, dst_gpu = e.dst->gpu() >= 0;
  if (!src_gpu && !dst_gpu) return std::string("memcpy");
  for (const Buffer* b : {e.src, e.dst}) {
    if (b->gpu() >= 0 && (gpus == nullptr || static_cast<size_t>(b->gpu()) >= gpus->count())) {
      return absl::FailedPreconditionError(
          absl::StrCat("buffer ", b->id(), " is on ", b->device(), ", which this agent has no "
                       "device for"));
    }
    // A copy engine reads or writes host memory with no fault guard (the simulation's copy
    // thread with the CPU, a driver staging pageable memory): a client's file that can
    // shrink would kill it. Such memory meets GPU memory only through the agent's pools.
    if (b->gpu() < 0 && Shrinkable(*b)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "buffer ", b->id(), " is a client's file that is not sealed against shrinking, "
          "and a copy to or from GPU memory cannot be guarded; seal it (F_SEAL_SHRINK) or "
          "copy through a buffer the agent allocated"));
    }
  }
  if (src_gpu && dst_gpu) {
    return gpus->device(e.dst->gpu()).PeerCopyPath(gpus->device(e.src->gpu()));
  }
  return std::string("copy engine");
}

bool LocalCopier::CopiesInline(const PlannedBatch& ops, const std::vector<size_t>& local) {
  const std::optional<uint64_t> bytes = HostOnlyBytes(ops, local);
  return bytes && *bytes <= kInlineBytes;
}

LocalCopier::LocalCopier(std::shared_ptr<Transfer> transfer, PlannedOps planned,
                         std::vector<size_t> ops, GpuPools* gpus, Settle settle)
    : transfer_(std::move(transfer)),
      planned_(std::move(planned)),
      ops_(std::move(ops)),
      gpus_(gpus),
      settle_(std::move(settle)) {}

void LocalCopier::Run() {
  // A batch of many host ops (a KV cache's blocks) in two halves of equal bytes, one on a
  // thread of its own; each op settles where it was copied.
  const uint64_t bytes = HostOnlyBytes(*planned_, ops_).value_or(0);
  if (ops_.size() > 1 && bytes >= kTwoThreadBytes) {
    size_t half = 0;
    for (uint64_t first_half = 0; half < ops_.size() && first_half < bytes / 2; ++half) {
      first_half += (*planned_)[ops_[half]].length;
    }
    std::thread other([this, half] { RunOps(0, half, /*split=*/false); });
    RunOps(half, ops_.size(), /*split=*/false);
    other.join();
    return;
  }
  RunOps(0, ops_.size(), /*split=*/true);
}

void LocalCopier::RunOps(size_t first, size_t last, bool split) {
  for (size_t k = first; k < last; ++k) {
    if (Ended()) return;  // cancelled, past its deadline, or the agent stopping
    settle_(ops_[k], Copy((*planned_)[ops_[k]], split));
  }
}

absl::Status LocalCopier::Copy(const PlannedOp& op, bool split) {
  const Ends e = EndsOf(op);
  if (e.src->gpu() < 0 && e.dst->gpu() < 0) {
    if (!split || op.length < kTwoThreadBytes) {
      return CopyHost(*e.src, e.src_offset, *e.dst, e.dst_offset, op.length);
    }
    // The two halves at once; the op's outcome is the first half's error, else the second's.
    const uint64_t half = op.length / 2;
    absl::Status second;
    std::thread other([&] {
      second = CopyHost(*e.src, e.src_offset + half, *e.dst, e.dst_offset + half,
                        op.length - half);
    });
    absl::Status first = CopyHost(*e.src, e.src_offset, *e.dst, e.dst_offset, half);
    other.join();
    return first.ok() ? second : first;
  }
  return CopyGpu(*e.src, e.src_offset, *e.dst, e.dst_offset, op.length);
}

absl::Status LocalCopier::CopyHost(const Buffer& src, uint64_t src_offset, const Buffer& dst,
                                   uint64_t dst_offset, uint64_t length) {
  for (uint64_t done = 0; done < length;) {
    if (done > 0 && Ended()) return absl::CancelledError("the transfer ended mid-copy");
    const uint64_t n = std::min(kSliceBytes, length - done);
    char* to = dst.data() + dst_offset + done;
    const char* from = src.data() + src_offset + done;
    absl::Status copied;
    // Either side may be a client's file that shrinks under the copy: the fault fails this
    // op and marks that buffer broken (GuardedTouch), never the agent.
    if (Shrinkable(src) || Shrinkable(dst)) {
      absl::Status inner;
      copied = GuardedTouch(src, [&] {
        inner = GuardedTouch(dst, [&] { StreamCopy(to, from, n); });
      });
      if (copied.ok()) copied = inner;
    } else {
      StreamCopy(to, from, n);
    }
    if (!copied.ok()) return copied;
    done += n;
  }
  return absl::OkStatus();
}

absl::Status LocalCopier::CopyGpu(const Buffer& src, uint64_t src_offset, const Buffer& dst,
                                  uint64_t dst_offset, uint64_t length) {
  CopiesInFlight copies;
  absl::Status status;
  for (uint64_t done = 0; done < length && status.ok();) {
    if (done > 0 && Ended()) {
      status = absl::CancelledError("the transfer ended mid-copy");
      break;
    }
    status = copies.AwaitAtMost(kGpuSlicesInFlight - 1);
    if (!status.ok()) break;
    const uint64_t n = std::min(kSliceBytes, length - done);
    char* to = dst.data() + dst_offset + done;
    const char* from = src.data() + src_offset + done;
    absl::Status queued;
    if (src.gpu() >= 0 && dst.gpu() >= 0) {
      queued = gpus_->device(dst.gpu())
                   .CopyFromDevice(to, gpus_->device(src.gpu()), from, n, copies.Done());
    } else if (dst.gpu() >= 0) {
      queued = gpus_->device(dst.gpu()).CopyToDevice(to, from, n, copies.Done());
    } else {
      queued = gpus_->device(src.gpu()).CopyToHost(to, from, n, copies.Done());
    }
    if (!queued.ok()) copies.NotQueued(queued);
    done += n;
  }
  // Every queued copy finishes before the op settles: its buffers stay held until then.
  absl::Status copied = copies.AwaitAtMost(0);
  return status.ok() ? copied : status;
}

}  // namespace ferry::server
