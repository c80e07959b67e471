#pragma once
// The agent's buffers: host pool memory, registered with the fabric, known by id and
// (optionally) by name. Transfers hold a shared_ptr, so freeing a buffer in use waits for
// them: the memory and the fabric key live until the last transfer lets go.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "transport/fabric.h"
#include "transport/memory/host_pool.h"

namespace ferry::server {

class Buffer {
 public:
  using Regions = std::vector<std::pair<std::string, std::unique_ptr<fabric::MemoryRegion>>>;

  Buffer(uint64_t id, std::string name, std::unique_ptr<memory::HostBlock> block, Regions regions)
      : id_(id), name_(std::move(name)), block_(std::move(block)), regions_(std::move(regions)) {}

  uint64_t id() const { return id_; }
  const std::string& name() const { return name_; }
  uint64_t size() const { return block_->size(); }
  uint64_t pool_offset() const { return block_->offset(); }
  // The registration with `provider`'s fabric; nullptr if it has none.
  const fabric::MemoryRegion* region(const std::string& provider) const;
  // (provider, region) for every fabric the buffer is registered with.
  const Regions& regions() const { return regions_; }
  const std::string& device() const;

 private:
  const uint64_t id_;
  const std::string name_;
  // Declared before regions_ so it is destroyed after them: every key is revoked (and
  // remote accesses drained) before the memory goes back to the pool.
  std::unique_ptr<memory::HostBlock> block_;
  Regions regions_;
};

class BufferRegistry {
 public:
  // Every buffer is registered with each of `fabrics`.
  BufferRegistry(memory::HostPool* pool, std::vector<fabric::Fabric*> fabrics)
      : pool_(pool), fabrics_(std::move(fabrics)) {}

  // Named buffers are exported to peers (remote read and write); unnamed ones are not.
  // ALREADY_EXISTS for a name in use, RESOURCE_EXHAUSTED when the pool is full.
  absl::StatusOr<std::shared_ptr<Buffer>> Allocate(uint64_t size, const std::string& name);
  // NOT_FOUND for an unknown or already freed id.
  absl::Status Free(uint64_t id);
  // NOT_FOUND naming `field` ("ops[3].local_buffer") for an unknown or freed id.
  absl::StatusOr<std::shared_ptr<Buffer>> Get(uint64_t id, const std::string& field) const;
  absl::StatusOr<std::shared_ptr<Buffer>> FindByName(const std::string& name) const;
  std::vector<std::shared_ptr<Buffer>> List() const;
  size_t count() const;

 private:
  memory::HostPool* const pool_;
  const std::vector<fabric::Fabric*> fabrics_;
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Buffer>> by_id_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint64_t> by_name_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry::server
