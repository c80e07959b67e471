#pragma once
// A memory registration on one device: an ibverbs MR with lkey/rkey.

#include <memory>
#include <string>

#include "transport/fabric.h"
#include "transport/verbs/ibv_handles.h"
#include "transport/verbs/verbs_device.h"

namespace ferry::verbs {

// ibverbs access flags for a fabric::Access role: peers get only what the role needs.
// LOCAL_WRITE is always set: every region may be the destination of our own READs, and the
// HCA refuses REMOTE_WRITE without it.
int IbvAccessFor(uint32_t access);

class VerbsRegion : public fabric::MemoryRegion {
 public:
  // `data` is the address the MR was registered at (its iova): SGEs and peers use it.
  VerbsRegion(std::shared_ptr<VerbsDevice> device, MrPtr mr, void* data, bool device_memory,
              std::string how)
      : device_(std::move(device)), mr_(std::move(mr)), data_(data),
        device_memory_(device_memory), how_(std::move(how)) {}

  void* data() const override { return data_; }
  uint64_t length() const override { return mr_->length; }
  // Not mr->addr: for ibv_reg_dmabuf_mr rdma-core sets that to the dma-buf offset
  // (libibverbs/verbs.c), while the HCA addresses the MR by the iova we registered.
  uint64_t remote_address() const override { return reinterpret_cast<uint64_t>(data_); }
  uint32_t key() const override { return mr_->rkey; }
  std::string registration() const override { return how_; }

  uint32_t lkey() const { return mr_->lkey; }
  // GPU memory: the CPU must never read it (no inline sends from it).
  bool device_memory() const { return device_memory_; }
  const VerbsDevice* device() const { return device_.get(); }

 private:
  // The device outlives the MR: deregistration needs the PD and context.
  std::shared_ptr<VerbsDevice> device_;
  MrPtr mr_;
  void* data_;
  bool device_memory_;
  std::string how_;
};

// ibv_reg_mr on [data, data+length): host memory, or GPU memory through nvidia-peermem.
absl::StatusOr<std::unique_ptr<fabric::MemoryRegion>> RegisterHost(
    std::shared_ptr<VerbsDevice> device, void* data, uint64_t length, uint32_t access);

// ibv_reg_dmabuf_mr on a DMA-BUF (e.g. from cuMemGetHandleForAddressRange), addressed by
// peers and in local slices at `data` (the IOVA).
absl::StatusOr<std::unique_ptr<fabric::MemoryRegion>> RegisterDmabuf(
    std::shared_ptr<VerbsDevice> device, void* data, uint64_t length,
    const fabric::DmabufHandle& dmabuf, uint32_t access);

}  // namespace ferry::verbs
