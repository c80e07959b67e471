// libferry after its agent restarted, as a program sees it (<ferry/ferry_client.h> only,
// linked to libferry.so): the agent is killed (SIGKILL) while a Client holds buffers, a
// registration and a notification waiting for it, and a new agent starts on the same socket.
// Every call of the old Client then answers UNAVAILABLE at once, saying the agent went away
// (which run, when it started), that what the Client held is gone and to Connect again;
// connected() is false; a Buffer still mapped can be touched and destroyed; and a new Client
// works. The test starts and stops its agents itself, by pid: $FERRYD is the agent to run.
#include <fcntl.h>
#include <ferry/ferry_client.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

using ::testing::HasSubstr;

constexpr uint64_t kSize = 64 << 10;

// A free TCP port on loopback, for the agent's peer listener (a transfer to the agent's own
// node dials it).
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) close(fd);
    return 0;
  }
  close(fd);
  return ntohs(addr.sin_port);
}

// One ferryd run in the test's folder (socket `dir`/ferryd.sock, log `dir`/ferryd.log), alone,
// with a small pool; stopped by pid when it goes. The child dies with the test if the test
// dies first (PR_SET_PDEATHSIG), so no agent outlives a crash.
class Agent {
 public:
  Agent(std::string ferryd, std::string dir)
      : ferryd_(std::move(ferryd)), dir_(std::move(dir)), socket_(dir_ + "/ferryd.sock") {}
  ~Agent() { Stop(SIGTERM); }

  const std::string& socket() const { return socket_; }

  // Starts it and waits until it opens a session; the Client on that session.
  std::unique_ptr<ferry::Client> Start() {
    const std::string listen = "127.0.0.1:" + std::to_string(FreePort());
    const std::string log = dir_ + "/ferryd.log";
    // Everything the child needs is made before fork: a multithreaded process (gRPC's
    // threads are running by the restart) may call only async-signal-safe functions there.
    const int log_fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) {
      ADD_FAILURE() << "open(" << log << "): " << std::strerror(errno);
      return nullptr;
    }
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      dup2(log_fd, STDOUT_FILENO);  // dup2 clears O_CLOEXEC on the copies
      dup2(log_fd, STDERR_FILENO);
      execl(ferryd_.c_str(), ferryd_.c_str(), "--node", "sdk-restart", "--socket", socket_.c_str(),
            "--peer-listen", listen.c_str(), "--host-pool", "64MiB", static_cast<char*>(nullptr));
      _exit(127);
    }
    close(log_fd);
    if (pid_ < 0) {
      ADD_FAILURE() << "fork: " << std::strerror(errno);
      return nullptr;
    }
    // The killed run's socket file may still be there: wait for an agent that answers.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      auto client = ferry::Client::Connect(socket_, absl::Seconds(1));
      if (client.ok()) return std::move(*client);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::ifstream in(log);
    std::cerr << in.rdbuf();
    ADD_FAILURE() << "ferryd (pid " << pid_ << ") did not open a session within 20 s";
    return nullptr;
  }

  // Ends it with `signal` (SIGKILL: no drain, no cleanup, as a crash) and waits for it.
  void Stop(int signal) {
    if (pid_ <= 0) return;
    kill(pid_, signal);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  std::string ferryd_;
  std::string dir_;
  std::string socket_;
  pid_t pid_ = -1;
};

class SdkRestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* ferryd = std::getenv("FERRYD");
    ASSERT_NE(ferryd, nullptr) << "set $FERRYD to the ferryd to run";
    char dir[] = "/tmp/ferry-sdk-restart.XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    agent_ = std::make_unique<Agent>(ferryd, dir_);
  }
  void TearDown() override {
    agent_.reset();
    std::string rm = "rm -rf '" + dir_ + "'";
    if (!dir_.empty() && std::system(rm.c_str()) != 0) std::cerr << "could not " << rm << "\n";
  }

  std::string dir_;
  std::unique_ptr<Agent> agent_;
};

// Shared memory of the test's own (a memfd mapped MAP_SHARED), to register.
struct OwnMemory {
  OwnMemory() {
    fd = memfd_create("sdk-restart-own", MFD_CLOEXEC);
    if (fd >= 0 && ftruncate(fd, kSize) == 0) {
      void* p = mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) data = static_cast<char*>(p);
    }
  }
  ~OwnMemory() {
    if (data != nullptr) munmap(data, kSize);
    if (fd >= 0) close(fd);
  }
  int fd = -1;
  char* data = nullptr;
};

TEST_F(SdkRestartTest, EveryCallAfterARestartSaysSoAndANewClientWorks) {
  std::unique_ptr<ferry::Client> client = agent_->Start();
  ASSERT_NE(client, nullptr);
  EXPECT_TRUE(client->connected());
  auto info = client->GetInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  const std::string node = info->node;

  // What the old session holds: a named buffer, a source, a registration, a transfer, and a
  // notification delivered to this node that nobody took.
  ferry::AllocOptions named;
  named.name = "sdk-restart-kv";
  auto target = client->Alloc(kSize, named);
  ASSERT_TRUE(target.ok()) << target.status();
  auto source = client->Alloc(kSize);
  ASSERT_TRUE(source.ok()) << source.status();
  std::memset((*source)->data(), 0x5a, kSize);
  OwnMemory own;
  ASSERT_NE(own.data, nullptr);
  auto reg = client->RegisterMemory(own.data, kSize, "sdk-restart-own");
  ASSERT_TRUE(reg.ok()) << reg.status();
  ASSERT_TRUE(client->Write(**source, 0, node, "sdk-restart-kv", 0, kSize).ok());
  auto submitted = client->Submit(
      {{ferry::OpType::kWrite, (*source)->id(), 0, node, "sdk-restart-kv", 0, 4096}});
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  ASSERT_TRUE(client->Wait(*submitted, absl::Seconds(10)).ok());
  auto written = client->WriteBlocks((*source)->id(), node, "sdk-restart-kv", {{0, 0, 4096}},
                                     "sdk-restart/pending");
  ASSERT_TRUE(written.ok()) << written.status();

  agent_->Stop(SIGKILL);
  std::unique_ptr<ferry::Client> probe = agent_->Start();  // the new run, same socket
  ASSERT_NE(probe, nullptr);
  probe.reset();

  EXPECT_FALSE(client->connected());
  const ferry::Buffer& buf = **source;
  const uint64_t reg_id = reg->buffer.id;
  const std::vector<ferry::Op> ops = {
      {ferry::OpType::kWrite, buf.id(), 0, node, "sdk-restart-kv", 0, 4096}};
  const std::vector<std::pair<std::string, std::function<absl::Status()>>> calls = {
      {"GetInfo", [&] { return client->GetInfo().status(); }},
      {"Alloc", [&] { return client->Alloc(kSize).status(); }},
      {"Free", [&] { return client->Free(buf.id()); }},
      {"ListBuffers", [&] { return client->ListBuffers().status(); }},
      {"StatRemoteBuffer",
       [&] { return client->StatRemoteBuffer(node, "sdk-restart-kv").status(); }},
      {"RegisterMemory", [&] { return client->RegisterMemory(own.data, kSize).status(); }},
      {"RegisterFd", [&] { return client->RegisterFd(own.fd, 0, kSize).status(); }},
      {"DeregisterMemory", [&] { return client->DeregisterMemory(reg_id); }},
      {"Write", [&] { return client->Write(buf, 0, node, "sdk-restart-kv", 0, 4096); }},
      {"Read", [&] { return client->Read(buf, 0, node, "sdk-restart-kv", 0, 4096); }},
      {"Run", [&] { return client->Run(ops).status(); }},
      {"Submit", [&] { return client->Submit(ops).status(); }},
      {"Wait", [&] { return client->Wait(*submitted, absl::Seconds(30)).status(); }},
      {"Poll", [&] { return client->Poll(*submitted).status(); }},
      {"Cancel", [&] { return client->Cancel(*submitted).status(); }},
      {"WriteBlocks",
       [&] {
         return client->WriteBlocks(buf.id(), node, "sdk-restart-kv", {{0, 0, 4096}}, "n").status();
       }},
      {"WaitNotification",
       [&] {
         return client->WaitNotification("sdk-restart/pending", "", absl::Seconds(30)).status();
       }},
      {"PollNotifications", [&] { return client->PollNotifications("sdk-restart/").status(); }},
      {"GetPolicy", [&] { return client->GetPolicy().status(); }},
      {"SetPolicy",
       [&] {
         return client->SetPolicy({{"gdr", "never"}}).status();
       }},
  };
  for (const auto& [name, call] : calls) {
    const auto start = std::chrono::steady_clock::now();
    const absl::Status status = call();
    const auto took = std::chrono::steady_clock::now() - start;
    const std::string message(status.message());
    std::cout << name << " (" << std::chrono::duration<double, std::milli>(took).count()
              << " ms) -> " << status << "\n";
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << name << ": " << status;
    EXPECT_THAT(message, HasSubstr("went away")) << name;
    EXPECT_THAT(message, ::testing::ContainsRegex("incarnation [0-9a-f]+, started 20")) << name;
    EXPECT_THAT(message, HasSubstr("buffers, registrations and notifications")) << name;
    EXPECT_THAT(message, HasSubstr("Connect again")) << name;
    // Answered here, not after a round trip to an agent that may not answer.
    EXPECT_LT(took, std::chrono::milliseconds(500)) << name << " waited";
  }
  EXPECT_FALSE(client->connected());

  // The old buffers stay mapped memory: touched and destroyed without a fault. They are no
  // longer shared with any agent.
  (*source)->data()[0] = 1;
  (*target)->data()[kSize - 1] = 2;
  EXPECT_EQ((*source)->data()[1], 0x5a);
  source->reset();
  target->reset();
  client.reset();

  // A new Client works on the new run, which knows nothing of the old session.
  auto again = ferry::Client::Connect(agent_->socket());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE((*again)->connected());
  auto fresh = (*again)->Alloc(kSize, named);  // the name is free again
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  auto new_source = (*again)->Alloc(kSize);
  ASSERT_TRUE(new_source.ok()) << new_source.status();
  std::memset((*new_source)->data(), 0x33, kSize);
  auto new_reg = (*again)->RegisterMemory(own.data, kSize, "sdk-restart-own");
  ASSERT_TRUE(new_reg.ok()) << new_reg.status();
  auto pending = (*again)->PollNotifications("sdk-restart/");
  ASSERT_TRUE(pending.ok()) << pending.status();
  EXPECT_TRUE(pending->empty()) << "the old run's notification came back";
  ASSERT_TRUE((*again)->Write(**new_source, 0, node, "sdk-restart-kv", 0, kSize).ok());
  EXPECT_EQ((*fresh)->data()[kSize - 1], 0x33);
  auto blocks = (*again)->WriteBlocks((*new_source)->id(), node, "sdk-restart-kv", {{0, 0, 4096}},
                                      "sdk-restart/new");
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  auto note = (*again)->WaitNotification("sdk-restart/new", node, absl::Seconds(10));
  ASSERT_TRUE(note.ok()) << note.status();
  EXPECT_EQ(note->bytes, 4096u);
  auto buffers = (*again)->ListBuffers();
  ASSERT_TRUE(buffers.ok()) << buffers.status();
  EXPECT_EQ(buffers->size(), 3u) << "the new session's two buffers and one registration";
  EXPECT_TRUE((*again)->connected());
}

// An agent that does not come back: once the client heard that its connection closed, calls
// answer at once (no wait for an agent that is not there, WaitNotification's 60 s included).
TEST_F(SdkRestartTest, AnAgentThatDidNotComeBackIsAnsweredAtOnce) {
  std::unique_ptr<ferry::Client> client = agent_->Start();
  ASSERT_NE(client, nullptr);
  auto buf = client->Alloc(kSize);
  ASSERT_TRUE(buf.ok()) << buf.status();

  agent_->Stop(SIGKILL);
  // gRPC tells the client on its own thread that the connection closed; wait for that.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (client->connected() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_FALSE(client->connected()) << "the client did not hear that its agent went away";

  const auto start = std::chrono::steady_clock::now();
  auto note = client->WaitNotification("never", "", absl::Seconds(60));
  auto info = client->GetInfo();
  const auto took = std::chrono::steady_clock::now() - start;
  for (const absl::Status& status : {note.status(), info.status()}) {
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr("went away")) << status;
  }
  EXPECT_LT(took, std::chrono::milliseconds(500));
  std::memset((*buf)->data(), 7, kSize);  // still this process's memory
  buf->reset();
}

}  // namespace
