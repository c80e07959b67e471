#pragma once
// Memory a client allocated itself and registers with the agent (RegisterMemory): host
// memory shared by file descriptor, which the agent maps too, or a GPU allocation the agent
// imports (CUDA IPC handle; a simulated GPU's shared memory by fd). Each registration is a
// Buffer (BufferRegistry::AddClientMemory), so transfers, block lists and the session's
// clean-up treat it as any buffer; only DeregisterMemory ends it early.

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "base/unique_fd.h"
#include "server/buffers/buffer_memory.h"
#include "server/buffers/buffer_registry.h"

namespace ferry::server {

class GpuPools;

// What a client registers.
struct ClientMemorySpec {
  UniqueFd fd;               // host memory or a simulated GPU's: the file that holds it
  std::string ipc_handle;    // or a CUDA IPC handle (cudaIpcMemHandle_t bytes)
  uint64_t offset = 0;       // in the file, or in the allocation the handle names
  uint64_t length = 0;
  uint64_t allocation_size = 0;  // a GPU descriptor's whole allocation (GpuImport)
  std::string device = "host";  // "host" or "cuda:N"
  std::string name;          // optional: exported to peers, as AllocBuffer's name
  std::vector<std::string> allowed_peers;
};

struct ClientRegistration {
  std::shared_ptr<Buffer> buffer;
  bool existing = false;     // the session had registered the same range already
};

class ClientMemory {
 public:
  ClientMemory(BufferRegistry* buffers, GpuPools* gpus) : buffers_(buffers), gpus_(gpus) {}

  // Maps or imports the memory and registers it as a buffer `owner` owns; the same range
  // (same file or handle, offset, length and device) registered again by the same session
  // returns the first registration while it lives. INVALID_ARGUMENT naming the field for a
  // descriptor that is not shared memory, a read-only one, or a range outside the file.
  absl::StatusOr<ClientRegistration> Register(ClientMemorySpec spec, BufferOwner owner);

 private:
  // What makes two registrations the same range.
  using RangeKey = std::tuple<uint64_t /*session*/, std::string /*device*/, dev_t, ino_t,
                              std::string /*handle*/, uint64_t /*offset*/, uint64_t /*length*/>;

  BufferRegistry* const buffers_;
  GpuPools* const gpus_;
  absl::Mutex mu_;
  // Registered ranges -> buffer id; an entry whose buffer is gone is replaced on next use.
  absl::flat_hash_map<RangeKey, uint64_t> ranges_ ABSL_GUARDED_BY(mu_);
};

// Host memory from a client's file: [offset, offset + length) of `fd`, mapped shared.
// INVALID_ARGUMENT / OUT_OF_RANGE as ClientMemory::Register says, the failing call's errno
// otherwise.
absl::StatusOr<std::unique_ptr<BufferMemory>> MapClientFile(UniqueFd fd, uint64_t offset,
                                                            uint64_t length);

}  // namespace ferry::server
