#include "server/tensors/recv_matcher.h"

#include "absl/strings/str_cat.h"
#include "server/tensors/tensor_meta.h"
#include "spdlog/spdlog.h"

namespace ferry::server {

struct RecvMatcher::Recv {
  enum State { kPosted, kMatched, kDone, kFailed };
  uint64_t id = 0;
  RecvSpec spec;
  State state = kPosted;
  // Set at match time.
  std::shared_ptr<Buffer> landing;
  bool allocated = false;
  uint64_t send_id = 0;
  ferry::v1::TensorMeta meta;
  uint64_t bytes = 0;
  absl::Status status;
  // The receiver gave up while the sender was writing: nobody collects the result.
  bool abandoned = false;
};

struct RecvMatcher::PendingOffer {
  std::string from_node;
  uint64_t send_id = 0;
  ferry::v1::TensorMeta meta;
  uint64_t bytes = 0;
  absl::Time sender_deadline;
  std::shared_ptr<Recv> recv;  // once matched
  Landing landing;
  absl::Status failure;        // the match failed; the sender gets this once
};

namespace {
// A matched send whose agent never reports back (crashed) is given up this long after its
// own deadline, so the pinned landing buffer cannot leak.
constexpr absl::Duration kCompleteGrace = absl::Seconds(10);
}  // namespace

RecvMatcher::RecvMatcher(std::string node, BufferRegistry* buffers)
    : node_(std::move(node)), buffers_(buffers) {
  reaper_ = std::thread([this] { ReapLoop(); });
}

RecvMatcher::~RecvMatcher() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    changed_.SignalAll();
  }
  reaper_.join();
}

absl::StatusOr<RecvMatcher::Ticket> RecvMatcher::Post(RecvSpec spec) {
  absl::MutexLock lock(&mu_);
  Key key{spec.peer, spec.tag};
  if (recvs_.contains(key)) {
    return absl::AlreadyExistsError(absl::StrCat("tag: a receive of '", spec.tag, "' from ",
                                                 spec.peer, " is already pending on ", node_,
                                                 " (a tag can be reused once it completes)"));
  }
  auto recv = std::make_shared<Recv>();
  recv->id = next_recv_id_++;
  recv->spec = std::move(spec);
  recvs_.emplace(key, recv);
  // A send may have arrived first.
  auto t = offer_by_tag_.find(key);
  if (t != offer_by_tag_.end()) {
    auto o = offers_.find({key.first, t->second});
    if (o != offers_.end() && !o->second->recv && o->second->failure.ok()) {
      absl::Status matched = MatchLocked(*o->second, *recv);
      changed_.SignalAll();
      if (!matched.ok()) {
        recvs_.erase(key);
        return matched;
      }
    }
  }
  return recv;
}

absl::Status RecvMatcher::MatchLocked(PendingOffer& offer, Recv& recv) {
  const RecvSpec& spec = recv.spec;
  const std::string who = absl::StrCat("receive of '", spec.tag, "' from ", offer.from_node);
  absl::Status bad;
  const auto& expect = spec.expect;
  if (expect.dtype() != ferry::v1::DTYPE_UNSPECIFIED && expect.dtype() != offer.meta.dtype()) {
    bad = absl::InvalidArgumentError(absl::StrCat(
        "meta.dtype: the sender sent ", tensors::DTypeName(offer.meta.dtype()), ", the ", who,
        " on ", node_, " expects ", tensors::DTypeName(expect.dtype())));
  } else if (expect.shape_size() > 0 &&
             !std::equal(expect.shape().begin(), expect.shape().end(), offer.meta.shape().begin(),
                         offer.meta.shape().end())) {
    bad = absl::InvalidArgumentError(absl::StrCat(
        "meta.shape: the sender sent ", tensors::DescribeShape(offer.meta), ", the ", who, " on ",
        node_, " expects ", tensors::DescribeShape(expect)));
  } else if (spec.buffer) {
    uint64_t room = spec.offset <= spec.buffer->size() ? spec.buffer->size() - spec.offset : 0;
    if (offer.bytes > room) {
      bad = absl::OutOfRangeError(absl::StrCat(
          "buffer: the ", who, " on ", node_, " lands in buffer ", spec.buffer->id(), " ('",
          spec.buffer->name(), "') with ", room, " bytes of room from offset ", spec.offset,
          "; the tensor ", tensors::DescribeTensor(offer.meta), " needs ", offer.bytes, " bytes"));
    }
  }
  std::shared_ptr<Buffer> landing = spec.buffer;
  bool allocated = false;
  if (bad.ok() && !landing && offer.bytes > 0) {
    // Named so the sender's agent can resolve and WRITE into it; unique per receive, and
    // exported to that sender only.
    auto made = buffers_->Allocate(
        offer.bytes, absl::StrCat(kLandingNamePrefix, recv.id, ".", absl::Hex(offer.send_id)),
        "host", {}, {offer.from_node});
    if (!made.ok()) {
      bad = absl::Status(made.status().code(),
                         absl::StrCat("the ", who, " on ", node_, " cannot allocate ", offer.bytes,
                                      " bytes: ", made.status().message()));
    } else {
      landing = *made;
      allocated = true;
    }
  }
  if (!bad.ok()) {
    // Both sides learn: the offer carries the error back to the sender, the receive fails.
    offer.failure = bad;
    recv.state = Recv::kFailed;
    recv.status = bad;
    return bad;
  }
  recv.state = Recv::kMatched;
  recv.landing = landing;
  recv.allocated = allocated;
  recv.send_id = offer.send_id;
  recv.meta = offer.meta;
  recv.meta.set_tag(spec.tag);
  recv.bytes = offer.bytes;
  offer.recv = recvs_.at({spec.peer, spec.tag});
  offer.landing.buffer_name = landing ? landing->name() : "";
  offer.landing.offset = allocated ? 0 : spec.offset;
  return absl::OkStatus();
}

void RecvMatcher::FinishLocked(Recv& recv, const absl::Status& status) {
  if (recv.state == Recv::kDone || recv.state == Recv::kFailed) return;
  recv.status = status;
  recv.state = status.ok() ? Recv::kDone : Recv::kFailed;
  // A landing buffer the agent named for this send is exported no longer: the tensor is
  // the receiver's now, and no peer (the finished sender included) may write into it.
  if (status.ok() && recv.allocated && recv.landing)
    buffers_->Unexport(recv.landing->id()).IgnoreError();
  if (!status.ok()) {
    if (recv.allocated && recv.landing) buffers_->Free(recv.landing->id()).IgnoreError();
    recv.landing.reset();
  }
  changed_.SignalAll();
}

absl::StatusOr<RecvOutcome> RecvMatcher::Await(const Ticket& recv, absl::Time deadline,
                                                const CancelledFn& cancelled) {
  const Key key{recv->spec.peer, recv->spec.tag};
  absl::MutexLock lock(&mu_);
  while (recv->state == Recv::kPosted || recv->state == Recv::kMatched) {
    absl::Time now = absl::Now();
    bool gone = cancelled && cancelled();
    if (now >= deadline || gone) {
      absl::Status why =
          gone ? absl::CancelledError(absl::StrCat("receive of '", key.second, "' from ", key.first,
                                                   " was cancelled"))
               : absl::DeadlineExceededError(absl::StrCat(
                     "receive of '", key.second, "' from ", key.first, ": ",
                     recv->state == Recv::kPosted ? "no matching send arrived"
                                                  : "the sender did not finish writing",
                     " before the deadline"));
      if (recv->state == Recv::kMatched) {
        // The sender is writing into the landing buffer: keep it pinned until Complete.
        recv->abandoned = true;
        recv->status = why;
        recv->state = Recv::kFailed;
      } else {
        FinishLocked(*recv, why);
      }
      break;
    }
    // Short waits so a client that hung up is noticed.
    changed_.WaitWithDeadline(&mu_, std::min(deadline, now + absl::Milliseconds(100)));
  }
  auto it = recvs_.find(key);
  if (it != recvs_.end() && it->second == recv) recvs_.erase(it);
  if (recv->state == Recv::kFailed) return recv->status;
  RecvOutcome out;
  out.meta = recv->meta;
  out.buffer = recv->landing;
  out.offset = recv->allocated ? 0 : recv->spec.offset;
  out.bytes = recv->bytes;
  out.allocated = recv->allocated;
  return out;
}

int RecvMatcher::CancelRecv(const std::string& peer, const std::string& tag, int64_t taker,
                            bool* others) {
  absl::MutexLock lock(&mu_);
  auto it = recvs_.find({peer, tag});
  if (it == recvs_.end()) return 0;
  Recv& recv = *it->second;
  if (taker >= 0 && recv.spec.owner_uid >= 0 && recv.spec.owner_uid != taker) {
    if (others != nullptr) *others = true;
    return 0;
  }
  absl::Status why = absl::CancelledError(
      absl::StrCat("receive of '", tag, "' from ", peer, " was cancelled"));
  if (recv.state == Recv::kMatched) {
    recv.abandoned = true;
    recv.status = why;
    recv.state = Recv::kFailed;
    changed_.SignalAll();
  } else {
    FinishLocked(recv, why);
  }
  recvs_.erase(it);
  return 1;
}

absl::StatusOr<std::optional<Landing>> RecvMatcher::Offer(const std::string& from_node,
                                                          uint64_t send_id,
                                                          const ferry::v1::TensorMeta& meta,
                                                          uint64_t bytes,
                                                          absl::Time sender_deadline,
                                                          absl::Time wait_until) {
  const OfferKey okey{from_node, send_id};
  const Key tkey{from_node, meta.tag()};
  absl::MutexLock lock(&mu_);
  auto it = offers_.find(okey);
  if (it == offers_.end()) {
    auto busy = offer_by_tag_.find(tkey);
    if (busy != offer_by_tag_.end()) {
      return absl::AlreadyExistsError(absl::StrCat("meta.tag: a send of '", meta.tag(), "' from ",
                                                   from_node, " to ", node_,
                                                   " is already in flight (a tag can be reused "
                                                   "once it completes)"));
    }
    auto offer = std::make_shared<RecvMatcher::PendingOffer>();
    offer->from_node = from_node;
    offer->send_id = send_id;
    offer->meta = meta;
    offer->bytes = bytes;
    offer->sender_deadline = sender_deadline;
    it = offers_.emplace(okey, offer).first;
    offer_by_tag_[tkey] = send_id;
    auto r = recvs_.find(tkey);
    if (r != recvs_.end() && r->second->state == Recv::kPosted) {
      if (!MatchLocked(*offer, *r->second).ok()) recvs_.erase(r);
      changed_.SignalAll();
    }
  }
  while (true) {
    auto o = offers_.find(okey);
    if (o == offers_.end()) {
      return absl::CancelledError(absl::StrCat("the send of '", meta.tag(), "' was withdrawn"));
    }
    PendingOffer& offer = *o->second;
    if (!offer.failure.ok()) {
      absl::Status failure = offer.failure;
      EraseOfferLocked(okey);
      return failure;
    }
    if (offer.recv) return offer.landing;
    absl::Time now = absl::Now();
    if (now >= wait_until || stopping_) return std::nullopt;
    changed_.WaitWithDeadline(&mu_, wait_until);
  }
}

void RecvMatcher::EraseOfferLocked(const OfferKey& key) {
  auto it = offers_.find(key);
  if (it == offers_.end()) return;
  Key tkey{key.first, it->second->meta.tag()};
  auto t = offer_by_tag_.find(tkey);
  if (t != offer_by_tag_.end() && t->second == key.second) offer_by_tag_.erase(t);
  offers_.erase(it);
}

absl::Status RecvMatcher::Complete(const std::string& from_node, uint64_t send_id,
                                   const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  auto it = offers_.find({from_node, send_id});
  if (it == offers_.end()) {
    return absl::NotFoundError(absl::StrCat("send_id: ", node_, " has no send ", send_id, " from ",
                                            from_node, " (withdrawn or expired)"));
  }
  std::shared_ptr<PendingOffer> offer = it->second;
  EraseOfferLocked(it->first);
  if (!offer->recv) {
    return absl::FailedPreconditionError(absl::StrCat("send_id: send ", send_id, " from ",
                                                      from_node, " was never matched"));
  }
  Recv& recv = *offer->recv;
  if (recv.abandoned) {
    // The client will not collect it: release the buffer now the WRITE is over.
    absl::Status why = recv.status;
    if (recv.allocated && recv.landing) buffers_->Free(recv.landing->id()).IgnoreError();
    recv.landing.reset();
    return absl::CancelledError(
        absl::StrCat("the receiver on ", node_, " gave up: ", why.message()));
  }
  if (status.ok()) {
    FinishLocked(recv, status);
  } else {
    FinishLocked(recv, absl::Status(status.code(),
                                    absl::StrCat("the send from ", from_node, " failed: ",
                                                 status.message())));
  }
  return absl::OkStatus();
}

void RecvMatcher::Withdraw(const std::string& from_node, uint64_t send_id,
                           const std::string& reason) {
  absl::MutexLock lock(&mu_);
  auto it = offers_.find({from_node, send_id});
  if (it == offers_.end()) return;
  std::shared_ptr<PendingOffer> offer = it->second;
  EraseOfferLocked(it->first);
  if (offer->recv) {
    Recv& recv = *offer->recv;
    if (recv.abandoned) {
      if (recv.allocated && recv.landing) buffers_->Free(recv.landing->id()).IgnoreError();
      recv.landing.reset();
    } else {
      FinishLocked(recv, absl::CancelledError(absl::StrCat(
                             "the sender on ", from_node, " cancelled: ", reason)));
    }
  }
  changed_.SignalAll();
}

void RecvMatcher::ReapLoop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    changed_.WaitWithTimeout(&mu_, absl::Milliseconds(200));
    absl::Time now = absl::Now();
    std::vector<OfferKey> expired;
    for (const auto& [key, offer] : offers_) {
      absl::Time limit =
          offer->recv ? offer->sender_deadline + kCompleteGrace : offer->sender_deadline;
      if (now > limit) expired.push_back(key);
    }
    for (const auto& key : expired) {
      std::shared_ptr<PendingOffer> offer = offers_.at(key);
      EraseOfferLocked(key);
      if (!offer->recv) continue;
      spdlog::warn("send {} of '{}' from {} never completed; releasing its landing buffer",
                   key.second, offer->meta.tag(), key.first);
      Recv& recv = *offer->recv;
      if (recv.abandoned) {
        if (recv.allocated && recv.landing) buffers_->Free(recv.landing->id()).IgnoreError();
        recv.landing.reset();
      } else {
        FinishLocked(recv, absl::UnavailableError(absl::StrCat(
                               "the sender on ", key.first, " never reported completion")));
      }
    }
  }
}

void RecvMatcher::List(ferry::v1::ListPendingResponse* out, int64_t taker) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [key, recv] : recvs_) {
    if (taker >= 0 && recv->spec.owner_uid >= 0 && recv->spec.owner_uid != taker) continue;
    auto* p = out->add_recvs();
    p->set_peer(key.first);
    p->set_tag(key.second);
    p->set_state(recv->state == Recv::kPosted ? "waiting for send" : "writing");
    p->set_bytes(recv->bytes);
  }
  for (const auto& [key, offer] : offers_) {
    // An offer nobody received yet is nobody's: only those who see all see it.
    if (taker >= 0 && (!offer->recv || offer->recv->spec.owner_uid != taker)) continue;
    auto* p = out->add_arrived();
    p->set_peer(key.first);
    p->set_tag(offer->meta.tag());
    p->set_state(offer->recv ? (offer->recv->abandoned ? "abandoned, writing" : "writing")
                             : "waiting for receive");
    p->set_bytes(offer->bytes);
  }
}

}  // namespace ferry::server
