// A TensorClient's calls on gRPC's callback API end before the client does: going with
// calls in flight cancels them and waits for them, so that the channel's last reference is
// never dropped on one of gRPC's callback threads. That used to abort the process ("assertion
// failed: prior > 0" in grpc_cq_internal_unref) about one run in ten of
// examples/disagg_prefill_decode.py, whose prefill closes its notification stream just
// before its client goes.

#include <dirent.h>
#include <stdlib.h>

#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/agent_process.h"
#include "client/tensor_client.h"
#include "gtest/gtest.h"
#include "tests/accounting.h"
#include "tests/agent_pair.h"

namespace ferry {
namespace {

// Threads of this process serving gRPC's callback queue (CallbackAlternativeCQ, named
// "nexting_thread"): they exist while a channel that made callback calls does, and the last
// such channel joins them as it goes.
int CallbackThreads() {
  int n = 0;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return -1;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream comm(absl::StrCat("/proc/self/task/", e->d_name, "/comm"));
    std::string name;
    std::getline(comm, name);
    n += name == "nexting_thread";
  }
  closedir(d);
  return n;
}

// Polls until there are callback threads (`some`) or none: a thread names itself once it
// runs, and a joined one leaves /proc a moment after its join returned. False after 5 s.
bool CallbackThreadsAre(bool some) {
  absl::Time deadline = absl::Now() + absl::Seconds(5);
  while ((CallbackThreads() > 0) != some) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

class TensorClientLifetimeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = MakeTempDir();
    AgentSpec spec;
    spec.node = "node-a";
    spec.dir = dir_;
    spec.extra_yaml = "host_pool:\n  size: 64MiB\n";
    auto agent = AgentProcess::Start(spec);
    ASSERT_TRUE(agent.ok()) << agent.status();
    agent_ = *std::move(agent);
  }
  static void TearDownTestSuite() {
    agent_.reset();
    if (!dir_.empty()) std::system(("rm -rf " + dir_).c_str());
  }

  static std::unique_ptr<TensorClient> Connect() {
    auto c = TensorClient::Connect(agent_->socket(), absl::Seconds(5));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  static inline std::string dir_;
  static inline std::unique_ptr<AgentProcess> agent_;
};

TEST_F(TensorClientLifetimeTest, ACallInFlightIsCancelledAndEndedBeforeTheClientIsGone) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  // Shared with the callback, which may run after a failed assertion returned.
  struct Ended {
    absl::Notification done;
    absl::Status status;
  };
  auto ended = std::make_shared<Ended>();
  CallOptions options;
  options.timeout = absl::Seconds(60);  // far longer than the test: only cancelling ends it
  client->WaitNotificationAsync("never-sent", "", options,
                                [ended](absl::StatusOr<ferry::v1::Notification> r) {
                                  ended->status = r.status();
                                  ended->done.Notify();
                                });
  absl::SleepFor(absl::Milliseconds(200));  // the call reaches the agent and waits there
  ASSERT_FALSE(ended->done.HasBeenNotified());
  client.reset();
  // The client waited for the call's end: its callback has run, with CANCELLED.
  ASSERT_TRUE(ended->done.HasBeenNotified());
  EXPECT_TRUE(CallbackThreadsAre(false)) << CallbackThreads();
  EXPECT_EQ(ended->status.code(), absl::StatusCode::kCancelled) << ended->status;
  ExpectAccountingAtZero(agent_->socket(), "node-a");
}

// What the example did, many times over: the notification stream closed, and at once its
// client goes. Each time gRPC's callback threads are gone once the client is: the channel
// went on this thread, which joined them, not on one of them.
TEST_F(TensorClientLifetimeTest, AClientGoingRightAfterItsNotificationReaderNeverAborts) {
  for (int i = 0; i < 100; ++i) {
    auto client = Connect();
    ASSERT_NE(client, nullptr);
    auto reader = client->OpenNotificationReader(absl::StrCat("round-", i), absl::Seconds(60));
    ASSERT_TRUE(CallbackThreadsAre(true)) << "round " << i;
    if (i % 2 == 1) {
      auto first = reader->WaitUntil(absl::Now() + absl::Milliseconds(1));
      EXPECT_FALSE(first) << "nothing was sent";
    }
    reader.reset();  // cancels the stream; gRPC ends it on one of its threads
    client.reset();
    ASSERT_TRUE(CallbackThreadsAre(false)) << "round " << i << ": " << CallbackThreads();
  }
  ExpectAccountingAtZero(agent_->socket(), "node-a");
}

// A reader kept past its client still ends cleanly: the client cancelled the stream.
TEST_F(TensorClientLifetimeTest, AReaderKeptPastItsClientReportsTheStreamCancelled) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  auto reader = client->OpenNotificationReader("kept-", absl::Seconds(60));
  client.reset();
  ASSERT_TRUE(reader->WaitUntil(absl::Now() + absl::Seconds(5)));
  auto next = reader->Next();
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.status().code(), absl::StatusCode::kCancelled) << next.status();
  reader.reset();
  ExpectAccountingAtZero(agent_->socket(), "node-a");
}

}  // namespace
}  // namespace ferry
