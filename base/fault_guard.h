#pragma once
// Touching memory another process can take away: a client's file, mapped MAP_SHARED, that
// the client truncates while the agent's CPU reads or writes it. Past the file's new end
// the access raises SIGBUS (mmap(2): "Attempted access to a portion of the buffer that does
// not correspond to the file"), whose default action kills the agent and with it every
// client's transfers and every peer's.
//
// While a FaultGuard lives, a SIGBUS on this thread at an address inside its range maps
// anonymous zero pages over the whole range (MAP_FIXED; what Wayland compositors do when a
// wl_shm client shrinks its pool under them), so the faulting access completes on zeros,
// and the guard records that it faulted: the caller then fails its op and marks the memory
// broken (its mapping no longer shows the client's file). A SIGBUS anywhere else, or on a
// thread without a guard, goes to the handler that was there before (a sanitizer's), or
// kills the process as it always did.
//
// Guards nest (the innermost whose range holds the address wins). The handler is
// async-signal-safe: it reads this thread's guards (initial-exec TLS), calls mmap and stores
// to a flag.

#include <cstddef>

namespace ferry {

class FaultGuard {
 public:
  // Guards [begin, begin + length); `begin` and `length` need not be page-aligned (the
  // pages holding them are what is replaced).
  FaultGuard(const void* begin, size_t length);
  ~FaultGuard();
  FaultGuard(const FaultGuard&) = delete;
  FaultGuard& operator=(const FaultGuard&) = delete;

  // True once a SIGBUS inside the range was taken: what the access read is zeros, and what
  // it wrote went nowhere.
  bool faulted() const { return faulted_ != 0; }

 private:
  friend struct FaultGuardAccess;
  const char* const begin_;
  const char* const end_;
  FaultGuard* const outer_;
  volatile int faulted_ = 0;
};

}  // namespace ferry
