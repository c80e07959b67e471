// `ferryctl nics` and the NIC lines of `ferryctl info`, from a GetInfo answer built here.

#include "client/nics_view.h"

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

}  // namespace
}  // namespace ferry::client
