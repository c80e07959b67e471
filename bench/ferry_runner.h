#pragma once
// Drives two real agents through libferry: size sweeps, KV batches, and a long run that
// watches the agents' memory.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/measurement.h"
#include "client/block_client.h"
#include "client/ferry_client.h"

namespace ferry::bench {

struct RunOptions {
  ferry::v1::OpType op = ferry::v1::WRITE;
  double min_seconds = 1.0;    // per point
  int min_iterations = 3;
  int max_iterations = 10000;
  uint64_t batch_bytes = 64ull << 20;  // small ops are batched up to this many bytes...
  uint32_t outstanding = 64;           // ...and at most this many ops per batch
  int clients = 1;                     // concurrent client connections
  // Untimed runs of each batch before the timed ones, as ucx_perftest (-w) and perftest
  // warm up: the first pass over a buffer's pages costs page-table and (in a VM) host work
  // that is no transfer's (10x the next pass on the 2-core VM at 256 MiB).
  int warmup = 1;
};

// The agents under test: A is where clients submit, B owns the target buffer.
struct Agents {
  std::string socket_a, socket_b;
  std::string node_b;
};

class FerryRunner {
 public:
  // Allocates source (on A) and target (on B, named) buffers of `capacity` bytes each and
  // touches them, so page faults stay out of the numbers.
  static absl::StatusOr<std::unique_ptr<FerryRunner>> Create(const Agents& agents,
                                                             uint64_t capacity);
  ~FerryRunner();

  // One point of a sweep: ops of `size` bytes, batched, repeated.
  absl::StatusOr<Measurement> RunSize(uint64_t size, const RunOptions& options);
  // KV mode: `blocks` ops of `block` bytes at scattered offsets in one batch, repeated;
  // `adjacent`: block i from slot i to slot i (consecutive blocks, which the engine coalesces).
  absl::StatusOr<Measurement> RunKv(uint32_t blocks, uint64_t block, const RunOptions& options,
                                    bool adjacent = false);
  // Over one TransferStream: one-op WRITEs of `size`, `outstanding` of them in flight (1: the
  // latency of one op without a call per op), each timed from Send to its answer.
  absl::StatusOr<Measurement> RunStreamedOps(uint64_t size, uint32_t outstanding,
                                             const RunOptions& options);
  // Over one TransferStream, two batches in flight, so that the agent takes in and plans one
  // while the wire carries the other (what a client with many batches does): `blocks` KV
  // blocks of `block` bytes as RunKv ("ferry kv stream"), or with blocks = 1 one op of
  // `block` bytes ("ferry write stream").
  absl::StatusOr<Measurement> RunStreamedBatches(uint32_t blocks, uint64_t block,
                                                 const RunOptions& options);
  // The block-list path: node-b exports a list over its target, node-a prepares one over its
  // source, and one `block` moves at a time (MoveBlocks; `wait`: answered when it ended, else
  // followed by Wait), each timed ("ferry block lat", "ferry block+wait lat";
  // bench/block_moves.cc).
  absl::StatusOr<Measurement> RunBlockMoves(uint64_t block, bool wait, const RunOptions& options);
  // The same lists, `blocks` scattered blocks per MoveBlocks with `wait`, one move at a time:
  // a KV batch as a serving engine moves it ("ferry kv blocks").
  absl::StatusOr<Measurement> RunBlockBatches(uint32_t blocks, uint64_t block,
                                              const RunOptions& options);
  // Moves `total` bytes in 64 MiB ops; calls `sample` after the first GiB and at the end.
  absl::Status RunLong(uint64_t total, const std::function<void(bool early)>& sample);
  // Whether node-a's client runs small batches and streams over the agent's transfer socket
  // (the default) or over gRPC (Client::set_use_transfer_socket).
  void set_use_transfer_socket(bool use) { a_->set_use_transfer_socket(use); }

 private:
  FerryRunner(Agents agents, uint64_t capacity) : agents_(std::move(agents)), capacity_(capacity) {}
  // Prepares node-a's list over the source and exports node-b's over the target, `slots`
  // blocks of `block` each, and runs `moves` (which returns the measurement) between them;
  // the lists are released after, whatever it returned.
  absl::StatusOr<Measurement> WithBlockLists(
      uint64_t block, uint64_t slots,
      const std::function<absl::StatusOr<Measurement>(BlockClient& mine, uint64_t local_list,
                                                      const std::string& remote_list)>& moves);
  absl::StatusOr<Measurement> Run(const std::string& series, uint64_t size,
                                  const std::vector<OpSpec>& batch, const RunOptions& options);
  // `blocks` ops of `block` bytes between scattered slots (or, `adjacent`, consecutive ones)
  // of the source and the target, among the `slots` from slot `first` on.
  std::vector<OpSpec> KvBatch(uint32_t blocks, uint64_t block, bool adjacent, uint64_t first,
                              uint64_t slots, ferry::v1::OpType op) const;
  // Every batch in flight at once on one TransferStream, each sent again when answered,
  // until time is up; each timed from Send to its answer.
  absl::StatusOr<Measurement> RunStreamed(const std::string& series, uint64_t size,
                                          const std::vector<std::vector<OpSpec>>& batches,
                                          const RunOptions& options);

  const Agents agents_;
  const uint64_t capacity_;
  std::unique_ptr<Client> a_, b_;
  std::unique_ptr<Buffer> src_, dst_;
  std::string dst_name_;
};

}  // namespace ferry::bench
