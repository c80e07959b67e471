#include "server/tensors/block_verifier.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/echo.h"
#include "ferry/v1/tensor.grpc.pb.h"
#include "server/tensors/block_checksum.h"
#include "server/tensors/peer_call.h"

namespace ferry::server {
namespace {

// A check has at least this long for the peer's answer, however little of the transfer's
// own time the move left.
constexpr absl::Duration kMinCheckTime = absl::Seconds(5);

const absl::Status& Stopping() {
  static const absl::Status* s =
      new absl::Status(absl::UnavailableError("verify: agent is shutting down; not checked"));
  return *s;
}

}  // namespace

BlockVerifier::BlockVerifier(PeerDirectory* peers, GpuPools* gpus) : peers_(peers), gpus_(gpus) {}

TransferEngine::CheckHook BlockVerifier::Hook(std::shared_ptr<const VerifyPlan> plan) {
  {
    // Workers start with the first verified transfers: an agent whose clients never ask
    // for verify holds none.
    absl::MutexLock lock(&state_->mu);
    if (!state_->stopping && threads_.size() < kVerifyWorkers) {
      threads_.emplace_back([this] { Run(); });
    }
  }
  return [state = state_, plan = std::move(plan)](std::shared_ptr<const Transfer> transfer,
                                                  TransferEngine::CheckDone done) {
    {
      absl::MutexLock lock(&state->mu);
      if (!state->stopping) {
        state->queue.push_back({plan, std::move(transfer), std::move(done)});
        return;
      }
    }
    std::move(done)({}, Stopping());
  };
}

void BlockVerifier::Stop() {
  {
    absl::MutexLock lock(&state_->mu);
    state_->stopping = true;
    for (grpc::ClientContext* call : state_->calls) call->TryCancel();
  }
  // Hook starts threads under the lock, and none once stopping is set: no race here.
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void BlockVerifier::Run() {
  while (true) {
    Job job;
    {
      absl::MutexLock lock(&state_->mu);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(state_->mu) {
        return state_->stopping || !state_->queue.empty();
      };
      state_->mu.Await(absl::Condition(&ready));
      if (state_->stopping) break;
      job = std::move(state_->queue.front());
      state_->queue.pop_front();
    }
    Check(std::move(job));
  }
  std::deque<Job> left;
  {
    absl::MutexLock lock(&state_->mu);
    left.swap(state_->queue);
  }
  for (Job& job : left) std::move(job.done)({}, Stopping());
}

absl::StatusOr<std::vector<uint32_t>> BlockVerifier::AskPeer(const VerifyPlan& plan,
                                                             const std::vector<size_t>& pairs,
                                                             size_t first, size_t last,
                                                             absl::Time deadline) {
  auto channel = peers_->Channel(plan.peer);
  if (!channel.ok()) return channel.status();
  auto stub = ferry::v1::TensorPeer::NewStub(*std::move(channel));
  ferry::v1::ChecksumBlocksRequest req;
  req.set_list(plan.remote_list);
  req.set_from_node(peers_->self());
  req.mutable_blocks()->Reserve(static_cast<int>(last - first));
  for (size_t k = first; k < last; ++k) req.add_blocks(plan.remote_ids[pairs[k]]);
  ferry::v1::ChecksumBlocksResponse resp;
  const absl::Duration budget = deadline - absl::Now();
  auto ctx = PeerContext(deadline);
  {
    absl::MutexLock lock(&state_->mu);
    if (state_->stopping) return Stopping();
    state_->calls.insert(ctx.get());
  }
  grpc::Status s = stub->ChecksumBlocks(ctx.get(), req, &resp);
  {
    absl::MutexLock lock(&state_->mu);
    state_->calls.erase(ctx.get());
  }
  if (!s.ok()) return PeerCallError(s, "verify", plan.peer, "ChecksumBlocks", budget);
  // Network input: exactly one checksum per block asked for.
  if (resp.crc32c_size() != req.blocks_size()) {
    return absl::DataLossError(absl::StrCat("verify: ", plan.peer, " sent ", resp.crc32c_size(),
                                            " checksums for ", req.blocks_size(), " blocks"));
  }
  return std::vector<uint32_t>(resp.crc32c().begin(), resp.crc32c().end());
}

void BlockVerifier::Check(Job job) {
  const VerifyPlan& plan = *job.plan;
  if (absl::Now() > job.transfer->deadline() + kMinCheckTime) {
    // It waited its turn past its deadline (others' peers were slow): not checked now.
    std::move(job.done)({}, absl::DeadlineExceededError(
                                "verify: the transfer's deadline passed before its check began"));
    return;
  }
  std::vector<size_t> moved;  // the pairs whose bytes moved: the others failed already
  size_t i = 0;
  job.transfer->VisitOps([&](const Transfer::OpView& op) {
    if (op.code == 0) moved.push_back(i);
    ++i;
  });
  const absl::Time deadline = std::max(job.transfer->deadline(), absl::Now() + kMinCheckTime);
  std::vector<Transfer::CheckFailure> failed;
  std::vector<char> scratch;
  for (size_t first = 0; first < moved.size(); first += kMaxChecksumBlocks) {
    const size_t last = std::min(moved.size(), first + kMaxChecksumBlocks);
    auto theirs = AskPeer(plan, moved, first, last, deadline);
    if (!theirs.ok()) {
      // Unchecked bytes are not vouched for: every pair that moved fails with the reason
      // (those found to differ already, with theirs).
      std::move(job.done)(std::move(failed), theirs.status());
      return;
    }
    for (size_t k = first; k < last; ++k) {
      const size_t pair = moved[k];
      const VerifyPlan::Held& held = plan.local[pair];
      auto ours = BlockCrc32c(*held.buffer, held.offset, held.length, gpus_, scratch);
      if (!ours.ok()) {
        failed.push_back({pair, absl::Status(ours.status().code(),
                                             absl::StrCat("verify: local block ",
                                                          plan.local_ids[pair], ": ",
                                                          ours.status().message()))});
        continue;
      }
      const uint32_t remote = (*theirs)[k - first];
      if (*ours != remote) {
        failed.push_back({pair, absl::DataLossError(absl::StrFormat(
                                    "verify: the blocks differ: local block %u has CRC32C "
                                    "%08x, %s's block %u of %s has %08x",
                                    plan.local_ids[pair], *ours, plan.peer,
                                    plan.remote_ids[pair], Echo(plan.remote_list), remote))});
      }
    }
  }
  std::move(job.done)(std::move(failed), absl::OkStatus());
}

}  // namespace ferry::server
