// Mutual TLS on the Peer API with real agents (issue 15): who may call, and that the sender
// of a peer message is the node its certificate names. Certificates are made at test time
// (client/dev_pki.h, the openssl command); none are committed.

#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/agent_process.h"
#include "client/dev_pki.h"
#include "client/ferry_client.h"
#include "client/tensor_client.h"
#include "ferry/v1/peer.grpc.pb.h"
#include "ferry/v1/tensor.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/peers/protocol.h"
#include "tests/agent_pair.h"
#include "tests/peer_channel.h"
#include "tests/text_file.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = 1 << 20;

grpc::Status CallHello(grpc::Channel* channel, const std::string& node) {
  auto stub = ferry::v1::Peer::NewStub(std::shared_ptr<grpc::Channel>(channel, [](auto*) {}));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  ferry::v1::HelloRequest req;
  req.set_node(node);
  req.set_protocol_version(server::kPeerProtocolVersion);
  ferry::v1::HelloResponse resp;
  return stub->Hello(&ctx, req, &resp);
}

grpc::Status CallConnect(grpc::Channel* channel, const std::string& node) {
  auto stub = ferry::v1::Peer::NewStub(std::shared_ptr<grpc::Channel>(channel, [](auto*) {}));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  ferry::v1::ConnectRequest req;
  req.set_node(node);
  req.set_provider("tcp");
  req.set_incarnation(1);
  ferry::v1::ConnectResponse resp;
  return stub->Connect(&ctx, req, &resp);
}

grpc::Status CallResolve(grpc::Channel* channel, const std::string& from,
                         const std::string& name, ferry::v1::ResolveBufferResponse* resp) {
  auto stub = ferry::v1::Peer::NewStub(std::shared_ptr<grpc::Channel>(channel, [](auto*) {}));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  ferry::v1::ResolveBufferRequest req;
  req.set_name(name);
  req.set_from_node(from);
  return stub->ResolveBuffer(&ctx, req, resp);
}

// The notification a forged Notify would fake: "1 GiB of batch `name` has arrived".
grpc::Status CallNotify(grpc::Channel* channel, const std::string& from,
                        const std::string& name) {
  auto stub =
      ferry::v1::TensorPeer::NewStub(std::shared_ptr<grpc::Channel>(channel, [](auto*) {}));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  ferry::v1::Notification req;
  req.set_name(name);
  req.set_from_node(from);
  req.set_bytes(1ull << 30);
  req.set_blocks(1);
  ferry::v1::NotifyResponse resp;
  return stub->Notify(&ctx, req, &resp);
}

class AgentTrustTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The default pair: mutual TLS with certificates for node-a and node-b from one CA.
    ASSERT_TRUE(pair_.Start().ok());
    auto dst = pair_.cb->Alloc(kMiB, "secret");
    ASSERT_TRUE(dst.ok()) << dst.status();
    dst_ = std::move(*dst);
    std::memset(dst_->data(), 0x5a, kMiB);
    auto tensors = TensorClient::Connect(pair_.b->socket());
    ASSERT_TRUE(tensors.ok());
    tensors_b_ = std::move(*tensors);
  }

  // Every peer call a stranger would make, through `channel`, claiming to be node-a: each
  // must fail with `code`, and node-b's buffer must be untouched.
  void ExpectEveryCallRefused(grpc::Channel* channel, grpc::StatusCode code,
                              const std::string& why) {
    SCOPED_TRACE(why);
    EXPECT_EQ(CallHello(channel, "node-a").error_code(), code);
    EXPECT_EQ(CallConnect(channel, "node-a").error_code(), code);
    ferry::v1::ResolveBufferResponse resolved;
    grpc::Status resolve = CallResolve(channel, "node-a", "secret", &resolved);
    EXPECT_EQ(resolve.error_code(), code) << resolve.error_message();
    EXPECT_EQ(resolved.keys_size(), 0);
    EXPECT_EQ(CallNotify(channel, "node-a", "batch-1").error_code(), code);
    // The consumer waiting for node-a's batch is not fooled.
    CallOptions quick;
    quick.timeout = absl::Milliseconds(300);
    auto n = tensors_b_->WaitNotification("batch-1", "node-a", quick);
    EXPECT_FALSE(n.ok()) << "a forged notification was taken: " << n->DebugString();
    for (uint64_t i = 0; i < kMiB; ++i) {
      if (dst_->data()[i] != 0x5a) FAIL() << "byte " << i << " changed";
    }
  }

  Pair pair_;
  std::unique_ptr<Buffer> dst_;
  std::unique_ptr<TensorClient> tensors_b_;
};

TEST_F(AgentTrustTest, AgentsOfOneCaMoveDataOverMutualTls) {
  auto src = pair_.ca->Alloc(kMiB);
  ASSERT_TRUE(src.ok());
  Fill(**src, 7);
  auto result = pair_.ca->Run(
      {{ferry::v1::WRITE, (*src)->id(), 0, "node-b", "secret", 0, kMiB}}, absl::Seconds(30));
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->state(), ferry::v1::SUCCEEDED) << result->message();
  EXPECT_EQ(std::memcmp((*src)->data(), dst_->data(), kMiB), 0);
  EXPECT_THAT(ReadFile(pair_.b->log_path()), HasSubstr("(mtls)"));
}

TEST_F(AgentTrustTest, PlaintextIsRefused) {
  auto plain = PeerChannel(pair_.b->peer_address(), "node-b", {});
  ExpectEveryCallRefused(plain.get(), grpc::StatusCode::UNAVAILABLE, "plaintext");
}

TEST_F(AgentTrustTest, ACallerWithoutACertificateIsRefused) {
  PeerIdentity none = IdentityFor(pair_.dir, "node-a");
  none.cert_pem.clear();
  none.key_pem.clear();
  auto channel = PeerChannel(pair_.b->peer_address(), "node-b", none);
  ExpectEveryCallRefused(channel.get(), grpc::StatusCode::UNAVAILABLE, "no certificate");
}

TEST_F(AgentTrustTest, ACertificateFromAnotherCaIsRefused) {
  // A CA of its own that also names node-a: the name is right, the signer is not.
  std::string other = MakeTempDir();
  auto rogue = DevPki::Open(other, "rogue");
  ASSERT_TRUE(rogue.ok()) << rogue.status();
  PeerIdentity as = IdentityFor(other, "node-a");
  // It trusts node-b's CA, so the refusal is node-b's, not its own.
  as.ca_pem = ReadPemFile(absl::StrCat(pair_.dir, "/ca.pem"));
  auto channel = PeerChannel(pair_.b->peer_address(), "node-b", as);
  ExpectEveryCallRefused(channel.get(), grpc::StatusCode::UNAVAILABLE, "another CA");
  std::system(("rm -rf " + other).c_str());
}

TEST_F(AgentTrustTest, ACertificateForAnotherNodeCannotSpeakForNodeA) {
  // Signed by the right CA, for node-c: it may not say it is node-a anywhere.
  auto channel = PeerChannelAs(pair_.dir, pair_.b->peer_address(), "node-b", "node-c");
  ExpectEveryCallRefused(channel.get(), grpc::StatusCode::PERMISSION_DENIED, "node-c as node-a");
  grpc::Status hello = CallHello(channel.get(), "node-a");
  EXPECT_THAT(hello.error_message(), HasSubstr("certificate names node-c"));
}

TEST_F(AgentTrustTest, TheSenderOfANotificationIsTheCertificatesNode) {
  // node-c, saying nothing about who it is: its Notify is recorded as node-c's.
  auto channel = PeerChannelAs(pair_.dir, pair_.b->peer_address(), "node-b", "node-c");
  ASSERT_TRUE(CallNotify(channel.get(), "", "batch-2").ok());
  CallOptions quick;
  quick.timeout = absl::Milliseconds(300);
  EXPECT_FALSE(tensors_b_->WaitNotification("batch-2", "node-a", quick).ok());
  auto n = tensors_b_->WaitNotification("batch-2", "", quick);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->from_node(), "node-c");
}

TEST(AgentTrustServerTest, AnAgentWhoseCertificateNamesAnotherNodeIsNotThePeer) {
  // "node-b" runs with node-x's certificate (same CA): node-a will not take it for node-b,
  // and node-b's own calls to node-a are refused too.
  std::string dir = MakeTempDir();
  auto pki = DevPki::Open(dir);
  ASSERT_TRUE(pki.ok());
  auto x = pki->Issue("node-x");
  ASSERT_TRUE(x.ok());
  auto pa = PickFreePort(), pb = PickFreePort();
  ASSERT_TRUE(pa.ok() && pb.ok());
  auto a = AgentProcess::Start(
      {"node-a", dir, *pa, {{"node-b", absl::StrCat("127.0.0.1:", *pb)}}, ""});
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = AgentProcess::Start(
      {"node-b", dir, *pb, {{"node-a", absl::StrCat("127.0.0.1:", *pa)}},
       absl::StrCat("security:\n  mode: mtls\n  ca: ", pki->ca(), "\n  cert: ", x->cert,
                    "\n  key: ", x->key, "\n")});
  ASSERT_TRUE(b.ok()) << b.status();
  auto ca = Client::Connect((*a)->socket());
  auto cb = Client::Connect((*b)->socket());
  ASSERT_TRUE(ca.ok() && cb.ok());
  auto dst = (*cb)->Alloc(kMiB, "target");
  auto src = (*ca)->Alloc(kMiB);
  ASSERT_TRUE(dst.ok() && src.ok());
  std::memset((*dst)->data(), 0x11, kMiB);
  Fill(**src, 9);
  // Refused at Submit: resolving the target already needs the TLS handshake.
  auto result = (*ca)->Run(
      {{ferry::v1::WRITE, (*src)->id(), 0, "node-b", "target", 0, kMiB}}, absl::Seconds(10));
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("Peer name node-b is not in peer certificate"));
  EXPECT_EQ((*dst)->data()[0], 0x11);
  EXPECT_EQ((*dst)->data()[kMiB - 1], 0x11);
  // And node-b's Hello to node-a (its certificate says node-x) is refused by node-a.
  auto back = (*dst)->id();
  auto reverse = (*cb)->Run({{ferry::v1::WRITE, back, 0, "node-a", "anything", 0, 1}},
                            absl::Seconds(10));
  ASSERT_FALSE(reverse.ok());
  EXPECT_THAT(std::string(reverse.status().message()), HasSubstr("certificate names node-x"));
  dst->reset();
  src->reset();
  ca->reset();
  cb->reset();
  (*a)->Stop();
  (*b)->Stop();
  std::system(("rm -rf " + dir).c_str());
}

TEST(AgentTrustServerTest, InsecureAgentsWorkOnLoopbackAndMeetNoMtlsAgent) {
  std::string dir = MakeTempDir();
  auto pa = PickFreePort(), pb = PickFreePort(), pc = PickFreePort();
  ASSERT_TRUE(pa.ok() && pb.ok() && pc.ok());
  std::map<std::string, std::string> peers = {{"node-b", absl::StrCat("127.0.0.1:", *pb)},
                                              {"node-c", absl::StrCat("127.0.0.1:", *pc)}};
  AgentSpec sa{"node-a", dir, *pa, peers, ""};
  sa.security = "insecure";
  AgentSpec sb{"node-b", dir, *pb, {{"node-a", absl::StrCat("127.0.0.1:", *pa)}}, ""};
  sb.security = "insecure";
  AgentSpec sc{"node-c", dir, *pc, {{"node-a", absl::StrCat("127.0.0.1:", *pa)}}, ""};
  auto a = AgentProcess::Start(sa), b = AgentProcess::Start(sb), c = AgentProcess::Start(sc);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_THAT(ReadFile((*a)->log_path()), HasSubstr("plaintext and unauthenticated"));
  auto ca = Client::Connect((*a)->socket());
  auto cb = Client::Connect((*b)->socket());
  auto cc = Client::Connect((*c)->socket());
  ASSERT_TRUE(ca.ok() && cb.ok() && cc.ok());
  auto src = (*ca)->Alloc(kMiB);
  auto on_b = (*cb)->Alloc(kMiB, "plain");
  auto on_c = (*cc)->Alloc(kMiB, "tls");
  ASSERT_TRUE(src.ok() && on_b.ok() && on_c.ok());
  Fill(**src, 3);
  auto ok = (*ca)->Run({{ferry::v1::WRITE, (*src)->id(), 0, "node-b", "plain", 0, kMiB}},
                       absl::Seconds(30));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->state(), ferry::v1::SUCCEEDED) << ok->message();
  EXPECT_EQ(std::memcmp((*src)->data(), (*on_b)->data(), kMiB), 0);
  // A plaintext agent does not reach an mTLS one: it asks for a certificate node-a lacks.
  auto refused = (*ca)->Run({{ferry::v1::WRITE, (*src)->id(), 0, "node-c", "tls", 0, kMiB}},
                            absl::Seconds(10));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  for (auto* buf : {&src, &on_b, &on_c}) buf->value().reset();
  ca->reset();
  cb->reset();
  cc->reset();
  for (auto* agent : {&a, &b, &c}) (*agent)->get()->Stop();
  std::system(("rm -rf " + dir).c_str());
}

TEST(AgentTrustServerTest, AnUnreadableCertificateStopsTheAgentNamingTheKey) {
  std::string dir = MakeTempDir();
  auto agent = AgentProcess::Start(
      {"node-a", dir, 0, {},
       absl::StrCat("security:\n  mode: mtls\n  ca: ", dir, "/none.pem\n  cert: ", dir,
                    "/none.pem\n  key: ", dir, "/none.key\n")});
  ASSERT_FALSE(agent.ok());
  EXPECT_THAT(ReadFile(absl::StrCat(dir, "/node-a.log")), HasSubstr("security.ca: cannot read"));
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace ferry
