#include "transport/verbs/target_qp.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <optional>

#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"
#include "base/status_macros.h"
#include "transport/verbs/qp_state.h"

namespace ferry::verbs {

absl::StatusOr<std::shared_ptr<TargetQp>> TargetQp::Create(
    std::shared_ptr<VerbsDevice> device, const VerbsOptions& options,
    const fabric::PeerInstance& initiator_agent, uint64_t initiator,
    std::shared_ptr<ImmediateDispatch> immediates) {
  const PortInfo& port = device->port();
  // Receives only serve WRITE-with-immediate: a fabric without an immediate handler posts
  // none (and says so in its reply), rather than 256 per connection that nothing consumes.
  uint32_t depth = 0;
  if (immediates->HasHandler()) {
    depth = std::max<uint32_t>(1, options.recv_queue_depth);
    if (port.max_qp_wr > 0) depth = std::min<uint32_t>(depth, port.max_qp_wr);
  }
  absl::StatusOr<std::shared_ptr<TargetQp>> made = absl::UnavailableError(
      absl::StrFormat("verbs: %s is closed", port.device));
  device->WhileOpen([&] { made = CreateOpen(device, options, initiator_agent, initiator,
                                            std::move(immediates), depth); });
  if (!made.ok() && device->closed()) return device->health();
  return made;
}

absl::StatusOr<std::shared_ptr<TargetQp>> TargetQp::CreateOpen(
    const std::shared_ptr<VerbsDevice>& device, const VerbsOptions& options,
    const fabric::PeerInstance& initiator_agent, uint64_t initiator,
    std::shared_ptr<ImmediateDispatch> immediates, uint32_t depth) {
  const PortInfo& port = device->port();
  // The send queue is never used; the posted receives may all flush at once.
  ASSIGN_OR_RETURN(CqSlot slot, device->ReserveCq(std::max<uint32_t>(depth, 1)));
  ibv_qp_init_attr init = {};
  init.send_cq = slot.cq();
  init.recv_cq = slot.cq();
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = 1;  // the target posts no sends; some drivers refuse 0
  init.cap.max_recv_wr = std::max<uint32_t>(depth, 1);
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  VerbsApi& api = device->api();
  QpPtr qp(api.CreateQp(device->pd(), &init), QpDeleter{&api});
  if (!qp) {
    return absl::ErrnoToStatus(errno, absl::StrFormat("ibv_create_qp(%s, RC, %d receives)",
                                                      port.device, depth));
  }
  std::shared_ptr<TargetQp> made(new TargetQp(device, options, std::move(slot),
                                                std::move(qp), depth, initiator_agent, initiator,
                                                std::move(immediates)));
  device->Attach(made.get());
  return made;
}

TargetQp::TargetQp(std::shared_ptr<VerbsDevice> device, const VerbsOptions& options, CqSlot cq,
                   QpPtr qp, uint32_t rq_depth, fabric::PeerInstance initiator_agent,
                   uint64_t initiator, std::shared_ptr<ImmediateDispatch> immediates)
    : device_(std::move(device)),
      options_(options),
      cq_(std::move(cq)),
      rq_depth_(rq_depth),
      initiator_agent_(std::move(initiator_agent)),
      initiator_(initiator),
      immediates_(std::move(immediates)),
      psn_(RandomPsn()),
      qp_(std::move(qp)),
      qpn_(qp_->qp_num) {}

TargetQp::~TargetQp() {
  device_->Detach(this);
  // The QP goes before its CQ room does (cq_ is destroyed after this body).
  absl::MutexLock lock(&mu_);
  qp_.reset();
}

QpAddress TargetQp::LocalAddress() const {
  QpAddress a = device_->AddressOf(qpn_, psn_);
  a.takes_immediates = rq_depth_ > 0;
  return a;
}

absl::Status TargetQp::PostReceive(uint64_t wr_id) {
  // No scatter list: a WRITE-with-immediate places its data by rkey; the receive only
  // carries the immediate.
  ibv_recv_wr wr = {};
  wr.wr_id = wr_id;
  wr.num_sge = 0;
  ibv_recv_wr* bad = nullptr;
  errno = 0;
  int rc = device_->api().PostRecv(qp_.get(), &wr, &bad);
  if (rc == 0) return absl::OkStatus();
  return absl::ErrnoToStatus(rc > 0 ? rc : errno,
                             absl::StrFormat("ibv_post_recv(QP 0x%x, wr_id %d)", qpn_, wr_id));
}

absl::Status TargetQp::Accept(const QpAddress& remote) {
  ibv_cq* cq = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (!qp_) return device_->health();  // released: its device closed
    // Peers may WRITE and READ through this QP; each region's own flags still decide.
    absl::Status s = ConnectQp(device_->api(), qp_.get(), device_->port(),
                               IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ, psn_, remote,
                               options_);
    if (!s.ok()) return s;
    // Receives go up before the reply leaves: the initiator cannot send before it has it.
    for (uint32_t i = 0; i < rq_depth_; ++i) {
      if (absl::Status p = PostReceive(i); !p.ok()) return p;
    }
    registered_ = true;
    cq = cq_.cq();
  }
  device_->poller().Add(qpn_, cq, shared_from_this());
  return absl::OkStatus();
}

bool TargetQp::dead() const {
  absl::MutexLock lock(&mu_);
  return dead_;
}

void TargetQp::OnCompletion(const ibv_wc& wc) {
  std::optional<uint32_t> imm;
  {
    absl::MutexLock lock(&mu_);
    if (wc.status != IBV_WC_SUCCESS) {
      if (!dead_ && wc.status != IBV_WC_WR_FLUSH_ERR) {
        spdlog::warn("verbs: target {}", WcStatusToStatus(wc).ToString());
      }
      dead_ = true;
      return;
    }
    if (wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM || dead_ || !qp_) return;
    // Repost first: the next immediate may already be on the wire.
    absl::Status s = PostReceive(wc.wr_id);
    if (!s.ok()) {
      spdlog::warn("verbs: {}", s.ToString());
      dead_ = true;
    }
    if (wc.wc_flags & IBV_WC_WITH_IMM) imm = ntohl(wc.imm_data);
  }
  if (imm) immediates_->Deliver(*imm);
}

void TargetQp::OnFatal(const absl::Status& why, bool) {
  // Nothing of ours is posted but receives; the fabric reaps the QP at the next accept.
  absl::MutexLock lock(&mu_);
  if (!dead_) spdlog::warn("verbs: target QP 0x{:x}: {}", qpn_, std::string(why.message()));
  dead_ = true;
}

void TargetQp::ReleaseFromDevice() {
  absl::MutexLock lock(&mu_);
  dead_ = true;
  qp_.reset();
  cq_ = CqSlot();
}

void TargetQp::Close() {
  bool registered;
  {
    absl::MutexLock lock(&mu_);
    if (!qp_) return;
    registered = registered_;
    dead_ = true;
    if (registered) {
      absl::Status s = MoveToError(device_->api(), qp_.get());
      if (!s.ok()) spdlog::warn("verbs: closing target: {}", s.ToString());
    }
  }
  // Receives carry no caller's completion: nothing waits for their flush.
  if (registered) device_->poller().Remove(qpn_);
  absl::MutexLock lock(&mu_);
  qp_.reset();
}

}  // namespace ferry::verbs
