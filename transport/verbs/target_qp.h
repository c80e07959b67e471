#pragma once
// The target side of one RC connection, created by AcceptConnect. Peers WRITE into and READ
// from our regions through it without our CPU. Where the fabric has an immediate handler it
// keeps receives posted so that each WRITE-with-immediate can consume one, and hands the
// immediate to the handler; elsewhere it posts none and tells the initiator so.

#include <functional>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "transport/fabric.h"
#include "transport/verbs/completion_poller.h"
#include "transport/verbs/handshake.h"
#include "transport/verbs/verbs_device.h"

namespace ferry::verbs {

// The fabric's immediate handler, shared with its target QPs; called without any lock.
class ImmediateDispatch {
 public:
  void Set(std::function<void(uint32_t)> handler) {
    absl::MutexLock lock(&mu_);
    handler_ = std::move(handler);
  }
  bool HasHandler() {
    absl::MutexLock lock(&mu_);
    return handler_ != nullptr;
  }
  void Deliver(uint32_t imm) {
    std::function<void(uint32_t)> handler;
    {
      absl::MutexLock lock(&mu_);
      handler = handler_;
    }
    if (handler) handler(imm);
  }

 private:
  absl::Mutex mu_;
  std::function<void(uint32_t)> handler_ ABSL_GUARDED_BY(mu_);
};

class TargetQp : public CompletionSink,
                 public DeviceUser,
                 public std::enable_shared_from_this<TargetQp> {
 public:
  // `initiator_agent` is the agent that asked (its node and incarnation), `initiator` its
  // fabric's id from the handshake. Receives are posted only if `immediates` has a handler.
  static absl::StatusOr<std::shared_ptr<TargetQp>> Create(
      std::shared_ptr<VerbsDevice> device, const VerbsOptions& options,
      const fabric::PeerInstance& initiator_agent, uint64_t initiator,
      std::shared_ptr<ImmediateDispatch> immediates);
  ~TargetQp() override;

  QpAddress LocalAddress() const;
  // RESET -> RTS against the initiator, then posts the receives.
  absl::Status Accept(const QpAddress& remote);
  // Stops the QP (its receives flush) and destroys it.
  void Close();

  uint32_t qpn() const { return qpn_; }
  uint64_t initiator() const { return initiator_; }
  const fabric::PeerInstance& initiator_agent() const { return initiator_agent_; }
  // True once the QP left RTS (an error, or a flush): nothing can use it any more.
  bool dead() const;
  void OnCompletion(const ibv_wc& wc) override;
  void OnFatal(const absl::Status& why, bool completions_lost) override;
  void ReleaseFromDevice() override;

 private:
  // Create's work while the device is open (WhileOpen): the QP, attached to the device.
  static absl::StatusOr<std::shared_ptr<TargetQp>> CreateOpen(
      const std::shared_ptr<VerbsDevice>& device, const VerbsOptions& options,
      const fabric::PeerInstance& initiator_agent, uint64_t initiator,
      std::shared_ptr<ImmediateDispatch> immediates, uint32_t depth);
  TargetQp(std::shared_ptr<VerbsDevice> device, const VerbsOptions& options, CqSlot cq, QpPtr qp,
           uint32_t rq_depth, fabric::PeerInstance initiator_agent, uint64_t initiator,
           std::shared_ptr<ImmediateDispatch> immediates);
  absl::Status PostReceive(uint64_t wr_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<VerbsDevice> device_;
  const VerbsOptions options_;
  CqSlot cq_;  // room in the CQ; given back after the QP is destroyed (or released)
  const uint32_t rq_depth_;  // receives kept posted; 0 without an immediate handler
  const fabric::PeerInstance initiator_agent_;
  const uint64_t initiator_;
  const std::shared_ptr<ImmediateDispatch> immediates_;
  const uint32_t psn_;

  mutable absl::Mutex mu_;
  QpPtr qp_ ABSL_GUARDED_BY(mu_);
  const uint32_t qpn_;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  bool dead_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ferry::verbs
