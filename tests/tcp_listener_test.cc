// The tcp provider's data listener under abuse: connections that never say hello, a first
// frame that is not a hello, more connections than the caps allow, and a process out of
// fds. After each, a real endpoint still connects and moves bytes.

#include <dirent.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <cstring>
#include <vector>

#include "absl/time/clock.h"
#include "base/unique_fd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/completion_waiter.h"
#include "transport/tcp/socket.h"
#include "transport/tcp/tcp_fabric.h"
#include "transport/tcp/wire.h"

namespace ferry::tcp {
namespace {

using ::testing::HasSubstr;

// True once the peer closed `fd` (recv sees EOF or a reset) within `timeout`.
bool ClosedByPeer(int fd, absl::Duration timeout) {
  timeval tv = {static_cast<time_t>(absl::ToInt64Seconds(timeout)), 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char byte;
  ssize_t n = recv(fd, &byte, 1, 0);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

// One WRITE of `length` bytes through a fresh endpoint from `fabric` to itself.
absl::Status WriteThrough(TcpFabric& fabric, std::vector<char>& from, std::vector<char>& to) {
  auto src = fabric.Register(from.data(), from.size(), fabric::kLocal);
  auto dst = fabric.Register(to.data(), to.size(), fabric::kRemoteWrite);
  if (!src.ok() || !dst.ok()) return absl::InternalError("register");
  auto endpoint = fabric::ConnectDirect(fabric, fabric);
  if (!endpoint.ok()) return endpoint.status();
  fabric::CompletionWaiter done;
  absl::Status posted = (*endpoint)->PostWrite({src->get(), 0, from.size()},
                                               {(*dst)->remote_address(), (*dst)->key()},
                                               done.Callback());
  absl::Status result = posted.ok() ? done.Wait() : posted;
  (*endpoint)->Close();
  return result;
}

bool WaitOpen(TcpFabric& fabric, uint32_t open, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (fabric.listener_stats().open == open) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

TEST(TcpListenerTest, AConnectionThatSaysNoHelloIsClosedAtTheHandshakeTimeout) {
  TcpOptions options;
  options.handshake_timeout_ms = 200;
  auto fabric = TcpFabric::Create(options);
  ASSERT_TRUE(fabric.ok());
  auto fd = ConnectTcp((*fabric)->address());
  ASSERT_TRUE(fd.ok());
  absl::Time start = absl::Now();
  EXPECT_TRUE(ClosedByPeer(fd->get(), absl::Seconds(5)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(150));
  EXPECT_TRUE(WaitOpen(**fabric, 0, absl::Seconds(2)));
}

TEST(TcpListenerTest, AFirstFrameOtherThanHelloClosesTheConnectionAndTouchesNothing) {
  auto fabric = TcpFabric::Create({});
  ASSERT_TRUE(fabric.ok());
  std::vector<char> target(4096, 0);
  auto region = (*fabric)->Register(target.data(), target.size(), fabric::kRemoteWrite);
  ASSERT_TRUE(region.ok());
  auto fd = ConnectTcp((*fabric)->address());
  ASSERT_TRUE(fd.ok());
  RequestHeader write = {kRequestMagic, WireOp::kWrite, 1, (*region)->remote_address(), 16,
                         (*region)->key(), 0};
  char payload[16];
  std::memset(payload, 0x5a, sizeof(payload));
  ASSERT_TRUE(SendAll(fd->get(), &write, sizeof(write)).ok());
  SendAll(fd->get(), payload, sizeof(payload)).IgnoreError();
  EXPECT_TRUE(ClosedByPeer(fd->get(), absl::Seconds(5)));
  EXPECT_EQ(std::count(target.begin(), target.end(), 0), 4096) << "a frame before hello wrote";
  // A hello of another wire version is refused too.
  auto old = ConnectTcp((*fabric)->address());
  ASSERT_TRUE(old.ok());
  RequestHeader hello = {kRequestMagic, WireOp::kHello, 0, 0, 0, 0, kWireVersion + 1};
  ASSERT_TRUE(SendAll(old->get(), &hello, sizeof(hello)).ok());
  EXPECT_TRUE(ClosedByPeer(old->get(), absl::Seconds(5)));
}

TEST(TcpListenerTest, ConnectionsOverTheCapAreClosedAtOnceAndRoomComesBack) {
  TcpOptions options;
  options.max_connections_per_source = 4;
  // The room is one endpoint's: 3 bulk connections and the express one.
  options.connections = 3;
  options.handshake_timeout_ms = 10000;
  auto fabric = TcpFabric::Create(options);
  ASSERT_TRUE(fabric.ok());
  std::vector<UniqueFd> idle;
  for (int i = 0; i < 4; ++i) {
    auto fd = ConnectTcp((*fabric)->address());
    ASSERT_TRUE(fd.ok());
    idle.push_back(std::move(*fd));
  }
  ASSERT_TRUE(WaitOpen(**fabric, 4, absl::Seconds(2)));
  auto over = ConnectTcp((*fabric)->address());
  ASSERT_TRUE(over.ok());
  absl::Time start = absl::Now();
  EXPECT_TRUE(ClosedByPeer(over->get(), absl::Seconds(5)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << "closed at the timeout, not at once";
  EXPECT_GE((*fabric)->listener_stats().refused, 1u);
  idle.clear();
  ASSERT_TRUE(WaitOpen(**fabric, 0, absl::Seconds(5)));
  std::vector<char> from(1 << 20, 7), to(1 << 20, 0);
  EXPECT_TRUE(WriteThrough(**fabric, from, to).ok());
  EXPECT_EQ(from, to);
}

// Issue 44 row 14: admitted connections count against their peer node, not their address:
// 16 agents behind one address (containers on a host) each have their share, where a cap per
// address refused the 13th's. A node past its share is told why (kBusy), and its op's error
// names the limit instead of "endpoint ... is broken".
TEST(TcpListenerTest, AdmittedConnectionsCountPerNodeAndARefusalIsNamed) {
  TcpOptions options;
  options.max_connections_per_source = 4;  // also the per-node share
  options.connections = 3;                 // an endpoint: 3 bulk connections and the express one
  auto fabric = TcpFabric::Create(options);
  ASSERT_TRUE(fabric.ok());
  std::vector<char> from(4096, 3), to(4096, 0);
  auto src = (*fabric)->Register(from.data(), from.size(), fabric::kLocal);
  auto dst = (*fabric)->Register(to.data(), to.size(), fabric::kRemoteWrite);
  ASSERT_TRUE(src.ok() && dst.ok());
  auto write = [&](fabric::Endpoint& ep) {
    fabric::CompletionWaiter done;
    absl::Status posted = ep.PostWrite({src->get(), 0, from.size()},
                                       {(*dst)->remote_address(), (*dst)->key()},
                                       done.Callback());
    return posted.ok() ? done.Wait() : posted;
  };
  // Two nodes, both from 127.0.0.1, a full share each. (Their hellos are read first: until
  // then a connection counts against its address, whose cap limits handshakes in progress.)
  auto x = fabric::ConnectDirect(**fabric, **fabric, {"node-x", 1});
  ASSERT_TRUE(x.ok());
  EXPECT_TRUE(write(**x).ok());
  ASSERT_TRUE(WaitOpen(**fabric, 4, absl::Seconds(2)));
  absl::SleepFor(absl::Milliseconds(200));
  auto y = fabric::ConnectDirect(**fabric, **fabric, {"node-y", 2});
  ASSERT_TRUE(y.ok());
  EXPECT_TRUE(write(**y).ok()) << "a second node behind the same address was refused";
  absl::SleepFor(absl::Milliseconds(200));
  ASSERT_TRUE(WaitOpen(**fabric, 8, absl::Seconds(2)));
  // node-x again: past its share.
  auto again = fabric::ConnectDirect(**fabric, **fabric, {"node-x", 1});
  absl::Status refused = again.ok() ? write(**again) : again.status();
  EXPECT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.message()), HasSubstr("limits.tcp_max_connections_per_peer"))
      << refused;
  if (again.ok()) (*again)->Close();
  (*x)->Close();
  (*y)->Close();
  ASSERT_TRUE(WaitOpen(**fabric, 0, absl::Seconds(5)));
  EXPECT_EQ((*fabric)->listener_stats().open, 0u);
}

size_t OpenFds() {
  size_t n = 0;
  DIR* dir = opendir("/proc/self/fd");
  while (dir != nullptr && readdir(dir) != nullptr) ++n;
  if (dir != nullptr) closedir(dir);
  return n;
}

// ASan/UBSan's runtime needs descriptors of its own while it checks and reports: UBSan's vptr
// check probes the vtable through a pipe (sanitizer_common's IsAccessibleMemoryRange), and
// the symbolizer starts over a socketpair. Out of fds on purpose, the vptr check fails on a
// valid object ("object has invalid vptr", from inside libspdlog). `make test` runs it.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FERRY_SANITIZER_NEEDS_FDS 1
#endif
#endif

TEST(TcpListenerTest, TheListenerOutlivesAProcessOutOfFds) {
#ifdef FERRY_SANITIZER_NEEDS_FDS
  GTEST_SKIP() << "the sanitizer runtime needs fds of its own; runs in the plain build";
#endif
  auto fabric = TcpFabric::Create({});
  ASSERT_TRUE(fabric.ok());
  auto hp = ParseHostPort((*fabric)->address());
  ASSERT_TRUE(hp.ok());
  // The client sockets exist before the limit drops; connecting them needs no new fd.
  std::vector<UniqueFd> clients;
  for (int i = 0; i < 40; ++i) {
    clients.emplace_back(socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  }
  rlimit saved = {};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit low = saved;
  low.rlim_cur = OpenFds() + 8;  // room for a few accepted connections, not 40
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(hp->port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (auto& c : clients) connect(c.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  absl::Time deadline = absl::Now() + absl::Seconds(5);
  while ((*fabric)->listener_stats().accept_errors == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_GT((*fabric)->listener_stats().accept_errors, 0u) << "accept() never ran out of fds";
  // Room again: the clients leave, the limit goes back, and new connections are served.
  clients.clear();
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  ASSERT_TRUE(WaitOpen(**fabric, 0, absl::Seconds(10)));
  std::vector<char> from(1 << 20, 9), to(1 << 20, 0);
  absl::Status s = WriteThrough(**fabric, from, to);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(from, to);
  EXPECT_GE((*fabric)->listener_stats().accepted, 40u);
}

}  // namespace
}  // namespace ferry::tcp
