#pragma once
// The local clients' sessions. A session lives exactly as long as the client's OpenSession
// call: the client ends it by cancelling the call, and the agent sees it end when the
// client exits or crashes (its connection closes). What a session owns is freed then, so
// the pools' accounting returns to zero however clients leave.

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/buffers/buffer_registry.h"

namespace ferry::server {

// The metadata key that names the caller's session on every Agent / Tensors call.
inline constexpr char kSessionMetadata[] = "ferry-session";

class SessionRegistry {
 public:
  // `incarnation`: the agent's (AgentCore::incarnation), `started`: when it started; both
  // go to clients with their session id. Session ids start at a point drawn from the
  // incarnation (base/run_ids.h), not at 1: a client of an earlier run of the agent that
  // still names its old session is refused as "not open".
  explicit SessionRegistry(BufferRegistry* buffers, uint64_t incarnation = 0,
                           absl::Time started = absl::Now());
  // Runs the sweeps CloseSoon queued, then stops its thread.
  ~SessionRegistry();

  // A new session for `client` (what it is: "ferryctl", "python") running as `pid` and
  // `uid` (-1: not known).
  uint64_t Open(const std::string& client, uint32_t pid, int64_t uid = -1);
  // Ends the session and frees every buffer it owns (memory still used by a transfer in
  // flight goes back when that transfer finishes). Idempotent.
  void Close(uint64_t id);
  // Close for a caller that must not block (gRPC's callback threads: a peer call made there
  // cannot complete until the callback returns): the session is closed now, and its buffers
  // are freed on the registry's own thread, since freeing may call the peers that kept
  // their answers (server/peers/export_leases.h).
  void CloseSoon(uint64_t id);

  // Also run when a session ended, after its buffers were freed: what else it owns goes
  // (its block lists). Set once before use; an empty function (teardown) calls nothing.
  using ClosedHook = std::function<void(uint64_t session)>;
  void OnClose(ClosedHook hook) {
    absl::MutexLock lock(&mu_);
    on_close_ = std::move(hook);
  }

  // The session a call names in its metadata value (`value` empty: none, 0).
  // FAILED_PRECONDITION naming the key for a malformed id or one that is not open.
  absl::StatusOr<uint64_t> Resolve(absl::string_view value) const;
  bool IsOpen(uint64_t id) const;
  // What a buffer of the session shows as its owner; "" for session 0 (persists).
  BufferOwner OwnerFor(uint64_t id) const;
  // The uid that opened session `id` (-1: not known, or not open).
  int64_t UidOf(uint64_t id) const;
  size_t count() const;
  uint64_t incarnation() const { return incarnation_; }
  absl::Time started() const { return started_; }

 private:
  BufferRegistry* const buffers_;
  const uint64_t incarnation_;
  const absl::Time started_;
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_);
  struct Open_ {
    std::string label;
    int64_t uid = -1;
  };
  absl::flat_hash_map<uint64_t, Open_> open_ ABSL_GUARDED_BY(mu_);
  ClosedHook on_close_ ABSL_GUARDED_BY(mu_);
  // Closed sessions whose buffers the sweeper frees; started on first use.
  void Sweep();
  void FreeOf(uint64_t id);
  std::deque<uint64_t> to_sweep_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread sweeper_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry::server
