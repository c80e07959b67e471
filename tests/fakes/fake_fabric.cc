#include "tests/fakes/fake_fabric.h"

#include <fcntl.h>

#include <random>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "tests/fakes/fake_core.h"
#include "transport/memory/peer_memory.h"

namespace ferry::fake {
namespace internal {
namespace {

std::string NewNonce() {
  Registry& r = Global();
  absl::MutexLock lock(&r.mu);
  return absl::StrFormat("%016x", r.rng());
}

// Request: "fake-connect\n<initiator>\n<target>\n<nonce>"; reply: "fake-accept\n<target>\n
// <initiator>\n<nonce>". Anything else is refused: a verbs target cannot ready a QP from
// bytes another provider wrote either.
class FakePendingConnection : public fabric::PendingConnection {
 public:
  FakePendingConnection(std::shared_ptr<Core> initiator, std::string peer)
      : initiator_(std::move(initiator)),
        peer_(std::move(peer)),
        nonce_(NewNonce()),
        request_(absl::StrCat("fake-connect\n", initiator_->address, "\n", peer_, "\n", nonce_)) {}

  const std::string& request() const override { return request_; }

  absl::StatusOr<std::shared_ptr<fabric::Endpoint>> Finish(const std::string& reply) override {
    if (finished_) return absl::FailedPreconditionError("fake: this connection was finished");
    finished_ = true;
    if (reply != absl::StrCat("fake-accept\n", peer_, "\n", initiator_->address, "\n", nonce_)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("fake: the reply %s does not answer the request %s", absl::CEscape(reply),
                          absl::CEscape(request_)));
    }
    std::shared_ptr<Core> target = Find(peer_);
    if (target == nullptr) {
      return absl::UnavailableError(absl::StrCat("fake: no fabric at ", peer_, " any more"));
    }
    auto link = std::make_shared<Link>(initiator_, target, peer_);
    {
      absl::MutexLock lock(&target->mu);
      if (!target->serving || !target->accepted.erase(nonce_)) {
        return absl::UnavailableError(absl::StrCat("fake: ", peer_, " stopped serving"));
      }
      target->incoming.push_back(link);
      ++target->stats.incoming_endpoints;
    }
    {
      absl::MutexLock lock(&initiator_->mu);
      if (initiator_->stopping) {
        // The endpoint exists only to be closed: the target counts it until then.
        link->broken = absl::UnavailableError("fake: the initiating fabric is being destroyed");
      } else {
        initiator_->outgoing.push_back(link);
        ++initiator_->stats.connects;
        ++initiator_->stats.live_endpoints;
      }
    }
    return std::shared_ptr<fabric::Endpoint>(std::make_shared<FakeEndpoint>(std::move(link)));
  }

 private:
  const std::shared_ptr<Core> initiator_;
  const std::string peer_;
  const std::string nonce_;
  const std::string request_;
  bool finished_ = false;
};

// A uniformly random multiple of 4 KiB in [2^56, 2^57): added to virtual addresses (below
// 2^57 even with 5-level paging) it cannot wrap.
uint64_t RandomBias() {
  std::mt19937_64 rng(std::random_device{}());
  return ((1ull << 56) + (rng() % (1ull << 56))) & ~4095ull;
}

}  // namespace
}  // namespace internal

using internal::Core;
using internal::Link;

FakeFabric::FakeFabric(FakeFabricOptions options) {
  internal::Registry& r = internal::Global();
  std::string address;
  {
    absl::MutexLock lock(&r.mu);
    address = absl::StrCat("fake-", options.provider, "-", r.next++);
  }
  core_ = std::make_shared<Core>(std::move(options), address, internal::RandomBias());
  {
    // The thread waits for the lock, so it sees thread_id set.
    absl::MutexLock lock(&core_->mu);
    Core* core = core_.get();
    core_->thread = std::thread([core] { core->Run(); });
    core_->thread_id = core_->thread.get_id();
  }
  absl::MutexLock lock(&r.mu);
  r.fabrics[address] = core_;
}

FakeFabric::~FakeFabric() {
  {
    internal::Registry& r = internal::Global();
    absl::MutexLock lock(&r.mu);
    r.fabrics.erase(core_->address);
  }
  StopServing();
  uint64_t live_regions = 0;
  {
    absl::MutexLock lock(&core_->mu);
    for (const auto& weak : core_->outgoing) {
      if (auto link = weak.lock()) {
        core_->BreakLocked(*link, absl::UnavailableError(
                                      absl::StrCat("fake: ", core_->address, " was destroyed")));
      }
    }
    core_->stopping = true;
    live_regions = core_->regions.size();
  }
  core_->thread.join();
  if (live_regions > 0) {
    internal::RecordViolation(absl::StrCat(
        core_->address, " destroyed with ", live_regions,
        " region(s) still registered (transport/fabric.h: the region must not outlive the "
        "fabric; verbs: ibv_dealloc_pd fails with EBUSY)"));
  }
}

std::string FakeFabric::provider() const { return core_->options.provider; }
std::string FakeFabric::address() const { return core_->address; }

absl::StatusOr<std::unique_ptr<fabric::MemoryRegion>> FakeFabric::Register(void* data,
                                                                           uint64_t length,
                                                                           uint32_t access) {
  const std::string what =
      absl::StrFormat("%s: registering %d bytes at %p", core_->options.provider, length, data);
  absl::MutexLock lock(&core_->mu);
  absl::Status injected;
  if (core_->fail_registrations.Take(&injected)) return injected;
  // ibv_reg_mr(3): EINVAL for an invalid address, length or access value.
  if (data == nullptr || length == 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": no memory (ibv_reg_mr: EINVAL)"));
  }
  if ((access & ~uint32_t{fabric::kRemoteWrite | fabric::kRemoteRead |
                          fabric::kDeviceMemory}) != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: unknown access bits 0x%x (ibv_reg_mr: EINVAL)", what, access));
  }
  char* memory = static_cast<char*>(data);
  std::shared_ptr<char> pages;
  if (access & fabric::kDeviceMemory) {
    // The fake moves bytes with memcpy, like tcp: it reaches GPU memory only where a
    // peer-memory client maps it (a simulated GPU's), and refuses the rest.
    pages = memory::PeerMemory().Find(data, length);
    if (pages == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(what, ": cannot touch GPU memory"));
    }
    memory = pages.get();
  }
  const uint64_t start = reinterpret_cast<uint64_t>(data);
  if (length > ~start) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the range wraps (ibv_reg_mr: EINVAL)"));
  }
  // Random keys, as a real HCA's rkeys look: a stale key from an earlier region is unlikely
  // to name a live one, and a test cannot guess one.
  uint32_t key;
  do {
    key = static_cast<uint32_t>(core_->rng());
  } while (key == 0 || core_->regions.contains(key));
  const uint64_t remote = start + core_->remote_bias;
  core_->regions.emplace(key, internal::RegionEntry{.data = memory,
                                                    .length = length,
                                                    .remote_base = remote,
                                                    .access = access,
                                                    .peer_pages = std::move(pages)});
  ++core_->stats.registrations;
  return std::unique_ptr<fabric::MemoryRegion>(
      new internal::FakeRegion(core_, data, length, key, remote, core_->options.provider));
}

absl::StatusOr<std::unique_ptr<fabric::MemoryRegion>> FakeFabric::RegisterDmabuf(
    void* data, uint64_t length, const fabric::DmabufHandle& dmabuf, uint32_t access) {
  if (!core_->options.dmabuf) return Fabric::RegisterDmabuf(data, length, dmabuf, access);
  // ibv_reg_dmabuf_mr(3) fails for a descriptor that is not open.
  if (dmabuf.fd < 0 || ::fcntl(dmabuf.fd, F_GETFD) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(core_->options.provider, ": DMA-BUF fd ", dmabuf.fd, " is not open (EBADF)"));
  }
  return Register(data, length, access);
}

absl::StatusOr<std::unique_ptr<fabric::PendingConnection>> FakeFabric::BeginConnect(
    const std::string& peer_address) {
  {
    absl::MutexLock lock(&core_->mu);
    absl::Status injected;
    if (core_->fail_connects.Take(&injected)) return injected;
  }
  if (internal::Find(peer_address) == nullptr) {
    return absl::UnavailableError(
        absl::StrCat(core_->options.provider, ": no fake fabric at '", peer_address, "'"));
  }
  return std::unique_ptr<fabric::PendingConnection>(
      new internal::FakePendingConnection(core_, peer_address));
}

absl::StatusOr<std::string> FakeFabric::AcceptConnect(const std::string& request,
                                                      const fabric::PeerInstance&) {
  std::vector<std::string> parts = absl::StrSplit(request, '\n');
  if (parts.size() != 4 || parts[0] != "fake-connect" || parts[2] != core_->address) {
    return absl::InvalidArgumentError(absl::StrCat(
        core_->address, ": not a connection request for this fabric: ", absl::CEscape(request)));
  }
  absl::MutexLock lock(&core_->mu);
  if (!core_->serving) {
    return absl::UnavailableError(absl::StrCat(core_->address, ": stopped serving"));
  }
  core_->accepted.insert(parts[3]);
  return absl::StrCat("fake-accept\n", core_->address, "\n", parts[1], "\n", parts[3]);
}

void FakeFabric::StopServing() {
  std::vector<std::shared_ptr<Link>> links;
  {
    absl::MutexLock lock(&core_->mu);
    core_->serving = false;
    core_->accepted.clear();
    for (const auto& weak : core_->incoming) {
      if (auto link = weak.lock()) links.push_back(std::move(link));
    }
  }
  // Each link under its initiator's lock, never two fabrics' locks at once.
  for (const auto& link : links) {
    absl::MutexLock lock(&link->initiator->mu);
    link->initiator->BreakLocked(
        *link, absl::UnavailableError(absl::StrCat("fake: ", core_->address, " stopped serving")));
  }
}

void FakeFabric::SetImmediateHandler(ImmediateHandler handler) {
  ImmediateHandler old;
  {
    absl::MutexLock lock(&core_->mu);
    old = std::move(core_->handler);
    core_->handler = std::move(handler);
    // A handler running now finishes before we return, so the caller may free what the old
    // one used (unless the caller is that handler).
    if (!core_->OnThread()) {
      core_->mu.Await(absl::Condition(
          +[](Core* c) ABSL_NO_THREAD_SAFETY_ANALYSIS { return !c->in_handler; }, core_.get()));
    }
  }
  // `old` and its captures die here, outside the lock.
}

void FakeFabric::HoldCompletions() {
  absl::MutexLock lock(&core_->mu);
  core_->hold = true;
}

void FakeFabric::ReleaseCompletions() {
  absl::MutexLock lock(&core_->mu);
  core_->hold = false;
}

bool FakeFabric::AwaitHeld(uint64_t n, absl::Duration timeout) {
  absl::MutexLock lock(&core_->mu);
  auto enough = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return core_->hold && core_->queue.size() >= n;
  };
  return core_->mu.AwaitWithTimeout(absl::Condition(&enough), timeout);
}

void FakeFabric::FailNextOps(int n, absl::Status status) {
  absl::MutexLock lock(&core_->mu);
  core_->fail_ops = {n, std::move(status)};
}

void FakeFabric::RefuseNextPosts(int n, absl::Status status) {
  absl::MutexLock lock(&core_->mu);
  core_->refuse_posts = {n, std::move(status)};
}

void FakeFabric::FailNextRegistrations(int n, absl::Status status) {
  absl::MutexLock lock(&core_->mu);
  core_->fail_registrations = {n, std::move(status)};
}

void FakeFabric::FailNextConnects(int n, absl::Status status) {
  absl::MutexLock lock(&core_->mu);
  core_->fail_connects = {n, std::move(status)};
}

void FakeFabric::BreakEndpoints() {
  absl::MutexLock lock(&core_->mu);
  for (const auto& weak : core_->outgoing) {
    if (auto link = weak.lock()) {
      core_->BreakLocked(*link, absl::UnavailableError(absl::StrCat(
                                    "fake: endpoint to ", link->peer, " broken by the test")));
    }
  }
}

FakeFabricStats FakeFabric::stats() const {
  absl::MutexLock lock(&core_->mu);
  FakeFabricStats s = core_->stats;
  s.held = core_->hold ? core_->queue.size() : 0;
  s.live_regions = core_->regions.size();
  return s;
}

bool FakeFabric::AwaitIdle(absl::Duration timeout) {
  absl::MutexLock lock(&core_->mu);
  auto idle = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return core_->stats.outstanding == 0 && core_->immediates.empty() && !core_->in_handler;
  };
  return core_->mu.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

std::vector<std::string> FakeFabric::ContractViolations() {
  internal::Registry& r = internal::Global();
  absl::MutexLock lock(&r.mu);
  return r.violations;
}

void FakeFabric::ClearContractViolations() {
  internal::Registry& r = internal::Global();
  absl::MutexLock lock(&r.mu);
  r.violations.clear();
}

}  // namespace ferry::fake
