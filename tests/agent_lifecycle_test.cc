// A long-running agent, through real ferryd processes: memory comes back however clients
// leave (and stays while an idle client's session is left unread), one agent per socket and
// port, restarts at once, a data listener that survives a flood of idle connections under a
// low fd limit, cancel and capped deadlines, honest codes and bounded messages, SIGHUP and
// flags. Each test reproduces what was seen to break.

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/unique_fd.h"
#include "client/agent_process.h"
#include "client/child_process.h"
#include "client/ferry_client.h"
#include "client/tensor_client.h"
#include "ferry/v1/peer.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/peers/protocol.h"
#include "tests/agent_pair.h"
#include "tests/peer_channel.h"
#include "tests/text_file.h"
#include "transport/tcp/socket.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Waits for `pid` to exit; its exit code, or -1 if it is still running after `timeout`
// (then it is killed).
int WaitExit(pid_t pid, absl::Duration timeout = absl::Seconds(20)) {
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    absl::SleepFor(absl::Milliseconds(10));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

// Runs a command to its end; its exit code, its output in `output`.
int RunCommand(const std::vector<std::string>& argv, const std::string& dir,
               std::string* output = nullptr) {
  std::string log = absl::StrCat(dir, "/run-", getpid(), ".out");
  auto pid = SpawnChild(argv, log);
  if (!pid.ok()) return -1;
  int rc = WaitExit(*pid, absl::Seconds(60));
  if (output != nullptr) *output = ReadFile(log);
  return rc;
}

uint64_t HostPoolUsed(Client& c) {
  auto info = c.GetInfo();
  EXPECT_TRUE(info.ok()) << info.status();
  return info.ok() ? info->host_pool_used_bytes() : ~0ull;
}

// Polls until the agent's host pool is back to `used` bytes; false at the timeout.
bool PoolReturnsTo(Client& c, uint64_t used, absl::Duration timeout = absl::Seconds(10)) {
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (HostPoolUsed(c) == used) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

std::unique_ptr<ferry::v1::Agent::Stub> RawAgentStub(const std::string& socket) {
  // gRPC's defaults (4 MiB messages), as a client written from the protos alone has them.
  return ferry::v1::Agent::NewStub(
      grpc::CreateChannel(absl::StrCat("unix:", socket), grpc::InsecureChannelCredentials()));
}

TEST(AgentLifecycleTest, TwelvePutsOf32MiBLeaveThePoolEmpty) {
  Pair pair;
  ASSERT_TRUE(pair.Start("host_pool:\n  size: 256MiB\n").ok());
  auto target = pair.cb->Alloc(32 << 20, "put-target", "host", /*persist=*/true);
  ASSERT_TRUE(target.ok()) << target.status();
  std::string file = pair.dir + "/32MiB.bin";
  {
    std::ofstream out(file, std::ios::binary);
    std::string chunk(1 << 20, 'x');
    for (int i = 0; i < 32; ++i) out << chunk;
  }
  for (int i = 0; i < 12; ++i) {
    std::string out;
    int rc = RunCommand(
        {FERRY_FERRYCTL, "--socket", pair.a->socket(), "put", file, "--to", "node-b:put-target"},
        pair.dir, &out);
    ASSERT_EQ(rc, 0) << "put " << i << ": " << out;
    EXPECT_TRUE(PoolReturnsTo(*pair.ca, 0))
        << "put " << i << " left the pool at " << HostPoolUsed(*pair.ca);
  }
  auto info = pair.ca->GetInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->buffer_count(), 0u);
  EXPECT_TRUE(pair.cb->Free((*target)->id()).ok());
}

TEST(AgentLifecycleTest, AllocWriteFreeCyclesNeverFillThePool) {
  Pair pair;
  ASSERT_TRUE(pair.Start("host_pool:\n  size: 2GiB\n").ok());
  auto dst = pair.cb->Alloc(4096, "cycle-target");
  ASSERT_TRUE(dst.ok());
  // 8 cycles filled the pool when finished transfers kept their buffers; 16 fit twice over.
  for (int i = 0; i < 16; ++i) {
    auto src = pair.ca->Alloc(256 << 20);
    ASSERT_TRUE(src.ok()) << "cycle " << i << ": " << src.status();
    ASSERT_TRUE(pair.ca->Write(**src, 0, "node-b", "cycle-target", 0, 4096).ok());
    ASSERT_TRUE(pair.ca->Free((*src)->id()).ok());
    EXPECT_TRUE(PoolReturnsTo(*pair.ca, 0)) << "cycle " << i;
  }
}

TEST(AgentLifecycleTest, BuffersOfAClientThatCrashesOrExitsAreFreedAndPersistingOnesStay) {
  Pair pair;
  ASSERT_TRUE(pair.Start().ok());
  auto kept = pair.ca->Alloc(1 << 20, "kept", "host", /*persist=*/true);
  ASSERT_TRUE(kept.ok());
  for (const std::string mode : {"wait", "exit"}) {
    std::string out = absl::StrCat(pair.dir, "/helper-", mode, ".out");
    auto pid = SpawnChild(
        {FERRY_SESSION_HELPER, pair.a->socket(), "4", std::to_string(16 << 20), mode}, out);
    ASSERT_TRUE(pid.ok());
    ASSERT_TRUE(WaitForText(out, "ready", absl::Seconds(10))) << ReadFile(out);
    if (mode == "wait") {
      auto list = pair.ca->ListBuffers();
      ASSERT_TRUE(list.ok());
      int owned = 0;
      for (const auto& b : *list) {
        if (b.owner().find("session helper, pid " + std::to_string(*pid)) != std::string::npos) {
          ++owned;
          EXPECT_FALSE(b.persist());
          // Not ours to free: the buffer belongs to the helper's session.
          absl::Status s = pair.ca->Free(b.id());
          EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
          EXPECT_THAT(std::string(s.message()), HasSubstr("belongs to session"));
        }
      }
      EXPECT_EQ(owned, 4);
      kill(*pid, SIGKILL);  // a crash: no goodbye
    }
    WaitExit(*pid);
    EXPECT_TRUE(PoolReturnsTo(*pair.ca, 1 << 20)) << mode << ": pool at " << HostPoolUsed(*pair.ca);
  }
  auto list = pair.ca->ListBuffers();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].name(), "kept");
  EXPECT_TRUE((*list)[0].persist());
  EXPECT_TRUE(pair.ca->Free((*kept)->id()).ok());

  // A client without a session must say its buffer persists; the refusal names the field.
  auto stub = RawAgentStub(pair.a->socket());
  grpc::ClientContext ctx;
  ferry::v1::AllocBufferRequest req;
  req.set_size(4096);
  ferry::v1::AllocBufferResponse resp;
  grpc::Status s = stub->AllocBuffer(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("persist:"));
}

// libferry reads a session's first event only (client/agent_session.cc): the call then stays
// open unread. It must outlive a client that makes no call for longer than gRPC's backup
// poll (5 s), and still end with the client.
TEST(AgentLifecycleTest, AnIdleClientsUnreadSessionStaysOpenAndEndsWithTheClient) {
  Pair pair;
  ASSERT_TRUE(pair.Start().ok());
  auto idle = Client::Connect(pair.a->socket());
  ASSERT_TRUE(idle.ok());
  auto buffer = (*idle)->Alloc(1 << 20, "idle");
  ASSERT_TRUE(buffer.ok());
  const uint64_t held = HostPoolUsed(*pair.ca);
  EXPECT_GE(held, uint64_t{1} << 20);
  absl::SleepFor(absl::Seconds(6));
  EXPECT_EQ(HostPoolUsed(*pair.ca), held) << "the idle client's buffer was freed";
  EXPECT_TRUE((*idle)->GetInfo().ok());
  buffer->reset();
  idle->reset();
  EXPECT_TRUE(PoolReturnsTo(*pair.ca, 0)) << "pool at " << HostPoolUsed(*pair.ca);
}

TEST(AgentLifecycleTest, ASecondAgentOnTheSameSocketOrPortIsRefusedAndTheFirstServesOn) {
  std::string dir = MakeTempDir();
  auto first = AgentProcess::Start({"node-a", dir, 0, {}, ""});
  ASSERT_TRUE(first.ok()) << first.status();
  std::string pid = std::to_string((*first)->pid());

  // The same config: refused before it touches the socket.
  std::string log = dir + "/second.log";
  auto second = SpawnChild({FERRY_FERRYD, "--config", (*first)->config_path()}, log);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(WaitExit(*second), 1) << ReadFile(log);
  EXPECT_THAT(ReadFile(log), HasSubstr("another ferryd (pid " + pid + ")"));

  // Another socket, the same peer port: refused, naming the port's owner.
  std::string other = dir + "/other.log";
  auto third = SpawnChild({FERRY_FERRYD, "--config", (*first)->config_path(), "--socket",
                           dir + "/other.sock"}, other);
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(WaitExit(*third), 1) << ReadFile(other);
  EXPECT_THAT(ReadFile(other), HasSubstr("in use by pid " + pid));

  // The first one still serves, at its socket.
  auto c = Client::Connect((*first)->socket());
  ASSERT_TRUE(c.ok()) << c.status();
  auto info = (*c)->GetInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->pid(), static_cast<uint32_t>((*first)->pid()));
  c->reset();
  first->reset();
  std::system(("rm -rf " + dir).c_str());
}

TEST(AgentLifecycleTest, StopThenStartAtOnceComesUpReachable) {
  std::string dir = MakeTempDir();
  AgentSpec spec{"node-a", dir, 0, {}, ""};
  auto port = PickFreePort();
  ASSERT_TRUE(port.ok());
  spec.peer_port = *port;
  auto old = AgentProcess::Start(spec);
  ASSERT_TRUE(old.ok()) << old.status();
  for (int round = 0; round < 3; ++round) {
    kill((*old)->pid(), SIGTERM);  // and start the next one without waiting for it to go
    auto next = AgentProcess::Start(spec);
    ASSERT_TRUE(next.ok()) << "round " << round << ": " << next.status();
    EXPECT_EQ((*old)->Stop(), 0);  // it has exited by now, cleanly
    // Still reachable after its predecessor is gone (which removed only its own socket).
    auto c = Client::Connect((*next)->socket());
    ASSERT_TRUE(c.ok()) << c.status();
    auto info = (*c)->GetInfo();
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->pid(), static_cast<uint32_t>((*next)->pid()));
    old = std::move(next);
  }
  old->reset();
  std::system(("rm -rf " + dir).c_str());
}

TEST(AgentLifecycleTest, IdleConnectionsUnderALowFdLimitDoNotStopTransfers) {
  Pair pair;
  // Fewer fds than the flood needs (the agent itself uses a few dozen).
  pair.b_open_files = 128;
  ASSERT_TRUE(pair.Start("limits:\n  tcp_max_connections_per_peer: 32\n"
                         "  tcp_handshake_timeout_ms: 1000\n").ok());
  auto dst = pair.cb->Alloc(1 << 20, "flooded");
  auto src = pair.ca->Alloc(1 << 20);
  ASSERT_TRUE(dst.ok() && src.ok());
  // node-b's data listener, as its Hello tells peers.
  auto peer = ferry::v1::Peer::NewStub(
      PeerChannelAs(pair.dir, pair.b->peer_address(), "node-b", "probe"));
  grpc::ClientContext ctx;
  ferry::v1::HelloRequest hello;
  hello.set_node("probe");
  hello.set_protocol_version(server::kPeerProtocolVersion);
  ferry::v1::HelloResponse welcome;
  ASSERT_TRUE(peer->Hello(&ctx, hello, &welcome).ok());
  std::string data_address;
  for (const auto& e : welcome.endpoints()) {
    if (e.provider() == "tcp") data_address = e.address();
  }
  auto hp = tcp::ParseHostPort(data_address);
  ASSERT_TRUE(hp.ok()) << data_address;

  // 300 connections that never say hello: more than node-b has fds for (a flood seen with
  // `ulimit -n 256`, here with a lower limit so that the kernel's backlog of 128 suffices).
  std::vector<UniqueFd> idle;
  // They come from 127.0.0.2, as from another host; node-a connects from 127.0.0.1.
  for (int i = 0; i < 300; ++i) {
    UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    sockaddr_in from = {};
    from.sin_family = AF_INET;
    from.sin_addr.s_addr = htonl(INADDR_LOOPBACK + 1);
    ASSERT_EQ(bind(fd.get(), reinterpret_cast<sockaddr*>(&from), sizeof(from)), 0)
        << strerror(errno);
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(hp->port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    idle.push_back(std::move(fd));
  }
  // node-b keeps its connections below its fd limit (gRPC's own listener would die on one
  // EMFILE) and one address's below the per-peer cap, closes the rest at once, and the idle
  // ones at its handshake timeout.
  EXPECT_TRUE(WaitForText(pair.b->log_path(), "incoming connections (limits.tcp_max_connections",
                          absl::Seconds(1)));
  EXPECT_TRUE(WaitForText(pair.b->log_path(), "tcp: refused a connection from 127.0.0.2",
                          absl::Seconds(10))) << ReadFile(pair.b->log_path());
  // New connections (node-a's first to node-b) still get in, and the transfer lands.
  Fill(**src, 3);
  auto result = pair.ca->Run({{ferry::v1::WRITE, (*src)->id(), 0, "node-b", "flooded", 0, 1 << 20}},
                             absl::Seconds(30));
  ASSERT_TRUE(result.ok()) << result.status() << "\n" << ReadFile(pair.b->log_path());
  EXPECT_EQ(result->state(), ferry::v1::SUCCEEDED) << result->message();
  EXPECT_EQ(0, std::memcmp((*src)->data(), (*dst)->data(), 1 << 20));
  idle.clear();
  EXPECT_TRUE(pair.ca->Write(**src, 0, "node-b", "flooded", 0, 1 << 20).ok());
}

TEST(AgentLifecycleTest, CancelEndsARunningBatchAndASmallOpIsNotStuckBehindIt) {
  Pair pair;
  ASSERT_TRUE(pair.Start().ok());
  auto src = pair.ca->Alloc(64 << 20);
  auto dst = pair.cb->Alloc(64 << 20, "busy");
  ASSERT_TRUE(src.ok() && dst.ok());
  std::vector<OpSpec> ops;
  for (int i = 0; i < 256; ++i)
    ops.push_back({ferry::v1::WRITE, (*src)->id(), 0, "node-b", "busy", 0, 64 << 20});
  auto id = pair.ca->Submit(ops, absl::Seconds(120));
  ASSERT_TRUE(id.ok()) << id.status();
  absl::SleepFor(absl::Milliseconds(100));
  auto cancelled = pair.ca->Cancel(*id);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), ferry::v1::FAILED);
  EXPECT_EQ(cancelled->code(), static_cast<int>(absl::StatusCode::kCancelled))
      << cancelled->message();
  EXPECT_GT(cancelled->ops_failed(), 0u);
  EXPECT_EQ(cancelled->ops_total(), 256u);
  // Cancelling again, or waiting, tells the same ending.
  auto again = pair.ca->Cancel(*id);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->code(), cancelled->code());
  EXPECT_EQ(pair.ca->Cancel(987654321).status().code(), absl::StatusCode::kNotFound);
  auto small = pair.ca->Alloc(4096);
  ASSERT_TRUE(small.ok());
  EXPECT_TRUE(pair.ca->Write(**small, 0, "node-b", "busy", 0, 4096).ok());
}

TEST(AgentLifecycleTest, DeadlinesAreCappedByTheConfiguredMaximum) {
  Pair pair;
  ASSERT_TRUE(pair.Start("limits:\n  max_timeout_ms: 60000\n").ok());
  auto src = pair.ca->Alloc(4096);
  auto dst = pair.cb->Alloc(4096, "capped");
  ASSERT_TRUE(src.ok() && dst.ok());
  auto id = pair.ca->Submit({{ferry::v1::WRITE, (*src)->id(), 0, "node-b", "capped", 0, 4096}},
                            absl::Milliseconds(4294967295u));
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(id.status().message()), HasSubstr("timeout_ms"));
  EXPECT_THAT(std::string(id.status().message()), HasSubstr("limits.max_timeout"));
}

TEST(AgentLifecycleTest, SigtermOfTheReceiverFailsTransfersUnavailable) {
  Pair pair;
  ASSERT_TRUE(pair.Start().ok());
  auto src = pair.ca->Alloc(64 << 20);
  // Persisting: the point is the agent stopping, not its client leaving (that frees it).
  auto dst = pair.cb->Alloc(64 << 20, "stopping", "host", /*persist=*/true);
  ASSERT_TRUE(src.ok() && dst.ok());
  std::vector<OpSpec> ops;
  for (int i = 0; i < 512; ++i)
    ops.push_back({ferry::v1::WRITE, (*src)->id(), 0, "node-b", "stopping", 0, 64 << 20});
  auto id = pair.ca->Submit(ops, absl::Seconds(60));
  ASSERT_TRUE(id.ok()) << id.status();
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(pair.b->Stop(), 0);
  auto result = pair.ca->Wait(*id, absl::Seconds(60));
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->state(), ferry::v1::FAILED) << "the batch finished before the agent stopped";
  EXPECT_EQ(result->code(), static_cast<int>(absl::StatusCode::kUnavailable)) << result->message();
}

TEST(AgentLifecycleTest, TransferSubmitsAndWaitsInOneCallAndRefusesABadBatchAsSubmitDoes) {
  Pair pair;
  ASSERT_TRUE(pair.Start().ok());
  auto src = pair.ca->Alloc(4096);
  auto dst = pair.cb->Alloc(4096, "one-call");
  ASSERT_TRUE(src.ok() && dst.ok());
  std::memset((*src)->data(), 'T', 4096);
  auto stub = RawAgentStub(pair.a->socket());
  auto op = [&](ferry::v1::Op* o, uint64_t offset, uint64_t length) {
    o->set_type(ferry::v1::WRITE);
    o->set_local_buffer((*src)->id());
    o->set_local_offset(offset);
    o->set_peer("node-b");
    o->set_remote_buffer("one-call");
    o->set_remote_offset(offset);
    o->set_length(length);
  };
  ferry::v1::TransferRequest req;
  for (uint64_t i = 0; i < 4; ++i) op(req.mutable_submit()->add_ops(), i * 1024, 1024);
  req.set_include_ops(true);
  req.set_ops_limit(3);
  {
    grpc::ClientContext ctx;
    ferry::v1::TransferResult result;
    grpc::Status s = stub->Transfer(&ctx, req, &result);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(result.state(), ferry::v1::SUCCEEDED) << result.message();
    EXPECT_EQ(result.bytes(), 4096u);
    ASSERT_EQ(result.ops_size(), 3);  // the first page; Wait on transfer_id gives the rest
    EXPECT_EQ(result.ops_next(), 3u);
    EXPECT_NE(result.transfer_id(), 0u);
    EXPECT_EQ(std::memcmp((*src)->data(), (*dst)->data(), 4096), 0);
  }
  // A bad op refuses the whole batch, naming it, and nothing moves.
  std::memset((*dst)->data(), 0, 4096);
  op(req.mutable_submit()->add_ops(), 4000, 1000);  // past the end of both buffers
  grpc::ClientContext ctx;
  ferry::v1::TransferResult result;
  grpc::Status s = stub->Transfer(&ctx, req, &result);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("ops[4]"));
  EXPECT_EQ(std::count((*dst)->data(), (*dst)->data() + 4096, 0), 4096);
}

TEST(AgentLifecycleTest, ResultsOfA65536OpBatchFitADefaultClient) {
  Pair pair;
  ASSERT_TRUE(pair.Start().ok());
  constexpr int kOps = 65536;
  auto src = pair.ca->Alloc(kOps * 64);
  auto dst = pair.cb->Alloc(kOps * 64, "many");
  ASSERT_TRUE(src.ok() && dst.ok());
  std::vector<OpSpec> ops;
  for (uint64_t i = 0; i < kOps; ++i)
    ops.push_back({ferry::v1::WRITE, (*src)->id(), i * 64, "node-b", "many", i * 64, 64});
  auto result = pair.ca->Run(ops, absl::Seconds(60), /*include_ops=*/true);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->state(), ferry::v1::SUCCEEDED) << result->message();
  ASSERT_EQ(result->ops_size(), kOps);
  for (int i = 0; i < kOps; i += 4099) EXPECT_EQ(result->ops(i).index(), static_cast<uint64_t>(i));
  EXPECT_EQ(result->ops_succeeded(), static_cast<uint64_t>(kOps));

  // A client with gRPC's default 4 MiB limit gets every op, page by page.
  auto stub = RawAgentStub(pair.a->socket());
  ferry::v1::WaitRequest req;
  req.set_transfer_id(result->transfer_id());
  req.set_include_ops(true);
  uint64_t seen = 0;
  int pages = 0;
  do {
    grpc::ClientContext ctx;
    ferry::v1::TransferResult page;
    grpc::Status s = stub->Wait(&ctx, req, &page);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_GT(page.ops_size(), 0);
    EXPECT_EQ(page.ops(0).index(), seen);
    seen += page.ops_size();
    ++pages;
    req.set_ops_from(page.ops_next());
  } while (req.ops_from() != 0);
  EXPECT_EQ(seen, static_cast<uint64_t>(kOps));
  EXPECT_GT(pages, 1);
  // Only the failed ones: none.
  req.set_ops_from(0);
  req.set_failed_only(true);
  grpc::ClientContext ctx;
  ferry::v1::TransferResult failed;
  ASSERT_TRUE(stub->Wait(&ctx, req, &failed).ok());
  EXPECT_EQ(failed.ops_size(), 0);
  EXPECT_EQ(failed.ops_failed(), 0u);
}

TEST(AgentLifecycleTest, ErrorMessagesAreBoundedAndSayTheCodeOnce) {
  Pair pair;
  ASSERT_TRUE(pair.Start().ok());
  auto src = pair.ca->Alloc(4096);
  ASSERT_TRUE(src.ok());
  for (size_t length : {size_t{200}, size_t{1} << 20}) {
    std::string name(length, 'n');
    auto id = pair.ca->Submit({{ferry::v1::WRITE, (*src)->id(), 0, "node-b", name, 0, 4096}});
    ASSERT_FALSE(id.ok());
    std::string message(id.status().message());
    EXPECT_LT(message.size(), 300u) << message.substr(0, 300);
    EXPECT_THAT(message, HasSubstr("remote_buffer"));
    EXPECT_THAT(message, Not(HasSubstr(absl::StatusCodeToString(id.status().code()))));
  }
  auto alloc = pair.ca->Alloc(4096, std::string(1 << 20, 'x'));
  ASSERT_FALSE(alloc.ok());
  EXPECT_LT(alloc.status().message().size(), 300u);
}

TEST(AgentLifecycleTest, HelloRefusesAnotherProtocolVersionNamingBoth) {
  Pair pair;
  ASSERT_TRUE(pair.Start().ok());
  auto peer = ferry::v1::Peer::NewStub(
      PeerChannelAs(pair.dir, pair.a->peer_address(), "node-a", "old-node"));
  grpc::ClientContext ctx;
  ferry::v1::HelloRequest hello;
  hello.set_node("old-node");
  hello.set_protocol_version(99);
  ferry::v1::HelloResponse welcome;
  grpc::Status s = peer->Hello(&ctx, hello, &welcome);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("'old-node' speaks peer protocol 99"));
  EXPECT_THAT(s.error_message(),
              HasSubstr(absl::StrCat("node-a speaks ", server::kPeerProtocolVersion)));
}

TEST(AgentLifecycleTest, SighupAppliesWhatItCanAndNamesWhatNeedsARestart) {
  std::string dir = MakeTempDir();
  auto agent = AgentProcess::Start({"node-a", dir, 0, {}, ""});
  ASSERT_TRUE(agent.ok()) << agent.status();
  auto c = Client::Connect((*agent)->socket());
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->SetPolicy({{"gdr", "never"}}).ok());
  {
    std::ofstream out((*agent)->config_path(), std::ios::app);
    out << "peers:\n  node-c: 127.0.0.1:9\n"
        << "host_pool:\n  size: 512MiB\n"
        << "log:\n  level: debug\n"
        << "limits:\n  max_op_bytes: 1MiB\n"
        << "policy:\n  gdr_max_path: PXB\n";
  }
  kill((*agent)->pid(), SIGHUP);
  const std::string log = (*agent)->log_path();
  EXPECT_TRUE(WaitForText(log, "SIGHUP: peers: peer node-c added", absl::Seconds(10)))
      << ReadFile(log);
  EXPECT_TRUE(WaitForText(log, "SIGHUP: host_pool.size: changed in the file; needs a restart",
                          absl::Seconds(5)));
  EXPECT_TRUE(WaitForText(log, "SIGHUP: log.level: info -> debug", absl::Seconds(5)));
  auto info = (*c)->GetInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_THAT(std::vector<std::string>(info->peers().begin(), info->peers().end()),
              ::testing::Contains("node-c"));
  EXPECT_EQ(info->host_pool_bytes(), 1ull << 30) << "the pool keeps its size until a restart";
  // The run-time setting stays on top of the reloaded file's policy.
  auto policy = (*c)->GetPolicy();
  ASSERT_TRUE(policy.ok());
  EXPECT_EQ(policy->gdr(), "never");
  EXPECT_EQ(policy->gdr_max_path(), "PXB");
  ASSERT_EQ(policy->overrides_size(), 1);
  EXPECT_EQ(policy->overrides(0).key(), "gdr");
  // ferryctl shows which keys the run-time settings hold, and reset drops them.
  std::string out;
  EXPECT_EQ(
      RunCommand({FERRY_FERRYCTL, "--socket", (*agent)->socket(), "policy", "get"}, dir, &out), 0);
  EXPECT_THAT(out, HasSubstr("run-time       gdr=never (over the config file"));
  EXPECT_EQ(
      RunCommand({FERRY_FERRYCTL, "--socket", (*agent)->socket(), "policy", "reset"}, dir, &out), 0)
      << out;
  policy = (*c)->GetPolicy();
  ASSERT_TRUE(policy.ok());
  EXPECT_EQ(policy->gdr(), "auto") << "the file's again";
  EXPECT_EQ(policy->gdr_max_path(), "PXB");
  EXPECT_EQ(policy->overrides_size(), 0);
  // The reloaded limit holds for new Submits.
  auto big = (*c)->Alloc(2 << 20, "self-target");
  ASSERT_TRUE(big.ok());
  auto id =
      (*c)->Submit({{ferry::v1::WRITE, (*big)->id(), 0, "node-a", "self-target", 0, 2 << 20}});
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument) << id.status();
  c->reset();
  agent->reset();
  std::system(("rm -rf " + dir).c_str());
}

TEST(AgentLifecycleTest, SighupPeersAreTheTensorServicesPeersToo) {
  // Tensors once kept a peer map of their own, fixed at start: a reloaded peer was known to
  // transfers but "unknown" to Recv, and a removed one stayed reachable for tensors.
  std::string dir = MakeTempDir();
  auto agent = AgentProcess::Start({"node-a", dir, 0, {}, ""});
  ASSERT_TRUE(agent.ok()) << agent.status();
  auto tensors = TensorClient::Connect((*agent)->socket());
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  CallOptions briefly;
  briefly.timeout = absl::Milliseconds(200);
  auto got = (*tensors)->Recv("node-c", "t", {}, briefly);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound) << got.status();
  EXPECT_THAT(got.status().message(), HasSubstr("peer: unknown node 'node-c'"));

  const std::string original = ReadFile((*agent)->config_path());
  {
    std::ofstream out((*agent)->config_path(), std::ios::app);
    out << "peers:\n  node-c: 127.0.0.1:9\n";
  }
  kill((*agent)->pid(), SIGHUP);
  const std::string log = (*agent)->log_path();
  ASSERT_TRUE(WaitForText(log, "SIGHUP: peers: peer node-c added", absl::Seconds(10)))
      << ReadFile(log);
  // Known now: the receive waits for a send, and its deadline ends it.
  got = (*tensors)->Recv("node-c", "t", {}, briefly);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded) << got.status();

  {
    std::ofstream out((*agent)->config_path(), std::ios::trunc);
    out << original;
  }
  kill((*agent)->pid(), SIGHUP);
  ASSERT_TRUE(WaitForText(log, "SIGHUP: peers: peer node-c removed", absl::Seconds(10)))
      << ReadFile(log);
  got = (*tensors)->Recv("node-c", "t", {}, briefly);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound) << got.status();
  EXPECT_THAT(got.status().message(), HasSubstr("peer: unknown node 'node-c'"));
  tensors->reset();
  agent->reset();
  std::system(("rm -rf " + dir).c_str());
}

TEST(AgentLifecycleTest, FlagsAreCheckedLikeTheFileAndBothBinariesAnswerHelpAndVersion) {
  std::string dir = MakeTempDir();
  std::string out;
  for (const char* binary : {FERRY_FERRYD, FERRY_FERRYCTL}) {
    EXPECT_EQ(RunCommand({binary, "--help"}, dir, &out), 0) << binary << ": " << out;
    EXPECT_THAT(out, HasSubstr("usage:"));
    EXPECT_EQ(RunCommand({binary, "--version"}, dir, &out), 0) << binary << ": " << out;
    EXPECT_THAT(out, HasSubstr("0."));
  }
  EXPECT_EQ(RunCommand({FERRY_FERRYD, "--bogus"}, dir, &out), 2);
  EXPECT_THAT(out, HasSubstr("unknown flag '--bogus'"));
  EXPECT_EQ(RunCommand({FERRY_FERRYD, "--log-level", "loud"}, dir, &out), 2);
  EXPECT_THAT(out, HasSubstr("--log-level: 'loud' is not one of"));
  EXPECT_EQ(RunCommand({FERRY_FERRYCTL, "--bogus", "info"}, dir, &out), 2);
  EXPECT_THAT(out, HasSubstr("unknown option --bogus"));

  // A relative socket path, from where the agent starts.
  auto port = PickFreePort();
  ASSERT_TRUE(port.ok());
  auto pid =
      SpawnChild({"/bin/sh", "-c",
                  absl::StrCat("cd ", dir, " && exec ", FERRY_FERRYD,
                               " --node rel --socket rel.sock --peer-listen 127.0.0.1:", *port)},
                 dir + "/rel.log");
  ASSERT_TRUE(pid.ok());
  bool served = false;
  for (int i = 0; i < 200 && !served; ++i) {
    auto c = Client::Connect(dir + "/rel.sock", absl::Milliseconds(200));
    served = c.ok() && (*c)->GetInfo().ok();
    if (!served) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(served) << ReadFile(dir + "/rel.log");
  EXPECT_EQ(
      RunCommand({"/bin/sh", "-c",
                  absl::StrCat("cd ", dir, " && ", FERRY_FERRYCTL, " --socket rel.sock info")},
                 dir, &out),
      0)
      << out;
  kill(*pid, SIGTERM);
  EXPECT_EQ(WaitExit(*pid), 0);
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace ferry
