#pragma once
// The agent's host pool: one memfd mapped once, carved into buffers that clients map by
// opening /proc/<agent pid>/fd/<memfd> (same user) at the buffer's offset. A buffer's pages
// are committed when it is allocated and given back when it is freed, so a large pool costs
// nothing until used, and a transfer never waits on page faults (as verbs' registration
// pins a buffer's pages before its first transfer, ibv_reg_mr(3)).

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "base/unique_fd.h"
#include "transport/memory/range_allocator.h"

namespace ferry::memory {

class HostPool;

// A range of the pool; returns itself to the pool on destruction.
class HostBlock {
 public:
  HostBlock(HostPool* pool, char* data, uint64_t offset, uint64_t size)
      : pool_(pool), data_(data), offset_(offset), size_(size) {}
  ~HostBlock();
  HostBlock(const HostBlock&) = delete;
  HostBlock& operator=(const HostBlock&) = delete;

  char* data() const { return data_; }
  uint64_t offset() const { return offset_; }  // page-aligned offset in the pool's file
  uint64_t size() const { return size_; }

 private:
  HostPool* pool_;
  char* data_;
  uint64_t offset_;
  uint64_t size_;
};

class HostPool {
 public:
  // Alignment of every block: 64 KiB keeps blocks page-aligned (mmap) and cache-friendly.
  static constexpr uint64_t kAlignment = 64 << 10;

  // `numa` >= 0 binds the pages to that node (transport/memory/numa_bind.h); -1 leaves them
  // where the kernel puts them.
  static absl::StatusOr<std::unique_ptr<HostPool>> Create(uint64_t size, const std::string& name,
                                                          int numa = -1);
  ~HostPool();

  // A block whose pages are all in memory and mapped here. RESOURCE_EXHAUSTED when the pool
  // has no room, or when the machine cannot back the block (the error names madvise).
  absl::StatusOr<std::unique_ptr<HostBlock>> Allocate(uint64_t size);

  // The path a client opens to map blocks (valid while this process lives).
  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  // The NUMA node the pages are bound to, -1 when not bound; and how it went, in words.
  int numa() const { return numa_; }
  const std::string& placement() const { return placement_; }
  uint64_t used() const;
  double fragmentation() const;

 private:
  friend class HostBlock;
  HostPool(UniqueFd fd, char* base, uint64_t size, std::string path);
  void Release(uint64_t offset, uint64_t size);

  UniqueFd fd_;
  char* const base_;
  const uint64_t size_;
  const std::string path_;
  int numa_ = -1;
  std::string placement_ = "no NUMA binding";
  mutable absl::Mutex mu_;
  RangeAllocator allocator_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry::memory
