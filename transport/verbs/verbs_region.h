#pragma once
// A memory registration on one device: an ibverbs MR with lkey/rkey. A region outlives the
// device it was registered on: when that device closes (removed, or DEVICE_FATAL) the MR goes
// with it and the region waits, keyless, until the fabric opens the device again and
// registers it anew (new keys: the agent revokes the answers peers kept).

#include <atomic>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "base/unique_fd.h"
#include "transport/fabric.h"
#include "transport/verbs/ibv_handles.h"
#include "transport/verbs/verbs_device.h"

namespace ferry::verbs {

// ibverbs access flags for a fabric::Access role: peers get only what the role needs.
// LOCAL_WRITE is always set: every region may be the destination of our own READs, and the
// HCA refuses REMOTE_WRITE without it.
int IbvAccessFor(uint32_t access);

class VerbsRegion;

// A fabric's regions, so that a device opened again registers every one of them.
class RegionSet {
 public:
  void Add(VerbsRegion* region);
  void Remove(VerbsRegion* region);
  // Registers every region on `device`; the number that failed (the first error in `error`).
  size_t BindAll(const std::shared_ptr<VerbsDevice>& device, absl::Status* error);
  size_t size();

 private:
  absl::Mutex mu_;  // held while binding: a region cannot go meanwhile
  absl::flat_hash_set<VerbsRegion*> regions_ ABSL_GUARDED_BY(mu_);
};

class VerbsRegion : public fabric::MemoryRegion, public DeviceUser {
 public:
  // What is registered: [data, data+length) of host memory, or of a DMA-BUF (`dmabuf` valid,
  // a dup kept so that the region can be registered again) addressed at `data` (the IOVA).
  struct Spec {
    void* data = nullptr;
    uint64_t length = 0;
    uint32_t access = 0;
    UniqueFd dmabuf;
    uint64_t dmabuf_offset = 0;
  };
  // An unregistered region in `set`; Bind registers it.
  VerbsRegion(std::shared_ptr<RegionSet> set, Spec spec);
  ~VerbsRegion() override;

  // Registers the memory on `device` (dropping any older MR). OK without registering when the
  // device is closed: the region waits for the next one.
  absl::Status Bind(std::shared_ptr<VerbsDevice> device);
  void ReleaseFromDevice() override;

  void* data() const override { return spec_.data; }
  uint64_t length() const override { return spec_.length; }
  // Not mr->addr: for ibv_reg_dmabuf_mr rdma-core sets that to the dma-buf offset
  // (libibverbs/verbs.c), while the HCA addresses the MR by the iova we registered.
  uint64_t remote_address() const override { return reinterpret_cast<uint64_t>(spec_.data); }
  // 0 while the region has no MR (its device is closed).
  uint32_t key() const override { return rkey_.load(std::memory_order_acquire); }
  std::string registration() const override {
    return spec_.dmabuf.valid() ? "ibv_reg_dmabuf_mr" : "ibv_reg_mr";
  }

  uint32_t lkey() const { return lkey_.load(std::memory_order_acquire); }
  // GPU memory: the CPU must never read it (no inline sends from it).
  bool device_memory() const {
    return spec_.dmabuf.valid() || (spec_.access & fabric::kDeviceMemory) != 0;
  }
  // The device the MR is on; null while it has none.
  const VerbsDevice* device() const;

 private:
  absl::StatusOr<MrPtr> Register(VerbsDevice& device) const;

  const std::shared_ptr<RegionSet> set_;
  const Spec spec_;
  std::atomic<uint32_t> lkey_{0}, rkey_{0};
  mutable absl::Mutex mu_;
  // The device outlives the MR: deregistration needs the PD and context.
  std::shared_ptr<VerbsDevice> device_ ABSL_GUARDED_BY(mu_);
  MrPtr mr_ ABSL_GUARDED_BY(mu_);
};

// ibv_reg_mr on [data, data+length): host memory, or GPU memory through nvidia-peermem.
absl::StatusOr<std::unique_ptr<fabric::MemoryRegion>> RegisterHost(
    std::shared_ptr<RegionSet> set, std::shared_ptr<VerbsDevice> device, void* data,
    uint64_t length, uint32_t access);

// ibv_reg_dmabuf_mr on a DMA-BUF (e.g. from cuMemGetHandleForAddressRange), addressed by
// peers and in local slices at `data` (the IOVA).
absl::StatusOr<std::unique_ptr<fabric::MemoryRegion>> RegisterDmabuf(
    std::shared_ptr<RegionSet> set, std::shared_ptr<VerbsDevice> device, void* data,
    uint64_t length, const fabric::DmabufHandle& dmabuf, uint32_t access);

}  // namespace ferry::verbs
