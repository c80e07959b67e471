// Small transfers over the agent's transfer socket (server/api/transfer_socket.h,
// client/socket_line.h) between two real agents: threads sharing a connection each get their
// own answers, refusals included; Client::Run takes the socket and the agent's count of its
// connections returns to zero when the client goes; an agent that stops answering gives
// DEADLINE_EXCEEDED at the caller's deadline, one that died UNAVAILABLE; and what a hostile
// local process sends (no hello, a frame too long, bytes that are not a request, requests
// it never reads the answers of) is refused by name or held back, while other clients go on.

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "base/frame.h"
#include "base/unique_fd.h"
#include "client/ferry_client.h"
#include "client/socket_line.h"
#include "ferry/v1/transfer_socket.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/accounting.h"
#include "tests/agent_pair.h"
#include "tests/shared_line_check.h"
#include "tests/socket_clients.h"
#include "tests/stop_process.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kBlock = 4096;
constexpr absl::Duration kTimeout = absl::Seconds(60);

std::string TransferSocketOf(Client& client) {
  auto info = client.GetInfo();
  EXPECT_TRUE(info.ok()) << info.status();
  return info.ok() ? info->transfer_socket() : "";
}


// A raw connection to the transfer socket, as a process that is not libferry would open it.
UniqueFd RawConnect(const std::string& path) {
  sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  EXPECT_EQ(connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0)
      << strerror(errno);
  return fd;
}

void SendAll(int fd, const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    ASSERT_GT(n, 0) << strerror(errno);
    sent += static_cast<size_t>(n);
  }
}

std::string Framed(const google::protobuf::MessageLite& message) {
  std::string out;
  AppendFrameHeader(static_cast<uint32_t>(message.ByteSizeLong()), &out);
  message.AppendToString(&out);
  return out;
}

// Reads frames until the agent closes the connection (or 10 s pass); the answers in them.
std::vector<ferry::v1::StreamedResult> ReadUntilClosed(int fd) {
  std::string in;
  char buf[4096];
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    in.append(buf, static_cast<size_t>(n));
  }
  std::vector<ferry::v1::StreamedResult> answers;
  size_t at = 0;
  while (auto length = FrameLength(absl::string_view(in).substr(at))) {
    if (in.size() - at < kFrameHeaderBytes + *length) break;
    ferry::v1::StreamedResults results;
    EXPECT_TRUE(results.ParseFromArray(in.data() + at + kFrameHeaderBytes, *length));
    for (const auto& r : results.results()) answers.push_back(r);
    at += kFrameHeaderBytes + *length;
  }
  return answers;
}

// Two agents, a 1 MiB source on node-a, a target on node-b named `target`, one WRITE of
// `length` from the one to the other, and node-a's transfer socket.
struct OneWrite {
  Pair pair;
  std::string path;
  std::unique_ptr<Buffer> src, dst;
  OpSpec op;

  void Start(const std::string& target, uint64_t length) {
    ASSERT_TRUE(pair.Start().ok());
    path = TransferSocketOf(*pair.ca);
    auto s = pair.ca->Alloc(1 << 20);
    auto d = pair.cb->Alloc(1 << 20, target);
    ASSERT_TRUE(s.ok() && d.ok());
    src = *std::move(s);
    dst = *std::move(d);
    op = {ferry::v1::WRITE, src->id(), 0, "node-b", target, 0, length};
  }
};

// 6 threads on one connection, 100 one-block WRITEs each (tests/shared_line_check.h).
TEST(ClientSocketLineTest, ThreadsSharingAConnectionEachGetTheirOwnAnswer) {
  Pair pair;
  ASSERT_TRUE(pair.Start("host_pool:\n  size: 256MiB\n").ok());
  auto line = SocketLine::Connect(TransferSocketOf(*pair.ca));
  ASSERT_TRUE(line.ok()) << line.status();
  ExpectThreadsGetTheirOwnAnswers(pair, 6, 100, [&](const std::vector<OpSpec>& ops) {
    return (*line)->Run(ops, kTimeout, false, kTimeout);
  });
  EXPECT_FALSE((*line)->ended());
}

// Client::Run takes the socket (the agent counts the connection), a READ comes back with
// the bytes; with the socket turned off the same client's Run goes over gRPC and the
// connection is gone; a large batch takes a second connection of its own; when the clients
// are gone the agent's accounting and this count return to zero.
TEST(ClientSocketLineTest, RunTakesTheSocketAndItsConnectionEndsWithTheClient) {
  Pair pair;
  ASSERT_TRUE(pair.Start().ok());
  auto before = pair.ca->GetInfo();
  ASSERT_TRUE(before.ok());
  EXPECT_THAT(before->transfer_socket(), HasSubstr(".transfers"));
  EXPECT_EQ(before->transfer_socket_clients(), 0u);
  auto client = Client::Connect(pair.a->socket());
  ASSERT_TRUE(client.ok());
  auto src = (*client)->Alloc(1 << 20);
  auto back = (*client)->Alloc(1 << 20);
  auto dst = pair.cb->Alloc(1 << 20, "runs");
  ASSERT_TRUE(src.ok() && back.ok() && dst.ok());
  Fill(**src, 9);
  auto wrote = (*client)->Run({{ferry::v1::WRITE, (*src)->id(), 0, "node-b", "runs", 0, kBlock}});
  ASSERT_TRUE(wrote.ok()) << wrote.status();
  EXPECT_TRUE(TransferStatus(*wrote).ok());
  EXPECT_EQ(SocketClients(*pair.ca), 1u);
  auto read = (*client)->Run({{ferry::v1::READ, (*back)->id(), 0, "node-b", "runs", 0, kBlock}});
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(std::memcmp((*src)->data(), (*back)->data(), kBlock), 0);

  (*client)->set_use_transfer_socket(false);
  ExpectSocketClients(*pair.ca, 0);
  auto over_grpc =
      (*client)->Run({{ferry::v1::WRITE, (*src)->id(), kBlock, "node-b", "runs", 0, kBlock}});
  ASSERT_TRUE(over_grpc.ok()) << over_grpc.status();
  EXPECT_EQ(SocketClients(*pair.ca), 0u);
  (*client)->set_use_transfer_socket(true);
  ASSERT_TRUE((*client)->Run({{ferry::v1::WRITE, (*src)->id(), 0, "node-b", "runs", 0, kBlock}})
                  .ok());
  EXPECT_EQ(SocketClients(*pair.ca), 1u);
  // A batch past kLineOps goes over a connection of its own: 256 blocks of 4 KiB, reversed.
  Fill(**src, 10);
  std::vector<OpSpec> large;
  for (uint64_t i = 0; i < 256; ++i) {
    large.push_back({ferry::v1::WRITE, (*src)->id(), i * kBlock, "node-b", "runs",
                     (255 - i) * kBlock, kBlock});
  }
  auto bulk = (*client)->Run(large);
  ASSERT_TRUE(bulk.ok()) << bulk.status();
  EXPECT_EQ(bulk->bytes(), 256 * kBlock);
  EXPECT_EQ(SocketClients(*pair.ca), 2u);
  for (uint64_t i = 0; i < 256; ++i) {
    ASSERT_EQ(std::memcmp((*src)->data() + i * kBlock, (*dst)->data() + (255 - i) * kBlock,
                          kBlock),
              0)
        << "block " << i;
  }

  src->reset();
  back->reset();
  client->reset();
  ExpectSocketClients(*pair.ca, 0);
  pair.ca.reset();
  ExpectAccountingAtZero(pair.a->socket(), "node-a");
}

// An agent that stops answering (SIGSTOP): DEADLINE_EXCEEDED once the wait passed, not
// later, and the same connection carries the next transfer once the agent runs again.
// Then the agent dies: UNAVAILABLE at once, and the connection has ended.
TEST(ClientSocketLineTest, AStoppedAgentGivesDeadlineExceededAndADeadOneUnavailable) {
  OneWrite w;
  ASSERT_NO_FATAL_FAILURE(w.Start("paused", kBlock));
  Pair& pair = w.pair;
  const OpSpec& op = w.op;
  auto line = SocketLine::Connect(w.path);
  ASSERT_TRUE(line.ok()) << line.status();
  ASSERT_TRUE((*line)->Run({op}, kTimeout, false, kTimeout).result.ok());
  StopProcess(pair.a->pid());
  absl::Time start = absl::Now();
  SocketLine::Outcome stalled = (*line)->Run({op}, absl::Seconds(1), false, absl::Seconds(2));
  const absl::Duration took = absl::Now() - start;
  kill(pair.a->pid(), SIGCONT);
  EXPECT_EQ(stalled.result.status().code(), absl::StatusCode::kDeadlineExceeded)
      << stalled.result.status();
  EXPECT_TRUE(stalled.sent);
  EXPECT_GE(took, absl::Seconds(2));
  EXPECT_LT(took, absl::Seconds(10));
  SocketLine::Outcome after = (*line)->Run({op}, kTimeout, false, kTimeout);
  ASSERT_TRUE(after.result.ok()) << after.result.status();
  EXPECT_FALSE((*line)->ended());

  pair.a->Kill();
  start = absl::Now();
  SocketLine::Outcome dead = (*line)->Run({op}, absl::Seconds(30), false, absl::Seconds(35));
  EXPECT_EQ(dead.result.status().code(), absl::StatusCode::kUnavailable) << dead.result.status();
  EXPECT_TRUE((*line)->ended());
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

// What a local process that is not libferry may send: each refusal is one answer of tag 0,
// INVALID_ARGUMENT naming what was wrong, and the agent closes that connection; a request
// the engine refuses is answered with its tag and the connection stays. Transfers on
// another connection go on throughout.
TEST(ClientSocketLineTest, MalformedInputIsRefusedByNameAndTheConnectionCloses) {
  OneWrite w;
  ASSERT_NO_FATAL_FAILURE(w.Start("hostile", kBlock));
  Pair& pair = w.pair;
  const std::string& path = w.path;
  const OpSpec& op = w.op;

  struct Case {
    std::string name, bytes, message;
  };
  ferry::v1::StreamedTransfer request;
  request.set_tag(7);
  std::string too_long = kTransferSocketHello;
  AppendFrameHeader(kMaxFrameBytes + 1, &too_long);
  std::string garbage = kTransferSocketHello;
  AppendFrameHeader(5, &garbage);
  garbage += "\xff\xff\xff\xff\xff";
  const std::vector<Case> cases = {
      {"no hello", "GET / HTTP/1.1\r\n\r\n", "begins with \"ferryxf1\" or \"ferryxf2\""},
      {"a frame too long", too_long, "message 1 is 67108865 bytes; at most 67108864"},
      {"not a request", garbage, "message 1 (5 bytes) is not a ferry.v1.SocketRequest"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    UniqueFd fd = RawConnect(path);
    SendAll(fd.get(), c.bytes);
    std::vector<ferry::v1::StreamedResult> answers = ReadUntilClosed(fd.get());
    ASSERT_EQ(answers.size(), 1u);
    EXPECT_EQ(answers[0].tag(), 0u);
    EXPECT_EQ(answers[0].code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(answers[0].message(), HasSubstr(c.message));
    ASSERT_TRUE(pair.ca->Run({op}).ok());  // another connection, unharmed
  }

  // A request the engine refuses: answered by tag, and the connection carries the next one.
  UniqueFd fd = RawConnect(path);
  ferry::v1::StreamedTransfer bad;
  bad.set_tag(41);
  FillSubmitRequest({{ferry::v1::WRITE, w.src->id(), 0, "node-b", "hostile", 0, 0}},
                    absl::Seconds(10), bad.mutable_transfer()->mutable_submit());
  // A transfer and a block move in one request: which is it? Refused, nothing started.
  ferry::v1::SocketRequest both;
  both.set_tag(43);
  FillSubmitRequest({op}, absl::Seconds(10), both.mutable_transfer()->mutable_submit());
  both.mutable_move()->set_session(pair.ca->session().id());
  ferry::v1::StreamedTransfer good;
  good.set_tag(42);
  FillSubmitRequest({op}, absl::Seconds(10), good.mutable_transfer()->mutable_submit());
  SendAll(fd.get(), std::string(kTransferSocketHello) + Framed(bad) + Framed(both) + Framed(good));
  shutdown(fd.get(), SHUT_WR);  // the agent closes once it read the end
  std::vector<ferry::v1::StreamedResult> answers = ReadUntilClosed(fd.get());
  ASSERT_EQ(answers.size(), 3u);
  EXPECT_EQ(answers[0].tag(), 41u);
  EXPECT_THAT(answers[0].message(), HasSubstr("ops[0].length"));
  EXPECT_EQ(answers[1].tag(), 43u);
  EXPECT_EQ(answers[1].code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(answers[1].message(), HasSubstr("a transfer, a move or a poll, only one"));
  EXPECT_EQ(answers[2].tag(), 42u);
  EXPECT_EQ(answers[2].code(), 0) << answers[2].message();
  fd = UniqueFd();
  ExpectSocketClients(*pair.ca, 1);  // Client::Run's own connection only
  w.src.reset();
  pair.ca.reset();
  ExpectAccountingAtZero(pair.a->socket(), "node-a");
}

// A client whose uid holds its limit of connections already (TransferSocket::
// kMaxConnectionsPerUid) learns it at connect, and its transfers go over gRPC; once there is
// room (and its second of waiting passed) they take the socket again.
TEST(ClientSocketLineTest, AClientPastItsUidsConnectionsTransfersOverGrpc) {
  OneWrite w;
  ASSERT_NO_FATAL_FAILURE(w.Start("crowded", kBlock));
  Pair& pair = w.pair;
  constexpr uint64_t kPerUid = 128;  // TransferSocket::kMaxConnectionsPerUid
  std::vector<std::unique_ptr<SocketLine>> lines;
  for (uint64_t i = 0; i < kPerUid; ++i) {
    auto line = SocketLine::Connect(w.path);
    ASSERT_TRUE(line.ok()) << i << ": " << line.status();
    lines.push_back(*std::move(line));
  }
  ExpectSocketClients(*pair.ca, kPerUid);
  ASSERT_TRUE(pair.ca->Run({w.op}).ok());
  EXPECT_EQ(SocketClients(*pair.ca), kPerUid);  // its own connect was refused
  lines.clear();
  ExpectSocketClients(*pair.ca, 0);
  absl::SleepFor(absl::Seconds(1));  // Client::kSocketRetry
  ASSERT_TRUE(pair.ca->Run({w.op}).ok());
  EXPECT_EQ(SocketClients(*pair.ca), 1u);
  w.src.reset();
  pair.ca.reset();
  ExpectAccountingAtZero(pair.a->socket(), "node-a");
}

// A process whose transfers do not end (their target is stopped) and that sends more: the
// agent stops reading it at its window (kStreamWindow), so its sends block, and the socket's
// thread answers another client meanwhile. When it goes, its connection is counted out and
// its transfers end with the target's return.
TEST(ClientSocketLineTest, AClientPastItsWindowHoldsOnlyItsOwnConnection) {
  OneWrite w;
  ASSERT_NO_FATAL_FAILURE(w.Start("stalled", 64));
  Pair& pair = w.pair;
  const std::string& path = w.path;
  const OpSpec& op = w.op;
  ASSERT_TRUE(pair.ca->Run({op}).ok());  // node-b's buffer is known: no request may block
  StopProcess(pair.b->pid());
  UniqueFd fd = RawConnect(path);
  SendAll(fd.get(), kTransferSocketHello);
  std::string requests;
  // About 1.8 MB: past what the agent reads ahead (256 KiB) and the kernel's buffers hold.
  constexpr uint64_t kRequests = 40000;
  for (uint64_t tag = 1; tag <= kRequests; ++tag) {
    ferry::v1::StreamedTransfer r;
    r.set_tag(tag);
    FillSubmitRequest({op}, absl::Seconds(30), r.mutable_transfer()->mutable_submit());
    requests += Framed(r);
  }
  // Non-blocking: how much the agent took before it stopped reading.
  size_t sent = 0;
  for (int idle = 0; sent < requests.size() && idle < 20;) {
    const ssize_t n = send(fd.get(), requests.data() + sent, requests.size() - sent,
                           MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      idle = 0;
      continue;
    }
    ASSERT_EQ(errno, EAGAIN) << strerror(errno);
    ++idle;
    absl::SleepFor(absl::Milliseconds(50));  // for the agent to read more, if it will
  }
  EXPECT_LT(sent, requests.size()) << "the agent read every request while none was answered";
  // Another client's request, refused by the engine at once: the thread is not held.
  auto refused = pair.ca->Run({{ferry::v1::WRITE, w.src->id(), 0, "node-b", "stalled", 0, 0}});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  ExpectSocketClients(*pair.ca, 2);
  fd = UniqueFd();
  ExpectSocketClients(*pair.ca, 1);
  kill(pair.b->pid(), SIGCONT);
  ASSERT_TRUE(pair.ca->Run({op}).ok());
  w.src.reset();
  pair.ca.reset();
  ExpectAccountingAtZero(pair.a->socket(), "node-a");
}

}  // namespace
}  // namespace ferry
