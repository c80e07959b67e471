#pragma once
// Every CPU touch of a buffer's memory by the agent (a checksum, a simulated GPU's copy)
// runs through GuardedTouch: for memory a client can shrink under us (its own file, not
// sealed), a fault then fails this op instead of killing the agent (base/fault_guard.h).

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "server/buffers/buffer_registry.h"

namespace ferry::server {

// Runs `touch`, which reads or writes `buffer`'s memory with the CPU. FAILED_PRECONDITION
// (touch not run) for a buffer broken already; DATA_LOSS naming the buffer when the touch
// faulted (the client's file shrank under it): the buffer is broken from then on, and what
// the touch read was zeros.
absl::Status GuardedTouch(const Buffer& buffer, absl::FunctionRef<void()> touch);

// FAILED_PRECONDITION naming `field` and the buffer when it is broken; OK else.
absl::Status NotBroken(const Buffer& buffer, absl::string_view field);

}  // namespace ferry::server
