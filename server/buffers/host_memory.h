#pragma once
// A buffer in the agent's host pool: shared memory that clients map by path and offset.

#include <memory>
#include <string>

#include "server/buffers/buffer_memory.h"
#include "transport/memory/host_pool.h"

namespace ferry::server {

class HostMemory : public BufferMemory {
 public:
  // `path`: the pool's shared-memory file, which clients map.
  HostMemory(std::unique_ptr<memory::HostBlock> block, std::string path)
      : block_(std::move(block)), path_(std::move(path)) {}

  char* data() const override { return block_->data(); }
  uint64_t size() const override { return block_->size(); }
  std::string device() const override { return "host"; }
  int gpu() const override { return -1; }
  std::string backend() const override { return "host"; }
  absl::StatusOr<BufferMapping> mapping() const override {
    return HostMapping{path_, block_->offset(), block_->size()};
  }

 private:
  std::unique_ptr<memory::HostBlock> block_;  // returns the range to the pool when dropped
  std::string path_;
};

}  // namespace ferry::server
