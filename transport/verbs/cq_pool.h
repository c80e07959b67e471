#pragma once
// The completion queues of one device, created as QPs need room. Every QP promises itself
// room for all its WRs in one CQ (on an error the HCA flushes each posted WR with a
// completion, signalled or not, all at once), so a CQ of `depth` entries holds only a few
// QPs; rather than one CQ that caps the connections a node may hold, the pool opens another
// CQ of the same depth when none has room, up to the device's max_cq. CQs stay open until
// the device closes (an empty CQ costs only its ring).

#include <infiniband/verbs.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "transport/verbs/ibv_handles.h"
#include "transport/verbs/verbs_api.h"

namespace ferry::verbs {

class CqPool;

// Room for `entries` completions in one of the pool's CQs; gives it back when destroyed.
// Destroy the QP that uses the CQ first.
class CqSlot {
 public:
  CqSlot() = default;
  CqSlot(CqSlot&& other) noexcept { *this = std::move(other); }
  CqSlot& operator=(CqSlot&& other) noexcept;
  ~CqSlot() { Release(); }

  ibv_cq* cq() const { return cq_; }
  uint32_t entries() const { return entries_; }

 private:
  friend class CqPool;
  CqSlot(CqPool* pool, ibv_cq* cq, uint32_t entries) : pool_(pool), cq_(cq), entries_(entries) {}
  void Release();

  CqPool* pool_ = nullptr;
  ibv_cq* cq_ = nullptr;
  uint32_t entries_ = 0;
};

class CqPool {
 public:
  // `on_new_cq` runs (under no pool lock) for every CQ the pool creates, so that the poller
  // starts polling it before any QP can complete into it. `depth` is capped by max_cqe.
  CqPool(VerbsApi* api, ibv_context* context, std::string device, uint32_t depth,
         int max_cqe, int max_cq, std::function<void(ibv_cq*)> on_new_cq);

  // RESOURCE_EXHAUSTED when `entries` exceeds one CQ or the device has no CQ left; the
  // ibv_create_cq error otherwise.
  absl::StatusOr<CqSlot> Reserve(uint32_t entries);

  // Promised entries over every CQ, and the CQs open (for tests and `ferryctl`).
  uint64_t reserved() const;
  size_t cq_count() const;

 private:
  friend class CqSlot;
  struct Cq {
    CqPtr cq;
    uint32_t capacity = 0;
    uint32_t reserved = 0;
  };
  void Give(ibv_cq* cq, uint32_t entries);

  VerbsApi* const api_;
  ibv_context* const context_;
  const std::string device_;
  const uint32_t depth_;
  const int max_cq_;
  const std::function<void(ibv_cq*)> on_new_cq_;

  mutable absl::Mutex mu_;
  std::vector<Cq> cqs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry::verbs
