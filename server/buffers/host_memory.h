#pragma once
// A buffer in the agent's host pool: a memfd of its own (transport/memory/host_pool.h), which
// the agent lends its owner over the fd socket to map.

#include <memory>
#include <string>

#include "server/buffers/buffer_memory.h"
#include "server/buffers/open_files.h"
#include "transport/memory/host_pool.h"

namespace ferry::server {

class HostMemory : public BufferMemory {
 public:
  explicit HostMemory(std::unique_ptr<memory::HostBlock> block) : block_(std::move(block)) {}

  char* data() const override { return block_->data(); }
  uint64_t size() const override { return block_->size(); }
  std::string device() const override { return "host"; }
  int gpu() const override { return -1; }
  std::string backend() const override { return "host"; }
  absl::StatusOr<BufferMapping> mapping() const override {
    return HostMapping{0, block_->size()};
  }
  absl::StatusOr<UniqueFd> LendFile() const override {
    return DupForClient(block_->file(), "host pool buffer");
  }

 private:
  std::unique_ptr<memory::HostBlock> block_;  // returns the range to the pool when dropped
  ClientFdHold fd_hold_;                      // the block's file counts against RLIMIT_NOFILE
};

}  // namespace ferry::server
