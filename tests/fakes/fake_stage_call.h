#pragma once
// The peer's side of a Stage call (server/peers/stage_call.h), in-process, for engine unit
// tests: it grants chunks of the peer's own bounce pool (registered with the peer's fabric),
// copies what we report into the peer's memory, copies out what we fetch, and calls back on
// a thread of its own, as the gRPC client does from its reader thread. Strict: what the real
// Stage service refuses (a report of a chunk not granted or reported twice, a range outside
// the buffer or longer than a chunk, a call used the wrong way round) is recorded in
// violations() and refused. At most `depth` WRITE credits are out at once, as the service
// grants them; fetches are not bounded here (the service queues them on its pool), so
// peak_grants() tells how many the sender asked for at once.

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/buffers/bounce_pools.h"
#include "server/peers/stage_call.h"

namespace ferry::fake {

class FakeStageCall : public server::StageCall {
 public:
  // `memory`/`size`: the peer's buffer behind the call (its GPU, as far as we can tell).
  // `rail`: the peer fabric whose keys the grants carry. `hold`: copies wait for
  // ReleaseCopies() (a slow peer GPU).
  FakeStageCall(server::StageCallSpec spec, server::StageEvents* events,
                std::shared_ptr<server::StagingPool> pool, fabric::RailId rail, char* memory,
                uint64_t size, bool hold);
  ~FakeStageCall() override;

  // --- server::StageCall ---
  const server::StageCallSpec& spec() const override { return spec_; }
  absl::Status Open() override;
  uint64_t grant_length() const override { return pool_->chunk_bytes(); }
  // As the gRPC client's: the call ends and, on its thread, reports OnCallFailed.
  void Cancel() override;
  absl::StatusOr<server::StageGrant> TakeGrant(absl::Time deadline) override;
  bool Report(uint64_t grant, uint64_t offset, uint64_t length, uint64_t token) override;
  void Fetch(uint64_t offset, uint64_t length, Ready ready) override;
  void Release(uint64_t grant) override;
  absl::Status Close(absl::Time deadline) override;

  // --- test knobs ---
  // After `n` more grants, TakeGrant fails with `why` (the peer's pool ran dry).
  void FailGrantsAfter(int n, absl::Status why);
  void ReleaseCopies();
  // The call breaks now, as a peer agent that went away: OnCallFailed(why) on the call's
  // thread, then nothing more is copied or granted.
  void Fail(absl::Status why);
  // Waits until `n` copies are held; false on timeout.
  bool AwaitHeld(size_t n, absl::Duration timeout);

  // --- inspection ---
  size_t outstanding_grants() const;
  size_t peak_grants() const;  // granted (or being fetched) at once, at most
  uint64_t copies() const;     // chunks copied in (WRITE) or out (READ)
  bool ended() const;
  std::vector<std::string> violations() const;

 private:
  using Task = absl::AnyInvocable<void() &&>;
  void Loop();
  void Push(Task task) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Violation(std::string what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailLocked(absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the call: every grant goes back to the peer's pool.
  void EndLocked(absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<server::StageGrant> GrantLocked(uint64_t length, uint64_t token)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const server::StageCallSpec spec_;
  server::StageEvents* const events_;
  const std::shared_ptr<server::StagingPool> pool_;
  const fabric::RailId rail_;
  char* const memory_;
  const uint64_t size_;

  mutable absl::Mutex mu_;
  bool hold_ ABSL_GUARDED_BY(mu_);
  bool opened_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status verdict_ ABSL_GUARDED_BY(mu_);
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  uint64_t next_grant_ ABSL_GUARDED_BY(mu_) = 1;
  struct Granted {
    server::ChunkLease lease;
    bool reported = false;
  };
  std::map<uint64_t, Granted> granted_ ABSL_GUARDED_BY(mu_);
  size_t fetching_ ABSL_GUARDED_BY(mu_) = 0;
  size_t peak_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t copies_ ABSL_GUARDED_BY(mu_) = 0;
  int grants_left_ ABSL_GUARDED_BY(mu_) = -1;  // -1: no limit
  absl::Status grant_failure_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> violations_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace ferry::fake
