// PeerDirectory through its public interface, against fake agents: each a gRPC server on
// 127.0.0.1 with a scripted Peer service in front of a real tcp fabric, so that Hello,
// Connect (the fabric's own handshake), ResolveBuffer and the endpoints it makes are real.

#include "server/peers/peer_directory.h"

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/unique_fd.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/fakes/fake_peer_service.h"
#include "tests/completion_waiter.h"
#include "transport/tcp/socket.h"
#include "transport/tcp/tcp_fabric.h"

namespace ferry::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using fake::FakePeerService;

constexpr uint64_t kLandingBytes = 4096;
// Long enough for a loaded machine, short enough that a hang fails the test, not ctest.
constexpr absl::Duration kPatience = absl::Seconds(10);

absl::Time Soon() { return absl::Now() + absl::Seconds(5); }

absl::StatusOr<std::unique_ptr<tcp::TcpFabric>> MakeFabric() {
  tcp::TcpOptions options;
  options.listen_address = "127.0.0.1:0";
  options.connections = 2;
  options.event_loops = 1;
  return tcp::TcpFabric::Create(options);
}

// A fake agent: a tcp fabric, a "landing" buffer exported on it, and the fake Peer service
// on 127.0.0.1:`port` (0: any free port).
class FakeAgent {
 public:
  static absl::StatusOr<std::unique_ptr<FakeAgent>> Start(const std::string& node,
                                                          uint64_t incarnation, int port = 0) {
    auto agent = std::unique_ptr<FakeAgent>(new FakeAgent());
    auto fabric = MakeFabric();
    if (!fabric.ok()) return fabric.status();
    agent->fabric_ = *std::move(fabric);
    auto region = agent->fabric_->Register(agent->landing_.data(), agent->landing_.size(),
                                           fabric::kRemoteWrite);
    if (!region.ok()) return region.status();
    agent->region_ = *std::move(region);
    agent->service_ =
        std::make_unique<FakePeerService>(node, agent->fabric_.get(), incarnation);
    ferry::v1::ResolveBufferResponse landing;
    landing.set_size(kLandingBytes);
    landing.set_device("host");
    auto* key = landing.add_keys();
    key->set_provider("tcp");
    key->set_address(agent->region_->remote_address());
    key->set_key(agent->region_->key());
    agent->service_->AddBuffer("landing", landing);

    grpc::ServerBuilder builder;
    builder.AddListeningPort(absl::StrCat("127.0.0.1:", port), grpc::InsecureServerCredentials(),
                             &agent->port_);
    builder.RegisterService(agent->service_.get());
    agent->server_ = builder.BuildAndStart();
    if (!agent->server_ || agent->port_ == 0) {
      return absl::UnavailableError(absl::StrCat("cannot serve on 127.0.0.1:", port));
    }
    return agent;
  }

  ~FakeAgent() {
    // Calls in progress are cut at once: a stopping agent, not a slow one.
    server_->Shutdown(absl::ToChronoTime(absl::Now()));
    server_->Wait();
    region_.reset();
  }

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  int port() const { return port_; }
  FakePeerService& service() { return *service_; }
  const std::vector<uint8_t>& landing() const { return landing_; }

 private:
  FakeAgent() : landing_(kLandingBytes, 0) {}

  std::vector<uint8_t> landing_;
  std::unique_ptr<tcp::TcpFabric> fabric_;
  std::unique_ptr<fabric::MemoryRegion> region_;
  std::unique_ptr<FakePeerService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

class PeerDirectoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto local = MakeFabric();
    ASSERT_TRUE(local.ok()) << local.status();
    local_ = *std::move(local);
    auto self = FakeAgent::Start("node-a", 0xa1);
    ASSERT_TRUE(self.ok()) << self.status();
    self_ = *std::move(self);
    auto b = FakeAgent::Start("node-b", 0xb1);
    ASSERT_TRUE(b.ok()) << b.status();
    b_ = *std::move(b);
    dir_ = std::make_unique<PeerDirectory>("node-a", 0xa1, self_->address(),
                                           std::map<std::string, std::string>{
                                               {"node-b", b_->address()}},
                                           std::vector<fabric::Fabric*>{local_.get()});
  }

  void TearDown() override {
    // Endpoints go before the fabric that made them.
    if (dir_) dir_->CloseAll();
    dir_.reset();
  }

  // Writes a pattern through `endpoint` into the buffer `remote` names (its tcp key, as the
  // engine would use it) and returns the completion's status.
  absl::Status WriteThrough(fabric::Endpoint& endpoint, const RemoteBuffer& remote,
                            uint8_t pattern) {
    std::vector<uint8_t> src(kLandingBytes, pattern);
    auto region = local_->Register(src.data(), src.size(), fabric::kLocal);
    if (!region.ok()) return region.status();
    const fabric::RemoteSlice* key = remote.KeyFor("tcp");
    if (key == nullptr) return absl::NotFoundError("no tcp key");
    fabric::CompletionWaiter waiter;
    absl::Status posted =
        endpoint.PostWrite({region->get(), 0, src.size()}, *key, waiter.Callback());
    if (!posted.ok()) return posted;
    return waiter.Wait();
  }

  static bool AllEqual(const std::vector<uint8_t>& bytes, uint8_t value) {
    for (uint8_t b : bytes) {
      if (b != value) return false;
    }
    return true;
  }

  // Resolve, retried while the peer's channel is still reconnecting (after a restart).
  absl::StatusOr<RemoteBuffer> ResolveWhenBack(const std::string& node, const std::string& name) {
    absl::Time give_up = absl::Now() + kPatience;
    while (true) {
      auto r = dir_->Resolve(node, name, absl::Now() + absl::Seconds(1));
      if (r.ok() || !absl::IsUnavailable(r.status()) || absl::Now() > give_up) return r;
      absl::SleepFor(absl::Milliseconds(20));
    }
  }

  std::unique_ptr<tcp::TcpFabric> local_;
  std::unique_ptr<FakeAgent> self_;
  std::unique_ptr<FakeAgent> b_;
  std::unique_ptr<PeerDirectory> dir_;
};

TEST_F(PeerDirectoryTest, UnknownNodeIsNotFoundAndNamed) {
  EXPECT_FALSE(dir_->Known("node-z"));
  EXPECT_TRUE(dir_->Known("node-b"));
  EXPECT_TRUE(dir_->Known("node-a"));  // the self entry
  EXPECT_THAT(dir_->Names(), ElementsAre("node-b"));
  EXPECT_EQ(dir_->self(), "node-a");

  auto resolved = dir_->Resolve("node-z", "landing", Soon());
  EXPECT_EQ(resolved.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(resolved.status().message(), HasSubstr("'node-z'"));
  EXPECT_THAT(resolved.status().message(), HasSubstr("node-a, node-b"));
  auto endpoint = dir_->Endpoint("node-z", 0, Soon());
  EXPECT_EQ(endpoint.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(endpoint.status().message(), HasSubstr("'node-z'"));
  auto stub = dir_->Stub("node-z");
  EXPECT_EQ(stub.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(stub.status().message(), HasSubstr("'node-z'"));
  auto channel = dir_->Channel("node-z");
  EXPECT_EQ(channel.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(channel.status().message(), HasSubstr("'node-z'"));
  // Nothing went out for it.
  EXPECT_EQ(b_->service().hellos() + b_->service().resolves(), 0);
}

TEST_F(PeerDirectoryTest, ResolveMapsEveryField) {
  ferry::v1::ResolveBufferResponse canned;
  canned.set_size(1 << 20);
  canned.set_device("cuda:1");
  auto* tcp = canned.add_keys();
  tcp->set_provider("tcp");
  tcp->set_address(0x1000);
  tcp->set_key(7);
  auto* verbs = canned.add_keys();
  verbs->set_provider("verbs");
  verbs->set_address(0x7f0000002000);
  verbs->set_key(0x12345);
  verbs->set_nic("mlx5_1");
  canned.set_mode("staged");
  canned.set_reason("GPU and NIC across the socket interconnect (SYS)");
  canned.set_nic("mlx5_1");
  canned.set_path("SYS");
  canned.set_backend("sim");
  b_->service().AddBuffer("kv", canned);
  b_->service().set_incarnation(0xb7);

  auto r = dir_->Resolve("node-b", "kv", Soon());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->node, "node-b");
  EXPECT_EQ(r->name, "kv");
  EXPECT_EQ(r->size, 1u << 20);
  EXPECT_EQ(r->device, "cuda:1");
  ASSERT_EQ(r->keys.size(), 2u);
  ASSERT_NE(r->KeyFor("tcp"), nullptr);
  EXPECT_EQ(r->KeyFor("tcp")->address, 0x1000u);
  EXPECT_EQ(r->KeyFor("tcp")->key, 7u);
  ASSERT_NE(r->KeyFor("verbs"), nullptr);
  EXPECT_EQ(r->KeyFor("verbs")->address, 0x7f0000002000u);
  EXPECT_EQ(r->KeyFor("verbs")->key, 0x12345u);
  EXPECT_EQ(r->keys[1].rail, (fabric::RailId{"verbs", "mlx5_1"}));
  EXPECT_EQ(r->mode, LegMode::kStaged);
  EXPECT_EQ(r->reason, "GPU and NIC across the socket interconnect (SYS)");
  EXPECT_EQ(r->nic, "mlx5_1");
  EXPECT_EQ(r->path, "SYS");
  EXPECT_EQ(r->backend, "sim");
  EXPECT_EQ(r->incarnation, 0xb7u);
  // The peer learns who asks (it decides exports by it).
  EXPECT_EQ(b_->service().last_from(), "node-a");

  // A peer that says nothing about the mode takes writes into host memory.
  ferry::v1::ResolveBufferResponse plain;
  plain.set_size(64);
  b_->service().AddBuffer("plain", plain);
  auto p = dir_->Resolve("node-b", "plain", Soon());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->mode, LegMode::kHost);

  // A mode word we do not know is refused as unavailable, saying so, never guessed.
  ferry::v1::ResolveBufferResponse odd;
  odd.set_size(64);
  odd.set_mode("teleport");
  b_->service().AddBuffer("odd", odd);
  auto o = dir_->Resolve("node-b", "odd", Soon());
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->mode, LegMode::kUnavailable);
  EXPECT_NE(o->reason.find("unknown mode"), std::string::npos) << o->reason;
  EXPECT_TRUE(p->keys.empty());
  EXPECT_EQ(p->size, 64u);
}

// Kept says whether ResolveKept would answer without asking the peer (a TransferStream
// starts such requests on gRPC's thread): only for a revocable answer kept, until revoked.
TEST_F(PeerDirectoryTest, KeptSaysWhetherAResolveWouldAskThePeer) {
  ferry::v1::ResolveBufferResponse revocable;
  revocable.set_size(4096);
  revocable.set_revocable(true);
  b_->service().AddBuffer("kept", revocable);
  ferry::v1::ResolveBufferResponse once;
  once.set_size(4096);
  b_->service().AddBuffer("once", once);

  EXPECT_FALSE(dir_->Kept("node-b", "kept"));
  ASSERT_TRUE(dir_->ResolveKept("node-b", "kept", Soon()).ok());
  EXPECT_TRUE(dir_->Kept("node-b", "kept"));
  const int asked = b_->service().resolves();
  ASSERT_TRUE(dir_->ResolveKept("node-b", "kept", Soon()).ok());
  EXPECT_EQ(b_->service().resolves(), asked) << "Kept said true, yet the peer was asked";

  ASSERT_TRUE(dir_->ResolveKept("node-b", "once", Soon()).ok());
  EXPECT_FALSE(dir_->Kept("node-b", "once")) << "an answer the peer does not revoke is not kept";
  EXPECT_FALSE(dir_->Kept("node-z", "kept"));

  dir_->kept_answers().Revoke("node-b", {"kept"}, /*all=*/false);
  EXPECT_FALSE(dir_->Kept("node-b", "kept"));
}

// RailsFresh says whether Rails would answer without a Hello and no endpoint would reconnect
// (Transfer calls start such requests on gRPC's thread): not before the first Hello, then
// until the Hello's answer is kHelloTtl old or an endpoint breaks.
TEST_F(PeerDirectoryTest, RailsFreshSaysWhetherRailsWouldAskThePeer) {
  EXPECT_FALSE(dir_->RailsFresh("node-b"));
  EXPECT_FALSE(dir_->RailsFresh("node-z"));
  auto endpoint = dir_->Endpoint("node-b", 0, Soon());
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const absl::Time said = absl::Now();
  EXPECT_TRUE(dir_->RailsFresh("node-b"));
  ASSERT_TRUE(dir_->Rails("node-b", 0, Soon()).ok());
  EXPECT_EQ(b_->service().hellos(), 1) << "RailsFresh said true, yet the peer was asked";

  endpoint->endpoint->Close();
  EXPECT_FALSE(dir_->RailsFresh("node-b")) << "a broken endpoint reconnects: a blocking call";
  ASSERT_TRUE(dir_->Endpoint("node-b", 0, Soon()).ok());
  EXPECT_TRUE(dir_->RailsFresh("node-b"));

  absl::SleepFor(said + PeerDirectory::kHelloTtl - absl::Now());
  EXPECT_FALSE(dir_->RailsFresh("node-b"));
  ASSERT_TRUE(dir_->Rails("node-b", 0, Soon()).ok());
  EXPECT_EQ(b_->service().hellos(), 2);
  EXPECT_TRUE(dir_->RailsFresh("node-b"));
}

TEST_F(PeerDirectoryTest, PeerErrorsPassThrough) {
  auto missing = dir_->Resolve("node-b", "missing", Soon());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("'missing'"));
  EXPECT_THAT(missing.status().message(), HasSubstr("node-b"));
  // Other codes keep their code and say which call failed where.
  auto secret = dir_->Resolve("node-b", "secret", Soon());
  EXPECT_EQ(secret.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(secret.status().message(), HasSubstr("asking node-b for buffer 'secret': "));
  EXPECT_THAT(secret.status().message(), Not(HasSubstr("ResolveBuffer")));
  EXPECT_THAT(secret.status().message(), HasSubstr("not exported to you"));
  EXPECT_EQ(b_->service().resolves(), 2);
}

TEST_F(PeerDirectoryTest, SilentPeerIsUnavailableWithinTheDeadline) {
  // A listener that never accepts: connections open, but no gRPC answer ever comes.
  uint16_t port = 0;
  auto silent = tcp::ListenTcp("127.0.0.1:0", &port);
  ASSERT_TRUE(silent.ok()) << silent.status();
  // And a port where nothing listens at all.
  uint16_t closed_port = 0;
  {
    auto closed = tcp::ListenTcp("127.0.0.1:0", &closed_port);
    ASSERT_TRUE(closed.ok()) << closed.status();
  }
  dir_->Update({{"node-b", b_->address()},
                {"node-s", absl::StrCat("127.0.0.1:", port)},
                {"node-c", absl::StrCat("127.0.0.1:", closed_port)}});

  for (const std::string node : {"node-s", "node-c"}) {
    SCOPED_TRACE(node);
    const absl::Duration deadline = absl::Milliseconds(300);
    absl::Time start = absl::Now();
    auto r = dir_->Resolve(node, "landing", start + deadline);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr(node));
    EXPECT_LT(absl::Now() - start, deadline + absl::Seconds(2));

    start = absl::Now();
    auto e = dir_->Endpoint(node, 0, start + deadline);
    EXPECT_EQ(e.status().code(), absl::StatusCode::kUnavailable) << e.status();
    EXPECT_THAT(e.status().message(), HasSubstr("did not answer Hello"));
    EXPECT_LT(absl::Now() - start, deadline + absl::Seconds(2));
  }
  // The others are not held up by it.
  EXPECT_TRUE(dir_->Resolve("node-b", "landing", Soon()).ok());
}

TEST_F(PeerDirectoryTest, EndpointIsReusedWhileHealthy) {
  auto remote = dir_->Resolve("node-b", "landing", Soon());
  ASSERT_TRUE(remote.ok()) << remote.status();
  auto first = dir_->Endpoint("node-b", 0, Soon());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->rail, (fabric::RailId{"tcp", ""}));
  ASSERT_NE(first->endpoint, nullptr);
  // Hello carried our identity and version.
  EXPECT_EQ(b_->service().last_from(), "node-a");
  EXPECT_EQ(b_->service().last_hello_version(), kPeerProtocolVersion);

  auto again = dir_->Endpoint("node-b", 0, Soon());
  auto same_life = dir_->Endpoint("node-b", remote->incarnation, Soon());
  ASSERT_TRUE(again.ok() && same_life.ok());
  EXPECT_EQ(again->endpoint.get(), first->endpoint.get());
  EXPECT_EQ(same_life->endpoint.get(), first->endpoint.get());
  EXPECT_EQ(b_->service().hellos(), 1);
  EXPECT_EQ(b_->service().connects(), 1);

  // And it is a real connection into the peer's memory.
  ASSERT_TRUE(WriteThrough(*first->endpoint, *remote, 0x5a).ok());
  EXPECT_TRUE(AllEqual(b_->landing(), 0x5a));
}

TEST_F(PeerDirectoryTest, EndpointReconnectsForANewIncarnation) {
  auto first = dir_->Endpoint("node-b", 0, Soon());
  ASSERT_TRUE(first.ok()) << first.status();
  b_->service().set_incarnation(0xb2);
  // 0 accepts any incarnation: nothing to learn, nothing redone.
  auto any = dir_->Endpoint("node-b", 0, Soon());
  ASSERT_TRUE(any.ok());
  EXPECT_EQ(any->endpoint.get(), first->endpoint.get());
  EXPECT_EQ(b_->service().hellos(), 1);

  // A buffer resolved in the peer's new life needs an endpoint from that life.
  auto fresh = dir_->Endpoint("node-b", 0xb2, Soon());
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_NE(fresh->endpoint.get(), first->endpoint.get());
  EXPECT_TRUE(first->endpoint->broken());  // the old one was closed
  EXPECT_EQ(b_->service().hellos(), 2);
  EXPECT_EQ(b_->service().connects(), 2);
  auto kept = dir_->Endpoint("node-b", 0xb2, Soon());
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->endpoint.get(), fresh->endpoint.get());
  EXPECT_EQ(b_->service().connects(), 2);
}

TEST_F(PeerDirectoryTest, AHealthAnswerFromANewLifeClosesTheOldEndpointsAtOnce) {
  // issue 43 item 5: node-b SIGKILLed and back within 6 s, its new incarnation already in
  // node-a's peer list, yet node-a's put hung on the old QPs until its deadline.
  auto remote = dir_->Resolve("node-b", "landing", Soon());
  ASSERT_TRUE(remote.ok()) << remote.status();
  auto first = dir_->Endpoint("node-b", remote->incarnation, Soon());
  ASSERT_TRUE(first.ok()) << first.status();
  dir_->Answered("node-b", remote->incarnation);  // the same life: nothing changes
  EXPECT_FALSE(first->endpoint->broken());
  dir_->Answered("node-b", 0xb9);
  EXPECT_TRUE(first->endpoint->broken());
  // An op posted on it now fails at once rather than waiting for anything.
  EXPECT_FALSE(WriteThrough(*first->endpoint, *remote, 0x11).ok());
  b_->service().set_incarnation(0xb9);
  auto second = dir_->Endpoint("node-b", 0xb9, Soon());
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(second->endpoint.get(), first->endpoint.get());
  EXPECT_FALSE(second->endpoint->broken());
}

TEST_F(PeerDirectoryTest, EndpointReconnectsWhenItBroke) {
  auto first = dir_->Endpoint("node-b", 0, Soon());
  ASSERT_TRUE(first.ok()) << first.status();
  first->endpoint->Close();
  ASSERT_TRUE(first->endpoint->broken());
  auto second = dir_->Endpoint("node-b", 0, Soon());
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(second->endpoint.get(), first->endpoint.get());
  EXPECT_FALSE(second->endpoint->broken());
  EXPECT_EQ(b_->service().connects(), 2);
}

TEST_F(PeerDirectoryTest, EndpointReconnectsAfterThePeerRestarted) {
  auto before = dir_->Resolve("node-b", "landing", Soon());
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(before->incarnation, 0xb1u);
  auto first = dir_->Endpoint("node-b", before->incarnation, Soon());
  ASSERT_TRUE(first.ok()) << first.status();

  // The agent restarts on the same address, with a new fabric and a new incarnation.
  const int port = b_->port();
  b_.reset();
  auto restarted = FakeAgent::Start("node-b", 0xb2, port);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  b_ = *std::move(restarted);

  auto after = ResolveWhenBack("node-b", "landing");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->incarnation, 0xb2u);
  auto second = dir_->Endpoint("node-b", after->incarnation, Soon());
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(second->endpoint.get(), first->endpoint.get());
  EXPECT_EQ(b_->service().connects(), 1);
  // The new endpoint reaches the new life's memory with the new life's key.
  ASSERT_TRUE(WriteThrough(*second->endpoint, *after, 0x3c).ok());
  EXPECT_TRUE(AllEqual(b_->landing(), 0x3c));
}

TEST_F(PeerDirectoryTest, HelloMismatchesAreRefused) {
  b_->service().set_protocol_version(kPeerProtocolVersion + 1);
  auto e = dir_->Endpoint("node-b", 0, Soon());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition) << e.status();
  EXPECT_THAT(e.status().message(),
              HasSubstr(absl::StrCat("speaks protocol ", kPeerProtocolVersion + 1, ", we speak ",
                                     kPeerProtocolVersion)));
  EXPECT_EQ(b_->service().connects(), 0);  // refused before any provider handshake

  // A peer that refuses our version says why.
  b_->service().set_protocol_version(kPeerProtocolVersion);
  b_->service().set_refuse_hello(true);
  e = dir_->Endpoint("node-b", 0, Soon());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition) << e.status();
  EXPECT_THAT(e.status().message(), HasSubstr("refused Hello"));
  EXPECT_THAT(e.status().message(), HasSubstr("not ours"));
  EXPECT_EQ(b_->service().connects(), 0);

  // An agent at a peer's address that is another node.
  dir_->Update({{"node-b", b_->address()}, {"node-x", b_->address()}});
  b_->service().set_refuse_hello(false);
  e = dir_->Endpoint("node-x", 0, Soon());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition) << e.status();
  EXPECT_THAT(e.status().message(), HasSubstr("calls itself 'node-b'"));
  EXPECT_EQ(b_->service().connects(), 0);

  // Once the peer agrees, nothing of the refusals is left over.
  e = dir_->Endpoint("node-b", 0, Soon());
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(b_->service().connects(), 1);
}

TEST_F(PeerDirectoryTest, UpdateAddsAPeer) {
  auto c = FakeAgent::Start("node-c", 0xc1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(dir_->Known("node-c"));
  auto changes = dir_->Update({{"node-b", b_->address()}, {"node-c", (*c)->address()}});
  EXPECT_THAT(changes, ElementsAre(absl::StrCat("peer node-c added at ", (*c)->address())));
  EXPECT_TRUE(dir_->Known("node-c"));
  EXPECT_THAT(dir_->Names(), ElementsAre("node-b", "node-c"));
  EXPECT_TRUE(dir_->Channel("node-c").ok());

  auto remote = dir_->Resolve("node-c", "landing", Soon());
  ASSERT_TRUE(remote.ok()) << remote.status();
  EXPECT_EQ(remote->incarnation, 0xc1u);
  auto e = dir_->Endpoint("node-c", remote->incarnation, Soon());
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(WriteThrough(*e->endpoint, *remote, 0x77).ok());
  EXPECT_TRUE(AllEqual((*c)->landing(), 0x77));
  // The same peers again change nothing.
  EXPECT_THAT(dir_->Update({{"node-b", b_->address()}, {"node-c", (*c)->address()}}), IsEmpty());
  dir_->CloseAll();  // before node-c's fabric goes
}

TEST_F(PeerDirectoryTest, UpdateRemovesAPeer) {
  auto remote = dir_->Resolve("node-b", "landing", Soon());
  ASSERT_TRUE(remote.ok()) << remote.status();
  auto e = dir_->Endpoint("node-b", 0, Soon());
  ASSERT_TRUE(e.ok()) << e.status();
  auto stub = dir_->Stub("node-b");
  auto channel = dir_->Channel("node-b");
  ASSERT_TRUE(stub.ok() && channel.ok());

  EXPECT_THAT(dir_->Update({}), ElementsAre("peer node-b removed"));
  // Its endpoint was closed: transfers to it fail rather than go on.
  EXPECT_TRUE(e->endpoint->broken());
  EXPECT_EQ(WriteThrough(*e->endpoint, *remote, 1).code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(dir_->Known("node-b"));
  EXPECT_THAT(dir_->Names(), IsEmpty());
  EXPECT_EQ(dir_->Resolve("node-b", "landing", Soon()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(dir_->Endpoint("node-b", 0, Soon()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(dir_->Stub("node-b").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(dir_->Channel("node-b").status().code(), absl::StatusCode::kNotFound);

  // What callers took before the removal still works for the calls that use it.
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(Soon()));
    ferry::v1::ResolveBufferRequest req;
    req.set_name("landing");
    ferry::v1::ResolveBufferResponse resp;
    grpc::Status s = (*stub)->ResolveBuffer(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.size(), kLandingBytes);
  }
  {
    // As the tensor service uses it: its own stub on the directory's channel.
    auto on_channel = ferry::v1::Peer::NewStub(*channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(Soon()));
    ferry::v1::HelloRequest req;
    req.set_node("node-a");
    req.set_protocol_version(kPeerProtocolVersion);
    ferry::v1::HelloResponse resp;
    grpc::Status s = on_channel->Hello(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.node(), "node-b");
  }
  // The self entry is never removed.
  EXPECT_TRUE(dir_->Known("node-a"));
  EXPECT_TRUE(dir_->Resolve("node-a", "landing", Soon()).ok());
}

TEST_F(PeerDirectoryTest, UpdateMovesAPeer) {
  auto moved = FakeAgent::Start("node-b", 0xb9);
  ASSERT_TRUE(moved.ok()) << moved.status();
  auto e = dir_->Endpoint("node-b", 0, Soon());
  ASSERT_TRUE(e.ok()) << e.status();
  auto old_stub = dir_->Stub("node-b");
  auto old_channel = dir_->Channel("node-b");
  auto same_channel = dir_->Channel("node-b");
  ASSERT_TRUE(old_stub.ok() && old_channel.ok() && same_channel.ok());
  EXPECT_EQ(old_channel->get(), same_channel->get());  // one channel per peer

  auto changes = dir_->Update({{"node-b", (*moved)->address()}});
  EXPECT_THAT(changes, ElementsAre(absl::StrCat("peer node-b moved from ", b_->address(), " to ",
                                                (*moved)->address())));
  EXPECT_TRUE(e->endpoint->broken());
  auto new_channel = dir_->Channel("node-b");
  ASSERT_TRUE(new_channel.ok());
  EXPECT_NE(new_channel->get(), old_channel->get());

  auto remote = dir_->Resolve("node-b", "landing", Soon());
  ASSERT_TRUE(remote.ok()) << remote.status();
  EXPECT_EQ(remote->incarnation, 0xb9u);  // answered at the new address
  auto again = dir_->Endpoint("node-b", 0, Soon());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NE(again->endpoint.get(), e->endpoint.get());
  EXPECT_EQ((*moved)->service().connects(), 1);
  ASSERT_TRUE(WriteThrough(*again->endpoint, *remote, 0x42).ok());
  EXPECT_TRUE(AllEqual((*moved)->landing(), 0x42));
  EXPECT_TRUE(AllEqual(b_->landing(), 0));

  // The stub taken before the move still reaches the old address.
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(Soon()));
  ferry::v1::HelloRequest hello;
  hello.set_node("node-a");
  hello.set_protocol_version(kPeerProtocolVersion);
  ferry::v1::HelloResponse welcome;
  grpc::Status s = (*old_stub)->Hello(&ctx, hello, &welcome);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(welcome.incarnation(), 0xb1u);
  dir_->CloseAll();  // before the moved agent's fabric goes
}

TEST_F(PeerDirectoryTest, SelfEntryResolvesThroughSelfAddress) {
  auto remote = dir_->Resolve("node-a", "landing", Soon());
  ASSERT_TRUE(remote.ok()) << remote.status();
  EXPECT_EQ(remote->node, "node-a");
  EXPECT_EQ(remote->incarnation, 0xa1u);
  EXPECT_EQ(self_->service().resolves(), 1);
  EXPECT_EQ(b_->service().resolves(), 0);
  auto e = dir_->Endpoint("node-a", remote->incarnation, Soon());
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(WriteThrough(*e->endpoint, *remote, 0x99).ok());
  EXPECT_TRUE(AllEqual(self_->landing(), 0x99));
  EXPECT_TRUE(dir_->Channel("node-a").ok());

  // A reload that names this node at another address does not move it.
  EXPECT_THAT(dir_->Update({{"node-a", "127.0.0.1:1"}, {"node-b", b_->address()}}), IsEmpty());
  auto again = dir_->Endpoint("node-a", 0, Soon());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->endpoint.get(), e->endpoint.get());
  EXPECT_TRUE(dir_->Resolve("node-a", "landing", Soon()).ok());
}

// Peers from etcd and from AddPeer live beside the config file's: a reload replaces only the
// file's, and each source's entry comes and goes on its own.
TEST_F(PeerDirectoryTest, DiscoveredPeersSurviveAConfigReload) {
  auto c = FakeAgent::Start("node-c", 0xc1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(dir_->Upsert("node-c", (*c)->address(), PeerSource::kEtcd),
            absl::StrCat("peer node-c added at ", (*c)->address()));
  EXPECT_EQ(dir_->Upsert("node-c", (*c)->address(), PeerSource::kEtcd), "");  // no change
  EXPECT_EQ(dir_->SourceOf("node-c"), PeerSource::kEtcd);
  EXPECT_EQ(dir_->SourceOf("node-b"), PeerSource::kConfig);
  EXPECT_FALSE(dir_->SourceOf("node-a").has_value());  // this node
  EXPECT_FALSE(dir_->SourceOf("node-z").has_value());
  EXPECT_THAT(dir_->Update({{"node-b", b_->address()}}), IsEmpty());
  EXPECT_THAT(dir_->Update({}), ElementsAre("peer node-b removed"));
  EXPECT_THAT(dir_->Names(), ElementsAre("node-c"));
  auto remote = dir_->Resolve("node-c", "landing", Soon());
  ASSERT_TRUE(remote.ok()) << remote.status();
  EXPECT_EQ(remote->incarnation, 0xc1u);
  EXPECT_EQ(dir_->Remove("node-c", PeerSource::kConfig), "");  // the file never named it
  EXPECT_EQ(dir_->Remove("node-c", PeerSource::kEtcd), "peer node-c removed");
  EXPECT_FALSE(dir_->Known("node-c"));
  // This node itself is no peer to add or remove.
  EXPECT_EQ(dir_->Upsert("node-a", "127.0.0.1:1", PeerSource::kRuntime), "");
  EXPECT_EQ(dir_->Remove("node-a", PeerSource::kConfig), "");
  EXPECT_TRUE(dir_->Known("node-a"));
}

TEST_F(PeerDirectoryTest, EtcdNeverRemovesAConfiguredPeer) {
  EXPECT_EQ(dir_->Upsert("node-b", b_->address(), PeerSource::kEtcd), "");
  EXPECT_THAT(dir_->SourcesOf("node-b"), ElementsAre(PeerSource::kConfig, PeerSource::kEtcd));
  auto e = dir_->Endpoint("node-b", 0, Soon());
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(dir_->Remove("node-b", PeerSource::kEtcd),
            absl::StrCat("peer node-b kept: config still names it at ", b_->address()));
  EXPECT_TRUE(dir_->Known("node-b"));
  EXPECT_EQ(dir_->SourceOf("node-b"), PeerSource::kConfig);
  EXPECT_FALSE(e->endpoint->broken());  // nothing moved, nothing closed
  // Dropped from the file while etcd names it: etcd keeps it.
  EXPECT_EQ(dir_->Upsert("node-b", b_->address(), PeerSource::kEtcd), "");
  EXPECT_THAT(dir_->Update({}),
              ElementsAre(absl::StrCat("peer node-b kept: etcd still names it at ",
                                       b_->address())));
  EXPECT_EQ(dir_->SourceOf("node-b"), PeerSource::kEtcd);
  EXPECT_FALSE(e->endpoint->broken());
}

TEST_F(PeerDirectoryTest, RuntimeAddressWinsUntilRemoved) {
  auto moved = FakeAgent::Start("node-b", 0xb9);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(dir_->Upsert("node-b", (*moved)->address(), PeerSource::kRuntime),
            absl::StrCat("peer node-b moved from ", b_->address(), " to ", (*moved)->address()));
  EXPECT_EQ(dir_->SourceOf("node-b"), PeerSource::kRuntime);
  EXPECT_EQ(dir_->AddressOf("node-b"), (*moved)->address());
  auto remote = dir_->Resolve("node-b", "landing", Soon());
  ASSERT_TRUE(remote.ok()) << remote.status();
  EXPECT_EQ(remote->incarnation, 0xb9u);
  // A reload naming the file's address changes nothing: the run-time word stands.
  EXPECT_THAT(dir_->Update({{"node-b", b_->address()}}), IsEmpty());
  EXPECT_EQ(dir_->AddressOf("node-b"), (*moved)->address());
  EXPECT_EQ(dir_->Remove("node-b", PeerSource::kRuntime),
            absl::StrCat("peer node-b moved from ", (*moved)->address(), " to ", b_->address()));
  EXPECT_EQ(dir_->SourceOf("node-b"), PeerSource::kConfig);
  auto back = dir_->Resolve("node-b", "landing", Soon());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->incarnation, 0xb1u);
  dir_->CloseAll();  // before the moved agent's fabric goes
}

}  // namespace
}  // namespace ferry::server
