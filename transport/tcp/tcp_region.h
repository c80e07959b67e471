#pragma once
// A tcp registration. Peers address it by the pointer it was registered with; the provider
// moves its bytes, with the CPU, through memory(): the same pointer for host memory, and for
// device memory the mapping a peer-memory client (transport/memory/peer_memory.h) gave,
// since the device address itself has no CPU pages behind it.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "transport/fabric.h"
#include "transport/tcp/region_table.h"

namespace ferry::tcp {

class TcpRegion : public fabric::MemoryRegion {
 public:
  // `pages` holds the peer-memory mapping of device memory (null for host memory) until the
  // region is gone.
  TcpRegion(RegionTable* table, void* data, char* memory, std::shared_ptr<char> pages,
            uint64_t length, uint32_t key)
      : table_(table),
        data_(data),
        memory_(memory),
        pages_(std::move(pages)),
        length_(length),
        key_(key) {}
  ~TcpRegion() override { table_->Remove(key_); }

  void* data() const override { return data_; }
  uint64_t length() const override { return length_; }
  uint64_t remote_address() const override { return reinterpret_cast<uint64_t>(data_); }
  uint32_t key() const override { return key_; }
  std::string registration() const override { return "tcp"; }
  absl::Status RestrictToLocal() override {
    table_->SetAccess(key_, fabric::kLocal);
    return absl::OkStatus();
  }
  absl::Status RestrictToPeers(const std::vector<std::string>& nodes) override {
    table_->SetAllowedPeers(key_, nodes);
    return absl::OkStatus();
  }

  // Where byte 0 is for the CPU.
  char* memory() const { return memory_; }

 private:
  RegionTable* table_;
  void* data_;
  char* memory_;
  std::shared_ptr<char> pages_;
  uint64_t length_;
  uint32_t key_;
};

}  // namespace ferry::tcp
