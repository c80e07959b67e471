#include "server/engine/striped_op.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/byte_size.h"

namespace ferry::server {

LaneSet::LaneSet(std::vector<Lane> primary_lanes, std::vector<Lane> reserve_lanes)
    : lanes(std::move(primary_lanes)), primary(lanes.size()) {
  for (Lane& l : reserve_lanes) lanes.push_back(std::move(l));
  for (const Lane& l : lanes) {
    ours.push_back(std::make_shared<const std::vector<std::string>>(
        std::vector<std::string>{l.route.ours.ToString()}));
    theirs.push_back(std::make_shared<const std::vector<std::string>>(
        std::vector<std::string>{l.route.theirs.ToString()}));
  }
}

StripedOp::StripedOp(Spec spec, std::shared_ptr<const LaneSet> lanes,
                     std::shared_ptr<RailLedger> ledger, std::shared_ptr<FairQueue> queue,
                     Wanted wanted, Done done)
    : spec_(std::move(spec)),
      set_(std::move(lanes)),
      primary_(set_->primary),
      lanes_(set_->lanes),
      ledger_(std::move(ledger)),
      queue_(std::move(queue)),
      wanted_(std::move(wanted)),
      done_(std::move(done)) {}

void StripedOp::AppendSlices(std::vector<SliceWork>& out) {
  if (spec_.pieces || spec_.length <= spec_.slice_bytes) {
    // One slice, as most ops of a KV batch are (and a gathered one is): no plan to build.
    {
      absl::MutexLock lock(&mu_);
      open_ = 1;
    }
    out.push_back(Work({0, spec_.length}, spec_.first_lane % primary_));
    return;
  }
  std::vector<SliceRange> slices = PlanSlices(spec_.length, spec_.slice_bytes);
  {
    absl::MutexLock lock(&mu_);
    open_ = slices.size();
  }
  out.reserve(out.size() + slices.size());
  for (size_t k = 0; k < slices.size(); ++k) {
    out.push_back(Work(slices[k], (spec_.first_lane + k) % primary_));
  }
}

std::vector<SliceWork> StripedOp::Slices() {
  std::vector<SliceWork> out;
  AppendSlices(out);
  return out;
}

SliceWork StripedOp::Work(const SliceRange& slice, size_t lane) {
  const Lane& l = lanes_[lane];
  fabric::Completion done = [self = shared_from_this(), slice, lane](absl::Status s) {
    self->OnSlice(slice, lane, std::move(s));
  };
  if (spec_.pieces) {
    // The pieces name offsets in the buffers; the lane says where they are on its rails.
    return {l.endpoint, spec_.read, {l.region, 0, spec_.length}, l.base, std::move(done),
            spec_.pieces};
  }
  return {l.endpoint, spec_.read,
          {l.region, spec_.local_offset + slice.offset, slice.length},
          {l.base.address + spec_.remote_offset + slice.offset, l.base.key}, std::move(done)};
}

std::string CarriedBy(const StripedOutcome& outcome, const std::string& planned) {
  if (outcome.ours == nullptr || outcome.ours->empty()) return planned;
  // Rail names are "provider" or "provider:nic", sorted: equal providers are neighbours.
  std::string out;
  absl::string_view last;
  for (const std::string& rail : *outcome.ours) {
    absl::string_view provider = absl::string_view(rail).substr(0, rail.find(':'));
    if (provider == last) continue;
    absl::StrAppend(&out, out.empty() ? "" : "+", provider);
    last = provider;
  }
  return out;
}

int StripedOp::OtherLane(size_t failed) const {
  const absl::Time now = absl::Now();
  auto usable = [&](size_t candidate) {
    const Route& route = lanes_[candidate].route;
    return !failed_.contains(route) && ledger_->Usable(route.ours, spec_.peer, now) &&
           !lanes_[candidate].endpoint->broken();
  };
  // Each retry starts its search one lane further on, so a failed NIC's slices spread over
  // the others instead of all landing on the next one.
  const size_t start = failed + 1 + retries_.size();
  for (size_t step = 0; step < primary_; ++step) {
    size_t candidate = (start + step) % primary_;
    if (candidate != failed && usable(candidate)) return static_cast<int>(candidate);
  }
  for (size_t candidate = primary_; candidate < lanes_.size(); ++candidate) {
    if (candidate != failed && usable(candidate)) return static_cast<int>(candidate);
  }
  return -1;
}

namespace {

// A peer's refusal explains the UNAVAILABLE slices it caused: tcp and verbs end a connection
// after a refused op (transport/tcp/wire.h; an RC QP after IBV_WC_REM_ACCESS_ERR), so the
// slices posted to it meanwhile fail UNAVAILABLE and may finish first. The op reports the
// refusal (the engine then names the freed buffer), not the broken connection.
bool ExplainsUnavailable(const absl::Status& first, const absl::Status& now) {
  return first.code() == absl::StatusCode::kUnavailable &&
         (now.code() == absl::StatusCode::kPermissionDenied ||
          now.code() == absl::StatusCode::kOutOfRange);
}

}  // namespace

StripedOutcome StripedOp::OutcomeLocked() {
  StripedOutcome outcome{error_, nullptr, nullptr, retries_};
  if (carried_.size() == 1) {
    outcome.ours = set_->ours[carried_[0]];
    outcome.theirs = set_->theirs[carried_[0]];
  } else if (!carried_.empty()) {
    auto names = [&](const std::vector<RailNames>& by_lane) {
      std::vector<std::string> out;
      for (size_t lane : carried_) out.push_back(by_lane[lane]->front());
      std::sort(out.begin(), out.end());
      out.erase(std::unique(out.begin(), out.end()), out.end());
      return std::make_shared<const std::vector<std::string>>(std::move(out));
    };
    outcome.ours = names(set_->ours);
    outcome.theirs = names(set_->theirs);
  }
  return outcome;
}

void StripedOp::OnSlice(const SliceRange& slice, size_t lane, absl::Status status) {
  const Route& route = lanes_[lane].route;
  if (status.ok()) {
    ledger_->Carried(route.ours, spec_.peer, slice.length);
  }
  std::optional<SliceWork> again;
  Done finished;
  StripedOutcome outcome;
  {
    absl::MutexLock lock(&mu_);
    if (status.ok()) {
      if (std::find(carried_.begin(), carried_.end(), lane) == carried_.end()) {
        carried_.push_back(lane);
      }
    } else if (status.code() == absl::StatusCode::kUnavailable &&
               (!wanted_ || !*wanted_ || (*wanted_)())) {
      // No `wanted` means nothing cancels the op (as FairQueue::Enqueue reads it): retry.
      failed_.insert(route);
      int other = OtherLane(lane);
      ledger_->Failed(route.ours, spec_.peer, status, other >= 0, absl::Now(),
                      other >= 0 ? lanes_[other].route.ToString() : std::string());
      if (other >= 0) {
        retries_.push_back(absl::StrCat(
            FormatByteSize(slice.length), " at +", slice.offset, " on ", route.ToString(),
            " failed (", status.message(), "); carried by ", lanes_[other].route.ToString()));
        again = Work(slice, static_cast<size_t>(other));
      } else if (error_.ok()) {
        error_ = absl::UnavailableError(absl::StrCat(
            status.message(), " (", route.ToString(), "; no other route to ", spec_.peer,
            " left for this op)"));
      }
    } else if (error_.ok() || ExplainsUnavailable(error_, status)) {
      error_ = status;
    }
    if (!again && --open_ == 0) {
      finished = std::move(done_);
      outcome = OutcomeLocked();
    }
  }
  // Outside the lock: the queue may post (and a refused post complete) on this thread.
  if (again) {
    std::vector<SliceWork> one;
    one.push_back(std::move(*again));
    queue_->Enqueue(spec_.transfer_id, std::move(one), wanted_, spec_.owner_uid);
  }
  if (finished) std::move(finished)(std::move(outcome));
}

}  // namespace ferry::server
