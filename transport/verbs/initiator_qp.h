#pragma once
// The initiator side of one RC connection: the QP our endpoint posts WRITE / WRITE-with-
// immediate / READ on, and the bookkeeping that gives every op exactly one completion.
//
// Ops are split into WRs of at most the port's message size. WRs wait in `pending_` while
// the send queue is full and are posted in chains; every Nth WR is signalled, and so is the
// last of a chain unless more WRs wait and a signalled one is already in flight (whose
// completion will post them). Under light load each op is signalled; under load one in N. A
// signalled completion retires every earlier WR of the QP (an RC QP completes in order), which
// frees their send queue slots. When the QP enters the error state the HCA flushes every posted WR
// with an error completion (signalled or not), so each op still completes exactly once.

#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "transport/fabric.h"
#include "transport/verbs/completion_poller.h"
#include "transport/verbs/handshake.h"
#include "transport/verbs/verbs_device.h"

namespace ferry::verbs {

class InitiatorQp : public CompletionSink,
                    public DeviceUser,
                    public std::enable_shared_from_this<InitiatorQp> {
 public:
  // Creates the QP (RESET). RESOURCE_EXHAUSTED when the device's CQs are fully promised.
  static absl::StatusOr<std::shared_ptr<InitiatorQp>> Create(std::shared_ptr<VerbsDevice> device,
                                                             const VerbsOptions& options);
  ~InitiatorQp() override;

  // Our half of the handshake.
  QpAddress LocalAddress() const;
  // Moves the QP to RTS against the target's half and starts taking posts.
  absl::Status Connect(const QpAddress& remote);

  // As fabric::Endpoint's posts; `opcode` is IBV_WR_RDMA_WRITE, _WITH_IMM or IBV_WR_RDMA_READ.
  absl::Status Post(ibv_wr_opcode opcode, const fabric::LocalSlice& local,
                    const fabric::RemoteSlice& remote, uint32_t imm, fabric::Completion done);
  bool broken() const;
  // Fails what is queued, flushes what is posted, waits for the flush and destroys the QP.
  void Close();

  uint32_t qpn() const { return qpn_; }
  uint32_t remote_qpn() const;
  void OnCompletion(const ibv_wc& wc) override;
  void OnFatal(const absl::Status& why, bool completions_lost) override;
  void ReleaseFromDevice() override;

 private:
  struct Op {
    fabric::Completion done;
    uint32_t wrs_left = 0;
    absl::Status status;
  };
  struct Wr {
    uint64_t seq = 0;
    std::shared_ptr<Op> op;
    ibv_wr_opcode opcode = IBV_WR_RDMA_WRITE;
    uint64_t local_addr = 0;
    uint32_t length = 0;
    uint32_t lkey = 0;
    uint64_t remote_addr = 0;
    uint32_t rkey = 0;
    uint32_t imm = 0;
    bool signaled = false;
    bool host_memory = true;  // the CPU may read the source (inline sends)
  };
  // Completions to run once the lock is released.
  using Finished = std::vector<std::pair<fabric::Completion, absl::Status>>;

  // Create's work while the device is open (WhileOpen): the QP, attached to the device.
  static absl::StatusOr<std::shared_ptr<InitiatorQp>> CreateOpen(
      const std::shared_ptr<VerbsDevice>& device, const VerbsOptions& options);
  InitiatorQp(std::shared_ptr<VerbsDevice> device, const VerbsOptions& options, CqSlot cq,
              QpPtr qp, uint32_t sq_depth, uint32_t max_inline);

  // Posts as many pending WRs as the send queue has room for. If ibv_post_send fails, the QP
  // is broken; `current` (the op being posted by the caller, or null) is refused through
  // `*current_status` if none of its WRs got onto the QP, every other op fails.
  void Pump(Finished& finished, const Op* current, absl::Status* current_status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Retire(Wr& wr, const absl::Status& status, Finished& finished)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Retires the oldest posted WR.
  void RetireFront(const absl::Status& status, Finished& finished)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Break(absl::Status reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails every op still waiting for the send queue with the reason the QP broke.
  void FailPending(Finished& finished) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void Run(Finished& finished);

  // Declared first: the device (CQ, PD, context) outlives the QP.
  const std::shared_ptr<VerbsDevice> device_;
  const VerbsOptions options_;
  CqSlot cq_;  // room in the CQ; given back after the QP is destroyed
  QpPtr qp_;   // destroyed by Close()
  const uint32_t qpn_;
  const uint32_t psn_;
  const uint32_t sq_depth_;
  const uint32_t inline_limit_;
  const uint32_t signal_every_;
  const uint64_t max_wr_bytes_;

  mutable absl::Mutex mu_;
  std::deque<Wr> pending_ ABSL_GUARDED_BY(mu_);
  std::deque<Wr> posted_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  uint32_t since_signal_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t signaled_outstanding_ ABSL_GUARDED_BY(mu_) = 0;  // signalled WRs in posted_
  int delivering_ ABSL_GUARDED_BY(mu_) = 0;  // poller rounds running completions
  bool connected_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);  // non-OK once broken: why
  uint32_t remote_qpn_ ABSL_GUARDED_BY(mu_) = 0;
  bool peer_takes_immediates_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ferry::verbs
