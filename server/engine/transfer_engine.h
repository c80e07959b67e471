#pragma once
// Turns a client's batch into validated ops, posts them on the fabric endpoints to the
// peers, and keeps each transfer until the client has had its result.

#include <cstdint>
#include <deque>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "ferry/v1/agent.pb.h"
#include "server/buffer_registry.h"
#include "server/engine/transfer.h"
#include "server/peers/peer_directory.h"

namespace ferry::server {

struct EngineLimits {
  uint64_t max_op_bytes = 1ull << 30;
  uint32_t max_ops_per_submit = 65536;
  absl::Duration default_timeout = absl::Seconds(60);
  // Finished transfers kept for Wait/Watch after they end.
  size_t history = 4096;
};

class TransferEngine {
 public:
  TransferEngine(BufferRegistry* buffers, PeerDirectory* peers, EngineLimits limits);
  // Fails what is still running (UNAVAILABLE: agent stopping) and stops the reaper.
  ~TransferEngine();

  // Validates the whole batch (nothing moves if any op is bad; the status names the field,
  // e.g. "ops[3].remote_offset"), then posts every op. Returns the transfer id.
  absl::StatusOr<uint64_t> Submit(const ferry::v1::SubmitRequest& request);
  // NOT_FOUND for an unknown (or long forgotten) transfer id.
  absl::StatusOr<std::shared_ptr<Transfer>> Find(uint64_t id) const;

  size_t active() const;
  uint64_t finished() const;

 private:
  absl::StatusOr<std::vector<PlannedOp>> Plan(const ferry::v1::SubmitRequest& request,
                                              absl::Time deadline);
  void Post(const std::shared_ptr<Transfer>& transfer, absl::Time deadline);
  void OnFinished(uint64_t id);
  void ReapExpired();

  BufferRegistry* const buffers_;
  PeerDirectory* const peers_;
  const EngineLimits limits_;

  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t finished_count_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Transfer>> transfers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<Transfer>> active_ ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> history_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reaper_;
};

}  // namespace ferry::server
