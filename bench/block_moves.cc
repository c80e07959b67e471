// FerryRunner's block-list rows (PrepareBlocks, MoveBlocks): one block at a time, as a decode
// step pushes or pulls a layer's newest block, and batches of scattered blocks, as a prefill
// hands a request's KV cache over; each move timed.

#include <algorithm>
#include <functional>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "bench/ferry_runner.h"
#include "bench/stats.h"

namespace ferry::bench {

absl::StatusOr<Measurement> FerryRunner::WithBlockLists(
    uint64_t block, uint64_t slots,
    const std::function<absl::StatusOr<Measurement>(BlockClient& mine, uint64_t local_list,
                                                    const std::string& remote_list)>& moves) {
  // Ours on the client, so that its moves with wait take the transfer socket as Run does.
  BlockClient mine(a_.get()), theirs(b_.get());
  const std::string name = absl::StrCat(dst_name_, "-blocks");
  auto exported = theirs.Prepare({Extent(dst_->id(), 0, block, slots)}, name);
  if (!exported.ok()) return exported.status();
  auto local = mine.Prepare({Extent(src_->id(), 0, block, slots)});
  absl::StatusOr<Measurement> measured =
      local.ok() ? moves(mine, local->list(), name) : local.status();
  if (local.ok()) mine.Release(local->list()).IgnoreError();
  theirs.Release(exported->list()).IgnoreError();
  return measured;
}

namespace {

// Runs `move(i)` for i = 0, 1, ... until the options' time and iteration bounds are met,
// timing each; the measurement of `blocks` blocks of `block` bytes per move.
absl::StatusOr<Measurement> TimeMoves(const RunOptions& options, uint64_t block,
                                      uint32_t blocks,
                                      const std::function<absl::Status(uint64_t i)>& move) {
  for (int w = 0; w < options.warmup; ++w) RETURN_IF_ERROR(move(0));
  std::vector<double> latencies;
  const absl::Time start = absl::Now();
  const absl::Time until = start + absl::Seconds(options.min_seconds);
  for (uint64_t i = 0;; ++i) {
    const absl::Time t0 = absl::Now();
    RETURN_IF_ERROR(move(i));
    latencies.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
    const auto n = static_cast<int>(latencies.size());
    if ((absl::Now() >= until && n >= options.min_iterations) || n >= options.max_iterations) {
      break;
    }
  }
  Measurement m;
  m.size = block;
  m.batch = blocks;
  m.ops = latencies.size() * blocks;
  m.bytes = m.ops * block;
  SetTimings(m, absl::ToDoubleSeconds(absl::Now() - start), latencies);
  return m;
}

}  // namespace

absl::StatusOr<Measurement> FerryRunner::RunBlockMoves(uint64_t block, bool wait,
                                                       const RunOptions& options) {
  const uint64_t slots = std::min<uint64_t>(capacity_ / block, 4096);
  if (slots == 0) return absl::InvalidArgumentError("capacity below one block");
  auto m = WithBlockLists(block, slots, [&](BlockClient& mine, uint64_t local_list,
                                            const std::string& remote_list) {
    return TimeMoves(options, block, 1, [&](uint64_t i) -> absl::Status {
      auto moved = mine.Move(ferry::v1::WRITE, local_list, {(i * 7) % slots}, agents_.node_b,
                             remote_list, {(i * 13) % slots}, "", 0, false, wait);
      if (!moved.ok()) return moved.status();
      if (wait) return TransferStatus(moved->result());
      auto result = a_->Wait(moved->transfer_id(), absl::Seconds(30));
      return result.ok() ? TransferStatus(*result) : result.status();
    });
  });
  if (!m.ok()) return m;
  m->series = wait ? "ferry block lat" : "ferry block+wait lat";
  m->note = wait ? "MoveBlocks with wait: one request per block, over the transfer socket"
                 : "MoveBlocks, then Wait: two gRPC calls per block";
  return m;
}

absl::StatusOr<Measurement> FerryRunner::RunBlockBatches(uint32_t blocks, uint64_t block,
                                                         const RunOptions& options) {
  const uint64_t slots = capacity_ / block;
  if (slots < blocks) return absl::InvalidArgumentError("capacity too small for the KV batch");
  // Distinct slots in random order, as KvBatch scatters them: block i of the batch goes from
  // slot order[slots - 1 - i] to slot order[i].
  std::vector<uint64_t> order(slots);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(11));
  std::vector<uint64_t> from(blocks), to(blocks);
  for (uint32_t i = 0; i < blocks; ++i) {
    from[i] = order[slots - 1 - i];
    to[i] = order[i];
  }
  auto m = WithBlockLists(block, slots, [&](BlockClient& mine, uint64_t local_list,
                                            const std::string& remote_list) {
    return TimeMoves(options, block, blocks, [&](uint64_t) -> absl::Status {
      auto moved = mine.Move(ferry::v1::WRITE, local_list, from, agents_.node_b, remote_list, to,
                             "", 0, false, /*wait=*/true);
      return moved.ok() ? TransferStatus(moved->result()) : moved.status();
    });
  });
  if (!m.ok()) return m;
  m->series = "ferry kv blocks";
  m->note = absl::StrCat(blocks, " scattered blocks of prepared lists per MoveBlocks with wait");
  return m;
}

}  // namespace ferry::bench
