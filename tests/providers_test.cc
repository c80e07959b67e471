#include "transport/providers.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/completion_waiter.h"
#include "tests/fakes/gpu_copies.h"
#include "transport/memory/gpu_device.h"

namespace ferry::fabric {
namespace {

using ::testing::HasSubstr;

TEST(SelectProviderTest, FirstOfOurPreferencesThatThePeerOffers) {
  EXPECT_EQ(*SelectProvider({"verbs", "tcp"}, {"tcp", "verbs"}), "verbs");
  EXPECT_EQ(*SelectProvider({"verbs", "tcp"}, {"tcp"}), "tcp");  // a node without RDMA
  EXPECT_EQ(*SelectProvider({"tcp"}, {"verbs", "tcp"}), "tcp");
  EXPECT_EQ(*SelectProvider({"tcp", "verbs"}, {"verbs", "tcp"}), "tcp");
}

TEST(SelectProviderTest, NoCommonProviderNamesBothLists) {
  auto p = SelectProvider({"verbs"}, {"tcp"});
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("we offer [verbs], the peer [tcp]"));
}

TEST(CreateFabricsTest, SkipsWhatCannotRunAndSaysWhy) {
  ProviderOptions options;
  options.providers = {"verbs", "tcp"};
  std::vector<std::string> skipped;
  auto fabrics = CreateFabrics(options, &skipped);
  ASSERT_TRUE(fabrics.ok()) << fabrics.status();
  ASSERT_FALSE(fabrics->empty());
  EXPECT_EQ(fabrics->back()->provider(), "tcp");
  if (fabrics->size() == 1) {
    ASSERT_EQ(skipped.size(), 1u);
    EXPECT_THAT(skipped[0], HasSubstr("verbs not used: "));
  }
}

// One tcp fabric on loopback, through the registry.
absl::StatusOr<std::vector<std::unique_ptr<Fabric>>> LoopbackTcp() {
  ProviderOptions options;
  options.providers = {"tcp"};
  options.tcp.listen_address = "127.0.0.1:0";
  std::vector<std::string> skipped;
  return CreateFabrics(options, &skipped);
}

// tcp moves bytes with the CPU: it must refuse GPU memory (kDeviceMemory) rather than
// register a device pointer it would later read and fault on; the buffer then stages.
TEST(CreateFabricsTest, TcpRefusesGpuMemory) {
  auto fabrics = LoopbackTcp();
  ASSERT_TRUE(fabrics.ok()) << fabrics.status();
  std::vector<char> mem(4096);
  auto r = fabrics->front()->Register(mem.data(), mem.size(),
                                      fabric::kRemoteWrite | fabric::kDeviceMemory);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("GPU memory"));
  EXPECT_TRUE(fabrics->front()->Register(mem.data(), mem.size(), fabric::kRemoteWrite).ok());
}

// A simulated GPU's memory is in the peer-memory table, the stand-in for nvidia_peermem: tcp
// registers it and moves its bytes through that mapping, never through the device address
// (which faults on the CPU). A range no peer client maps is still refused.
TEST(CreateFabricsTest, TcpReachesSimulatedGpuMemoryThroughPeerMemory) {
  auto initiator = LoopbackTcp();
  auto target = LoopbackTcp();
  ASSERT_TRUE(initiator.ok() && target.ok());
  Fabric& a = *initiator->front();
  Fabric& b = *target->front();
  auto gpu = memory::CreateSimGpu(0, "", 0);
  constexpr uint64_t kSlab = 1 << 16;
  auto slab = gpu->AllocateSlab(kSlab);
  ASSERT_TRUE(slab.ok()) << slab.status();
  char* device = static_cast<char*>((*slab)->data());
  EXPECT_EQ(b.Register(device + 4096, kSlab, kRemoteWrite | kDeviceMemory).status().code(),
            absl::StatusCode::kFailedPrecondition)
      << "past the slab: no peer client maps it";
  auto gpu_target = b.Register(device, kSlab / 2, kRemoteWrite | kRemoteRead | kDeviceMemory);
  ASSERT_TRUE(gpu_target.ok()) << gpu_target.status();
  auto gpu_source = a.Register(device + kSlab / 2, kSlab / 2, kLocal | kDeviceMemory);
  ASSERT_TRUE(gpu_source.ok()) << gpu_source.status();
  std::vector<char> host(8192, 'h');
  auto host_region = a.Register(host.data(), host.size(), kLocal);
  ASSERT_TRUE(host_region.ok());
  auto endpoint = ConnectDirect(a, b);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();

  // Host -> GPU, then GPU -> GPU: both land in device memory.
  const std::string pattern = "written into GPU memory over tcp";
  ASSERT_TRUE(fake::WriteGpu(*gpu, device + kSlab / 2, pattern.data(), pattern.size()).ok());
  for (const MemoryRegion* src : {host_region->get(), gpu_source->get()}) {
    CompletionWaiter w;
    ASSERT_TRUE((*endpoint)
                    ->PostWrite({src, 0, pattern.size()},
                                {(*gpu_target)->remote_address() + 100, (*gpu_target)->key()},
                                w.Callback())
                    .ok());
    EXPECT_TRUE(w.Wait().ok()) << w.Wait();
    std::string landed(pattern.size(), 0);
    ASSERT_TRUE(fake::ReadGpu(*gpu, landed.data(), device + 100, landed.size()).ok());
    EXPECT_EQ(landed, src == host_region->get() ? std::string(pattern.size(), 'h') : pattern);
  }
  // GPU -> host by READ.
  CompletionWaiter r;
  ASSERT_TRUE((*endpoint)
                  ->PostRead({host_region->get(), 0, pattern.size()},
                             {(*gpu_target)->remote_address() + 100, (*gpu_target)->key()},
                             r.Callback())
                  .ok());
  EXPECT_TRUE(r.Wait().ok()) << r.Wait();
  EXPECT_EQ(std::string(host.data(), pattern.size()), pattern);
  (*endpoint)->Close();
}

TEST(CreateFabricsTest, NothingUsableIsAnError) {
  ProviderOptions options;
  options.providers = {"tcp"};
  options.tcp.listen_address = "256.0.0.1:0";  // cannot bind
  std::vector<std::string> skipped;
  auto fabrics = CreateFabrics(options, &skipped);
  EXPECT_EQ(fabrics.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(skipped.size(), 1u);
}

}  // namespace
}  // namespace ferry::fabric
