#include "server/buffers/guarded_touch.h"

#include "absl/strings/str_cat.h"
#include "base/fault_guard.h"

namespace ferry::server {

absl::Status NotBroken(const Buffer& buffer, absl::string_view field) {
  if (!buffer.memory().broken()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      field, field.empty() ? "" : ": ", "buffer ", buffer.id(),
      " is broken: the client's file shrank under a transfer, so the agent no longer sees "
      "its memory; deregister it (DeregisterMemory) and register the memory again"));
}

absl::Status GuardedTouch(const Buffer& buffer, absl::FunctionRef<void()> touch) {
  const BufferMemory& memory = buffer.memory();
  if (absl::Status ok = NotBroken(buffer, ""); !ok.ok()) return ok;
  auto [begin, length] = memory.shrinkable_range();
  if (length == 0) {
    touch();
    return absl::OkStatus();
  }
  bool faulted = false;
  {
    FaultGuard guard(begin, length);
    touch();
    faulted = guard.faulted();
  }
  if (!faulted) return absl::OkStatus();
  memory.MarkBroken();
  return absl::DataLossError(absl::StrCat(
      "buffer ", buffer.id(),
      " (client memory): its file shrank while the agent read or wrote it (SIGBUS past the "
      "file's end); this op failed and the registration is broken: deregister it"));
}

}  // namespace ferry::server
