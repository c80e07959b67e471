#pragma once
// Test helpers for the verbs provider on the software verbs model: two-HCA models and a
// pair of fabrics (one per HCA) with one endpoint between them.

#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "tests/verbs_model/verbs_model.h"
#include "transport/verbs/verbs_endpoint.h"
#include "transport/verbs/verbs_fabric.h"

namespace ferry::verbs {

using model::VerbsModel;

// Two fabrics on one model, one per HCA, connected.
struct Pair {
  Pair(std::shared_ptr<VerbsModel> m, VerbsOptions a_options = {}, VerbsOptions b_options = {},
       const fabric::PeerInstance& from = {})
      : model(std::move(m)) {
    a_options.device = a_options.device.empty() ? "mlx5_0" : a_options.device;
    b_options.device = b_options.device.empty() ? "mlx5_1" : b_options.device;
    auto a = VerbsFabric::Create(a_options, model);
    auto b = VerbsFabric::Create(b_options, model);
    EXPECT_TRUE(a.ok()) << a.status();
    EXPECT_TRUE(b.ok()) << b.status();
    if (!a.ok() || !b.ok()) return;
    initiator = std::move(*a);
    target = std::move(*b);
    auto ep = fabric::ConnectDirect(*initiator, *target, from);
    EXPECT_TRUE(ep.ok()) << ep.status();
    if (ep.ok()) endpoint = std::move(*ep);
  }
  ~Pair() {
    if (endpoint) endpoint->Close();
  }
  // A new connection (after setting an immediate handler, which only later accepts see).
  void Reconnect() {
    endpoint->Close();
    auto ep = fabric::ConnectDirect(*initiator, *target);
    ASSERT_TRUE(ep.ok()) << ep.status();
    endpoint = std::move(*ep);
  }
  VerbsEndpoint& verbs_endpoint() { return dynamic_cast<VerbsEndpoint&>(*endpoint); }

  std::shared_ptr<VerbsModel> model;
  std::unique_ptr<VerbsFabric> initiator, target;
  std::shared_ptr<fabric::Endpoint> endpoint;
};

inline std::shared_ptr<VerbsModel> IbModel(uint32_t max_msg = 1u << 30,
                                           ibv_mtu mtu_b = IBV_MTU_4096) {
  auto a = model::InfinibandDevice("mlx5_0", 0x11);
  auto b = model::InfinibandDevice("mlx5_1", 0x22);
  a.ports[0].max_msg_sz = b.ports[0].max_msg_sz = max_msg;
  b.ports[0].active_mtu = mtu_b;
  return std::make_shared<VerbsModel>(std::vector<model::DeviceConfig>{a, b});
}

inline std::shared_ptr<VerbsModel> RoceModel() {
  return std::make_shared<VerbsModel>(std::vector<model::DeviceConfig>{
      model::RoceDevice("mlx5_0", "10.0.0.1"), model::RoceDevice("mlx5_1", "10.0.0.2")});
}

}  // namespace ferry::verbs
