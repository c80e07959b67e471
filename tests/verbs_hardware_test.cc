// The verbs provider on a real RDMA NIC (label `rdma`): the same handshake and ops as the
// model-backed tests, against rdma-core. Without a NIC every test skips and says why.

#include <cstring>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "transport/verbs/rdma_core_api.h"
#include "transport/verbs/verbs_fabric.h"

namespace ferry::verbs {
namespace {

class VerbsHardwareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto a = VerbsFabric::Create(VerbsOptions{}, RdmaCoreApi());
    if (!a.ok()) {
      std::printf("skipping: no usable RDMA NIC here: %s\n", a.status().ToString().c_str());
      GTEST_SKIP() << "no usable RDMA NIC: " << a.status();
    }
    auto b = VerbsFabric::Create(VerbsOptions{}, RdmaCoreApi());
    ASSERT_TRUE(b.ok()) << b.status();
    initiator_ = std::move(*a);
    target_ = std::move(*b);
  }

  std::unique_ptr<VerbsFabric> initiator_, target_;
};

TEST_F(VerbsHardwareTest, LoopbackWriteAndReadOnTheFirstActivePort) {
  auto ep = fabric::ConnectDirect(*initiator_, *target_);
  ASSERT_TRUE(ep.ok()) << ep.status();
  std::vector<char> src(1 << 20, 'h'), dst(1 << 20, 0), back(1 << 20, 0);
  auto src_mr = initiator_->Register(src.data(), src.size(), fabric::kLocal);
  auto back_mr = initiator_->Register(back.data(), back.size(), fabric::kLocal);
  auto dst_mr =
      target_->Register(dst.data(), dst.size(), fabric::kRemoteWrite | fabric::kRemoteRead);
  ASSERT_TRUE(src_mr.ok() && back_mr.ok() && dst_mr.ok());
  EXPECT_EQ((*src_mr)->registration(), "ibv_reg_mr");
  for (bool read : {false, true}) {
    absl::Notification done;
    absl::Status status;
    auto cb = [&](absl::Status s) {
      status = s;
      done.Notify();
    };
    fabric::RemoteSlice remote{(*dst_mr)->remote_address(), (*dst_mr)->key()};
    absl::Status posted = read ? (*ep)->PostRead({back_mr->get(), 0, back.size()}, remote, cb)
                               : (*ep)->PostWrite({src_mr->get(), 0, src.size()}, remote, cb);
    ASSERT_TRUE(posted.ok()) << posted;
    done.WaitForNotification();
    ASSERT_TRUE(status.ok()) << status;
  }
  EXPECT_EQ(0, std::memcmp(src.data(), back.data(), src.size()));
  (*ep)->Close();
}

}  // namespace
}  // namespace ferry::verbs
