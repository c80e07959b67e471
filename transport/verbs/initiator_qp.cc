#include "transport/verbs/initiator_qp.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "spdlog/spdlog.h"
#include "base/status_macros.h"
#include "transport/verbs/qp_state.h"
#include "transport/verbs/verbs_region.h"

namespace ferry::verbs {
namespace {

// WRs handed to one ibv_post_send: long enough to amortize the doorbell, short enough to keep
// the arrays on the stack.
constexpr size_t kMaxChain = 64;
// An sge length is 32 bits; stay a page below so split points keep 4 KiB alignment.
constexpr uint64_t kMaxSgeBytes = (1ull << 31);
// How long Close() waits for the HCA to flush posted WRs before giving up on them.
constexpr absl::Duration kFlushWait = absl::Seconds(10);

}  // namespace

absl::StatusOr<std::shared_ptr<InitiatorQp>> InitiatorQp::Create(
    std::shared_ptr<VerbsDevice> device, const VerbsOptions& options) {
  absl::StatusOr<std::shared_ptr<InitiatorQp>> made = absl::UnknownError("not run");
  if (!device->WhileOpen([&] { made = CreateOpen(device, options); })) return device->health();
  return made;
}

absl::StatusOr<std::shared_ptr<InitiatorQp>> InitiatorQp::CreateOpen(
    const std::shared_ptr<VerbsDevice>& device, const VerbsOptions& options) {
  const PortInfo& port = device->port();
  uint32_t depth = std::max<uint32_t>(1, options.send_queue_depth);
  if (port.max_qp_wr > 0) depth = std::min<uint32_t>(depth, port.max_qp_wr);
  // Every WR can come back at once (a flush), so the CQ must have room for all of them.
  ASSIGN_OR_RETURN(CqSlot slot, device->ReserveCq(depth));
  ibv_qp_init_attr init = {};
  init.send_cq = slot.cq();
  init.recv_cq = slot.cq();
  init.qp_type = IBV_QPT_RC;
  init.sq_sig_all = 0;  // selective signalling: we choose per WR
  init.cap.max_send_wr = depth;
  init.cap.max_recv_wr = 1;  // nothing is received here; some drivers refuse 0
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  init.cap.max_inline_data = options.inline_threshold;
  VerbsApi& api = device->api();
  QpPtr qp(api.CreateQp(device->pd(), &init), QpDeleter{&api});
  if (!qp && options.inline_threshold > 0) {
    // Some devices cannot inline at all: retry without, rather than failing the connection.
    init.cap.max_inline_data = 0;
    init.cap.max_send_wr = depth;
    qp.reset(api.CreateQp(device->pd(), &init));
  }
  if (!qp) {
    return absl::ErrnoToStatus(errno, absl::StrFormat("ibv_create_qp(%s, RC, %d send WRs)",
                                                      port.device, depth));
  }
  uint32_t granted = std::min<uint32_t>(depth, init.cap.max_send_wr);
  uint32_t inline_limit = std::min<uint32_t>(options.inline_threshold, init.cap.max_inline_data);
  std::shared_ptr<InitiatorQp> made(
      new InitiatorQp(device, options, std::move(slot), std::move(qp), granted, inline_limit));
  device->Attach(made.get());
  return made;
}

InitiatorQp::InitiatorQp(std::shared_ptr<VerbsDevice> device, const VerbsOptions& options,
                         CqSlot cq, QpPtr qp, uint32_t sq_depth, uint32_t inline_limit)
    : device_(std::move(device)),
      options_(options),
      cq_(std::move(cq)),
      qp_(std::move(qp)),
      qpn_(qp_->qp_num),
      psn_(RandomPsn()),
      sq_depth_(sq_depth),
      inline_limit_(inline_limit),
      // A full send queue of unsignalled WRs would never drain.
      signal_every_(std::clamp<uint32_t>(options.signal_every, 1, sq_depth)),
      max_wr_bytes_(std::min<uint64_t>(
          {options.max_message_bytes ? options.max_message_bytes : UINT64_MAX,
           device_->port().max_msg_sz ? device_->port().max_msg_sz : kMaxSgeBytes, kMaxSgeBytes})) {
}

InitiatorQp::~InitiatorQp() {
  device_->Detach(this);
  // The QP goes before its CQ room does (cq_ is destroyed after this body).
  absl::MutexLock lock(&mu_);
  qp_.reset();
}

QpAddress InitiatorQp::LocalAddress() const {
  return device_->AddressOf(qpn_, psn_);
}

absl::Status InitiatorQp::Connect(const QpAddress& remote) {
  ibv_cq* cq = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;  // released: its device closed
    if (connected_ || closing_) {
      return absl::FailedPreconditionError(absl::StrFormat("verbs: QP 0x%x is already used", qpn_));
    }
    // The initiator's QP answers no requests: it needs no remote access rights.
    absl::Status s = ConnectQp(device_->api(), qp_.get(), device_->port(), 0, psn_, remote,
                               options_);
    if (!s.ok()) return s;
    connected_ = true;
    remote_qpn_ = remote.qpn;
    peer_takes_immediates_ = remote.takes_immediates;
    cq = cq_.cq();
  }
  device_->poller().Add(qpn_, cq, shared_from_this());
  return absl::OkStatus();
}

uint32_t InitiatorQp::remote_qpn() const {
  absl::MutexLock lock(&mu_);
  return remote_qpn_;
}

bool InitiatorQp::broken() const {
  absl::MutexLock lock(&mu_);
  return !broken_.ok() || closing_;
}

absl::Status InitiatorQp::Post(ibv_wr_opcode opcode, const fabric::LocalSlice& local,
                               const fabric::RemoteSlice& remote, uint32_t imm,
                               fabric::Completion done) {
  if (local.region == nullptr || local.length == 0 || local.offset > local.region->length() ||
      local.length > local.region->length() - local.offset) {
    return absl::OutOfRangeError(absl::StrCat("verbs: local slice [", local.offset, ", +",
                                              local.length, ") is outside its region"));
  }
  const auto* region = dynamic_cast<const VerbsRegion*>(local.region);
  if (region != nullptr && region->device() == nullptr) {
    return absl::UnavailableError(absl::StrFormat(
        "verbs: the local slice's memory has no registration on %s (the device closed; it is "
        "registered again when the device comes back)",
        device_->port().device));
  }
  if (region == nullptr || region->device() != device_.get()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "verbs: the local slice's region is not registered with %s (registration: %s)",
        device_->port().device, local.region->registration()));
  }
  const uint64_t base = region->remote_address() + local.offset;
  Finished finished;
  absl::Status result;
  {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;
    if (closing_) {
      return absl::UnavailableError(absl::StrFormat("verbs: endpoint (QP 0x%x) is closed", qpn_));
    }
    if (!connected_) {
      return absl::FailedPreconditionError(
          absl::StrFormat("verbs: QP 0x%x is not connected", qpn_));
    }
    if (opcode == IBV_WR_RDMA_WRITE_WITH_IMM && !peer_takes_immediates_) {
      // It posted no receives: the WRITE would wait in RNR retries forever (rnr_retry 7).
      return absl::FailedPreconditionError(absl::StrFormat(
          "verbs: the peer of QP 0x%x takes no immediates (it had no immediate handler when "
          "it accepted this connection)",
          qpn_));
    }
    auto op = std::make_shared<Op>();
    op->done = std::move(done);
    const uint64_t parts = (local.length + max_wr_bytes_ - 1) / max_wr_bytes_;
    op->wrs_left = static_cast<uint32_t>(parts);
    for (uint64_t i = 0; i < parts; ++i) {
      const uint64_t offset = i * max_wr_bytes_;
      Wr w;
      w.seq = next_seq_++;
      w.op = op;
      // Only the last part of a WRITE-with-immediate carries the immediate: RC executes WRs
      // in order, so the peer is told only after every part has landed.
      w.opcode = opcode == IBV_WR_RDMA_WRITE_WITH_IMM && i + 1 < parts ? IBV_WR_RDMA_WRITE : opcode;
      w.local_addr = base + offset;
      w.length = static_cast<uint32_t>(std::min(max_wr_bytes_, local.length - offset));
      w.lkey = region->lkey();
      w.host_memory = !region->device_memory();
      w.remote_addr = remote.address + offset;
      w.rkey = remote.key;
      w.imm = imm;
      pending_.push_back(std::move(w));
    }
    Pump(finished, op.get(), &result);
  }
  Run(finished);
  if (result.ok()) device_->poller().Wake();
  return result;
}

void InitiatorQp::Pump(Finished& finished, const Op* current, absl::Status* current_status) {
  while (broken_.ok() && !closing_ && !pending_.empty() && posted_.size() < sq_depth_) {
    const size_t n = std::min({pending_.size(), sq_depth_ - posted_.size(), kMaxChain});
    ibv_sge sge[kMaxChain];
    ibv_send_wr swr[kMaxChain];
    const bool more_waiting = pending_.size() > n;
    uint32_t chain_signals = 0;
    for (size_t i = 0; i < n; ++i) {
      Wr& w = pending_[i];
      sge[i] = {w.local_addr, w.length, w.lkey};
      swr[i] = {};
      swr[i].wr_id = w.seq;
      swr[i].sg_list = &sge[i];
      swr[i].num_sge = 1;
      swr[i].opcode = w.opcode;
      // Signal every Nth WR so the send queue is reclaimed, and the last of the chain when no
      // later WR is known or no signalled one is in flight: nothing posted may wait for a
      // completion that never comes.
      const bool last = i + 1 == n;
      w.signaled = ++since_signal_ >= signal_every_ ||
                   (last && (!more_waiting || signaled_outstanding_ + chain_signals == 0));
      if (w.signaled) {
        swr[i].send_flags |= IBV_SEND_SIGNALED;
        since_signal_ = 0;
        ++chain_signals;
      }
      // Inline data is copied by the CPU at post time (libmlx5): only from host memory; a
      // GPU source would be a SIGSEGV here.
      if (w.opcode != IBV_WR_RDMA_READ && w.host_memory && w.length <= inline_limit_) {
        swr[i].send_flags |= IBV_SEND_INLINE;
      }
      if (w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) swr[i].imm_data = htonl(w.imm);
      swr[i].wr.rdma.remote_addr = w.remote_addr;
      swr[i].wr.rdma.rkey = w.rkey;
      swr[i].next = i + 1 < n ? &swr[i + 1] : nullptr;
    }
    ibv_send_wr* bad = nullptr;
    errno = 0;
    int rc = device_->api().PostSend(qp_.get(), swr, &bad);
    size_t accepted = rc == 0 ? n : (bad != nullptr ? static_cast<size_t>(bad - swr) : 0);
    for (size_t i = 0; i < accepted; ++i) {
      signaled_outstanding_ += pending_.front().signaled;
      posted_.push_back(std::move(pending_.front()));
      pending_.pop_front();
    }
    if (rc == 0) continue;
    int err = rc > 0 ? rc : errno;
    Break(absl::UnavailableError(absl::StrFormat(
        "verbs: ibv_post_send(QP 0x%x, wr_id %d) failed: %s (%s)", qpn_, swr[accepted].wr_id,
        strerror(err), ErrnoName(err))));
    // WRs posted after the last signalled one would wait forever: flushing them completes
    // them with IBV_WC_WR_FLUSH_ERR.
    if (!posted_.empty()) {
      absl::Status s = MoveToError(device_->api(), qp_.get());
      if (!s.ok()) spdlog::warn("verbs: {}", s.ToString());
    }
    size_t current_pending = 0;
    for (const Wr& w : pending_) current_pending += w.op.get() == current;
    if (current != nullptr && current_pending == current->wrs_left) {
      // None of the caller's op reached the QP: refuse it now; its completion never runs.
      *current_status = broken_;
      std::erase_if(pending_, [current](const Wr& w) { return w.op.get() == current; });
    }
    FailPending(finished);
    return;
  }
}

void InitiatorQp::Retire(Wr& wr, const absl::Status& status, Finished& finished) {
  Op& op = *wr.op;
  if (!status.ok() && op.status.ok()) op.status = status;
  if (--op.wrs_left == 0) finished.emplace_back(std::move(op.done), op.status);
  wr.op.reset();
}

void InitiatorQp::RetireFront(const absl::Status& status, Finished& finished) {
  signaled_outstanding_ -= posted_.front().signaled;
  Retire(posted_.front(), status, finished);
  posted_.pop_front();
}

void InitiatorQp::Break(absl::Status reason) {
  if (broken_.ok()) broken_ = std::move(reason);
}

void InitiatorQp::FailPending(Finished& finished) {
  for (Wr& w : pending_) Retire(w, broken_, finished);
  pending_.clear();
}

void InitiatorQp::Run(Finished& finished) {
  for (auto& [done, status] : finished) std::move(done)(std::move(status));
  finished.clear();
}

void InitiatorQp::OnCompletion(const ibv_wc& wc) {
  Finished finished;
  {
    absl::MutexLock lock(&mu_);
    absl::Status status = WcStatusToStatus(wc);
    if (wc.status == IBV_WC_WR_FLUSH_ERR && !broken_.ok()) {
      // A flush only follows the QP's entry into the error state: its ops report why it
      // entered it (retry exceeded, a port down, the peer's restart), the cause an operator
      // can act on, not "Work Request Flushed Error" (make test-rdma's cable pull showed the
      // flush in `ferryctl nics`).
      status = absl::UnavailableError(absl::StrFormat("%s (wr_id %d flushed)", broken_.message(),
                                                      wc.wr_id));
    }
    if (status.ok()) {
      // A signalled completion: it and every earlier WR of this QP are done.
      while (!posted_.empty() && posted_.front().seq <= wc.wr_id) RetireFront(status, finished);
    } else {
      Break(absl::UnavailableError(absl::StrFormat(
          "verbs: QP 0x%x (to QP 0x%x) entered the error state: %s", qpn_, remote_qpn_,
          status.message())));
      // Earlier WRs succeeded (completion is in order); this one failed; the rest flush.
      while (!posted_.empty() && posted_.front().seq < wc.wr_id) {
        RetireFront(absl::OkStatus(), finished);
      }
      if (!posted_.empty() && posted_.front().seq == wc.wr_id) RetireFront(status, finished);
      FailPending(finished);
    }
    Pump(finished, nullptr, nullptr);
    // Taken off posted_ but not yet run: Close() must not return before they have.
    if (!finished.empty()) ++delivering_;
  }
  if (finished.empty()) return;
  Run(finished);
  absl::MutexLock lock(&mu_);
  --delivering_;
}

void InitiatorQp::OnFatal(const absl::Status& why, bool completions_lost) {
  Finished finished;
  {
    absl::MutexLock lock(&mu_);
    if (closing_ || !connected_) return;
    Break(why);
    FailPending(finished);
    if (completions_lost) {
      // No flush will come for these: the CQ or the device is gone, and with it the HCA's
      // access to their memory.
      while (!posted_.empty()) RetireFront(broken_, finished);
    } else {
      // Posted WRs flush through the CQ, each completing its op once.
      absl::Status s = MoveToError(device_->api(), qp_.get());
      if (!s.ok()) spdlog::warn("verbs: {}", s.ToString());
    }
    if (!finished.empty()) ++delivering_;
  }
  if (finished.empty()) return;
  Run(finished);
  absl::MutexLock lock(&mu_);
  --delivering_;
}

void InitiatorQp::ReleaseFromDevice() {
  Finished finished;
  {
    absl::MutexLock lock(&mu_);
    // The device failed every connected QP's ops first (completions lost); one connected
    // meanwhile may hold some: they fail with the device's cause.
    if (broken_.ok()) Break(device_->health());
    FailPending(finished);
    while (!posted_.empty()) RetireFront(broken_, finished);
    closing_ = true;
    qp_.reset();
    cq_ = CqSlot();
    closed_ = true;
  }
  // Not here: a completion may drop the last reference to a user, whose destructor takes the
  // device's user lock held around this call.
  if (!finished.empty()) std::thread([finished = std::move(finished)]() mutable {
      Run(finished);
    }).detach();
}

void InitiatorQp::Close() {
  Finished finished;
  bool was_connected = false;
  {
    absl::MutexLock lock(&mu_);
    was_connected = connected_;
    if (closing_) {
      mu_.Await(absl::Condition(&closed_));
      return;
    }
    closing_ = true;
    Break(absl::UnavailableError(absl::StrFormat("verbs: endpoint (QP 0x%x) was closed", qpn_)));
    FailPending(finished);
    if (connected_) {
      absl::Status s = MoveToError(device_->api(), qp_.get());
      if (!s.ok()) spdlog::warn("verbs: closing: {}", s.ToString());
    }
  }
  Run(finished);
  // The poller delivers the flush; it cannot wait for itself (a completion callback that
  // drops the last reference to its endpoint closes it on the poller thread, or on the event
  // thread for ops an async event failed).
  const bool can_wait = was_connected && !device_->OnDeviceThread();
  {
    absl::MutexLock lock(&mu_);
    auto flushed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return posted_.empty() && delivering_ == 0;
    };
    if (can_wait && !mu_.AwaitWithTimeout(absl::Condition(&flushed), kFlushWait)) {
      spdlog::warn("verbs: QP 0x{:x}: {} WRs not flushed after {}; failing them", qpn_,
                   posted_.size(), absl::FormatDuration(kFlushWait));
    }
    // Whatever the HCA did not flush by now never reaches us (poller thread, dead device).
    while (!posted_.empty()) RetireFront(broken_, finished);
  }
  Run(finished);
  device_->poller().Remove(qpn_);
  absl::MutexLock lock(&mu_);
  qp_.reset();
  closed_ = true;
}

}  // namespace ferry::verbs
