#include "transport/verbs/verbs_region.h"

#include <fcntl.h>

#include <cerrno>

#include "absl/strings/str_format.h"

namespace ferry::verbs {
namespace {

std::string Size(uint64_t n) {
  if (n >= (1ull << 30) && n % (1ull << 30) == 0) return absl::StrCat(n >> 30, " GiB");
  if (n >= (1ull << 20) && n % (1ull << 20) == 0) return absl::StrCat(n >> 20, " MiB");
  if (n >= (1ull << 10) && n % (1ull << 10) == 0) return absl::StrCat(n >> 10, " KiB");
  return absl::StrCat(n, " B");
}

absl::StatusOr<std::unique_ptr<fabric::MemoryRegion>> Make(std::shared_ptr<RegionSet> set,
                                                           std::shared_ptr<VerbsDevice> device,
                                                           VerbsRegion::Spec spec) {
  auto region = std::make_unique<VerbsRegion>(std::move(set), std::move(spec));
  if (absl::Status s = region->Bind(std::move(device)); !s.ok()) return s;
  return std::unique_ptr<fabric::MemoryRegion>(std::move(region));
}

}  // namespace

int IbvAccessFor(uint32_t access) {
  int flags = IBV_ACCESS_LOCAL_WRITE;
  if (access & fabric::kRemoteWrite) flags |= IBV_ACCESS_REMOTE_WRITE;
  if (access & fabric::kRemoteRead) flags |= IBV_ACCESS_REMOTE_READ;
  return flags;
}

void RegionSet::Add(VerbsRegion* region) {
  absl::MutexLock lock(&mu_);
  regions_.insert(region);
}

void RegionSet::Remove(VerbsRegion* region) {
  absl::MutexLock lock(&mu_);
  regions_.erase(region);
}

size_t RegionSet::size() {
  absl::MutexLock lock(&mu_);
  return regions_.size();
}

size_t RegionSet::BindAll(const std::shared_ptr<VerbsDevice>& device, absl::Status* error) {
  absl::MutexLock lock(&mu_);
  size_t failed = 0;
  for (VerbsRegion* region : regions_) {
    absl::Status s = region->Bind(device);
    if (s.ok()) continue;
    if (failed++ == 0 && error != nullptr) *error = s;
  }
  return failed;
}

VerbsRegion::VerbsRegion(std::shared_ptr<RegionSet> set, Spec spec)
    : set_(std::move(set)), spec_(std::move(spec)) {
  set_->Add(this);
}

VerbsRegion::~VerbsRegion() {
  // Out of the set first: no Bind runs on it after this.
  set_->Remove(this);
  std::shared_ptr<VerbsDevice> device;
  {
    absl::MutexLock lock(&mu_);
    device = device_;
  }
  // Then out of its device's users (a Close under way finishes with it first).
  if (device) device->Detach(this);
  absl::MutexLock lock(&mu_);
  mr_.reset();
}

const VerbsDevice* VerbsRegion::device() const {
  absl::MutexLock lock(&mu_);
  return mr_ ? device_.get() : nullptr;
}

absl::StatusOr<MrPtr> VerbsRegion::Register(VerbsDevice& device) const {
  VerbsApi& api = device.api();
  errno = 0;
  if (spec_.dmabuf.valid()) {
    MrPtr mr(api.RegDmabufMr(device.pd(), spec_.dmabuf_offset, spec_.length,
                             reinterpret_cast<uint64_t>(spec_.data), spec_.dmabuf.get(),
                             IbvAccessFor(spec_.access)),
             MrDeleter{&api});
    if (!mr) {
      return absl::ErrnoToStatus(
          errno, absl::StrFormat("ibv_reg_dmabuf_mr(%s, fd %d, offset %d, %s)",
                                 device.port().device, spec_.dmabuf.get(), spec_.dmabuf_offset,
                                 Size(spec_.length)));
    }
    return mr;
  }
  // Relaxed ordering lets the NIC reorder PCIe writes to the memory (as NCCL and perftest
  // ask): an optional flag, which ibv_reg_mr passes through ibv_reg_mr_iova2 and rdma-core
  // drops where the device or kernel does not support it (verbs.h, IBV_ACCESS_OPTIONAL_RANGE).
  MrPtr mr(api.RegMr(device.pd(), spec_.data, spec_.length,
                     IbvAccessFor(spec_.access) | IBV_ACCESS_RELAXED_ORDERING),
           MrDeleter{&api});
  if (!mr) {
    return absl::ErrnoToStatus(
        errno, absl::StrFormat("ibv_reg_mr(%s, %s)", device.port().device, Size(spec_.length)));
  }
  return mr;
}

absl::Status VerbsRegion::Bind(std::shared_ptr<VerbsDevice> device) {
  std::shared_ptr<VerbsDevice> old;
  MrPtr old_mr;
  {
    absl::MutexLock lock(&mu_);
    old = std::move(device_);
    old_mr = std::move(mr_);
    lkey_.store(0, std::memory_order_release);
    rkey_.store(0, std::memory_order_release);
  }
  if (old) old->Detach(this);
  old_mr.reset();
  absl::Status status;
  // A closed device registers nothing: the region waits for the fabric's next device.
  device->WhileOpen([&] {
    absl::StatusOr<MrPtr> mr = Register(*device);
    if (!mr.ok()) {
      status = mr.status();
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      lkey_.store((*mr)->lkey, std::memory_order_release);
      rkey_.store((*mr)->rkey, std::memory_order_release);
      mr_ = std::move(*mr);
      device_ = device;
    }
    device->Attach(this);
  });
  return status;
}

void VerbsRegion::ReleaseFromDevice() {
  absl::MutexLock lock(&mu_);
  lkey_.store(0, std::memory_order_release);
  rkey_.store(0, std::memory_order_release);
  mr_.reset();
}

absl::StatusOr<std::unique_ptr<fabric::MemoryRegion>> RegisterHost(
    std::shared_ptr<RegionSet> set, std::shared_ptr<VerbsDevice> device, void* data,
    uint64_t length, uint32_t access) {
  if (data == nullptr || length == 0) {
    return absl::InvalidArgumentError("verbs: cannot register an empty region");
  }
  return Make(std::move(set), std::move(device), {data, length, access, UniqueFd(), 0});
}

absl::StatusOr<std::unique_ptr<fabric::MemoryRegion>> RegisterDmabuf(
    std::shared_ptr<RegionSet> set, std::shared_ptr<VerbsDevice> device, void* data,
    uint64_t length, const fabric::DmabufHandle& dmabuf, uint32_t access) {
  if (length == 0 || dmabuf.fd < 0) {
    return absl::InvalidArgumentError("verbs: a DMA-BUF registration needs a length and an fd");
  }
  // The caller may close its fd after the call; ours registers the memory again after the
  // device comes back.
  UniqueFd fd(fcntl(dmabuf.fd, F_DUPFD_CLOEXEC, 0));
  if (!fd.valid()) {
    return absl::ErrnoToStatus(errno, absl::StrFormat("fcntl(dma-buf fd %d, F_DUPFD_CLOEXEC)",
                                                      dmabuf.fd));
  }
  return Make(std::move(set), std::move(device),
              {data, length, access | fabric::kDeviceMemory, std::move(fd), dmabuf.offset});
}

}  // namespace ferry::verbs
