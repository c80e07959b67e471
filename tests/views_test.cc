// The operator views' small pieces: JSON log escaping, quantiles from histogram buckets, and
// the transfer statistics they read.

#include <algorithm>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/transfer_stats.h"
#include "server/agent/log_setup.h"
#include "server/api/views.h"

namespace ferry::server {
namespace {

TEST(JsonEscapeTest, QuotesBackslashesAndControlCharactersAreEscaped) {
  EXPECT_EQ(JsonEscape("plain"), "plain");
  EXPECT_EQ(JsonEscape("a \"b\" \\c"), "a \\\"b\\\" \\\\c");
  EXPECT_EQ(JsonEscape("line\nnext\ttab\x01"), "line\\nnext\\ttab\\u0001");
  EXPECT_EQ(JsonEscape("caf\xc3\xa9"), "caf\xc3\xa9");  // UTF-8 passes through
}

TEST(BucketQuantileTest, TheUpperBoundOfTheBucketHoldingTheQuantile) {
  const std::vector<double> bounds = {10, 100, 1000};
  EXPECT_EQ(BucketQuantile(bounds, {0, 0, 0}, 0.5), 0);
  EXPECT_EQ(BucketQuantile(bounds, {50, 49, 1}, 0.5), 10);
  EXPECT_EQ(BucketQuantile(bounds, {50, 49, 1}, 0.99), 100);
  EXPECT_EQ(BucketQuantile(bounds, {50, 49, 1}, 1.0), 1000);
}

ferry::v1::OpResult Op(uint64_t bytes, uint64_t us, const std::string& mode, int code = 0) {
  ferry::v1::OpResult r;
  r.set_bytes(code == 0 ? bytes : 0);
  r.set_duration_us(us);
  r.set_code(code);
  r.set_provider("tcp");
  r.add_legs()->set_mode(mode);
  return r;
}

// The bucket an op of `us` lands in: the first bound at or above it.
size_t BucketOf(double us) {
  return std::lower_bound(kLatencyBoundsUs.begin(), kLatencyBoundsUs.end(), us) -
         kLatencyBoundsUs.begin();
}

TEST(TransferStatsTest, OpsAddUpByPeerDirectionModeAndProviderAndLatencyBySize) {
  TransferStats stats;
  stats.Record("node-b", false, Op(4096, 80, "host"));
  stats.Record("node-b", false, Op(4096, 300, "host"));
  stats.Record("node-b", true, Op(64 << 20, 20000, "gdr"));
  stats.Record("node-c", false, Op(4096, 0, "staged", 14));
  auto totals = stats.Totals();
  ASSERT_EQ(totals.size(), 3u);
  const OpTotals& w = totals.at({"node-b", "write", "host", "tcp"});
  EXPECT_EQ(w.ops, 2u);
  EXPECT_EQ(w.bytes, 8192u);
  EXPECT_EQ(totals.at({"node-b", "read", "gdr", "tcp"}).bytes, 64u << 20);
  EXPECT_EQ(totals.at({"node-c", "write", "staged", "tcp"}).failed, 1u);
  auto latency = stats.Latency();
  ASSERT_EQ(latency.size(), 2u);  // failed ops are not timed
  const LatencyHistogram& small = latency.at("<=4KiB");
  EXPECT_EQ(small.count, 2u);
  EXPECT_EQ(small.buckets[BucketOf(80)], 1u);  // 80 us: <= 80
  EXPECT_EQ(small.buckets[BucketOf(300)], 1u);  // 300 us: <= 315
  EXPECT_EQ(kLatencyBoundsUs[BucketOf(300)], 315);
  EXPECT_EQ(latency.at(">16MiB").buckets[BucketOf(20000)], 1u);  // 20 ms: <= 20 ms
  EXPECT_STREQ(SizeClassOf(4096), "<=4KiB");
  EXPECT_STREQ(SizeClassOf(4097), "<=64KiB");
  EXPECT_STREQ(SizeClassOf(16 << 20), "<=16MiB");
}

// `ferryctl stats`' "P50 <=" is the bound of a bucket: never far above the ops' own time.
// From the field: one 55 ms op read "P50 <= 100000 us" when the bounds went 25, 100 ms.
TEST(TransferStatsTest, AQuantileReadsWithinAQuarterOfTheOpsTime) {
  const std::vector<double> bounds(kLatencyBoundsUs.begin(), kLatencyBoundsUs.end());
  for (uint64_t us : {10, 13, 80, 300, 4321, 20000, 55000, 99000, 2000000, 9900000}) {
    TransferStats stats;
    stats.Record("node-b", false, Op(4096, us, "host"));
    // Latency() returns a copy: keep it, or the reference dangles (ASan: heap-use-after-free).
    const auto latency = stats.Latency();
    const LatencyHistogram& h = latency.at("<=4KiB");
    const double p50 = BucketQuantile(bounds, {h.buckets.begin(), h.buckets.end()}, 0.5);
    EXPECT_GE(p50, us);
    EXPECT_LE(p50, us * 1.28) << us << " us";
    if (us == 55000) EXPECT_EQ(p50, 63000);
  }
  for (size_t i = 1; i < bounds.size(); ++i) {
    EXPECT_GT(bounds[i], bounds[i - 1]);
    EXPECT_LE(bounds[i] / bounds[i - 1], 1.28) << bounds[i];
  }
}

}  // namespace
}  // namespace ferry::server
