// The transfer socket (server/api/transfer_socket.h) and its client (client/socket_line.h) in one
// process, over calls that stand in for the engine: answers come on other threads, as the
// engine's do, some requests start on the starters (may_block), some are refused. Each
// caller gets its own answer, the caller's uid reaches the calls, and the connection count,
// answers after Stop and a stream's end of writing behave; block moves share connections,
// and one uid's connections are limited.
// In the TSan suite: the socket's thread, the starters, the answering threads and the
// client's readers all meet here.

#include <pthread.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/frame.h"
#include "base/unique_fd.h"
#include "base/worker_pool.h"
#include "client/socket_line.h"
#include "client/stream_wire.h"
#include "client/transfer_stream.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/api/transfer_socket.h"

namespace ferry::server {
namespace {

using ::testing::HasSubstr;

// A directory of the test's own for the socket, removed with it.
struct SocketDir {
  SocketDir() {
    char dir[] = "/tmp/ferry-socket-XXXXXX";
    EXPECT_NE(mkdtemp(dir), nullptr);
    path = dir;
  }
  ~SocketDir() { std::filesystem::remove_all(path); }
  std::string socket() const { return path + "/agent.sock.transfers"; }
  std::string path;
};

// Stands in for the engine: a length-0 op is refused, peer "slow" may block (so it starts
// on a starter), and every other transfer is answered on the `done` threads, with its bytes.
struct FakeEngine {
  // Declared first, so it goes last: a start still queued on the starters may answer here.
  WorkerPool done{3, "test-done"};
  WorkerPool starters{4, "test-start"};
  std::atomic<int> started{0};
  std::atomic<int> on_starters{0};
  std::atomic<int> misplaced{0};  // started inline though it should not have been, or not
  absl::Mutex mu;
  std::vector<uid_t> callers ABSL_GUARDED_BY(mu);

  // The calls the socket makes, handed to it as the agent's services hand theirs.
  struct Transfers final : TransferCalls {
    explicit Transfers(FakeEngine* engine) : engine(engine) {}
    absl::StatusOr<uint64_t> Start(const ferry::v1::TransferRequest& req,
                                   AnswerFn answer) const override {
      return engine->StartTransfer(req, std::move(answer));
    }
    std::optional<std::string> MayBlockOn(const ferry::v1::TransferRequest& req) const override {
      if (req.submit().targets_size() > 0 && req.submit().targets(0).peer() == "slow") {
        return "slow";
      }
      return std::nullopt;
    }
    FakeEngine* const engine;
  };
  struct Moves final : MoveCalls {
    explicit Moves(FakeEngine* engine) : engine(engine) {}
    absl::StatusOr<uint64_t> Start(const ferry::v1::SessionMove& move,
                                   AnswerFn answer) const override {
      return engine->StartMove(move, std::move(answer));
    }
    std::optional<std::string> MayBlockOn(const ferry::v1::SessionMove& move) const override {
      if (move.request().peer() == "slow") return "slow";
      return std::nullopt;
    }
    FakeEngine* const engine;
  };

  std::shared_ptr<const TransferCalls> CallsFor(const LocalCaller& caller) {
    {
      absl::MutexLock lock(&mu);
      callers.push_back(caller.uid);
    }
    return std::make_shared<Transfers>(this);
  }

  absl::StatusOr<uint64_t> StartTransfer(const ferry::v1::TransferRequest& req, AnswerFn answer) {
    uint64_t bytes = 0;
    for (int i = 0; i < req.submit().ops_size(); ++i) {
      if (req.submit().ops(i).length() == 0) {
        return absl::InvalidArgumentError(absl::StrCat("ops[", i, "].length: 0"));
      }
      bytes += req.submit().ops(i).length();
    }
    // Whether it started where the socket should have started it.
    char thread[16] = {};
    pthread_getname_np(pthread_self(), thread, sizeof(thread));
    const bool slow = req.submit().targets_size() > 0 && req.submit().targets(0).peer() == "slow";
    const bool on_starter = std::string(thread) == "test-start";
    if (on_starter) on_starters.fetch_add(1);
    if (on_starter != (slow || req.submit().ops_size() > TransferSocket::kInlineOps)) {
      misplaced.fetch_add(1);
    }
    const int id = started.fetch_add(1) + 1;
    done.Run([answer = std::move(answer), bytes, id] {
      ferry::v1::TransferResult result;
      result.set_transfer_id(id);
      result.set_state(ferry::v1::SUCCEEDED);
      result.set_bytes(bytes);
      answer(std::move(result));
    });
    return id;
  }

  // Block moves: session kSession is the caller's, any other refused; peer "slow" may block;
  // each pair is a 4 KiB block, answered on the `done` threads.
  static constexpr uint64_t kSession = 7;
  std::shared_ptr<const MoveCalls> MovesFor(const LocalCaller&) {
    return std::make_shared<Moves>(this);
  }

  absl::StatusOr<uint64_t> StartMove(const ferry::v1::SessionMove& move, AnswerFn answer) {
    if (move.session() != kSession) {
      return absl::PermissionDeniedError(
          absl::StrCat("move.session: session ", move.session(), " is not yours"));
    }
    char thread[16] = {};
    pthread_getname_np(pthread_self(), thread, sizeof(thread));
    const ferry::v1::MoveBlocksRequest& req = move.request();
    const bool should =
        req.peer() == "slow" || req.local_blocks_size() > TransferSocket::kInlineOps;
    const bool on_starter = std::string(thread) == "test-start";
    if (on_starter) on_starters.fetch_add(1);
    if (on_starter != should) misplaced.fetch_add(1);
    const int id = started.fetch_add(1) + 1;
    const uint64_t bytes = 4096ull * req.local_blocks_size();
    done.Run([answer = std::move(answer), bytes, id] {
      ferry::v1::TransferResult result;
      result.set_transfer_id(id);
      result.set_state(ferry::v1::SUCCEEDED);
      result.set_bytes(bytes);
      result.set_bytes_total(bytes);
      answer(std::move(result));
    });
    return id;
  }
};

// A transfer socket over a FakeEngine, in a directory of the test's own.
class TransferSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto started = TransferSocket::Start(
        path, 0600, static_cast<gid_t>(-1), &engine.starters,
        [this](const LocalCaller& caller) {
          return TransferSocket::Calls{engine.CallsFor(caller), engine.MovesFor(caller)};
        });
    ASSERT_TRUE(started.ok()) << started.status();
    socket = *std::move(started);
  }

  FakeEngine engine;
  SocketDir dir;
  const std::string path = dir.socket();
  std::unique_ptr<TransferSocket> socket;  // last: it goes first
};

void AwaitConnections(const TransferSocket& socket, size_t want) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (socket.connections() != want && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(socket.connections(), want);
}

// 4 threads on each of 2 connections, 200 transfers each: every 7th refused, every 5th on
// a peer that may block, every 11th a batch past kInlineOps (the last two start on the
// starters, the rest on the socket's thread). Each answer reaches its own caller with its
// own byte count.
TEST_F(TransferSocketTest, EveryCallerGetsItsOwnAnswerWhateverThreadAnswered) {
  std::vector<std::unique_ptr<SocketLine>> lines;
  for (int i = 0; i < 2; ++i) {
    auto line = SocketLine::Connect(path);
    ASSERT_TRUE(line.ok()) << line.status();
    lines.push_back(*std::move(line));
  }
  constexpr int kThreads = 8, kEach = 200;
  std::atomic<int> wrong{0}, refused{0}, moved{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      SocketLine& line = *lines[t % 2];
      for (int i = 0; i < kEach; ++i) {
        const uint64_t length = i % 7 == 6 ? 0 : 1 + t * 1000 + i;
        OpSpec op{ferry::v1::WRITE, 1, 0, i % 5 == 0 ? "slow" : "fast", "b", 0, length};
        // Every 11th a batch past kInlineOps, which starts on a starter too.
        const size_t ops = i % 11 == 3 ? TransferSocket::kInlineOps + 1 : 1;
        SocketLine::Outcome outcome = line.Run(std::vector<OpSpec>(ops, op), absl::Seconds(10),
                                               false, absl::Seconds(20));
        if (!outcome.sent) ++wrong;
        if (length == 0) {
          if (outcome.result.status().code() == absl::StatusCode::kInvalidArgument &&
              absl::StrContains(outcome.result.status().message(), "ops[0].length")) {
            ++refused;
          } else {
            ++wrong;
          }
        } else if (outcome.result.ok() && outcome.result->bytes() == ops * length) {
          ++moved;
        } else {
          ++wrong;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(refused.load(), kThreads * (kEach / 7));
  EXPECT_EQ(moved.load(), kThreads * (kEach - kEach / 7));
  EXPECT_GT(engine.on_starters.load(), 0);
  EXPECT_EQ(engine.misplaced.load(), 0);
  EXPECT_EQ(socket->connections(), 2u);
  {
    absl::MutexLock lock(&engine.mu);
    EXPECT_EQ(engine.callers, std::vector<uid_t>({getuid(), getuid()}));
  }
  lines.clear();
  AwaitConnections(*socket, 0);
}

// Block moves (SocketRequest.move) share a connection with transfers: each reaches the move
// calls with its session and pairs, starts where it should (peer "slow" and more than
// kInlineOps pairs on a starter), and is answered to its own caller; a move in a session the
// calls refuse gets that refusal by its tag.
TEST_F(TransferSocketTest, BlockMovesShareTheConnectionAndEachIsAnsweredToItsCaller) {
  auto line = SocketLine::Connect(path);
  ASSERT_TRUE(line.ok()) << line.status();
  constexpr int kThreads = 4, kEach = 100;
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        if (t == 0) {  // transfers between the moves
          OpSpec op{ferry::v1::WRITE, 1, 0, "fast", "b", 0, static_cast<uint64_t>(1 + i)};
          auto outcome = (*line)->Run({op}, absl::Seconds(10), false, absl::Seconds(20));
          if (!outcome.result.ok() || outcome.result->bytes() != 1u + i) ++wrong;
          continue;
        }
        ferry::v1::MoveBlocksRequest move;
        move.set_peer(i % 5 == 0 ? "slow" : "fast");
        const int pairs = i % 11 == 3 ? TransferSocket::kInlineOps + 1 : 1 + i % 3;
        for (int p = 0; p < pairs; ++p) {
          move.add_local_blocks(p);
          move.add_remote_blocks(p);
        }
        const uint64_t session = i % 13 == 12 ? FakeEngine::kSession + 1 : FakeEngine::kSession;
        auto outcome = (*line)->Move(session, move, absl::Seconds(20));
        if (!outcome.sent) ++wrong;
        if (session != FakeEngine::kSession) {
          if (outcome.result.status().code() != absl::StatusCode::kPermissionDenied ||
              !absl::StrContains(outcome.result.status().message(), "move.session")) {
            ++wrong;
          }
        } else if (!outcome.result.ok() || outcome.result->bytes_total() != 4096u * pairs) {
          ++wrong;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(engine.on_starters.load(), 0);
  EXPECT_EQ(engine.misplaced.load(), 0);
  line->reset();
  AwaitConnections(*socket, 0);
}

// One uid may hold kMaxConnectionsPerUid connections: libferry's next connect is refused
// at once, RESOURCE_EXHAUSTED naming the uid (it then uses gRPC), while those open go on;
// one closed makes room for the next.
TEST_F(TransferSocketTest, PastAUidsConnectionsTheConnectIsRefusedSayingSo) {
  constexpr size_t kPerUid = TransferSocket::kMaxConnectionsPerUid;
  std::vector<std::unique_ptr<SocketLine>> lines;
  for (size_t i = 0; i < kPerUid; ++i) {
    auto line = SocketLine::Connect(path);
    ASSERT_TRUE(line.ok()) << i << ": " << line.status();
    lines.push_back(*std::move(line));
  }
  auto refused = SocketLine::Connect(path);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_THAT(refused.status().message(),
              HasSubstr(absl::StrCat("uid ", getuid(), " has ", kPerUid,
                                     " connections open, at most ", kPerUid)));
  OpSpec op{ferry::v1::WRITE, 1, 0, "fast", "b", 0, 64};
  EXPECT_TRUE(lines.back()->Run({op}, absl::Seconds(10), false, absl::Seconds(20)).result.ok());
  EXPECT_EQ(socket->connections(), TransferSocket::kMaxConnectionsPerUid);
  lines.pop_back();
  AwaitConnections(*socket, TransferSocket::kMaxConnectionsPerUid - 1);
  auto next = SocketLine::Connect(path);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_TRUE((*next)->Run({op}, absl::Seconds(10), false, absl::Seconds(20)).result.ok());
}

// Issue 44 row 8: connections that each hold most of a 64 MiB frame (128 of them once held
// 8.4 GB for one uid). Together one uid's connections hold at most kMaxBufferedBytesPerUid:
// the one that would go past it is refused, naming the limit and the use, and closed; the
// others, and the socket, go on.
TEST_F(TransferSocketTest, OneUidsHalfSentFramesHoldAtMostItsBudget) {
  constexpr int kConnections = 5;
  constexpr uint32_t kFrame = kMaxFrameBytes - (4 << 20);  // 60 MiB, never finished
  constexpr size_t kSent = 56 << 20;                        // 5 x 56 MiB > 256 MiB
  static_assert(kConnections * kSent > TransferSocket::kMaxBufferedBytesPerUid);
  std::vector<UniqueFd> conns;
  for (int i = 0; i < kConnections; ++i) {
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un addr = {};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
    ASSERT_EQ(connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    std::string start(kTransferSocketHello, kTransferSocketHelloBytes);
    AppendFrameHeader(kFrame, &start);
    ASSERT_EQ(send(fd.get(), start.data(), start.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(start.size()));
    conns.push_back(std::move(fd));
  }
  std::atomic<int> cut_short{0};
  std::vector<std::thread> senders;
  const std::string chunk(1 << 20, 'z');
  for (int i = 0; i < kConnections; ++i) {
    senders.emplace_back([&, i] {
      for (size_t sent = 0; sent < kSent; sent += chunk.size()) {
        if (send(conns[i].get(), chunk.data(), chunk.size(), MSG_NOSIGNAL) < 0) {
          ++cut_short;  // refused and closed by the agent
          return;
        }
      }
    });
  }
  for (auto& t : senders) t.join();
  EXPECT_GE(cut_short.load(), 1) << "every connection buffered its 56 MiB";
  // The refused one was told why before it was closed.
  std::string told;
  for (UniqueFd& fd : conns) {
    char buf[4096];
    timeval tv = {0, 200000};
    setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ssize_t n = recv(fd.get(), buf, sizeof(buf), 0);
    if (n > 0) told.append(buf, static_cast<size_t>(n));
  }
  EXPECT_THAT(told, HasSubstr(absl::StrCat("at most ", TransferSocket::kMaxBufferedBytesPerUid,
                                           " a uid")));
  // The socket still serves.
  conns.clear();
  AwaitConnections(*socket, 0);
  auto line = SocketLine::Connect(path);
  ASSERT_TRUE(line.ok()) << line.status();
  OpSpec op{ferry::v1::WRITE, 1, 0, "fast", "b", 0, 64};
  EXPECT_TRUE((*line)->Run({op}, absl::Seconds(10), false, absl::Seconds(20)).result.ok());
}

// Transfers that end after Stop answer nobody, and nothing breaks: the connections hold
// what the answers need. A client whose agent stopped gets UNAVAILABLE, and the socket file
// is gone with the socket.
TEST_F(TransferSocketTest, AnswersAfterStopGoNowhereAndClientsSeeTheEnd) {
  auto line = SocketLine::Connect(path);
  ASSERT_TRUE(line.ok()) << line.status();
  OpSpec op{ferry::v1::WRITE, 1, 0, "fast", "b", 0, 64};
  ASSERT_TRUE((*line)->Run({op}, absl::Seconds(10), false, absl::Seconds(20)).result.ok());
  AwaitConnections(*socket, 1);
  socket.reset();  // Stop, then the file goes
  EXPECT_NE(access(path.c_str(), F_OK), 0);
  SocketLine::Outcome after = (*line)->Run({op}, absl::Seconds(1), false, absl::Seconds(5));
  EXPECT_EQ(after.result.status().code(), absl::StatusCode::kUnavailable)
      << after.result.status();
  EXPECT_TRUE((*line)->ended());
  EXPECT_FALSE(SocketLine::Connect(path).ok());
}

// A stream's connection (client/stream_wire.h): 1500 requests (more than the window of
// 1024; every 5th on a starter), then the client's end of writing. The agent answers every
// one of them, those it had not read yet included, then closes; the stream ends cleanly.
TEST_F(TransferSocketTest, AfterTheClientsEndOfWritingEveryRequestIsAnsweredThenItCloses) {
  auto wire = SocketStreamWire(path);
  ASSERT_TRUE(wire.ok()) << wire.status();
  TransferStream stream(*std::move(wire));
  constexpr int kRequests = 1500;
  std::thread sender([&] {
    for (int i = 0; i < kRequests; ++i) {
      OpSpec op{ferry::v1::WRITE, 1, 0, i % 5 == 0 ? "slow" : "fast", "b", 0,
                static_cast<uint64_t>(1 + i)};
      EXPECT_TRUE(stream.Send(i, {op}).ok());
    }
    EXPECT_TRUE(stream.CloseSend().ok());
  });
  std::vector<int> answered(kRequests, 0);
  int wrong = 0;
  absl::StatusOr<TransferStream::Answer> answer;
  for (answer = stream.Next(); answer.ok(); answer = stream.Next()) {
    const uint64_t tag = answer->tag;
    if (tag >= kRequests || !answer->result.ok() || answer->result->bytes() != 1 + tag) {
      ++wrong;
      continue;
    }
    ++answered[tag];
  }
  sender.join();
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kOutOfRange) << answer.status();
  EXPECT_TRUE(stream.Finish().ok()) << stream.Finish();
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(std::count(answered.begin(), answered.end(), 1), kRequests);
  EXPECT_GT(engine.on_starters.load(), 0);
  AwaitConnections(*socket, 0);  // closed by the agent, the stream still open here
}

}  // namespace
}  // namespace ferry::server
