// FerryRunner::RunBlockMoves: the block-list path (PrepareBlocks, MoveBlocks) one block at a
// time, as a decode step pushes or pulls a layer's newest block, timed per move.

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "bench/ferry_runner.h"
#include "bench/stats.h"
#include "client/block_client.h"

namespace ferry::bench {

absl::StatusOr<Measurement> FerryRunner::RunBlockMoves(uint64_t block, bool wait,
                                                       const RunOptions& options) {
  const uint64_t slots = std::min<uint64_t>(capacity_ / block, 4096);
  if (slots == 0) return absl::InvalidArgumentError("capacity below one block");
  BlockClient mine(a_->shared_session()), theirs(b_->shared_session());
  const std::string name = absl::StrCat(dst_name_, "-blocks");
  auto exported = theirs.Prepare({Extent(dst_->id(), 0, block, slots)}, name);
  if (!exported.ok()) return exported.status();
  auto local = mine.Prepare({Extent(src_->id(), 0, block, slots)});
  auto measured = [&]() -> absl::StatusOr<Measurement> {
    if (!local.ok()) return local.status();
    std::vector<double> latencies;
    const absl::Time start = absl::Now();
    const absl::Time until = start + absl::Seconds(options.min_seconds);
    for (uint64_t i = 0;; ++i) {
      const absl::Time t0 = absl::Now();
      auto moved = mine.Move(ferry::v1::WRITE, local->list(), {(i * 7) % slots}, agents_.node_b,
                             name, {(i * 13) % slots}, "", 0, false, wait);
      if (!moved.ok()) return moved.status();
      if (wait) {
        RETURN_IF_ERROR(TransferStatus(moved->result()));
      } else {
        auto result = a_->Wait(moved->transfer_id(), absl::Seconds(30));
        if (!result.ok()) return result.status();
        RETURN_IF_ERROR(TransferStatus(*result));
      }
      latencies.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
      const auto n = static_cast<int>(latencies.size());
      if ((absl::Now() >= until && n >= options.min_iterations) || n >= options.max_iterations) {
        break;
      }
    }
    Measurement m;
    m.series = wait ? "ferry block lat" : "ferry block+wait lat";
    m.note = wait ? "MoveBlocks with wait: one call per block"
                  : "MoveBlocks, then Wait: two calls per block";
    m.size = block;
    m.ops = latencies.size();
    m.bytes = m.ops * block;
    SetTimings(m, absl::ToDoubleSeconds(absl::Now() - start), latencies);
    return m;
  }();
  if (local.ok()) mine.Release(local->list()).IgnoreError();
  theirs.Release(exported->list()).IgnoreError();
  return measured;
}

}  // namespace ferry::bench
