#pragma once
// A buffer's memory, wherever it lives: the host pool (host_memory.h), a GPU pool
// (gpu_pools.h), or memory a client allocated and registered (client_memory.h). The
// registry, the planner and the engine see only this interface; `mapping()` is the plain
// description of how a client maps the memory, which the services turn into protos.

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <variant>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/unique_fd.h"
#include "transport/memory/gpu_device.h"

namespace ferry::server {

// Host memory: mmap [offset, offset+length) of the buffer's file, which the agent lends its
// owner over the fd socket (BufferMemory::LendFile; server/local/fd_inbox.h). Not a path:
// /proc/<agent pid>/fd/N opens only for the agent's own uid (or root).
struct HostMapping {
  uint64_t offset = 0;
  uint64_t length = 0;
};

// GPU memory: what the GPU exported for clients (CUDA IPC handle, or the simulation's
// shared-memory file), and the GPU's PCI address so a client opens it on the right device.
struct GpuMapping {
  memory::GpuExport exported;
  std::string pci;
};

using BufferMapping = std::variant<HostMapping, GpuMapping>;

class BufferMemory {
 public:
  virtual ~BufferMemory() = default;
  // Host address, or device address for a GPU buffer.
  virtual char* data() const = 0;
  virtual uint64_t size() const = 0;
  virtual std::string device() const = 0;   // "host" or "cuda:N"
  virtual int gpu() const = 0;              // -1 for host memory
  virtual std::string backend() const = 0;  // "host", "cuda" or "sim"
  // How a client maps it; the driver's error when GPU memory cannot be exported.
  virtual absl::StatusOr<BufferMapping> mapping() const = 0;
  // A new descriptor for the file that holds this memory and nothing of anyone else's (a
  // host pool buffer's own memfd, a client's registered file), for its owner to map at
  // HostMapping's offset. FAILED_PRECONDITION for memory that is no such file (GPU memory).
  virtual absl::StatusOr<UniqueFd> LendFile() const {
    return absl::FailedPreconditionError(
        absl::StrCat("buffer memory on ", device(), " is not a host file to lend"));
  }
  // The client's own memory (RegisterMemory), not the agent's pools: it counts in neither
  // pool's bytes, and DeregisterMemory (not FreeBuffer) ends it.
  virtual bool registered() const { return false; }
  // Memory another process can shrink under us (a client's file it may truncate): the range
  // every CPU touch of it guards (GuardedTouch, server/buffers/guarded_touch.h). Empty when
  // nobody can take it away: the agent's pools, a memfd sealed against shrinking.
  virtual std::pair<const char*, uint64_t> shrinkable_range() const { return {nullptr, 0}; }

  // A guarded touch faulted: the file shrank, and the agent's mapping shows zero pages
  // since, not the client's memory. Every later op on it fails.
  // Const: the memory's state, not its contents or description.
  void MarkBroken() const { broken_.store(true, std::memory_order_relaxed); }
  bool broken() const { return broken_.load(std::memory_order_relaxed); }

 private:
  mutable std::atomic<bool> broken_{false};
};

}  // namespace ferry::server
