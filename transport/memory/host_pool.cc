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

HostBlock::~HostBlock() { pool_->Release(offset_, size_); }

absl::StatusOr<std::unique_ptr<HostPool>> HostPool::Create(uint64_t size, const std::string& name,
                                                           int numa) {
  size = Span(size);
  UniqueFd fd(memfd_create(name.c_str(), MFD_CLOEXEC));
  if (!fd.valid()) return absl::ErrnoToStatus(errno, absl::StrCat("memfd_create(", name, ")"));
  if (ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("ftruncate(memfd, ", size, ")"));
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED)
    return absl::ErrnoToStatus(errno, absl::StrCat("mmap(host pool, ", size, ")"));
  std::string path = absl::StrCat("/proc/", getpid(), "/fd/", fd.get());
  std::unique_ptr<HostPool> pool(new HostPool(std::move(fd), static_cast<char*>(base), size, path));
  if (numa >= 0) {
    pool->placement_ = BindToNode(base, size, numa);
    if (pool->placement_.rfind("NUMA node", 0) == 0) pool->numa_ = numa;
  }
  return pool;
}

HostPool::HostPool(UniqueFd fd, char* base, uint64_t size, std::string path)
    : fd_(std::move(fd)), base_(base), size_(size), path_(std::move(path)),
      allocator_(size, kAlignment) {}

HostPool::~HostPool() { munmap(base_, size_); }

absl::StatusOr<std::unique_ptr<HostBlock>> HostPool::Allocate(uint64_t size) {
  uint64_t offset;
  {
    absl::MutexLock lock(&mu_);
    auto got = allocator_.Allocate(size);
    if (!got.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat("host pool: ", got.status().message()));
    }
    offset = *got;
  }
  auto block = std::make_unique<HostBlock>(this, base_ + offset, offset, size);
  // On failure the block gives its range back.
  RETURN_IF_ERROR(Populate(base_ + offset, Span(size)));
  return block;
}

void HostPool::Release(uint64_t offset, uint64_t size) {
  // Give the pages back before the range is reused: a freed buffer keeps no memory, and the
  // next owner sees zeroes, not the last client's bytes.
  const uint64_t span = Span(size);
  if (fallocate(fd_.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                static_cast<off_t>(span)) != 0) {
    spdlog::warn("host pool: fallocate(PUNCH_HOLE, {} bytes at {}): {}", span, offset,
                 strerror(errno));
  }
  absl::MutexLock lock(&mu_);
  absl::Status s = allocator_.Free(offset);
  if (!s.ok()) spdlog::error("host pool: {}", s.ToString());
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
