#include "transport/verbs/verbs_region.h"

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

}  // namespace

int IbvAccessFor(uint32_t access) {
  int flags = IBV_ACCESS_LOCAL_WRITE;
  if (access & fabric::kRemoteWrite) flags |= IBV_ACCESS_REMOTE_WRITE;
  if (access & fabric::kRemoteRead) flags |= IBV_ACCESS_REMOTE_READ;
  return flags;
}

absl::StatusOr<std::unique_ptr<fabric::MemoryRegion>> RegisterHost(
    std::shared_ptr<VerbsDevice> device, void* data, uint64_t length, uint32_t access) {
  if (data == nullptr || length == 0) {
    return absl::InvalidArgumentError("verbs: cannot register an empty region");
  }
  VerbsApi& api = device->api();
  // Relaxed ordering lets the NIC reorder PCIe writes to the memory (as NCCL and perftest
  // ask): an optional flag, which ibv_reg_mr passes through ibv_reg_mr_iova2 and rdma-core
  // drops where the device or kernel does not support it (verbs.h, IBV_ACCESS_OPTIONAL_RANGE).
  MrPtr mr(api.RegMr(device->pd(), data, length,
                     IbvAccessFor(access) | IBV_ACCESS_RELAXED_ORDERING),
           MrDeleter{&api});
  if (!mr) {
    return absl::ErrnoToStatus(errno, absl::StrFormat("ibv_reg_mr(%s, %s)", device->port().device,
                                                      Size(length)));
  }
  return std::unique_ptr<fabric::MemoryRegion>(
      new VerbsRegion(std::move(device), std::move(mr), data,
                      (access & fabric::kDeviceMemory) != 0, "ibv_reg_mr"));
}

absl::StatusOr<std::unique_ptr<fabric::MemoryRegion>> RegisterDmabuf(
    std::shared_ptr<VerbsDevice> device, void* data, uint64_t length,
    const fabric::DmabufHandle& dmabuf, uint32_t access) {
  if (length == 0 || dmabuf.fd < 0) {
    return absl::InvalidArgumentError("verbs: a DMA-BUF registration needs a length and an fd");
  }
  VerbsApi& api = device->api();
  MrPtr mr(api.RegDmabufMr(device->pd(), dmabuf.offset, length, reinterpret_cast<uint64_t>(data),
                           dmabuf.fd, IbvAccessFor(access)),
           MrDeleter{&api});
  if (!mr) {
    return absl::ErrnoToStatus(
        errno, absl::StrFormat("ibv_reg_dmabuf_mr(%s, fd %d, offset %d, %s)",
                               device->port().device, dmabuf.fd, dmabuf.offset, Size(length)));
  }
  return std::unique_ptr<fabric::MemoryRegion>(
      new VerbsRegion(std::move(device), std::move(mr), data, /*device_memory=*/true,
                      "ibv_reg_dmabuf_mr"));
}

}  // namespace ferry::verbs
