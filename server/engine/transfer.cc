#include "server/engine/transfer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ferry::server {

namespace {

std::vector<uint64_t> Lengths(const std::vector<PlannedOp>& ops) {
  std::vector<uint64_t> out;
  out.reserve(ops.size());
  for (const auto& op : ops) out.push_back(op.length);
  return out;
}

}  // namespace

Transfer::Transfer(uint64_t id, PlannedBatch ops, absl::Time deadline,
                   std::shared_ptr<const PolicySnapshot> policy, int64_t owner_uid)
    : id_(id),
      owner_uid_(owner_uid),
      lengths_(Lengths(ops.ops)),
      start_(absl::Now()),
      deadline_(deadline),
      policy_(std::move(policy)),
      ops_(std::make_shared<const PlannedBatch>(std::move(ops))),
      states_(lengths_.size()) {
  for (uint64_t length : lengths_) bytes_total_ += length;
  op_peer_.reserve(lengths_.size());
  op_read_.reserve(lengths_.size());
  const RemoteBuffer* previous = nullptr;  // ops on the previous op's buffer: its peer
  for (const PlannedOp& op : ops_->ops) {
    if (op_peer_.empty() || op.remote != previous) {
      // Batches name few peers: a linear search beats a map.
      static const std::string kNone;
      const std::string& node = op.remote ? op.remote->node : kNone;
      auto it = std::find(peers_.begin(), peers_.end(), node);
      if (it == peers_.end()) it = peers_.insert(peers_.end(), node);
      op_peer_.push_back(static_cast<uint32_t>(it - peers_.begin()));
      previous = op.remote;
    } else {
      op_peer_.push_back(op_peer_.back());
    }
    op_read_.push_back(op.type == ferry::v1::READ);
  }
}

PlannedOps Transfer::ops() const {
  absl::MutexLock lock(&mu_);
  return ops_;
}

void Transfer::ShareLegs(size_t index, Legs legs) {
  absl::MutexLock lock(&mu_);
  states_[index].legs = std::move(legs);
}

void Transfer::SetLegs(size_t index, std::vector<ferry::v1::Leg> legs) {
  ShareLegs(index, std::make_shared<const std::vector<ferry::v1::Leg>>(std::move(legs)));
}

std::vector<ferry::v1::Leg> Transfer::LegsOf(size_t index) const {
  absl::MutexLock lock(&mu_);
  const Legs& legs = states_[index].legs;
  return legs ? *legs : std::vector<ferry::v1::Leg>();
}

Transfer::Names Transfer::Intern(std::vector<std::string> names, Names& last) {
  if (!last || *last != names)
    last = std::make_shared<const std::vector<std::string>>(std::move(names));
  return last;
}

void Transfer::SetRails(size_t index, std::vector<std::string> ours,
                        std::vector<std::string> theirs, std::vector<std::string> retries) {
  absl::MutexLock lock(&mu_);
  OpState& st = states_[index];
  st.ours = Intern(std::move(ours), last_ours_);
  st.theirs = Intern(std::move(theirs), last_theirs_);
  if (!retries.empty()) {
    retries_[index] = std::move(retries);
  } else {
    retries_.erase(index);
  }
}

uint8_t Transfer::ProviderIndexLocked(const std::string& provider) {
  // A transfer's ops name one provider or two (tcp behind verbs): a linear search.
  auto it = std::find(providers_.begin(), providers_.end(), provider);
  if (it == providers_.end()) {
    if (providers_.size() > UINT8_MAX) return 0;  // cannot happen: providers are few
    it = providers_.insert(providers_.end(), provider);
  }
  return static_cast<uint8_t>(it - providers_.begin());
}

void Transfer::VisitOps(const std::function<void(const OpView& op)>& visit) const {
  static const std::string kNone;
  static const std::vector<std::string> kNoRails;
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < states_.size(); ++i) {
    const OpState& st = states_[i];
    const bool planned = st.legs && !st.legs->empty();
    auto retried = retries_.empty() ? retries_.end() : retries_.find(i);
    visit({.peer = peers_[op_peer_[i]],
           .read = op_read_[i],
           .code = st.code,
           .bytes = BytesLocked(i),
           .duration_us = st.duration_us,
           .provider = providers_[st.provider],
           .mode = planned ? (*st.legs)[kLocalLeg].mode() : kNone,
           .rails = planned && st.ours ? *st.ours : kNoRails,
           .retries = retried == retries_.end() ? 0 : retried->second.size()});
  }
}

ferry::v1::OpResult Transfer::ResultOfLocked(size_t index) const {
  const OpState& st = states_[index];
  ferry::v1::OpResult r;
  r.set_index(index);
  const uint64_t bytes = BytesLocked(index);
  r.set_code(st.code);
  if (auto m = messages_.find(index); m != messages_.end()) r.set_message(m->second);
  r.set_provider(providers_[st.provider]);
  r.set_bytes(bytes);
  r.set_duration_us(st.duration_us);
  if (st.legs) {
    for (size_t leg = 0; leg < st.legs->size(); ++leg) {
      ferry::v1::Leg* out = r.add_legs();
      *out = (*st.legs)[leg];
      const Names& rails = leg == kLocalLeg ? st.ours : st.theirs;
      if (rails) {
        for (const auto& rail : *rails) out->add_rails(rail);
      }
      if (st.settled) {
        out->set_bytes(bytes);
        out->set_duration_us(st.duration_us);
      }
    }
  }
  if (auto retried = retries_.find(index); retried != retries_.end()) {
    for (const auto& retry : retried->second) r.add_retries(retry);
  }
  return r;
}

void Transfer::MarkPosted(size_t first, size_t count) {
  const int64_t now_us = absl::ToInt64Microseconds(absl::Now() - start_);
  absl::MutexLock lock(&mu_);
  for (size_t i = first; i < first + count; ++i) states_[i].posted_us = now_us;
}

bool Transfer::Settle(size_t index, const absl::Status& status, const std::string& provider) {
  absl::MutexLock lock(&mu_);
  return SettleLocked(index, status, provider);
}

bool Transfer::SettleRun(size_t first, size_t last, const absl::Status& status,
                         const std::string& provider, Names ours, Names theirs,
                         std::vector<std::string> retries) {
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  bool finished = false;
  for (size_t i = first; i <= last && i < states_.size(); ++i) {
    OpState& st = states_[i];
    st.ours = ours;
    st.theirs = theirs;
    // A retried slice carried the whole run: said once, on its first op, so that the
    // transfer's retry count is the slices that moved.
    if (i == first && !retries.empty()) retries_[i] = std::move(retries);
    finished = SettleLocked(i, status, provider, now) || finished;
  }
  return finished;
}

bool Transfer::SettleLocked(size_t index, const absl::Status& status, const std::string& provider,
                            absl::Time now) {
  OpState& st = states_[index];
  if (st.settled) return false;
  st.settled = true;
  st.code = static_cast<int32_t>(status.code());
  if (!status.ok()) messages_[index] = std::string(status.message());
  st.provider = ProviderIndexLocked(provider);
  if (st.posted_us >= 0) {
    st.duration_us = static_cast<uint64_t>(
        std::max<int64_t>(0, absl::ToInt64Microseconds(now - start_) - st.posted_us));
  }
  if (status.ok()) {
    bytes_done_ += lengths_[index];
  } else {
    ++failed_;
    NoteErrorLocked(index, status);
  }
  ++version_;
  if (++settled_ < lengths_.size()) return false;
  end_ = now;
  ops_.reset();  // the buffers go back once nothing in flight holds them
  return true;
}

void Transfer::NoteErrorLocked(size_t index, const absl::Status& status) {
  // A refusal explains the UNAVAILABLE failures it caused: tcp and verbs end a connection
  // after a refused op (wire.h, IBV_WC_REM_ACCESS_ERR), and the ops posted to it meanwhile
  // may settle before the refused one. The result names the refusal (a buffer freed while
  // the op ran), not the broken connection.
  const bool explains = first_error_.code() == absl::StatusCode::kUnavailable &&
                        (status.code() == absl::StatusCode::kAborted ||
                         status.code() == absl::StatusCode::kPermissionDenied);
  if (first_error_.ok() || explains) {
    first_error_ =
        absl::Status(status.code(), absl::StrCat("ops[", index, "]: ", status.message()));
  }
}

void Transfer::ExpectCheck() {
  absl::MutexLock lock(&mu_);
  check_pending_ = true;
}

bool Transfer::checking() const {
  absl::MutexLock lock(&mu_);
  return settled_ == lengths_.size() && check_pending_;
}

void Transfer::FailSettledLocked(size_t index, const absl::Status& status) {
  OpState& st = states_[index];
  if (!st.settled || st.code != 0) return;
  bytes_done_ -= BytesLocked(index);
  st.code = static_cast<int32_t>(status.code());
  messages_[index] = std::string(status.message());
  ++failed_;
  NoteErrorLocked(index, status);
}

void Transfer::EndCheck(const std::vector<CheckFailure>& failed, const absl::Status& rest) {
  absl::MutexLock lock(&mu_);
  if (!check_pending_) return;
  for (const CheckFailure& f : failed) {
    if (f.index < states_.size() && !f.status.ok()) FailSettledLocked(f.index, f.status);
  }
  if (!rest.ok()) {
    for (size_t i = 0; i < states_.size(); ++i) FailSettledLocked(i, rest);
  }
  check_pending_ = false;
  end_ = absl::Now();
  ++version_;
}

void Transfer::SettleAll(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < states_.size(); ++i) SettleLocked(i, why, "");
}

bool Transfer::all_settled() const {
  absl::MutexLock lock(&mu_);
  return settled_ == lengths_.size();
}

bool Transfer::finished() const {
  absl::MutexLock lock(&mu_);
  return DoneLocked();
}

bool Transfer::AwaitFinished(absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return DoneLocked(); };
  return mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
}

uint64_t Transfer::AwaitChange(uint64_t seen, absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto changed = [this, seen]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return version_ != seen; };
  mu_.AwaitWithDeadline(absl::Condition(&changed), deadline);
  return version_;
}

ferry::v1::TransferResult Transfer::Result(const ResultPage& page) const {
  absl::MutexLock lock(&mu_);
  ferry::v1::TransferResult r;
  r.set_transfer_id(id_);
  r.set_policy_generation(policy_->generation);
  bool done = DoneLocked();
  r.set_state(!done ? ferry::v1::RUNNING
                    : first_error_.ok() ? ferry::v1::SUCCEEDED : ferry::v1::FAILED);
  r.set_code(static_cast<int>(first_error_.code()));
  r.set_message(std::string(first_error_.message()));
  r.set_bytes(bytes_done_);
  r.set_duration_us(static_cast<uint64_t>(
      absl::ToInt64Microseconds((done ? end_ : absl::Now()) - start_)));
  r.set_ops_total(states_.size());
  r.set_bytes_total(bytes_total_);
  r.set_ops_failed(failed_);
  r.set_ops_succeeded(settled_ - failed_);
  if (!page.include_ops) return r;
  uint64_t bytes = 0;
  for (uint64_t i = page.from; i < states_.size(); ++i) {
    if (page.failed_only && (!states_[i].settled || states_[i].code == 0)) continue;
    ferry::v1::OpResult op = ResultOfLocked(i);
    bool full = page.limit > 0 ? static_cast<uint64_t>(r.ops_size()) >= page.limit
                               : bytes + op.ByteSizeLong() > page.max_bytes && r.ops_size() > 0;
    if (full) {
      r.set_ops_next(i);
      break;
    }
    bytes += op.ByteSizeLong() + 8;
    *r.add_ops() = std::move(op);
  }
  return r;
}

ferry::v1::TransferProgress Transfer::Progress(uint64_t* version) const {
  absl::MutexLock lock(&mu_);
  ferry::v1::TransferProgress p;
  p.set_transfer_id(id_);
  bool done = DoneLocked();
  p.set_state(!done ? ferry::v1::RUNNING
                    : first_error_.ok() ? ferry::v1::SUCCEEDED : ferry::v1::FAILED);
  p.set_ops_total(lengths_.size());
  p.set_ops_done(settled_);
  p.set_bytes_total(bytes_total_);
  p.set_bytes_done(bytes_done_);
  p.set_code(static_cast<int>(first_error_.code()));
  p.set_message(std::string(first_error_.message()));
  if (version != nullptr) *version = version_;
  return p;
}

}  // namespace ferry::server
