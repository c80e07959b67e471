// `ferryctl nics` and the NIC lines of `ferryctl info`, from a GetInfo answer built here.

#include "client/nics_view.h"
#include "client/ops_views.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry::client {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

google::protobuf::RepeatedPtrField<ferry::v1::NicInfo> TwoRails() {
  google::protobuf::RepeatedPtrField<ferry::v1::NicInfo> nics;
  auto* a = nics.Add();
  a->set_rail("tcp:mlx5_0");
  a->set_health("ok");
  a->set_numa(0);
  a->add_gpus("cuda:0");
  a->set_host(true);
  a->set_served_written_bytes(3 << 20);
  auto* p = a->add_peers();
  p->set_peer("node-b");
  p->set_bytes(24994048);
  p->set_ops(24);
  auto* b = nics.Add();
  b->set_rail("tcp:mlx5_1");
  b->set_health("tcp 127.0.0.2:4000: taken down by the operator: cable swap");
  b->set_numa(-1);
  auto* q = b->add_peers();
  q->set_peer("node-b");
  q->set_bytes(1 << 20);
  q->set_errors(3);
  q->set_retries(3);
  q->set_state("paused");
  q->set_paused_ms_left(900);
  q->set_last_error("recv(): Connection reset by peer");
  return nics;
}

TEST(NicsViewTest, OneLinePerRailAndPeerThenWhatIsWrong) {
  const std::string text = FormatNics(TwoRails());
  EXPECT_THAT(text, HasSubstr("RAIL"));
  EXPECT_THAT(text, HasSubstr("tcp:mlx5_0     ok       0    cuda:0 host      3.0 MiB    node-b     "
                              "23.8 MiB"));
  EXPECT_THAT(text, HasSubstr("tcp:mlx5_1     down     -    -"));
  EXPECT_THAT(text, HasSubstr("paused 900 ms"));
  EXPECT_THAT(text, HasSubstr("  tcp:mlx5_1 to node-b: recv(): Connection reset by peer\n"));
  EXPECT_THAT(text, HasSubstr("  tcp:mlx5_1: tcp 127.0.0.2:4000: taken down by the operator"));
  EXPECT_THAT(text, Not(HasSubstr("tcp:mlx5_0 to node-b")));  // healthy: no error line
}

TEST(NicsViewTest, SummaryCountsWhatWasSentAndPausedPeers) {
  auto nics = TwoRails();
  EXPECT_EQ(FormatNicSummary(nics[0]),
            "tcp:mlx5_0 ok, numa 0, carries cuda:0 host, sent 23.8 MiB, served 3.0 MiB");
  EXPECT_THAT(FormatNicSummary(nics[1]), HasSubstr("carries -, sent 1.0 MiB, served 0 B, "
                                                   "paused for 1 peer(s)"));
}

TEST(OpsViewsTest, PeersTransfersAndStatsAsTables) {
  ferry::v1::ListPeersResponse peers;
  auto* ok = peers.add_peers();
  ok->set_node("node-b");
  ok->set_address("10.0.0.2:7100");
  ok->set_health("ok");
  ok->set_rtt_us(250);
  ok->set_incarnation(0xabc);
  ok->set_endpoints(4);
  ok->set_source("etcd");
  ok->add_rails("tcp:mlx5_0");
  ok->set_kept_answers(3);
  ok->set_answers_held(1);
  auto* gone = peers.add_peers();
  gone->set_node("node-c");
  gone->set_health("unreachable");
  gone->set_last_error("Health: failed to connect");
  gone->set_last_ok_ms_ago(3200);
  const std::string p = FormatPeers(peers);
  EXPECT_THAT(p, HasSubstr("node-b       10.0.0.2:7100          ok            0.25 ms abc"));
  EXPECT_THAT(p, HasSubstr("    4 3/1     etcd    tcp:mlx5_0"));
  EXPECT_THAT(p, HasSubstr("  node-c: Health: failed to connect (last answer 3.2 s ago)"));

  ferry::v1::ListTransfersResponse transfers;
  auto* t = transfers.add_recent();
  t->set_transfer_id(7);
  t->set_state(ferry::v1::SUCCEEDED);
  t->set_bytes_total(256 << 20);
  t->set_bytes_done(256 << 20);
  t->set_ops_total(4);
  t->set_ops_settled(4);
  t->add_peers("node-b");
  t->add_modes("host");
  t->add_rails("tcp:mlx5_0");
  t->set_retries(2);
  t->set_duration_us(12500);
  const std::string x = FormatTransfers(transfers);
  EXPECT_THAT(x, HasSubstr("running: 0\n"));
  EXPECT_THAT(x, HasSubstr("7        succeeded 256.0 MiB 100%"));
  EXPECT_THAT(x, HasSubstr("tcp:mlx5_0 (2 retried)"));
  EXPECT_THAT(x, HasSubstr("12.5 ms"));

  ferry::v1::GetStatsResponse stats;
  stats.set_transfers_succeeded(3);
  auto* row = stats.add_rows();
  row->set_peer("node-b");
  row->set_direction("write");
  row->set_mode("gdr");
  row->set_provider("verbs");
  row->set_ops(12);
  row->set_bytes(3 << 20);
  auto* l = stats.add_latency();
  l->set_size_class("<=4KiB");
  l->set_count(10);
  l->set_sum_us(1000);
  l->set_p50_us(100);
  l->set_p99_us(250);
  const std::string s = FormatStats(stats);
  EXPECT_THAT(s, HasSubstr("transfers: 3 succeeded, 0 failed"));
  EXPECT_THAT(s, HasSubstr("node-b       write  gdr      verbs             12      3.0 MiB"));
  EXPECT_THAT(s, HasSubstr("<=4KiB            10       100 us       100 us       250 us"));
}

}  // namespace
}  // namespace ferry::client
