#pragma once
// The agent's host pool: one range of address space, carved into buffers. Each buffer is a
// memfd of its own, mapped over its part of the range, so that the agent can hand a client
// exactly its buffer and nothing else (the file's descriptor over the fd socket, SCM_RIGHTS;
// a client of another uid cannot open /proc/<agent pid>/fd/N, and one file for the whole
// pool would show it every other client's buffer). The file is sealed against shrinking and
// growing (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL, memfd_create(2)): whoever holds it can
// neither take pages from under the agent (a SIGBUS on its next touch) nor grow it, nor add
// seals of its own (F_SEAL_FUTURE_WRITE would stop the hole punched when it is freed).
//
// A buffer's pages are committed when it is allocated and given back when it is freed, so a
// large pool costs nothing until used, and a transfer never waits on page faults (as verbs'
// registration pins a buffer's pages before its first transfer, ibv_reg_mr(3)). Addresses
// stay those of one range, as they were when the pool was one file.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "base/unique_fd.h"
#include "transport/memory/numa_bind.h"
#include "transport/memory/range_allocator.h"

namespace ferry::memory {

class HostPool;

// A range of the pool; returns itself to the pool on destruction.
class HostBlock {
 public:
  HostBlock(HostPool* pool, char* data, uint64_t offset, uint64_t size, UniqueFd file)
      : pool_(pool), data_(data), offset_(offset), size_(size), file_(std::move(file)) {}
  ~HostBlock();
  HostBlock(const HostBlock&) = delete;
  HostBlock& operator=(const HostBlock&) = delete;

  char* data() const { return data_; }
  uint64_t offset() const { return offset_; }  // 64 KiB-aligned offset in the pool's range
  uint64_t size() const { return size_; }
  // The block's own memfd (sealed), which holds exactly its bytes, from offset 0.
  int file() const { return file_.get(); }

 private:
  HostPool* pool_;
  char* data_;
  uint64_t offset_;
  uint64_t size_;
  UniqueFd file_;
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

  // A block whose pages are all in memory and mapped here, in a file of its own (one
  // descriptor while it lives). RESOURCE_EXHAUSTED when the pool has no room, or when the
  // machine cannot back the block (the error names madvise); the failing call's errno when
  // the file cannot be made.
  absl::StatusOr<std::unique_ptr<HostBlock>> Allocate(uint64_t size);

  uint64_t size() const { return size_; }
  // Blocks allocated and not yet freed (each holds a descriptor).
  uint64_t blocks() const;
  // The NUMA node the pages are bound to, -1 when not bound; and how it went, in words.
  int numa() const { return numa_; }
  const std::string& placement() const { return placement_; }
  uint64_t used() const;
  double fragmentation() const;

 private:
  friend class HostBlock;
  HostPool(char* base, uint64_t size, std::string name);
  // Punches the block's file (a holder of its descriptor keeps no memory), puts the
  // reservation back over its range and returns the range.
  void Release(uint64_t offset, uint64_t size, int file);

  char* const base_;  // the reserved range: PROT_NONE where no block is mapped
  const uint64_t size_;
  const std::string name_;  // each block's memfd name
  int numa_ = -1;
  std::string placement_ = "no NUMA binding";
  std::unique_ptr<NodeBinding> binding_;  // null: not bound
  mutable absl::Mutex mu_;
  RangeAllocator allocator_ ABSL_GUARDED_BY(mu_);
  uint64_t blocks_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ferry::memory
