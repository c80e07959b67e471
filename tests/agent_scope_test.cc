// Scoped exports with two real agents: a buffer node-b exports to another node only is, to
// node-a, a buffer that does not exist (the same answer, word for word, as an unknown name,
// through the client's transfers and through the Peer API itself), and its bytes stay as
// they were; one that lists node-a takes node-a's writes.

#include <cstring>
#include <string>

#include "absl/strings/str_replace.h"
#include "client/ferry_client.h"
#include "ferry/v1/peer.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/agent_pair.h"
#include "tests/peer_channel.h"

namespace ferry {
namespace {

// A message with the buffer's name taken out: what is left must not tell two names apart.
std::string Shape(const absl::Status& s, const std::string& name) {
  return absl::StrReplaceAll(s.message(), {{name, "NAME"}});
}

bool AllZero(const Buffer& b) {
  for (uint64_t i = 0; i < b.size(); ++i) {
    if (b.data()[i] != 0) return false;
  }
  return true;
}

TEST(AgentScopeTest, ABufferNotExportedToThePeerLooksLikeNoBufferAndTakesNoWrite) {
  Pair pair;
  ASSERT_TRUE(pair.Start().ok());
  constexpr uint64_t kSize = 1 << 20;
  auto elsewhere = pair.cb->Alloc(kSize, "scoped-elsewhere", "host", false, {"node-z"});
  auto for_a = pair.cb->Alloc(kSize, "scoped-for-a", "host", false, {"node-z", "node-a"});
  auto src = pair.ca->Alloc(kSize);
  ASSERT_TRUE(elsewhere.ok()) << elsewhere.status();
  ASSERT_TRUE(for_a.ok()) << for_a.status();
  ASSERT_TRUE(src.ok());
  std::memset((*elsewhere)->data(), 0, kSize);
  Fill(**src, 3);

  // Through node-a's engine: the scoped buffer fails exactly as a name nobody has.
  absl::Status scoped = pair.ca->Write(**src, 0, "node-b", "scoped-elsewhere", 0, kSize);
  absl::Status unknown = pair.ca->Write(**src, 0, "node-b", "scoped-nothing", 0, kSize);
  EXPECT_EQ(scoped.code(), absl::StatusCode::kNotFound) << scoped;
  EXPECT_EQ(scoped.code(), unknown.code());
  EXPECT_EQ(Shape(scoped, "scoped-elsewhere"), Shape(unknown, "scoped-nothing"));
  auto stat_scoped = pair.ca->StatRemoteBuffer("node-b", "scoped-elsewhere");
  auto stat_unknown = pair.ca->StatRemoteBuffer("node-b", "scoped-nothing");
  EXPECT_EQ(stat_scoped.status().code(), absl::StatusCode::kNotFound) << stat_scoped.status();
  EXPECT_EQ(Shape(stat_scoped.status(), "scoped-elsewhere"),
            Shape(stat_unknown.status(), "scoped-nothing"));
  EXPECT_TRUE(AllZero(**elsewhere)) << "a write reached a buffer not exported to node-a";

  // Through node-b's Peer API, asked as node-a (with node-a's certificate): the same
  // NOT_FOUND for both names.
  auto peer = ferry::v1::Peer::NewStub(
      PeerChannelAs(pair.dir, pair.b->peer_address(), "node-b", "node-a"));
  auto resolve = [&](const std::string& name) {
    grpc::ClientContext ctx;
    ferry::v1::ResolveBufferRequest req;
    req.set_name(name);
    req.set_from_node("node-a");
    ferry::v1::ResolveBufferResponse resp;
    grpc::Status s = peer->ResolveBuffer(&ctx, req, &resp);
    EXPECT_EQ(resp.keys_size(), 0) << "keys handed out for " << name;
    return s;
  };
  grpc::Status r_scoped = resolve("scoped-elsewhere");
  grpc::Status r_unknown = resolve("scoped-nothing");
  EXPECT_EQ(r_scoped.error_code(), grpc::StatusCode::NOT_FOUND) << r_scoped.error_message();
  EXPECT_EQ(r_unknown.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(absl::StrReplaceAll(r_scoped.error_message(), {{"scoped-elsewhere", "NAME"}}),
            absl::StrReplaceAll(r_unknown.error_message(), {{"scoped-nothing", "NAME"}}));

  // A buffer that lists node-a takes its write, byte for byte.
  ASSERT_TRUE(pair.ca->Write(**src, 0, "node-b", "scoped-for-a", 0, kSize).ok());
  EXPECT_EQ(0, std::memcmp((*src)->data(), (*for_a)->data(), kSize));

  // ListBuffers shows who may reach each.
  auto listed = pair.cb->ListBuffers();
  ASSERT_TRUE(listed.ok());
  int seen = 0;
  for (const auto& b : *listed) {
    if (b.name() == "scoped-elsewhere") {
      ASSERT_EQ(b.allowed_peers_size(), 1);
      EXPECT_EQ(b.allowed_peers(0), "node-z");
      ++seen;
    } else if (b.name() == "scoped-for-a") {
      EXPECT_EQ(b.allowed_peers_size(), 2);
      ++seen;
    }
  }
  EXPECT_EQ(seen, 2);
  // Peers of an unnamed buffer make no sense: refused, not ignored.
  EXPECT_EQ(pair.cb->Alloc(4096, "", "host", false, {"node-a"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // The buffers are the clients' (freed as they go); the pair checks accounting at zero.
}

}  // namespace
}  // namespace ferry
