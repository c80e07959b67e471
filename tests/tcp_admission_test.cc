// The tcp data plane's admission and refusals, with real fabrics over loopback and raw
// sockets playing the attacker: frames without a hello, hellos with a wrong, spent or
// revoked secret, and, inside a valid session, requests for keys, ranges and regions the
// peer was not given. Each touches no memory, gets no answer that tells one reason from
// another, and ends its connection; the listener's counters say what happened.

#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <vector>

#include "absl/time/clock.h"
#include "base/unique_fd.h"
#include "gtest/gtest.h"
#include "tests/completion_waiter.h"
#include "transport/tcp/region_table.h"
#include "transport/tcp/session_secrets.h"
#include "transport/tcp/socket.h"
#include "transport/tcp/tcp_fabric.h"
#include "transport/tcp/wire.h"

namespace ferry::tcp {
namespace {

void SetReceiveTimeout(int fd, absl::Duration timeout) {
  timeval tv = {static_cast<time_t>(absl::ToInt64Seconds(timeout)), 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

// True once the peer closed `fd` (EOF or a reset) without sending another byte.
bool ClosedWithoutAnswer(int fd) {
  SetReceiveTimeout(fd, absl::Seconds(5));
  char byte;
  ssize_t n = recv(fd, &byte, 1, 0);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

SessionTicket Ticket(TcpFabric& fabric, const fabric::PeerInstance& from, uint32_t sockets = 1) {
  auto reply = fabric.AcceptConnect(EncodeSessionRequest(sockets), from);
  EXPECT_TRUE(reply.ok()) << reply.status();
  auto ticket = DecodeSessionReply(reply.ok() ? *reply : "", fabric.address());
  EXPECT_TRUE(ticket.ok()) << ticket.status();
  return ticket.ok() ? *ticket : SessionTicket{};
}

UniqueFd Dial(TcpFabric& fabric) {
  auto fd = ConnectTcp(fabric.address());
  EXPECT_TRUE(fd.ok()) << fd.status();
  return fd.ok() ? std::move(*fd) : UniqueFd();
}

UniqueFd HelloWith(TcpFabric& fabric, const SessionTicket& ticket) {
  UniqueFd fd = Dial(fabric);
  RequestHeader hello = MakeHello(ticket);
  EXPECT_TRUE(SendAll(fd.get(), &hello, sizeof(hello)).ok());
  return fd;
}

// Sends a raw WRITE of `length` bytes of 0x5a (the send may fail once the target closed).
void RawWrite(int fd, uint64_t address, uint32_t key, uint64_t length, uint64_t id = 1) {
  RequestHeader write = {kRequestMagic, WireOp::kWrite, id, address, length, key, 0};
  std::vector<char> payload(length, 0x5a);
  SendAll(fd, &write, sizeof(write)).IgnoreError();
  SendAll(fd, payload.data(), payload.size()).IgnoreError();
}

absl::StatusOr<ResponseHeader> ReadAnswer(int fd) {
  SetReceiveTimeout(fd, absl::Seconds(5));
  ResponseHeader resp;
  absl::Status s = RecvAll(fd, &resp, sizeof(resp));
  if (!s.ok()) return s;
  return resp;
}

bool Untouched(const std::vector<char>& bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](char c) { return c == 0; });
}

// Counters change on the target's loop thread, just before or after the socket closes.
template <typename Get>
bool WaitFor(Get get, uint64_t at_least) {
  absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (get() < at_least && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  return get() >= at_least;
}

class TcpAdmissionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto fabric = TcpFabric::Create({});
    ASSERT_TRUE(fabric.ok()) << fabric.status();
    target_ = std::move(*fabric);
    auto region = target_->Register(memory_.data(), memory_.size(),
                                    fabric::kRemoteWrite | fabric::kRemoteRead);
    ASSERT_TRUE(region.ok()) << region.status();
    region_ = std::move(*region);
  }
  void TearDown() override { region_.reset(); }

  ListenerStats stats() const { return target_->listener_stats(); }

  std::unique_ptr<TcpFabric> target_;
  std::vector<char> memory_ = std::vector<char>(4096, 0);
  std::unique_ptr<fabric::MemoryRegion> region_;
};

TEST_F(TcpAdmissionTest, FramesWithoutAHelloTouchNothingAndGetNoAnswer) {
  // The right key and address, but no session: nothing may land.
  UniqueFd fd = Dial(*target_);
  RawWrite(fd.get(), region_->remote_address(), region_->key(), 64);
  EXPECT_TRUE(ClosedWithoutAnswer(fd.get()));
  EXPECT_TRUE(Untouched(memory_));
  EXPECT_TRUE(WaitFor([&] { return stats().unauthenticated; }, 1));
}

TEST_F(TcpAdmissionTest, AHelloWithAWrongSecretOrAnUnknownSessionIsClosedWithoutAnswer) {
  SessionTicket ticket = Ticket(*target_, {"peer-a", 7});
  SessionTicket wrong = ticket;
  wrong.secret[15] ^= 1;  // one bit of 128
  UniqueFd bad = HelloWith(*target_, wrong);
  RawWrite(bad.get(), region_->remote_address(), region_->key(), 64);
  EXPECT_TRUE(ClosedWithoutAnswer(bad.get()));
  SessionTicket unknown = ticket;
  unknown.session += 1000;
  UniqueFd stranger = HelloWith(*target_, unknown);
  RawWrite(stranger.get(), region_->remote_address(), region_->key(), 64);
  EXPECT_TRUE(ClosedWithoutAnswer(stranger.get()));
  // A hello of the old wire version, secretless, is refused the same way.
  UniqueFd old = Dial(*target_);
  RequestHeader v2 = {kRequestMagic, WireOp::kHello, 0, 0, 0, 0, 2};
  ASSERT_TRUE(SendAll(old.get(), &v2, sizeof(v2)).ok());
  EXPECT_TRUE(ClosedWithoutAnswer(old.get()));
  EXPECT_TRUE(Untouched(memory_));
  EXPECT_TRUE(WaitFor([&] { return stats().unauthenticated; }, 3));

  // The session itself was not spent by the wrong guesses: its owner still gets in.
  UniqueFd good = HelloWith(*target_, ticket);
  RawWrite(good.get(), region_->remote_address(), region_->key(), 64);
  auto answer = ReadAnswer(good.get());
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->refusal, Refusal::kNone);
  EXPECT_EQ(std::count(memory_.begin(), memory_.begin() + 64, 0x5a), 64);
}

TEST_F(TcpAdmissionTest, ASessionAdmitsTheSocketsItWasIssuedForOnce) {
  SessionTicket ticket = Ticket(*target_, {"peer-a", 7}, 2);
  // One after the other (each admitted before the next says hello: several loops serve
  // incoming connections, in no set order).
  std::vector<UniqueFd> admitted;
  for (int i = 0; i < 2; ++i) {
    admitted.push_back(HelloWith(*target_, ticket));
    RawWrite(admitted.back().get(), region_->remote_address(), region_->key(), 8);
    auto answer = ReadAnswer(admitted.back().get());
    ASSERT_TRUE(answer.ok()) << answer.status();
    EXPECT_EQ(answer->refusal, Refusal::kNone);
  }
  std::fill(memory_.begin(), memory_.end(), 0);
  UniqueFd third = HelloWith(*target_, ticket);
  RawWrite(third.get(), region_->remote_address(), region_->key(), 64);
  EXPECT_TRUE(ClosedWithoutAnswer(third.get()));
  EXPECT_TRUE(Untouched(memory_));
  EXPECT_EQ(target_->open_sessions(), 0u) << "a spent session stays";
}

TEST_F(TcpAdmissionTest, ANewerIncarnationRevokesTheOlderOnesSecrets) {
  SessionTicket old_life = Ticket(*target_, {"peer-a", 1});
  SessionTicket other_node = Ticket(*target_, {"peer-b", 1});
  SessionTicket new_life = Ticket(*target_, {"peer-a", 2});
  UniqueFd old_fd = HelloWith(*target_, old_life);
  RawWrite(old_fd.get(), region_->remote_address(), region_->key(), 64);
  EXPECT_TRUE(ClosedWithoutAnswer(old_fd.get()));
  EXPECT_TRUE(Untouched(memory_));
  EXPECT_TRUE(WaitFor([&] { return stats().unauthenticated; }, 1));
  for (const SessionTicket& t : {new_life, other_node}) {
    UniqueFd fd = HelloWith(*target_, t);
    RawWrite(fd.get(), region_->remote_address(), region_->key(), 8);
    auto answer = ReadAnswer(fd.get());
    ASSERT_TRUE(answer.ok()) << answer.status();
    EXPECT_EQ(answer->refusal, Refusal::kNone);
  }
}

TEST_F(TcpAdmissionTest, RefusalsLookTheSameAndEndTheConnection) {
  std::vector<char> read_only(64, 0);
  auto ro = target_->Register(read_only.data(), read_only.size(), fabric::kRemoteRead);
  ASSERT_TRUE(ro.ok());
  struct Case {
    const char* what;
    uint64_t address;
    uint32_t key;
    uint64_t length;
  };
  const uint64_t base = region_->remote_address();
  const Case cases[] = {
      {"unknown key", base, region_->key() ^ 0x5a5a5a5a, 64},
      {"past the end", base + 4090, region_->key(), 64},
      {"below the start", base - 1, region_->key(), 1},
      {"no write access", (*ro)->remote_address(), (*ro)->key(), 8},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    UniqueFd fd = HelloWith(*target_, Ticket(*target_, {"peer-a", 7}));
    RawWrite(fd.get(), c.address, c.key, c.length, 42);
    auto answer = ReadAnswer(fd.get());
    ASSERT_TRUE(answer.ok()) << answer.status();
    // Byte for byte the same answer, whatever the reason.
    ResponseHeader expected = {kResponseMagic, Refusal::kRefused, 42, 0};
    EXPECT_EQ(std::memcmp(&*answer, &expected, sizeof(expected)), 0);
    // And nothing more on this connection: a second request is never read.
    RawWrite(fd.get(), base, region_->key(), 8, 43);
    EXPECT_TRUE(ClosedWithoutAnswer(fd.get()));
  }
  EXPECT_TRUE(Untouched(memory_));
  EXPECT_TRUE(Untouched(read_only));
  ListenerStats s = stats();
  EXPECT_EQ(s.refused_key, 1u);
  EXPECT_EQ(s.refused_bounds, 2u);
  EXPECT_EQ(s.refused_access, 1u);
  EXPECT_TRUE(WaitFor([&] { return stats().open == 0 ? 1u : 0u; }, 1))
      << "refused connections stay open";
  ro->reset();
}

TEST_F(TcpAdmissionTest, ARegionScopedToPeersRefusesTheOthers) {
  ASSERT_TRUE(region_->RestrictToPeers({"peer-b"}).ok());
  UniqueFd a = HelloWith(*target_, Ticket(*target_, {"peer-a", 1}));
  RawWrite(a.get(), region_->remote_address(), region_->key(), 64, 5);
  auto refused = ReadAnswer(a.get());
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(refused->refusal, Refusal::kRefused);
  EXPECT_TRUE(Untouched(memory_));
  EXPECT_EQ(stats().refused_peer, 1u);

  // Through a real endpoint, admitted as peer-b: it lands.
  auto initiator = TcpFabric::Create({});
  ASSERT_TRUE(initiator.ok());
  std::vector<char> src(64, 0x33);
  auto src_mr = (*initiator)->Register(src.data(), src.size(), fabric::kLocal);
  ASSERT_TRUE(src_mr.ok());
  auto ep = fabric::ConnectDirect(**initiator, *target_, {"peer-b", 1});
  ASSERT_TRUE(ep.ok()) << ep.status();
  fabric::CompletionWaiter w;
  ASSERT_TRUE((*ep)->PostWrite({src_mr->get(), 0, 64}, {region_->remote_address(), region_->key()},
                               w.Callback())
                  .ok());
  EXPECT_TRUE(w.Wait().ok()) << w.Wait();
  EXPECT_EQ(std::count(memory_.begin(), memory_.begin() + 64, 0x33), 64);
  (*ep)->Close();
}

TEST_F(TcpAdmissionTest, AnEndpointSeesOneClearRefusalAndIsBrokenAfterIt) {
  auto initiator = TcpFabric::Create({});
  ASSERT_TRUE(initiator.ok());
  std::vector<char> src(64, 0x11);
  auto src_mr = (*initiator)->Register(src.data(), src.size(), fabric::kLocal);
  ASSERT_TRUE(src_mr.ok());
  auto ep = fabric::ConnectDirect(**initiator, *target_, {"peer-a", 1});
  ASSERT_TRUE(ep.ok()) << ep.status();
  fabric::CompletionWaiter w;
  ASSERT_TRUE((*ep)->PostWrite({src_mr->get(), 0, 64},
                               {region_->remote_address(), region_->key() + 1}, w.Callback())
                  .ok());
  absl::Status s = w.Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("remote access refused: key, bounds or access rights"),
            std::string::npos)
      << s;
  EXPECT_TRUE((*ep)->broken());
  EXPECT_TRUE(Untouched(memory_));
  (*ep)->Close();
}

TEST_F(TcpAdmissionTest, MalformedHandshakesAreRefusedWithAClearStatus) {
  EXPECT_EQ(target_->AcceptConnect("", {"peer-a", 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(target_->AcceptConnect(EncodeSessionRequest(0), {"peer-a", 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(target_->AcceptConnect(EncodeSessionRequest(1000), {"peer-a", 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto initiator = TcpFabric::Create({});
  ASSERT_TRUE(initiator.ok());
  auto pending = (*initiator)->BeginConnect(target_->address());
  ASSERT_TRUE(pending.ok());
  auto ep = (*pending)->Finish("");  // a tcp peer of wire version 2 replied nothing
  EXPECT_EQ(ep.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ep.status().message().find("Connect reply"), std::string::npos) << ep.status();
}

TEST(RegionTableTest, KeysAreRandomNonZeroAndUnique) {
  RegionTable table;
  std::vector<char> memory(1000);
  std::vector<uint32_t> keys;
  for (int i = 0; i < 1000; ++i) {
    auto key = table.Add(&memory[i], &memory[i], 1, 0);
    ASSERT_TRUE(key.ok());
    keys.push_back(*key);
  }
  std::set<uint32_t> distinct(keys.begin(), keys.end());
  EXPECT_EQ(distinct.size(), keys.size());
  EXPECT_EQ(distinct.count(0), 0u);
  // Not a sequence: consecutive keys differ by a constant in no run, and the differences
  // are nearly all distinct (random 32-bit keys repeat a difference about never).
  std::set<uint32_t> steps;
  for (size_t i = 1; i < keys.size(); ++i) steps.insert(keys[i] - keys[i - 1]);
  EXPECT_GT(steps.size(), 990u);
  EXPECT_FALSE(std::is_sorted(keys.begin(), keys.end()));
  for (uint32_t key : keys) table.Remove(key);
}

TEST(SessionSecretsTest, ExpiryAndThePerPeerBound) {
  SessionSecrets secrets;
  const absl::Time t0 = absl::Now();
  auto first = secrets.Issue({"peer-a", 1}, 1, t0);
  ASSERT_TRUE(first.ok());
  SessionSecrets::Refused why;
  EXPECT_FALSE(secrets.Admit(first->session, first->secret, &why, t0 + kSessionLifetime +
                                                                      absl::Seconds(1)));
  EXPECT_EQ(why, SessionSecrets::Refused::kExpired);
  // More unspent sessions than a peer may hold: the oldest go.
  std::vector<SessionTicket> tickets;
  for (uint32_t i = 0; i < kSessionsPerPeer + 1; ++i) {
    auto t = secrets.Issue({"peer-a", 1}, 1, t0);
    ASSERT_TRUE(t.ok());
    tickets.push_back(*t);
  }
  EXPECT_EQ(secrets.size(), kSessionsPerPeer);
  EXPECT_FALSE(secrets.Admit(tickets[0].session, tickets[0].secret, &why, t0));
  EXPECT_EQ(why, SessionSecrets::Refused::kUnknown);
  auto admitted = secrets.Admit(tickets.back().session, tickets.back().secret, &why, t0);
  ASSERT_TRUE(admitted.has_value());
  EXPECT_EQ(admitted->peer.node, "peer-a");
  EXPECT_EQ(admitted->peer.incarnation, 1u);
  // Two tickets never share a secret.
  EXPECT_NE(tickets[1].secret, tickets[2].secret);
}

// A kWriteList (wire.h) whose frame table cannot be trusted (a count of 0 or over
// kMaxWirePieces, an empty piece, lengths that do not add up, an address past 2^64) is
// answered kBadOp; one whose pieces reach outside the region is refused like a WRITE.
// Either way nothing lands and the connection ends.
TEST_F(TcpAdmissionTest, AGatheredWriteWithABadTableOrAPieceOutsideTheRegionTouchesNothing) {
  struct Case {
    const char* what;
    uint32_t count;
    std::vector<WirePiece> table;
    uint64_t length;
    Refusal answer;
  };
  const std::vector<Case> cases = {
      {"no pieces", 0, {}, 16, Refusal::kBadOp},
      {"too many pieces", kMaxWirePieces + 1, {}, 16, Refusal::kBadOp},
      {"an empty piece", 2, {{0, 16}, {100, 0}}, 16, Refusal::kBadOp},
      {"lengths over the payload", 2, {{0, 16}, {100, 16}}, 16, Refusal::kBadOp},
      {"lengths under the payload", 1, {{0, 16}}, 32, Refusal::kBadOp},
      {"an address past 2^64", 1, {{UINT64_MAX - 8, 16}}, 16, Refusal::kBadOp},
      {"a piece past the region", 2, {{0, 8}, {4090, 8}}, 16, Refusal::kRefused},
  };
  SessionTicket ticket = Ticket(*target_, {"peer-a", 7}, static_cast<uint32_t>(cases.size()));
  for (const Case& c : cases) {
    UniqueFd fd = HelloWith(*target_, ticket);
    RequestHeader list = {kRequestMagic, WireOp::kWriteList, 1, region_->remote_address(),
                          c.length,      region_->key(),     c.count};
    std::vector<char> payload(c.length, 0x5a);
    SendAll(fd.get(), &list, sizeof(list)).IgnoreError();
    SendAll(fd.get(), c.table.data(), c.table.size() * sizeof(WirePiece)).IgnoreError();
    SendAll(fd.get(), payload.data(), payload.size()).IgnoreError();
    auto answer = ReadAnswer(fd.get());
    ASSERT_TRUE(answer.ok()) << c.what << ": " << answer.status();
    EXPECT_EQ(answer->refusal, c.answer) << c.what;
    EXPECT_TRUE(ClosedWithoutAnswer(fd.get())) << c.what;
    EXPECT_TRUE(Untouched(memory_)) << c.what;
  }
  EXPECT_TRUE(WaitFor([&] { return stats().refused_bounds; }, 1));
}

// A well-formed one lands each piece at its place and is acked once.
TEST_F(TcpAdmissionTest, AGatheredWriteLandsEachPieceAndIsAckedOnce) {
  SessionTicket ticket = Ticket(*target_, {"peer-a", 7});
  UniqueFd fd = HelloWith(*target_, ticket);
  const std::vector<WirePiece> table = {{4000, 4}, {0, 4}, {2048, 4}};
  RequestHeader list = {kRequestMagic, WireOp::kWriteList, 9, region_->remote_address(), 12,
                        region_->key(), 3};
  ASSERT_TRUE(SendAll(fd.get(), &list, sizeof(list)).ok());
  ASSERT_TRUE(SendAll(fd.get(), table.data(), table.size() * sizeof(WirePiece)).ok());
  ASSERT_TRUE(SendAll(fd.get(), "tailheadmidd", 12).ok());
  auto answer = ReadAnswer(fd.get());
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->refusal, Refusal::kNone);
  EXPECT_EQ(answer->id, 9u);
  EXPECT_EQ(std::string(memory_.data() + 4000, 4), "tail");
  EXPECT_EQ(std::string(memory_.data(), 4), "head");
  EXPECT_EQ(std::string(memory_.data() + 2048, 4), "midd");
  EXPECT_EQ(std::count(memory_.begin(), memory_.end(), 0), 4096 - 12);
}

}  // namespace
}  // namespace ferry::tcp
