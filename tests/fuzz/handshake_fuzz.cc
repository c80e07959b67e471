// Fuzzes the peer handshake: what another agent sends in the Peer Connect call and what it
// answers. The first byte picks the side, the rest is the message:
//   0: a ferry.v1.ConnectRequest (protobuf, as PeerService::Connect receives it); its
//      `request` bytes go to a verbs fabric's AcceptConnect (on the software verbs model:
//      ParseQpAddress, reaping of retired / restarted QPs, a target QP brought up) and a tcp
//      fabric's AcceptConnect, with its node and incarnation as the PeerInstance;
//   1: raw bytes as the target's reply to a verbs initiator (PendingConnection::Finish, the
//      reply ParseQpAddress reads and the initiator QP is wired to);
//   2: raw bytes as a verbs QP address for ParseQpAddress alone, which must round-trip:
//      whatever it accepts, SerializeQpAddress writes back byte for byte.
// Invariants besides no crash, leak or UB: an accepted connection answers a reply that
// parses, and every QP a fabric made is gone when the fabric is.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "ferry/v1/peer.pb.h"
#include "google/protobuf/stubs/logging.h"
#include "spdlog/spdlog.h"
#include "tests/verbs_model/verbs_model.h"
#include "transport/tcp/tcp_fabric.h"
#include "transport/verbs/handshake.h"
#include "transport/verbs/verbs_fabric.h"

namespace {

using ferry::verbs::VerbsFabric;

[[noreturn]] void Fail(const char* what) {
  fprintf(stderr, "handshake_fuzz: %s\n", what);
  abort();
}

std::shared_ptr<ferry::verbs::model::VerbsModel> Model() {
  namespace model = ferry::verbs::model;
  return std::make_shared<model::VerbsModel>(std::vector<model::DeviceConfig>{
      model::InfinibandDevice("mlx5_0", 0x11), model::InfinibandDevice("mlx5_1", 0x22)});
}

std::unique_ptr<VerbsFabric> Verbs(std::shared_ptr<ferry::verbs::model::VerbsModel> m,
                                   const char* device) {
  ferry::verbs::VerbsOptions options;
  options.device = device;
  auto f = VerbsFabric::Create(options, std::move(m));
  if (!f.ok()) Fail("cannot open a verbs fabric on the model");
  return std::move(*f);
}

ferry::tcp::TcpFabric& Tcp() {
  static ferry::tcp::TcpFabric* tcp = [] {
    auto f = ferry::tcp::TcpFabric::Create(ferry::tcp::TcpOptions{});
    if (!f.ok()) Fail("cannot start a tcp fabric");
    return f->release();
  }();
  return *tcp;
}

void Accept(const std::string& message) {
  ferry::v1::ConnectRequest req;
  if (!req.ParseFromString(message)) return;
  const ferry::fabric::PeerInstance from{req.node(), req.incarnation()};
  (void)Tcp().AcceptConnect(req.request(), from);
  auto model = Model();
  auto target = Verbs(model, "mlx5_1");
  // Twice: the second accept runs the reaping of what the first one left.
  for (int i = 0; i < 2; ++i) {
    auto reply = target->AcceptConnect(req.request(), from);
    if (reply.ok() && !ferry::verbs::ParseQpAddress(*reply).ok()) {
      Fail("AcceptConnect answered a reply that does not parse");
    }
  }
}

void Finish(const std::string& reply) {
  auto model = Model();
  auto initiator = Verbs(model, "mlx5_0");
  auto target = Verbs(model, "mlx5_1");
  auto pending = initiator->BeginConnect(target->address());
  if (!pending.ok()) Fail("BeginConnect failed on the model");
  auto endpoint = (*pending)->Finish(reply);
  if (endpoint.ok()) (*endpoint)->Close();
}

void RoundTrip(const std::string& bytes) {
  auto parsed = ferry::verbs::ParseQpAddress(bytes);
  if (parsed.ok() && ferry::verbs::SerializeQpAddress(*parsed) != bytes) {
    Fail("ParseQpAddress accepted bytes that SerializeQpAddress does not write back");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = [] {
    spdlog::set_level(spdlog::level::off);
    // Protobuf logs every string field with invalid UTF-8; the parse failing is the point.
    google::protobuf::SetLogHandler(nullptr);
    return true;
  }();
  (void)quiet;
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0: Accept(rest); break;
    case 1: Finish(rest); break;
    case 2: RoundTrip(rest); break;
  }
  return 0;
}
