#include "transport/verbs/cq_pool.h"

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/strings/str_format.h"

namespace ferry::verbs {

CqSlot& CqSlot::operator=(CqSlot&& other) noexcept {
  if (this != &other) {
    Release();
    pool_ = std::exchange(other.pool_, nullptr);
    cq_ = std::exchange(other.cq_, nullptr);
    entries_ = std::exchange(other.entries_, 0);
  }
  return *this;
}

void CqSlot::Release() {
  if (pool_ != nullptr) pool_->Give(cq_, entries_);
  pool_ = nullptr;
  cq_ = nullptr;
  entries_ = 0;
}

CqPool::CqPool(VerbsApi* api, ibv_context* context, std::string device, uint32_t depth,
               int max_cqe, int max_cq, std::function<void(ibv_cq*)> on_new_cq)
    : api_(api),
      context_(context),
      device_(std::move(device)),
      depth_(std::max<uint32_t>(
          1, max_cqe > 0 ? std::min<uint32_t>(depth, static_cast<uint32_t>(max_cqe)) : depth)),
      max_cq_(max_cq),
      on_new_cq_(std::move(on_new_cq)) {}

absl::StatusOr<CqSlot> CqPool::Reserve(uint32_t entries) {
  ibv_cq* created = nullptr;
  {
    absl::MutexLock lock(&mu_);
    for (Cq& c : cqs_) {
      if (c.capacity - c.reserved >= entries) {
        c.reserved += entries;
        return CqSlot(this, c.cq.get(), entries);
      }
    }
    if (entries > depth_) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "verbs: a QP of %s needs %d CQ entries, more than one CQ holds (verbs.cq_depth %d)",
          device_, entries, depth_));
    }
    if (max_cq_ > 0 && cqs_.size() >= static_cast<size_t>(max_cq_)) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "verbs: %s has all its %d CQs open and full; raise verbs.cq_depth", device_, max_cq_));
    }
    errno = 0;
    CqPtr cq(api_->CreateCq(context_, static_cast<int>(depth_)), CqDeleter{api_});
    if (!cq) {
      return absl::ErrnoToStatus(errno, absl::StrFormat("ibv_create_cq(%s, %d entries, CQ #%d)",
                                                        device_, depth_, cqs_.size() + 1));
    }
    created = cq.get();
    // The driver may round the size up (ibv_create_cq(3): "at least cqe entries").
    const uint32_t capacity = static_cast<uint32_t>(std::max(created->cqe, 1));
    cqs_.push_back({std::move(cq), capacity, entries});
  }
  // Polled before any QP exists on it: the slot goes back only after this.
  if (on_new_cq_) on_new_cq_(created);
  return CqSlot(this, created, entries);
}

void CqPool::Give(ibv_cq* cq, uint32_t entries) {
  absl::MutexLock lock(&mu_);
  for (Cq& c : cqs_) {
    if (c.cq.get() == cq) c.reserved -= std::min(entries, c.reserved);
  }
}

uint64_t CqPool::reserved() const {
  absl::MutexLock lock(&mu_);
  uint64_t total = 0;
  for (const Cq& c : cqs_) total += c.reserved;
  return total;
}

size_t CqPool::cq_count() const {
  absl::MutexLock lock(&mu_);
  return cqs_.size();
}

}  // namespace ferry::verbs
