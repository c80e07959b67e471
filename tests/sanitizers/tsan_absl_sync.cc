// Linked into the test binaries of a TSan build only (FERRY_TSAN_ABSL_SHIM, `make test-tsan`).
//
// Why: Debian's libabsl_synchronization is built without TSan, so ThreadSanitizer never
// sees an absl::Mutex being taken or released (it is a futex and atomics inside a library
// TSan did not instrument) and would report every ABSL_GUARDED_BY member touched from two
// threads as a race. Abseil built with TSan annotates itself (ABSL_TSAN_MUTEX_* in
// mutex.cc); this file gives the same happens-before edges from outside: it defines the
// public entry points of Mutex, CondVar, Notification and BlockingCounter in the test
// executable, which takes precedence over the shared library's definitions (ELF symbol
// interposition, -rdynamic so the library's own calls come here too), tells TSan what each
// one means (release before letting go, acquire after taking), and calls the library's
// definition through dlsym(RTLD_NEXT).
//
// A Condition passed to Await / LockWhen is evaluated by whichever thread unlocks the mutex,
// inside the library; it is wrapped so that its evaluation counts as holding the mutex,
// as Abseil's own annotations do (EvalConditionAnnotated).

#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace {

template <typename Fn>
Fn Real(const char* symbol) {
  void* f = dlsym(RTLD_NEXT, symbol);
  if (f == nullptr) {
    fprintf(stderr, "tsan_absl_sync: %s not found in libabsl (%s)\n", symbol, dlerror());
    abort();
  }
  return reinterpret_cast<Fn>(f);
}

// Looked up on first use: dlsym may not run before the dynamic loader is done.
#define FERRY_REAL(type, symbol)                  \
  static const auto real = Real<type>(symbol)

void* Sync(const void* p) { return const_cast<void*>(p); }

struct Wrapped {
  const absl::Condition* cond;
  absl::Mutex* mu;
};

bool EvalHeld(void* arg) {
  __tsan_acquire(arg);  // see Held
  auto* w = static_cast<Wrapped*>(arg);
  __tsan_acquire(w->mu);
  bool r = w->cond->Eval();
  __tsan_release(w->mu);
  return r;
}

// The waiter builds `w` on its own stack and the unlocking thread reads it inside the
// library; what orders the two is absl's waiter queue, which TSan does not see (CI's TSan
// stage once reported exactly that read as a race). Publish `w` before handing it over.
absl::Condition Held(Wrapped* w) {
  __tsan_release(w);
  return absl::Condition(&EvalHeld, w);
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  FERRY_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex4LockEv");
  real(this);
  __tsan_acquire(this);
}

void Mutex::ReaderLock() {
  FERRY_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex10ReaderLockEv");
  real(this);
  __tsan_acquire(this);
}

bool Mutex::TryLock() {
  FERRY_REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex7TryLockEv");
  bool r = real(this);
  if (r) __tsan_acquire(this);
  return r;
}

bool Mutex::ReaderTryLock() {
  FERRY_REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex13ReaderTryLockEv");
  bool r = real(this);
  if (r) __tsan_acquire(this);
  return r;
}

void Mutex::Unlock() {
  FERRY_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex6UnlockEv");
  __tsan_release(this);
  real(this);
}

void Mutex::ReaderUnlock() {
  FERRY_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex12ReaderUnlockEv");
  __tsan_release(this);
  real(this);
}

void Mutex::LockWhen(const Condition& cond) {
  FERRY_REAL(void (*)(Mutex*, const Condition&),
             "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
  Wrapped w{&cond, this};
  real(this, Held(&w));
  __tsan_acquire(this);
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  FERRY_REAL(void (*)(Mutex*, const Condition&),
             "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Wrapped w{&cond, this};
  real(this, Held(&w));
  __tsan_acquire(this);
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  FERRY_REAL(bool (*)(Mutex*, const Condition&, Duration),
             "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Wrapped w{&cond, this};
  bool r = real(this, Held(&w), timeout);
  __tsan_acquire(this);  // held either way
  return r;
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  FERRY_REAL(bool (*)(Mutex*, const Condition&, Time),
             "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Wrapped w{&cond, this};
  bool r = real(this, Held(&w), deadline);
  __tsan_acquire(this);
  return r;
}

void Mutex::Await(const Condition& cond) {
  FERRY_REAL(void (*)(Mutex*, const Condition&), "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
  Wrapped w{&cond, this};
  __tsan_release(this);  // others may take it while we wait
  real(this, Held(&w));
  __tsan_acquire(this);
}

bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  FERRY_REAL(bool (*)(Mutex*, const Condition&, Duration),
             "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  Wrapped w{&cond, this};
  __tsan_release(this);
  bool r = real(this, Held(&w), timeout);
  __tsan_acquire(this);
  return r;
}

bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  FERRY_REAL(bool (*)(Mutex*, const Condition&, Time),
             "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  Wrapped w{&cond, this};
  __tsan_release(this);
  bool r = real(this, Held(&w), deadline);
  __tsan_acquire(this);
  return r;
}

void CondVar::Wait(Mutex* mu) {
  FERRY_REAL(void (*)(CondVar*, Mutex*), "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE");
  __tsan_release(mu);
  real(this, mu);
  __tsan_acquire(mu);
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  FERRY_REAL(bool (*)(CondVar*, Mutex*, Duration),
             "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  __tsan_release(mu);
  bool r = real(this, mu, timeout);
  __tsan_acquire(mu);
  return r;
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  FERRY_REAL(bool (*)(CondVar*, Mutex*, Time),
             "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  __tsan_release(mu);
  bool r = real(this, mu, deadline);
  __tsan_acquire(mu);
  return r;
}

void Notification::Notify() {
  FERRY_REAL(void (*)(Notification*), "_ZN4absl7debian312Notification6NotifyEv");
  __tsan_release(this);
  real(this);
}

void Notification::WaitForNotification() const {
  FERRY_REAL(void (*)(const Notification*),
             "_ZNK4absl7debian312Notification19WaitForNotificationEv");
  real(this);
  __tsan_acquire(Sync(this));
}

bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  FERRY_REAL(bool (*)(const Notification*, Duration),
             "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  bool r = real(this, timeout);
  if (r) __tsan_acquire(Sync(this));
  return r;
}

bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  FERRY_REAL(bool (*)(const Notification*, Time),
             "_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  bool r = real(this, deadline);
  if (r) __tsan_acquire(Sync(this));
  return r;
}

bool BlockingCounter::DecrementCount() {
  FERRY_REAL(bool (*)(BlockingCounter*), "_ZN4absl7debian315BlockingCounter14DecrementCountEv");
  __tsan_release(this);
  return real(this);
}

void BlockingCounter::Wait() {
  FERRY_REAL(void (*)(BlockingCounter*), "_ZN4absl7debian315BlockingCounter4WaitEv");
  real(this);
  __tsan_acquire(this);
}

ABSL_NAMESPACE_END
}  // namespace absl
