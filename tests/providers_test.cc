#include "transport/providers.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

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

// tcp moves bytes with the CPU: it must refuse GPU memory (kDeviceMemory) rather than
// register a device pointer it would later read and fault on; the buffer then stages.
TEST(CreateFabricsTest, TcpRefusesGpuMemory) {
  ProviderOptions options;
  options.providers = {"tcp"};
  options.tcp.listen_address = "127.0.0.1:0";
  std::vector<std::string> skipped;
  auto fabrics = CreateFabrics(options, &skipped);
  ASSERT_TRUE(fabrics.ok()) << fabrics.status();
  std::vector<char> mem(4096);
  auto r = fabrics->front()->Register(mem.data(), mem.size(),
                                      fabric::kRemoteWrite | fabric::kDeviceMemory);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("GPU memory"));
  EXPECT_TRUE(fabrics->front()->Register(mem.data(), mem.size(), fabric::kRemoteWrite).ok());
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
