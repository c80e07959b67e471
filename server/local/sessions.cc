#include "server/local/sessions.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/run_ids.h"
#include "spdlog/spdlog.h"

namespace ferry::server {

SessionRegistry::SessionRegistry(BufferRegistry* buffers, uint64_t incarnation,
                                 absl::Time started)
    : buffers_(buffers),
      incarnation_(incarnation),
      started_(started),
      next_id_(FirstIdOfRun(incarnation)) {}

uint64_t SessionRegistry::Open(const std::string& client, uint32_t pid, int64_t uid) {
  absl::MutexLock lock(&mu_);
  uint64_t id = next_id_++;
  std::string what = client.empty() ? "client" : client.substr(0, 64);
  open_.emplace(id, Open_{absl::StrCat("session ", id, " (", what, ", pid ", pid,
                                       uid >= 0 ? absl::StrCat(", uid ", uid) : "", ")"),
                          uid});
  spdlog::debug("session {} opened by {} (pid {}, uid {})", id, what, pid, uid);
  return id;
}

SessionRegistry::~SessionRegistry() {
  std::thread sweeper;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    sweeper = std::move(sweeper_);
  }
  if (sweeper.joinable()) sweeper.join();
}

void SessionRegistry::Close(uint64_t id) {
  {
    absl::MutexLock lock(&mu_);
    if (open_.erase(id) == 0) return;
  }
  FreeOf(id);
}

void SessionRegistry::CloseSoon(uint64_t id) {
  absl::MutexLock lock(&mu_);
  if (open_.erase(id) == 0) return;
  to_sweep_.push_back(id);
  if (!sweeper_.joinable()) sweeper_ = std::thread([this] { Sweep(); });
}

void SessionRegistry::Sweep() {
  while (true) {
    uint64_t id = 0;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !to_sweep_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (to_sweep_.empty()) return;  // stopping, and nothing left to free
      id = to_sweep_.front();
      to_sweep_.pop_front();
    }
    FreeOf(id);
  }
}

void SessionRegistry::FreeOf(uint64_t id) {
  // After the erase: an Allocate racing with this close either lands before the sweep (and
  // is swept) or sees the session closed and frees its buffer itself.
  size_t freed = buffers_->FreeOwnedBy(id);
  ClosedHook hook;
  {
    absl::MutexLock lock(&mu_);
    hook = on_close_;
  }
  if (hook) hook(id);
  spdlog::debug("session {} ended; {} buffer(s) freed", id, freed);
}

absl::StatusOr<uint64_t> SessionRegistry::Resolve(absl::string_view value) const {
  if (value.empty()) return 0;
  uint64_t id = 0;
  if (!absl::SimpleAtoi(value, &id) || id == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(kSessionMetadata, ": '", value.substr(0, 32), "' is not a session id"));
  }
  if (!IsOpen(id)) {
    return absl::FailedPreconditionError(
        absl::StrCat(kSessionMetadata, ": session ", id, " is not open (it ended)"));
  }
  return id;
}

bool SessionRegistry::IsOpen(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  return open_.contains(id);
}

BufferOwner SessionRegistry::OwnerFor(uint64_t id) const {
  if (id == 0) return {};
  absl::MutexLock lock(&mu_);
  auto it = open_.find(id);
  if (it == open_.end()) return {id, absl::StrCat("session ", id)};
  return {id, it->second.label, it->second.uid};
}

int64_t SessionRegistry::UidOf(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(id);
  return it == open_.end() ? -1 : it->second.uid;
}

size_t SessionRegistry::count() const {
  absl::MutexLock lock(&mu_);
  return open_.size();
}

}  // namespace ferry::server
