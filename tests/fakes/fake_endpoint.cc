#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tests/fakes/fake_core.h"
#include "tests/fakes/fake_fabric.h"

namespace ferry::fake {

using internal::Core;
using internal::Link;

FakeEndpoint::FakeEndpoint(std::shared_ptr<Link> link) : link_(std::move(link)) {}

FakeEndpoint::~FakeEndpoint() { Close(); }

absl::Status FakeEndpoint::PostWrite(const fabric::LocalSlice& src, const fabric::RemoteSlice& dst,
                                     fabric::Completion done) {
  return Post(internal::OpKind::kWrite, src, dst, 0, std::move(done));
}

absl::Status FakeEndpoint::PostWriteWithImmediate(const fabric::LocalSlice& src,
                                                  const fabric::RemoteSlice& dst, uint32_t imm,
                                                  fabric::Completion done) {
  return Post(internal::OpKind::kWriteImm, src, dst, imm, std::move(done));
}

absl::Status FakeEndpoint::PostRead(const fabric::LocalSlice& dst, const fabric::RemoteSlice& src,
                                    fabric::Completion done) {
  return Post(internal::OpKind::kRead, dst, src, 0, std::move(done));
}

absl::Status FakeEndpoint::PostWriteList(const fabric::MemoryRegion* region,
                                         const fabric::RemoteSlice& base,
                                         std::span<const fabric::Piece> pieces,
                                         fabric::Completion done) {
  return PostList(internal::OpKind::kWrite, region, base, pieces, std::move(done));
}

absl::Status FakeEndpoint::PostReadList(const fabric::MemoryRegion* region,
                                        const fabric::RemoteSlice& base,
                                        std::span<const fabric::Piece> pieces,
                                        fabric::Completion done) {
  return PostList(internal::OpKind::kRead, region, base, pieces, std::move(done));
}

absl::Status FakeEndpoint::PostList(internal::OpKind kind, const fabric::MemoryRegion* region,
                                    const fabric::RemoteSlice& base,
                                    std::span<const fabric::Piece> pieces,
                                    fabric::Completion done) {
  // One op, as tcp sends one request (verbs would post a chain of WRs): the checks every
  // provider makes first, then those of a single op against the whole region.
  if (absl::Status ok = CheckPieces(link_->initiator->options.provider, region, pieces);
      !ok.ok()) {
    absl::MutexLock lock(&link_->initiator->mu);
    ++link_->initiator->stats.refused_posts;
    return ok;
  }
  return Post(kind, {region, 0, region->length()}, base, 0, std::move(done),
              std::vector<fabric::Piece>(pieces.begin(), pieces.end()));
}

absl::Status FakeEndpoint::Post(internal::OpKind kind, const fabric::LocalSlice& local,
                                const fabric::RemoteSlice& remote, uint32_t imm,
                                fabric::Completion done, std::vector<fabric::Piece> pieces) {
  Core& core = *link_->initiator;
  absl::Status refused;
  // The same checks, in the same order and with the same codes, as TcpEndpoint::Post and
  // InitiatorQp::Post (pinned by tests/fabric_conformance_test.cc).
  if (local.region == nullptr || local.length == 0 || local.offset > local.region->length() ||
      local.length > local.region->length() - local.offset) {
    refused =
        absl::OutOfRangeError(absl::StrCat(core.options.provider, ": local slice [", local.offset,
                                           ", +", local.length, ") is outside its region"));
  } else if (const auto* region = dynamic_cast<const internal::FakeRegion*>(local.region);
             region == nullptr || region->core() != &core) {
    // verbs: an lkey of another protection domain; the provider refuses it at post.
    refused = absl::InvalidArgumentError(
        absl::StrFormat("%s: the local slice's region is not registered with %s (registration: %s)",
                        core.options.provider, core.address, local.region->registration()));
  }
  absl::MutexLock lock(&core.mu);
  if (refused.ok() && core.refuse_posts.Take(&refused)) {
    // injected
  } else if (refused.ok() && (!link_->broken.ok() || link_->closed)) {
    refused = absl::UnavailableError(
        absl::StrCat(core.options.provider, ": endpoint to ", link_->peer,
                     " is broken: ", link_->broken.ok() ? "closed" : link_->broken.message()));
  } else if (refused.ok() && core.options.max_outstanding > 0 &&
             link_->outstanding >= core.options.max_outstanding) {
    // ibv_post_send(3): ENOMEM, the send queue is full. Back-pressure, not a failure.
    refused = absl::ResourceExhaustedError(absl::StrCat(core.options.provider, ": endpoint to ",
                                                        link_->peer, " has ", link_->outstanding,
                                                        " ops outstanding (send queue full)"));
  }
  if (!refused.ok()) {
    ++core.stats.refused_posts;
    return refused;
  }
  auto op = std::make_unique<internal::Op>();
  op->link = link_;
  op->kind = kind;
  op->local_key = local.region->key();
  op->local_offset = local.offset;
  op->length = local.length;
  if (!pieces.empty()) {
    op->length = 0;
    for (const fabric::Piece& p : pieces) op->length += p.length;
  }
  op->remote = remote;
  op->imm = imm;
  op->pieces = std::move(pieces);
  op->done = std::move(done);
  core.fail_ops.Take(&op->fail);
  core.queue.push_back(std::move(op));
  ++link_->outstanding;
  ++core.stats.outstanding;
  ++core.stats.posts;
  return absl::OkStatus();
}

bool FakeEndpoint::broken() const {
  absl::MutexLock lock(&link_->initiator->mu);
  return !link_->broken.ok() || link_->closed;
}

void FakeEndpoint::Break(const std::string& why) {
  Core& core = *link_->initiator;
  absl::MutexLock lock(&core.mu);
  core.BreakLocked(
      *link_, absl::UnavailableError(absl::StrCat("fake: endpoint to ", link_->peer, ": ", why)));
}

void FakeEndpoint::Close() {
  Core& core = *link_->initiator;
  bool first = false;
  std::vector<std::unique_ptr<internal::Op>> mine;
  {
    absl::MutexLock lock(&core.mu);
    if (!link_->closed) {
      first = true;
      link_->closed = true;
      core.BreakLocked(*link_, absl::UnavailableError(
                                   absl::StrCat("fake: endpoint to ", link_->peer, " was closed")));
      if (std::erase_if(core.outgoing, [&](const auto& w) { return w.lock() == link_; }) > 0) {
        --core.stats.live_endpoints;
      }
      std::erase_if(core.outgoing, [](const auto& w) { return w.expired(); });
    }
    if (core.OnThread()) {
      // A completion closing an endpoint (or dropping the last reference to it): the thread
      // cannot wait for itself, so it runs the failed ops' completions here, as verbs does.
      for (auto it = core.failing.begin(); it != core.failing.end();) {
        if ((*it)->link != link_) {
          ++it;
          continue;
        }
        mine.push_back(std::move(*it));
        it = core.failing.erase(it);
      }
    } else {
      const Link* link = link_.get();
      core.mu.Await(absl::Condition(
          +[](const Link* l) ABSL_NO_THREAD_SAFETY_ANALYSIS { return l->outstanding == 0; }, link));
    }
  }
  for (auto& op : mine) {
    absl::Status why = op->fail;
    core.Complete(std::move(op), std::move(why));
  }
  if (!first) return;
  if (std::shared_ptr<Core> target = link_->target.lock()) {
    absl::MutexLock lock(&target->mu);
    if (std::erase_if(target->incoming, [&](const auto& w) { return w.lock() == link_; }) > 0) {
      --target->stats.incoming_endpoints;
    }
    std::erase_if(target->incoming, [](const auto& w) { return w.expired(); });
  }
}

const std::string& FakeEndpoint::peer_address() const { return link_->peer; }

}  // namespace ferry::fake
