#include "server/buffers/client_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "base/byte_size.h"
#include "base/status_macros.h"
#include "server/buffers/gpu_pools.h"
#include "server/buffers/open_files.h"

namespace ferry::server {
namespace {

// The client's file as the agent maps it: the fd stays open so that the agent can lend it
// back to its owner (the fd socket), as it lends the pool's buffers' files.
class ClientFileMemory : public BufferMemory {
 public:
  ClientFileMemory(UniqueFd fd, char* mapping, uint64_t mapped, uint64_t lead, uint64_t offset,
                   uint64_t length, bool sealed)
      : fd_(std::move(fd)), mapping_(mapping), mapped_(mapped), lead_(lead), offset_(offset),
        length_(length), sealed_(sealed) {}
  ~ClientFileMemory() override { munmap(mapping_, mapped_); }

  char* data() const override { return mapping_ + lead_; }
  uint64_t size() const override { return length_; }
  std::string device() const override { return "host"; }
  int gpu() const override { return -1; }
  std::string backend() const override { return "host"; }
  absl::StatusOr<BufferMapping> mapping() const override {
    return HostMapping{offset_, length_};
  }
  absl::StatusOr<UniqueFd> LendFile() const override {
    return DupForClient(fd_.get(), "registered memory");
  }
  bool registered() const override { return true; }
  std::pair<const char*, uint64_t> shrinkable_range() const override {
    if (sealed_) return {nullptr, 0};
    return {mapping_, mapped_};
  }

 private:
  UniqueFd fd_;
  char* mapping_;
  uint64_t mapped_;
  uint64_t lead_;
  uint64_t offset_;
  uint64_t length_;
  const bool sealed_;  // F_SEAL_SHRINK: the file cannot shrink, nothing to guard
  ClientFdHold fd_hold_;  // fd_ counts against RLIMIT_NOFILE (open_files.h)
};

// The file behind a client's descriptor, checked for what sharing its memory needs.
absl::StatusOr<struct stat> SharedFile(int fd, uint64_t offset, uint64_t length) {
  struct stat st = {};
  if (fstat(fd, &st) != 0) return absl::ErrnoToStatus(errno, "fd_ticket: fstat");
  // memfd_create and shm_open give regular files (on tmpfs); a socket, pipe or device is
  // not memory two processes can map alike.
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        "fd_ticket: the descriptor is not a file of shared memory (memfd, POSIX shm or a "
        "regular file)");
  }
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0) return absl::ErrnoToStatus(errno, "fd_ticket: fcntl(F_GETFL)");
  // mmap(MAP_SHARED, PROT_WRITE) needs a descriptor open for reading and writing (EACCES).
  if ((flags & O_ACCMODE) != O_RDWR) {
    return absl::InvalidArgumentError(
        "fd_ticket: the descriptor is not open for reading and writing (O_RDWR), which a "
        "transfer into the memory needs");
  }
  if (length == 0) return absl::InvalidArgumentError("length: must be positive");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (offset > size || length > size - offset) {
    return absl::OutOfRangeError(absl::StrCat("length: [", offset, ", +", length,
                                              ") is outside the file's ", size, " bytes"));
  }
  return st;
}

// Shared memory lives on tmpfs (memfd_create, /dev/shm) or hugetlbfs. A file on a disk's
// file system is refused: allocating its range below (posix_fallocate) would write the
// disk on the client's behalf, with the agent's rights and outside any quota of the
// client's (a 2 GiB sparse file cost a root agent 2 GiB of disk).
absl::Status InMemoryFileSystem(int fd) {
  struct statfs fs = {};
  if (fstatfs(fd, &fs) != 0) return absl::ErrnoToStatus(errno, "fd_ticket: fstatfs");
  if (fs.f_type == TMPFS_MAGIC || fs.f_type == HUGETLBFS_MAGIC) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "fd_ticket: the file is not shared memory (its file system, type 0x", absl::Hex(fs.f_type),
      ", is not tmpfs or hugetlbfs): register a memfd (memfd_create) or a POSIX shm file "
      "(/dev/shm), not a file on disk"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<BufferMemory>> MapClientFile(UniqueFd fd, uint64_t offset,
                                                            uint64_t length) {
  // A file that shrinks under a transfer faults the agent (SIGBUS) when its CPU touches the
  // pages that went. A memfd made with MFD_ALLOW_SEALING is sealed against shrinking first
  // (memfd_create(2), F_SEAL_SHRINK), and only then measured; other files (POSIX shm, plain
  // files, memfds without sealing) cannot be sealed: the agent's CPU touches those only
  // under a FaultGuard (shrinkable_range), which fails the op and marks them broken.
  RETURN_IF_ERROR(RoomForClientFd(ClientFdHold::held()));
  RETURN_IF_ERROR(InMemoryFileSystem(fd.get()));
  (void)fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK);
  const int seals = fcntl(fd.get(), F_GET_SEALS);
  const bool sealed = seals >= 0 && (seals & F_SEAL_SHRINK) != 0;
  RETURN_IF_ERROR(SharedFile(fd.get(), offset, length).status());
  // tmpfs allocates a sparse file's pages on first touch, and a full one (a container's
  // 64 MiB /dev/shm) answers that touch with SIGBUS: the range is allocated now, so that a
  // full file system is this call's clean error instead.
  if (int err = posix_fallocate(fd.get(), static_cast<off_t>(offset), static_cast<off_t>(length));
      err != 0 && err != EOPNOTSUPP && err != EINVAL) {
    return absl::ErrnoToStatus(
        err, absl::StrCat("fd_ticket: posix_fallocate(client memory, ", FormatByteSize(length),
                          ")"));
  }
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t lead = offset % page;
  const uint64_t mapped = lead + length;
  // MAP_POPULATE maps the pages (allocated above) now: a transfer takes no page fault, as
  // in the host pool (transport/memory/host_pool.h).
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd.get(),
                 static_cast<off_t>(offset - lead));
  if (p == MAP_FAILED) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat("mmap(client memory, ", FormatByteSize(length), ")"));
  }
  return std::unique_ptr<BufferMemory>(new ClientFileMemory(
      std::move(fd), static_cast<char*>(p), mapped, lead, offset, length, sealed));
}

absl::StatusOr<ClientRegistration> ClientMemory::Register(ClientMemorySpec spec,
                                                          BufferOwner owner) {
  ASSIGN_OR_RETURN(int gpu, GpuIndexOf(spec.device));
  const bool by_handle = !spec.ipc_handle.empty();
  if (by_handle == spec.fd.valid()) {
    return absl::InvalidArgumentError(
        "fd_ticket: give either a descriptor (fd_ticket) or a CUDA IPC handle "
        "(cuda_ipc_handle)");
  }
  if (by_handle && gpu < 0) {
    return absl::InvalidArgumentError("device: a CUDA IPC handle names GPU memory; say which GPU");
  }
  dev_t dev = 0;
  ino_t ino = 0;
  // A CUDA VMM shareable fd is not a file (a descriptor of the NVIDIA driver's device, the
  // same device and inode for every allocation): the GPU backend checks it, and since it
  // names no range we could compare, each registration of one is its own.
  bool vmm_fd = false;
  if (!by_handle && gpu >= 0) {
    struct stat st = {};
    if (fstat(spec.fd.get(), &st) != 0) return absl::ErrnoToStatus(errno, "fd_ticket: fstat");
    vmm_fd = !S_ISREG(st.st_mode);
    if (vmm_fd && spec.length == 0) return absl::InvalidArgumentError("length: must be positive");
  }
  if (!by_handle && !vmm_fd) {
    ASSIGN_OR_RETURN(struct stat st, SharedFile(spec.fd.get(), spec.offset, spec.length));
    dev = st.st_dev;
    ino = st.st_ino;
  } else if (spec.length == 0) {
    return absl::InvalidArgumentError("length: must be positive");
  }
  if (spec.allocation_size != 0 && (by_handle || gpu < 0)) {
    return absl::InvalidArgumentError(
        "allocation_size: only for a GPU allocation's descriptor (a CUDA VMM handle)");
  }
  const RangeKey key{owner.session, gpu < 0 ? "host" : spec.device, dev, ino, spec.ipc_handle,
                     spec.offset, spec.length};
  if (!vmm_fd) {
    absl::MutexLock lock(&mu_);
    auto it = ranges_.find(key);
    if (it != ranges_.end()) {
      auto buffer = buffers_->Get(it->second, "id");
      if (buffer.ok()) {
        const std::vector<std::string>& peers = (*buffer)->allowed_peers();
        if ((*buffer)->name() != spec.name || peers != spec.allowed_peers) {
          // The same memory under two names (or exports) would be two registrations a
          // deregistration of either tears half down: one registration, one way to reach it.
          return absl::AlreadyExistsError(absl::StrCat(
              "name: this range is registered already, as buffer ", (*buffer)->id(),
              (*buffer)->name().empty() ? " (unnamed)" : " named '" + (*buffer)->name() + "'",
              ", exported otherwise; deregister it first, or register it the same way"));
        }
        return ClientRegistration{*std::move(buffer), true};
      }
      ranges_.erase(it);
    }
  }
  std::unique_ptr<BufferMemory> mem;
  if (gpu < 0) {
    ASSIGN_OR_RETURN(mem, MapClientFile(std::move(spec.fd), spec.offset, spec.length));
  } else {
    if (gpus_ == nullptr) {
      return absl::NotFoundError(absl::StrCat("device: this agent has no GPU ", spec.device));
    }
    memory::GpuImport what;
    what.kind = by_handle ? "cuda_ipc" : "fd";
    what.fd = spec.fd.get();
    what.handle = spec.ipc_handle;
    what.offset = spec.offset;
    what.length = spec.length;
    what.allocation_size = spec.allocation_size;
    ASSIGN_OR_RETURN(mem, gpus_->Import(gpu, what));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<Buffer> buffer,
                   buffers_->AddClientMemory(std::move(mem), spec.name, std::move(owner),
                                             std::move(spec.allowed_peers)));
  absl::MutexLock lock(&mu_);
  // Entries of buffers since freed are dropped as they are met: the map stays the size of
  // what is registered, give or take the last few.
  for (auto it = ranges_.begin(); it != ranges_.end();) {
    if (!buffers_->Get(it->second, "id").ok()) {
      ranges_.erase(it++);
    } else {
      ++it;
    }
  }
  if (!vmm_fd) ranges_[key] = buffer->id();
  return ClientRegistration{std::move(buffer), false};
}

}  // namespace ferry::server
