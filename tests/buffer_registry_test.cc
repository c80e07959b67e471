// BufferRegistry through its public interface: a real host pool, fake fabrics that move bytes
// in-process, and a peer fabric that tries remote access the way another agent would.

#include "server/buffers/buffer_registry.h"
#include "server/buffers/gpu_pools.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/completion_waiter.h"
#include "tests/fakes/fake_fabric.h"
#include "tests/fakes/sim_gpus.h"
#include "transport/memory/gpu_device.h"
#include "transport/memory/host_pool.h"

namespace ferry::server {
namespace {

// The rail of a fake fabric (not bound to a NIC).
fabric::RailId Rail(const char* provider) { return {provider, ""}; }

using fake::FakeFabric;
using fake::FakeFabricOptions;
using Waiter = fabric::CompletionWaiter;

constexpr uint64_t kAlign = memory::HostPool::kAlignment;
constexpr uint64_t kPoolBytes = 64 * kAlign;

// The one place the test builds a registry: its constructor (and the GPU pools parameter)
// are about to change, and only this function should have to follow.
std::unique_ptr<BufferRegistry> MakeRegistry(memory::HostPool* pool,
                                             std::vector<fabric::Fabric*> fabrics,
                                             GpuPools* gpus = nullptr) {
  return std::make_unique<BufferRegistry>(pool, gpus, std::move(fabrics));
}

class BufferRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    FakeFabric::ClearContractViolations();
    auto pool = memory::HostPool::Create(kPoolBytes, "buffer_registry_test");
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(*pool);
    registry_ = MakeRegistry(pool_.get(), {&agent_, &agent_rail2_});
    auto ep = fabric::ConnectDirect(peer_, agent_);
    ASSERT_TRUE(ep.ok()) << ep.status();
    peer_to_agent_ = std::move(*ep);
    auto src = peer_.Register(peer_memory_.data(), peer_memory_.size(),
                              fabric::kRemoteWrite | fabric::kRemoteRead);
    ASSERT_TRUE(src.ok()) << src.status();
    peer_region_ = std::move(*src);
  }

  void TearDown() override {
    peer_to_agent_->Close();
    registry_.reset();
    // Every buffer is gone, so is every registration and every byte of the pool.
    EXPECT_EQ(agent_.stats().live_regions, 0u);
    EXPECT_EQ(agent_rail2_.stats().live_regions, 0u);
    EXPECT_EQ(pool_->used(), 0u);
    peer_region_.reset();
    EXPECT_TRUE(FakeFabric::ContractViolations().empty())
        << FakeFabric::ContractViolations().front();
  }

  // The peer WRITEs `n` bytes of its memory to `region` of the agent, as another agent would
  // after resolving the buffer; the op's status.
  absl::Status PeerWrite(const fabric::MemoryRegion& region, uint64_t n = 64) {
    Waiter w;
    absl::Status posted = peer_to_agent_->PostWrite(
        {peer_region_.get(), 0, n}, {region.remote_address(), region.key()}, w.Callback());
    if (!posted.ok()) return posted;
    return w.Wait();
  }
  absl::Status PeerWrite(uint64_t address, uint32_t key) {
    Waiter w;
    absl::Status posted =
        peer_to_agent_->PostWrite({peer_region_.get(), 0, 64}, {address, key}, w.Callback());
    if (!posted.ok()) return posted;
    return w.Wait();
  }
  absl::Status PeerRead(const fabric::MemoryRegion& region, uint64_t n = 64) {
    Waiter w;
    absl::Status posted = peer_to_agent_->PostRead(
        {peer_region_.get(), 0, n}, {region.remote_address(), region.key()}, w.Callback());
    if (!posted.ok()) return posted;
    return w.Wait();
  }

  std::shared_ptr<Buffer> Allocate(uint64_t size, const std::string& name = "",
                                   BufferOwner owner = {}) {
    auto b = registry_->Allocate(size, name, "host", std::move(owner));
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? *b : nullptr;
  }

  // Declared so that they are destroyed in this order: registry (buffers, regions), the
  // peer's endpoint, fabrics, then the pool the buffers came from.
  std::unique_ptr<memory::HostPool> pool_;
  FakeFabric peer_{FakeFabricOptions{.provider = "fake"}};
  FakeFabric agent_{FakeFabricOptions{.provider = "fake"}};
  FakeFabric agent_rail2_{FakeFabricOptions{.provider = "fake2"}};
  std::vector<char> peer_memory_ = std::vector<char>(4 * kAlign, 'p');
  std::unique_ptr<fabric::MemoryRegion> peer_region_;
  std::shared_ptr<fabric::Endpoint> peer_to_agent_;
  std::unique_ptr<BufferRegistry> registry_;
};

TEST_F(BufferRegistryTest, NamesAreValidated) {
  EXPECT_NE(Allocate(64, std::string(kMaxBufferName, 'n')), nullptr);
  for (const std::string& bad : {std::string(kMaxBufferName + 1, 'n'), std::string("a:b"),
                                 std::string("a b"), std::string("a\tb"), std::string("a\nb")}) {
    auto b = registry_->Allocate(64, bad);
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  // The 1 MB name is echoed bounded, not whole.
  auto huge = registry_->Allocate(64, std::string(1 << 20, 'x') + ":");
  EXPECT_LT(huge.status().message().size(), 512u);
  EXPECT_EQ(registry_->count(), 1u);
  EXPECT_EQ(agent_.stats().live_regions, 1u) << "refused names register nothing";
}

TEST_F(BufferRegistryTest, AllowedPeersScopeANamedBuffer) {
  auto scoped = registry_->Allocate(64, "scoped", "host", {}, {"node-a", "node-c"});
  ASSERT_TRUE(scoped.ok()) << scoped.status();
  EXPECT_TRUE((*scoped)->ExportedTo("node-a"));
  EXPECT_TRUE((*scoped)->ExportedTo("node-c"));
  EXPECT_FALSE((*scoped)->ExportedTo("node-b"));
  EXPECT_FALSE((*scoped)->ExportedTo(""));
  auto open = registry_->Allocate(64, "open");
  ASSERT_TRUE(open.ok());
  EXPECT_TRUE((*open)->ExportedTo("node-b")) << "no list: every peer";
  auto local = registry_->Allocate(64, "");
  ASSERT_TRUE(local.ok());
  EXPECT_FALSE((*local)->ExportedTo("node-a")) << "unnamed: nobody";
  // Peers for a buffer nobody can name, or an empty peer name: refused, registering nothing.
  EXPECT_EQ(registry_->Allocate(64, "", "host", {}, {"node-a"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_->Allocate(64, "x", "host", {}, {""}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_->count(), 3u);
  for (const auto& b : {*scoped, *open, *local}) EXPECT_TRUE(registry_->Free(b->id()).ok());
}

TEST_F(BufferRegistryTest, NameInUseIsAlreadyExistsUntilFreed) {
  auto first = Allocate(64, "kv");
  auto again = registry_->Allocate(64, "kv");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists) << again.status();
  EXPECT_EQ(registry_->count(), 1u);
  EXPECT_EQ(pool_->used(), kAlign) << "the refused allocation took nothing from the pool";
  EXPECT_EQ(agent_.stats().live_regions, 1u);
  ASSERT_TRUE(registry_->Free(first->id()).ok());
  EXPECT_NE(Allocate(64, "kv"), nullptr);
}

TEST_F(BufferRegistryTest, SizeZeroAndAFullPoolAreRefused) {
  EXPECT_EQ(registry_->Allocate(0, "").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_->Allocate(kPoolBytes + 1, "").status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(registry_->count(), 0u);
  EXPECT_EQ(agent_.stats().live_regions, 0u);
}

TEST_F(BufferRegistryTest, EveryHostBufferIsRegisteredWithEveryFabric) {
  auto b = Allocate(100, "both");
  ASSERT_EQ(b->regions().size(), 2u);
  EXPECT_EQ(b->regions()[0].first, Rail("fake"));
  EXPECT_EQ(b->regions()[1].first, Rail("fake2"));
  ASSERT_NE(b->region(Rail("fake")), nullptr);
  ASSERT_NE(b->region(Rail("fake2")), nullptr);
  EXPECT_EQ(b->region(Rail("tcp")), nullptr);
  EXPECT_EQ(b->region(Rail("fake"))->data(), b->data());
  EXPECT_EQ(b->region(Rail("fake"))->length(), 100u);
  EXPECT_EQ(b->device(), "host");
  EXPECT_EQ(b->gpu(), -1);
  EXPECT_EQ(agent_.stats().live_regions, 1u);
  EXPECT_EQ(agent_rail2_.stats().live_regions, 1u);
}

TEST_F(BufferRegistryTest, NamedBuffersAreExportedAndUnnamedOnesAreLocalOnly) {
  auto named = Allocate(kAlign, "exported");
  auto unnamed = Allocate(kAlign);
  std::memset(unnamed->data(), 'u', unnamed->size());

  ASSERT_TRUE(PeerWrite(*named->region(Rail("fake"))).ok());
  EXPECT_EQ(0, std::memcmp(named->data(), peer_memory_.data(), 64));
  EXPECT_TRUE(PeerRead(*named->region(Rail("fake"))).ok());

  EXPECT_EQ(PeerWrite(*unnamed->region(Rail("fake"))).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(PeerRead(*unnamed->region(Rail("fake"))).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(std::count(unnamed->data(), unnamed->data() + unnamed->size(), 'u'),
            static_cast<long>(kAlign))
      << "a peer touched an unnamed buffer";

  // Local use of the unnamed one goes on: the agent WRITEs from it to the peer.
  auto out = fabric::ConnectDirect(agent_, peer_);
  ASSERT_TRUE(out.ok()) << out.status();
  Waiter w;
  ASSERT_TRUE((*out)
                  ->PostWrite({unnamed->region(Rail("fake")), 0, 64},
                              {peer_region_->remote_address(), peer_region_->key()}, w.Callback())
                  .ok());
  EXPECT_TRUE(w.Wait().ok()) << w.Wait();
  EXPECT_EQ(peer_memory_[0], 'u');
  (*out)->Close();
}

TEST_F(BufferRegistryTest, FreedMemoryReturnsWhenTheLastHolderDrops) {
  auto held = Allocate(3 * kAlign, "in-flight");
  const uint64_t id = held->id();
  const fabric::RemoteSlice key{held->region(Rail("fake"))->remote_address(),
                                held->region(Rail("fake"))->key()};
  EXPECT_EQ(pool_->used(), 3 * kAlign);
  ASSERT_TRUE(registry_->Free(id).ok());
  // Gone from the registry at once...
  EXPECT_EQ(registry_->count(), 0u);
  EXPECT_EQ(registry_->host_bytes(), 0u);
  EXPECT_EQ(registry_->FindByName("in-flight").status().code(), absl::StatusCode::kNotFound);
  // ...but a transfer still holding it keeps memory and key until it lets go.
  EXPECT_EQ(pool_->used(), 3 * kAlign);
  EXPECT_EQ(agent_.stats().live_regions, 1u);
  EXPECT_TRUE(PeerWrite(key.address, key.key).ok());
  held.reset();
  EXPECT_EQ(pool_->used(), 0u);
  EXPECT_EQ(agent_.stats().live_regions, 0u);
  EXPECT_EQ(agent_rail2_.stats().live_regions, 0u);
  EXPECT_EQ(PeerWrite(key.address, key.key).code(), absl::StatusCode::kPermissionDenied)
      << "the key of a freed buffer must be revoked";
}

TEST_F(BufferRegistryTest, FreeForLetsOnlyTheOwnerFreeButAnyoneAPersistingBuffer) {
  auto owned = Allocate(64, "owned", {3, "session 3 (test, pid 1)"});
  auto persisting = Allocate(64, "kept");
  auto other = registry_->FreeFor(owned->id(), 4);
  EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(other.message().find("session 3 (test, pid 1)"), std::string::npos) << other;
  EXPECT_EQ(registry_->FreeFor(owned->id(), 0).code(), absl::StatusCode::kPermissionDenied)
      << "a caller outside any session frees only persisting buffers";
  EXPECT_EQ(registry_->count(), 2u);
  EXPECT_TRUE(registry_->FreeFor(owned->id(), 3).ok());
  EXPECT_TRUE(registry_->FreeFor(persisting->id(), 5).ok());
  EXPECT_EQ(registry_->FreeFor(persisting->id(), 5).code(), absl::StatusCode::kNotFound);
  auto any = Allocate(64, "", {6, "session 6"});
  EXPECT_TRUE(registry_->FreeFor(any->id(), BufferRegistry::kAnySession).ok());
  EXPECT_EQ(registry_->count(), 0u);
}

TEST_F(BufferRegistryTest, FreeOwnedByFreesExactlyThatSessionsBuffers) {
  for (int i = 0; i < 3; ++i) Allocate(64, "s7-" + std::to_string(i), {7, "session 7"});
  for (int i = 0; i < 2; ++i) Allocate(64, "", {8, "session 8"});
  Allocate(64, "persist");
  EXPECT_EQ(registry_->FreeOwnedBy(0), 0u) << "session 0 owns nothing: its buffers persist";
  EXPECT_EQ(registry_->FreeOwnedBy(7), 3u);
  EXPECT_EQ(registry_->FreeOwnedBy(7), 0u);
  EXPECT_EQ(registry_->count(), 3u);
  EXPECT_EQ(registry_->FindByName("s7-0").status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(Allocate(64, "s7-0"), nullptr) << "the name is free again";
  EXPECT_EQ(registry_->FreeOwnedBy(8), 2u);
  EXPECT_EQ(registry_->count(), 2u);
  EXPECT_EQ(agent_.stats().live_regions, 2u);
  EXPECT_EQ(pool_->used(), 2 * kAlign);
}

TEST_F(BufferRegistryTest, AdoptHandsTheBufferToAnotherOwner) {
  auto b = Allocate(64, "landing");
  EXPECT_EQ(b->owner(), 0u);
  ASSERT_TRUE(registry_->Adopt(b->id(), {9, "session 9 (receiver)"}).ok());
  EXPECT_EQ(b->owner(), 9u);
  EXPECT_EQ(b->owner_label(), "session 9 (receiver)");
  EXPECT_EQ(registry_->FreeFor(b->id(), 1).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(registry_->FreeOwnedBy(9), 1u);
  EXPECT_EQ(registry_->Adopt(b->id(), {9, ""}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry_->Adopt(12345, {9, ""}).code(), absl::StatusCode::kNotFound);
}

TEST_F(BufferRegistryTest, UnexportTakesTheNameAndRemoteAccessButNotLocalUse) {
  auto b = Allocate(kAlign, "public");
  ASSERT_TRUE(PeerWrite(*b->region(Rail("fake"))).ok());
  ASSERT_TRUE(registry_->Unexport(b->id()).ok());
  EXPECT_EQ(registry_->FindByName("public").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(registry_->Get(b->id(), "id").ok()) << "the buffer itself stays";
  std::memset(b->data(), 'k', 64);
  EXPECT_EQ(PeerWrite(*b->region(Rail("fake"))).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(PeerRead(*b->region(Rail("fake"))).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(std::count(b->data(), b->data() + 64, 'k'), 64);
  auto out = fabric::ConnectDirect(agent_, peer_);
  ASSERT_TRUE(out.ok());
  Waiter w;
  ASSERT_TRUE((*out)
                  ->PostWrite({b->region(Rail("fake")), 0, 64},
                              {peer_region_->remote_address(), peer_region_->key()}, w.Callback())
                  .ok());
  EXPECT_TRUE(w.Wait().ok()) << w.Wait();
  EXPECT_EQ(peer_memory_[0], 'k');
  (*out)->Close();
  EXPECT_NE(Allocate(64, "public"), nullptr) << "the name can name a new buffer";
  EXPECT_EQ(registry_->Unexport(777).code(), absl::StatusCode::kNotFound);
}

// An unexported buffer's name may be taken by a new buffer; freeing the old one must not drop
// the new one's name (Free, FreeOwnedBy and Unexport once erased whatever the name mapped to).
TEST_F(BufferRegistryTest, FreeingAnUnexportedBufferKeepsItsSuccessorsName) {
  auto old_one = Allocate(64, "public");
  ASSERT_TRUE(registry_->Unexport(old_one->id()).ok());
  auto new_one = Allocate(64, "public");
  ASSERT_TRUE(registry_->Free(old_one->id()).ok());
  auto found = registry_->FindByName("public");
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ((*found)->id(), new_one->id());
}

TEST_F(BufferRegistryTest, UnexportWhereTheProviderCannotRestrictOnlyHidesTheName) {
  // verbs cannot change an MR's access in place: the registry logs and goes on.
  FakeFabric fixed({.provider = "fixed", .restrict_to_local = false});
  auto pool = memory::HostPool::Create(4 * kAlign, "buffer_registry_test_fixed");
  ASSERT_TRUE(pool.ok());
  auto registry = MakeRegistry(pool->get(), {&fixed});
  auto b = registry->Allocate(64, "pinned");
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(registry->Unexport((*b)->id()).ok());
  EXPECT_EQ(registry->FindByName("pinned").status().code(), absl::StatusCode::kNotFound);
  b->reset();
  registry.reset();
  EXPECT_EQ(fixed.stats().live_regions, 0u);
}

TEST_F(BufferRegistryTest, GetSaysWhetherABufferWasFreedOrNeverExisted) {
  auto b = Allocate(64);
  const uint64_t id = b->id();
  auto got = registry_->Get(id, "ops[0].local_buffer");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->get(), b.get());
  ASSERT_TRUE(registry_->Free(id).ok());
  auto freed = registry_->Get(id, "ops[3].local_buffer");
  EXPECT_EQ(freed.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(freed.status().message(),
            "ops[3].local_buffer: buffer " + std::to_string(id) + " was freed");
  auto never = registry_->Get(id + 100, "id");
  EXPECT_EQ(never.status().message(), "id: buffer " + std::to_string(id + 100) + " does not exist");
  EXPECT_EQ(registry_->Get(0, "id").status().message(), "id: buffer 0 does not exist");
  EXPECT_NE(registry_->Free(id).message().find("was freed"), std::string::npos);
  EXPECT_NE(registry_->Free(id + 100).message().find("does not exist"), std::string::npos);
}

TEST_F(BufferRegistryTest, HostBytesAreCountedAsThePoolRoundsThem) {
  auto a = Allocate(1);
  auto b = Allocate(kAlign);
  auto c = Allocate(kAlign + 1, "c");
  EXPECT_EQ(registry_->host_bytes(), 4 * kAlign);
  EXPECT_EQ(registry_->host_bytes(), pool_->used());
  EXPECT_EQ(a->size(), 1u) << "the buffer keeps the size asked for";
  ASSERT_TRUE(registry_->Free(c->id()).ok());
  EXPECT_EQ(registry_->host_bytes(), 2 * kAlign);
  c.reset();
  EXPECT_EQ(registry_->host_bytes(), pool_->used());
}

TEST_F(BufferRegistryTest, ListIsInIdOrderAndFindByNameFindsNamedOnes) {
  std::vector<uint64_t> ids;
  for (const char* name : {"x", "", "y", ""}) ids.push_back(Allocate(64, name)->id());
  ASSERT_TRUE(registry_->Free(ids[1]).ok());
  auto list = registry_->List();
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[0]->id(), ids[0]);
  EXPECT_EQ(list[1]->id(), ids[2]);
  EXPECT_EQ(list[2]->id(), ids[3]);
  EXPECT_EQ(registry_->count(), 3u);
  auto y = registry_->FindByName("y");
  ASSERT_TRUE(y.ok());
  EXPECT_EQ((*y)->id(), ids[2]);
  EXPECT_EQ(registry_->FindByName("").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(BufferRegistryTest, AFailedRegistrationLeavesNothingBehind) {
  agent_rail2_.FailNextRegistrations(1, absl::ResourceExhaustedError("fake2: out of MR slots"));
  auto b = registry_->Allocate(kAlign, "half");
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted) << b.status();
  EXPECT_EQ(registry_->count(), 0u);
  EXPECT_EQ(pool_->used(), 0u);
  EXPECT_EQ(agent_.stats().live_regions, 0u) << "the first fabric's registration leaked";
  EXPECT_EQ(agent_.stats().registrations, 1u);
  EXPECT_NE(Allocate(kAlign, "half"), nullptr) << "the name was not taken";
}

TEST_F(BufferRegistryTest, DestroyingTheRegistryFreesEverything) {
  for (int i = 0; i < 5; ++i) Allocate(kAlign, i % 2 ? "" : "b" + std::to_string(i), {1, "s1"});
  auto held = Allocate(kAlign, "held");
  EXPECT_EQ(agent_.stats().live_regions, 6u);
  registry_.reset();
  EXPECT_EQ(agent_.stats().live_regions, 1u) << "only the buffer still held";
  EXPECT_EQ(pool_->used(), kAlign);
  held.reset();
  EXPECT_EQ(agent_.stats().live_regions, 0u);
  EXPECT_EQ(agent_rail2_.stats().live_regions, 0u);
  EXPECT_EQ(pool_->used(), 0u);
  registry_ = MakeRegistry(pool_.get(), {&agent_});  // for TearDown
}

TEST_F(BufferRegistryTest, SimulatedGpuBuffersAreRegisteredWithEachFabric) {
  auto gpus = fake::SimGpuPools();
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  auto registry = MakeRegistry(pool_.get(), {&agent_, &agent_rail2_}, gpus->get());

  auto g = registry->Allocate(1000, "activations", "cuda:0");
  ASSERT_TRUE(g.ok()) << g.status();
  const Buffer& b = **g;
  EXPECT_EQ(b.gpu(), 0);
  EXPECT_EQ(b.device(), "cuda:0");
  EXPECT_EQ(b.backend(), "sim");
  ASSERT_EQ(b.regions().size(), 2u);
  ASSERT_EQ(b.attempts().size(), 2u);
  EXPECT_EQ(b.attempts()[0].rail, Rail("fake"));
  EXPECT_TRUE(b.attempts()[0].status.ok()) << b.attempts()[0].status;
  // The fake, like tcp, reaches the simulated GPU's memory only through peer memory.
  EXPECT_EQ(b.attempts()[0].ToString(), "fake: peer memory");
  EXPECT_EQ(b.attempts()[1].rail, Rail("fake2"));
  EXPECT_EQ(registry->host_bytes(), 0u) << "GPU buffers are not host bytes";
  EXPECT_EQ(pool_->used(), 0u);
  ASSERT_TRUE(PeerWrite(*b.region(Rail("fake"))).ok());
  // The CPU cannot read device memory: the bytes come back through the copy engine.
  std::vector<char> landed(64);
  ASSERT_TRUE(fake::ReadGpu((*gpus)->device(0), landed.data(), b.data(), 64).ok());
  EXPECT_EQ(0, std::memcmp(landed.data(), peer_memory_.data(), 64));

  EXPECT_EQ(registry->Allocate(64, "", "cuda:1").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry->Allocate(64, "", "gpu0").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_->Allocate(64, "", "cuda:0").status().code(), absl::StatusCode::kNotFound)
      << "a registry without GPU pools has no GPUs";
  g->reset();
  registry.reset();
  EXPECT_EQ(agent_.stats().live_regions, 0u);
}

}  // namespace
}  // namespace ferry::server
