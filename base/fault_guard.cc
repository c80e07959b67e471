#include "base/fault_guard.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <mutex>

namespace ferry {
namespace {

// This thread's innermost guard. initial-exec: reading it from the signal handler must not
// allocate (a dynamic TLS access may).
thread_local FaultGuard* current __attribute__((tls_model("initial-exec"))) = nullptr;

struct sigaction previous_action;

}  // namespace

struct FaultGuardAccess {
  static FaultGuard* Outer(FaultGuard* g) { return g->outer_; }
  static bool Holds(const FaultGuard* g, const char* address) {
    return address >= g->begin_ && address < g->end_;
  }
  // Replaces the guard's pages by anonymous zero pages. True when that worked.
  static bool Replace(FaultGuard* g) {
    const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const uintptr_t from = reinterpret_cast<uintptr_t>(g->begin_) & ~(page - 1);
    const uintptr_t to = (reinterpret_cast<uintptr_t>(g->end_) + page - 1) & ~(page - 1);
    void* p = mmap(reinterpret_cast<void*>(from), to - from, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (p == MAP_FAILED) return false;
    g->faulted_ = 1;
    return true;
  }
};

namespace {

void OnSigbus(int sig, siginfo_t* info, void* context) {
  const char* address = static_cast<const char*>(info->si_addr);
  for (FaultGuard* g = current; g != nullptr; g = FaultGuardAccess::Outer(g)) {
    if (FaultGuardAccess::Holds(g, address)) {
      // Returning retries the access, on the zero pages now.
      if (FaultGuardAccess::Replace(g)) return;
      break;
    }
  }
  // Not ours: what was there before.
  if (previous_action.sa_flags & SA_SIGINFO) {
    if (previous_action.sa_sigaction != nullptr) {
      previous_action.sa_sigaction(sig, info, context);
      return;
    }
  } else if (previous_action.sa_handler != SIG_DFL && previous_action.sa_handler != SIG_IGN) {
    previous_action.sa_handler(sig);
    return;
  }
  // The default action: restored, then the access faults again and ends the process.
  signal(SIGBUS, SIG_DFL);
}

void InstallOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action = {};
    action.sa_sigaction = OnSigbus;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    sigaction(SIGBUS, &action, &previous_action);
  });
}

}  // namespace

FaultGuard::FaultGuard(const void* begin, size_t length)
    : begin_(static_cast<const char*>(begin)), end_(static_cast<const char*>(begin) + length),
      outer_(current) {
  InstallOnce();
  // The handler reads `current` only on this thread: a compiler barrier orders the stores.
  std::atomic_signal_fence(std::memory_order_seq_cst);
  current = this;
  std::atomic_signal_fence(std::memory_order_seq_cst);
}

FaultGuard::~FaultGuard() {
  std::atomic_signal_fence(std::memory_order_seq_cst);
  current = outer_;
  std::atomic_signal_fence(std::memory_order_seq_cst);
}

}  // namespace ferry
