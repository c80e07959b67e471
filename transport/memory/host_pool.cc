#include "transport/memory/host_pool.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/errno_name.h"
#include "base/status_macros.h"
#include "spdlog/spdlog.h"
#include "transport/memory/numa_bind.h"

namespace ferry::memory {
namespace {

// What a block of `size` bytes takes of the pool: every block starts kAlignment-aligned.
uint64_t Span(uint64_t size) {
  return (size + HostPool::kAlignment - 1) / HostPool::kAlignment * HostPool::kAlignment;
}

// Faults the pages of [data, data + span) in, as writes would.
absl::Status Populate(char* data, uint64_t span) {
  // MADV_POPULATE_WRITE (Linux 5.14, commit 4ca9b3859dac) faults the pages in as writes
  // would: allocated in the memfd and mapped here. EINTR: a signal came first, so go on.
  int rc;
  do {
    rc = madvise(data, span, MADV_POPULATE_WRITE);
  } while (rc != 0 && errno == EINTR);
  if (rc == 0) return absl::OkStatus();
  // EINVAL: a kernel before 5.14 does not know the advice; the pages come on first touch.
  if (errno == EINVAL) return absl::OkStatus();
  // ENOMEM or EFAULT: the node (or the agent's cgroup) cannot back the buffer; said here
  // rather than as a SIGBUS when a transfer first touches it.
  return absl::ResourceExhaustedError(absl::StrCat("host pool: madvise(MADV_POPULATE_WRITE, ",
                                                   span, " bytes): ", ErrnoName(errno), " ",
                                                   strerror(errno)));
}

}  // namespace

HostBlock::~HostBlock() { pool_->Release(offset_, size_, file_.get()); }

absl::StatusOr<std::unique_ptr<HostPool>> HostPool::Create(uint64_t size, const std::string& name,
                                                           int numa) {
  size = Span(size);
  // Address space only: each block maps its own file over its part (Allocate). PROT_NONE, so
  // that a stray touch of a free range faults rather than reading another block's bytes.
  void* base = mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    return absl::ErrnoToStatus(errno, absl::StrCat("mmap(host pool reservation, ", size, ")"));
  }
  std::unique_ptr<HostPool> pool(new HostPool(static_cast<char*>(base), size, name));
  if (numa >= 0) {
    pool->binding_ = NodeBinding::Load(numa, &pool->placement_);
    if (pool->binding_ != nullptr) pool->numa_ = numa;
  }
  return pool;
}

HostPool::HostPool(char* base, uint64_t size, std::string name)
    : base_(base), size_(size), name_(std::move(name)), allocator_(size, kAlignment) {}

HostPool::~HostPool() { munmap(base_, size_); }

absl::StatusOr<std::unique_ptr<HostBlock>> HostPool::Allocate(uint64_t size) {
  const uint64_t span = Span(size);
  // The file first: a failure here leaves no range to give back.
  UniqueFd file(memfd_create(name_.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!file.valid()) return absl::ErrnoToStatus(errno, absl::StrCat("memfd_create(", name_, ")"));
  if (ftruncate(file.get(), static_cast<off_t>(span)) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("ftruncate(", name_, ", ", span, ")"));
  }
  if (fcntl(file.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("fcntl(", name_, ", F_ADD_SEALS)"));
  }
  uint64_t offset;
  {
    absl::MutexLock lock(&mu_);
    auto got = allocator_.Allocate(size);
    if (!got.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat("host pool: ", got.status().message()));
    }
    offset = *got;
  }
  char* const data = base_ + offset;
  void* p = mmap(data, span, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, file.get(), 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    absl::MutexLock lock(&mu_);
    (void)allocator_.Free(offset);  // the reservation is still in place: nothing was mapped
    return absl::ErrnoToStatus(err, absl::StrCat("mmap(", name_, ", ", span, " bytes)"));
  }
  {
    absl::MutexLock lock(&mu_);
    ++blocks_;
  }
  // From here the block owns the range: on failure its destructor puts the reservation back.
  auto block = std::make_unique<HostBlock>(this, data, offset, size, std::move(file));
  if (binding_ != nullptr) {
    // A failed binding leaves the pages where the kernel puts them, as a pool-wide one did.
    if (std::string failed = binding_->Bind(data, span); !failed.empty()) {
      spdlog::warn("host pool: block of {} bytes not bound to NUMA node {}: {}", span, numa_,
                   failed);
    }
  }
  RETURN_IF_ERROR(Populate(data, span));
  return block;
}

void HostPool::Release(uint64_t offset, uint64_t size, int file) {
  // Give the pages back before anything else: a client still holding the file (or its
  // mapping) after the free keeps no memory of the pool's and sees zeroes, not the bytes.
  // Sealed against shrinking and growing, not writing: punching a hole is allowed.
  const uint64_t span = Span(size);
  if (fallocate(file, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(span)) !=
      0) {
    spdlog::warn("host pool: fallocate(PUNCH_HOLE, {} bytes at {}): {}", span, offset,
                 strerror(errno));
  }
  // The reservation back over the range (MAP_FIXED replaces the block's mapping in one
  // call), so that the next block maps its own file there.
  void* p = mmap(base_ + offset, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED |
                 MAP_NORESERVE, -1, 0);
  absl::MutexLock lock(&mu_);
  --blocks_;
  if (p == MAP_FAILED) {
    // The old file stays mapped there; handing the range out again would map a second file
    // over it while someone may still use it. Keep it out of the allocator instead.
    spdlog::error("host pool: mmap(reservation over {} bytes at {}): {}; the range stays used",
                  span, offset, strerror(errno));
    return;
  }
  absl::Status s = allocator_.Free(offset);
  if (!s.ok()) spdlog::error("host pool: {}", s.ToString());
}

uint64_t HostPool::blocks() const {
  absl::MutexLock lock(&mu_);
  return blocks_;
}

uint64_t HostPool::used() const {
  absl::MutexLock lock(&mu_);
  return allocator_.used();
}

double HostPool::fragmentation() const {
  absl::MutexLock lock(&mu_);
  return allocator_.fragmentation();
}

}  // namespace ferry::memory
