// Tagged Send/Recv, KV-block batches and notifications between two real ferryd processes:
// ordering, concurrency, large tensors, dtypes and shapes, cancellation, deadlines and bad
// input. Every failure must come back as a clear status and leave the data untouched.

#include <stdlib.h>

#include <atomic>
#include <cstring>
#include <future>
#include <numeric>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/agent_process.h"
#include "tests/accounting.h"
#include "client/ferry_client.h"
#include "client/tensor_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/tensors/tensor_meta.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;
using v1::DType;

void Fill(char* p, uint64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  for (uint64_t i = 0; i < n; ++i) p[i] = static_cast<char>(rng());
}

struct Node {
  std::unique_ptr<AgentProcess> agent;
  std::unique_ptr<Client> client;
  std::unique_ptr<TensorClient> tensors;
};

class TensorIntegrationTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/ferry-tensor-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = new std::string(tmpl);
    auto pa = PickFreePort();
    auto pb = PickFreePort();
    ASSERT_TRUE(pa.ok() && pb.ok());
    const std::string extra = "host_pool:\n  size: 1GiB\n";
    a_ = new Node();
    b_ = new Node();
    auto spec = [&](const std::string& node, uint16_t port, const std::string& peer,
                    uint16_t peer_port) {
      AgentSpec s;
      s.node = node;
      s.dir = *dir_;
      s.peer_port = port;
      s.peers[peer] = absl::StrFormat("127.0.0.1:%d", peer_port);
      s.extra_yaml = extra;
      return s;
    };
    auto sa = AgentProcess::Start(spec("node-a", *pa, "node-b", *pb));
    ASSERT_TRUE(sa.ok()) << sa.status();
    a_->agent = std::move(*sa);
    auto sb = AgentProcess::Start(spec("node-b", *pb, "node-a", *pa));
    ASSERT_TRUE(sb.ok()) << sb.status();
    b_->agent = std::move(*sb);
    for (Node* n : {a_, b_}) {
      // One session for both, as the Python binding has: landing buffers are the client's.
      auto session = AgentSession::Open(n->agent->socket(), absl::Seconds(5), "tensor test");
      ASSERT_TRUE(session.ok()) << session.status();
      n->client = std::make_unique<Client>(*session);
      n->tensors = std::make_unique<TensorClient>(*session);
    }
  }
  static void TearDownTestSuite() {
    for (Node* n : {a_, b_}) {
      if (n == nullptr) continue;
      n->client.reset();
      n->tensors.reset();
      if (n->agent) {
        ExpectAccountingAtZero(n->agent->socket(), n->agent->node());
        n->agent->Stop();
      }
      delete n;
    }
    a_ = b_ = nullptr;
    if (dir_) std::system(("rm -rf " + *dir_).c_str());
    delete dir_;
  }

  static CallOptions Timeout(absl::Duration d) {
    CallOptions o;
    o.timeout = d;
    return o;
  }
  static uint64_t PoolUsed(Node* n) {
    auto info = n->client->GetInfo();
    EXPECT_TRUE(info.ok());
    return info.ok() ? info->host_pool_used_bytes() : 0;
  }
  // Nothing of this test is left pending on either agent.
  static void ExpectNothingPending() {
    for (Node* n : {a_, b_}) {
      auto p = n->tensors->ListPending();
      ASSERT_TRUE(p.ok());
      EXPECT_EQ(p->sends_size() + p->recvs_size() + p->arrived_size(), 0) << p->DebugString();
    }
  }

  static std::string* dir_;
  static Node* a_;
  static Node* b_;
};
std::string* TensorIntegrationTest::dir_ = nullptr;
Node* TensorIntegrationTest::a_ = nullptr;
Node* TensorIntegrationTest::b_ = nullptr;

TEST_F(TensorIntegrationTest, RecvPostedBeforeSend) {
  auto src = a_->client->Alloc(4096 * 4);
  ASSERT_TRUE(src.ok());
  Fill((*src)->data(), (*src)->size(), 1);
  auto recv = std::async(std::launch::async, [] { return b_->tensors->Recv("node-a", "before"); });
  absl::SleepFor(absl::Milliseconds(200));  // the receive is posted and waiting
  auto sent = a_->tensors->Send((*src)->id(), 0, MakeMeta(v1::DTYPE_FLOAT32, {64, 64}, "before"),
                                "node-b");
  ASSERT_TRUE(sent.ok()) << sent.status();
  EXPECT_EQ(sent->bytes(), 4096u * 4);
  auto got = recv.get();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->meta.dtype(), v1::DTYPE_FLOAT32);
  EXPECT_THAT(got->meta.shape(), ::testing::ElementsAre(64, 64));
  EXPECT_EQ(got->meta.tag(), "before");
  EXPECT_TRUE(got->allocated);
  ASSERT_EQ(got->bytes, (*src)->size());
  EXPECT_EQ(0, std::memcmp(got->data(), (*src)->data(), got->bytes));
  EXPECT_TRUE(b_->client->Free(got->buffer->id()).ok());
  EXPECT_TRUE(a_->client->Free((*src)->id()).ok());
  ExpectNothingPending();
}

TEST_F(TensorIntegrationTest, SendPostedBeforeRecvIntoNamedBufferAtOffset) {
  auto src = a_->client->Alloc(1000 * 8);
  auto dst = b_->client->Alloc(1 << 20, "landing-after");
  ASSERT_TRUE(src.ok() && dst.ok());
  Fill((*src)->data(), (*src)->size(), 2);
  std::memset((*dst)->data(), 0x5a, (*dst)->size());
  auto send = std::async(std::launch::async, [&] {
    return a_->tensors->Send((*src)->id(), 0, MakeMeta(v1::DTYPE_INT64, {1000}, "after"), "node-b");
  });
  absl::SleepFor(absl::Milliseconds(300));  // the offer waits at node-b
  auto pending = b_->tensors->ListPending();
  ASSERT_TRUE(pending.ok());
  ASSERT_EQ(pending->arrived_size(), 1);
  EXPECT_EQ(pending->arrived(0).tag(), "after");
  RecvOptions into;
  into.buffer = (*dst)->id();
  into.offset = 4096;
  auto got = b_->tensors->Recv("node-a", "after", into);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(send.get().ok());
  EXPECT_FALSE(got->allocated);
  EXPECT_EQ(got->offset, 4096u);
  EXPECT_EQ(0, std::memcmp((*dst)->data() + 4096, (*src)->data(), 8000));
  // Bytes around the landing range are untouched.
  EXPECT_EQ((*dst)->data()[4095], 0x5a);
  EXPECT_EQ((*dst)->data()[4096 + 8000], 0x5a);
  EXPECT_TRUE(b_->client->Free((*dst)->id()).ok());
  EXPECT_TRUE(a_->client->Free((*src)->id()).ok());
  ExpectNothingPending();
}

TEST_F(TensorIntegrationTest, ManyConcurrentTagsEachLandWhereTheyBelong) {
  constexpr int kTags = 32;
  constexpr uint64_t kBytes = 64 << 10;
  auto src = a_->client->Alloc(kTags * kBytes);
  ASSERT_TRUE(src.ok());
  Fill((*src)->data(), (*src)->size(), 3);
  std::vector<std::future<absl::StatusOr<ReceivedTensor>>> recvs;
  std::vector<std::future<absl::StatusOr<v1::SendResponse>>> sends;
  // Half the receives first, then every send in reverse order, then the rest.
  for (int i = 0; i < kTags / 2; ++i) {
    recvs.push_back(std::async(std::launch::async, [i] {
      return b_->tensors->Recv("node-a", absl::StrCat("t", i));
    }));
  }
  for (int i = kTags - 1; i >= 0; --i) {
    sends.push_back(std::async(std::launch::async, [&, i] {
      return a_->tensors->Send((*src)->id(), i * kBytes,
                               MakeMeta(v1::DTYPE_UINT8, {static_cast<int64_t>(kBytes)},
                                        absl::StrCat("t", i)),
                               "node-b");
    }));
  }
  for (int i = kTags / 2; i < kTags; ++i) {
    recvs.push_back(std::async(std::launch::async, [i] {
      return b_->tensors->Recv("node-a", absl::StrCat("t", i));
    }));
  }
  for (auto& s : sends) {
    auto r = s.get();
    EXPECT_TRUE(r.ok()) << r.status();
  }
  for (int i = 0; i < kTags; ++i) {
    auto got = recvs[i].get();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->meta.tag(), absl::StrCat("t", i));
    EXPECT_EQ(0, std::memcmp(got->data(), (*src)->data() + i * kBytes, kBytes)) << "tag t" << i;
    EXPECT_TRUE(b_->client->Free(got->buffer->id()).ok());
  }
  EXPECT_TRUE(a_->client->Free((*src)->id()).ok());
  ExpectNothingPending();
}

TEST_F(TensorIntegrationTest, LargeTensor256MiB) {
  constexpr uint64_t kBytes = 256ull << 20;
  auto src = a_->client->Alloc(kBytes);
  ASSERT_TRUE(src.ok()) << src.status();
  Fill((*src)->data(), kBytes, 4);
  auto recv = std::async(std::launch::async, [] { return b_->tensors->Recv("node-a", "big"); });
  auto sent = a_->tensors->Send((*src)->id(), 0,
                                MakeMeta(v1::DTYPE_BFLOAT16, {8192, 16384}, "big"), "node-b");
  ASSERT_TRUE(sent.ok()) << sent.status();
  auto got = recv.get();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->bytes, kBytes);
  EXPECT_EQ(0, std::memcmp(got->data(), (*src)->data(), kBytes));
  EXPECT_TRUE(b_->client->Free(got->buffer->id()).ok());
  EXPECT_TRUE(a_->client->Free((*src)->id()).ok());
}

TEST_F(TensorIntegrationTest, EveryDtypeAndShapeRoundTrips) {
  struct Case {
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<int64_t> strides;
  };
  std::vector<Case> cases = {
      {v1::DTYPE_FLOAT32, {3, 5}, {}},         {v1::DTYPE_FLOAT16, {7}, {}},
      {v1::DTYPE_BFLOAT16, {2, 3, 4}, {}},     {v1::DTYPE_INT8, {17}, {}},
      {v1::DTYPE_UINT8, {1, 1, 1, 9}, {}},     {v1::DTYPE_INT32, {4, 4}, {1, 4}},  // transposed
      {v1::DTYPE_INT64, {}, {}},               // a scalar
      {v1::DTYPE_FLOAT8_E4M3FN, {8, 2}, {}},   {v1::DTYPE_FLOAT8_E5M2, {5}, {}},
      {v1::DTYPE_FLOAT64, {2, 2}, {4, 1}},     // rows of a wider matrix
      {v1::DTYPE_INT16, {6}, {}},              {v1::DTYPE_BOOL, {10}, {}},
  };
  auto src = a_->client->Alloc(1 << 16);
  ASSERT_TRUE(src.ok());
  Fill((*src)->data(), (*src)->size(), 5);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    std::string tag = absl::StrCat("dtype-", i);
    auto meta = MakeMeta(c.dtype, c.shape, tag, c.strides);
    auto span = tensors::TensorSpanBytes(meta, "meta");
    ASSERT_TRUE(span.ok());
    auto recv = std::async(std::launch::async, [&] { return b_->tensors->Recv("node-a", tag); });
    auto sent = a_->tensors->Send((*src)->id(), 128, meta, "node-b");
    ASSERT_TRUE(sent.ok()) << tensors::DescribeTensor(meta) << ": " << sent.status();
    auto got = recv.get();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->meta.dtype(), c.dtype) << tag;
    EXPECT_THAT(got->meta.shape(), ::testing::ElementsAreArray(c.shape)) << tag;
    EXPECT_THAT(got->meta.strides(), ::testing::ElementsAreArray(c.strides)) << tag;
    EXPECT_EQ(got->meta.device(), "host");
    ASSERT_EQ(got->bytes, *span) << tag;
    EXPECT_EQ(0, std::memcmp(got->data(), (*src)->data() + 128, *span)) << tag;
    EXPECT_TRUE(b_->client->Free(got->buffer->id()).ok());
  }
  // A zero-element tensor needs no bytes and no landing buffer.
  auto recv = std::async(std::launch::async, [] { return b_->tensors->Recv("node-a", "empty"); });
  ASSERT_TRUE(
      a_->tensors->Send((*src)->id(), 0, MakeMeta(v1::DTYPE_FLOAT32, {0, 4}, "empty"), "node-b")
          .ok());
  auto got = recv.get();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->bytes, 0u);
  EXPECT_EQ(got->buffer, nullptr);
  EXPECT_THAT(got->meta.shape(), ::testing::ElementsAre(0, 4));
  EXPECT_TRUE(a_->client->Free((*src)->id()).ok());
  ExpectNothingPending();
}

TEST_F(TensorIntegrationTest, NotificationArrivesOnlyAfterTheLastBlock) {
  constexpr int kLayers = 4;
  constexpr int kBlocks = 512;
  constexpr uint64_t kBlock = 16 << 10;
  auto kv_src = a_->client->Alloc(kBlocks * kBlock);
  auto kv_dst = b_->client->Alloc(2 * kBlocks * kBlock, "kv-notify");
  ASSERT_TRUE(kv_src.ok() && kv_dst.ok());
  // Nothing was written yet, so there is nothing to take.
  auto early = b_->tensors->WaitNotification("req-1/layer-0", "", Timeout(absl::Milliseconds(200)));
  EXPECT_EQ(early.status().code(), absl::StatusCode::kDeadlineExceeded) << early.status();
  for (int layer = 0; layer < kLayers; ++layer) {
    Fill((*kv_src)->data(), (*kv_src)->size(), 100 + layer);
    std::vector<BlockSpec> blocks;
    for (int i = 0; i < kBlocks; ++i) {
      // Scattered: block i goes to slot 2*(kBlocks-1-i).
      blocks.push_back({i * kBlock, 2 * (kBlocks - 1 - i) * kBlock, kBlock});
    }
    std::string name = absl::StrCat("req-1/layer-", layer);
    // The receiver waits first and checks every block the moment it is told.
    auto checker = std::async(std::launch::async, [&, name] {
      auto n = b_->tensors->WaitNotification(name, "node-a");
      if (!n.ok()) return n.status();
      for (const auto& b : blocks) {
        if (std::memcmp((*kv_dst)->data() + b.remote_offset, (*kv_src)->data() + b.local_offset,
                        b.length) != 0) {
          return absl::DataLossError(absl::StrCat(name, ": block at ", b.remote_offset,
                                                  " had not landed when notified"));
        }
      }
      if (n->blocks() != kBlocks || n->bytes() != kBlocks * kBlock) {
        return absl::InternalError(n->DebugString());
      }
      return absl::OkStatus();
    });
    auto w = a_->tensors->WriteBlocks((*kv_src)->id(), "node-b", "kv-notify", blocks, name);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(w->bytes(), kBlocks * kBlock);
    absl::Status checked = checker.get();
    EXPECT_TRUE(checked.ok()) << checked;
  }
  // A notification waits on the board when nobody waits yet; a stream takes it.
  ASSERT_TRUE(a_->tensors->WriteBlocks((*kv_src)->id(), "node-b", "kv-notify",
                                       {{0, 0, kBlock}}, "req-2/layer-0").ok());
  auto stream = b_->tensors->OpenNotifications("req-2/", absl::Seconds(5), 1);
  auto n = stream->Next();
  ASSERT_TRUE(n.ok() && n->has_value()) << n.status();
  EXPECT_EQ((*n)->name(), "req-2/layer-0");
  EXPECT_EQ((*n)->from_node(), "node-a");
  EXPECT_TRUE(a_->client->Free((*kv_src)->id()).ok());
  EXPECT_TRUE(b_->client->Free((*kv_dst)->id()).ok());
}

// Issue 46: a poll takes every pending notification at once (over gRPC and over the
// transfer socket alike), each with the payload its WriteBlocks gave; a wait with timeout 0
// polls; a payload over 4096 bytes is refused naming the field, and nothing is written.
TEST_F(TensorIntegrationTest, PollsTakeEveryPendingNotificationWithItsPayloadAtOnce) {
  auto src = a_->client->Alloc(4096);
  auto dst = b_->client->Alloc(4096, "kv-poll");
  ASSERT_TRUE(src.ok() && dst.ok());
  const absl::Time start = absl::Now();
  auto empty = b_->tensors->PollNotifications("poll/");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->notifications_size(), 0);
  auto none = b_->tensors->WaitNotification("poll/0", "", Timeout(absl::ZeroDuration()));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kDeadlineExceeded) << none.status();
  EXPECT_THAT(none.status().message(), HasSubstr("a poll does not wait"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));  // a timeout of 0 was 60 s

  for (int i = 0; i < 4; ++i) {
    auto w = a_->tensors->WriteBlocks((*src)->id(), "node-b", "kv-poll", {{0, 0, 4096}},
                                      absl::StrCat("poll/", i), {}, std::string(i * 1000, 'a' + i));
    ASSERT_TRUE(w.ok()) << w.status();
  }
  auto zero = b_->tensors->WaitNotification("poll/0", "", Timeout(absl::ZeroDuration()));
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_EQ(zero->payload(), "");
  auto on_socket = b_->client->PollOnSocket([] {
    v1::PollNotificationsRequest r;
    r.set_prefix("poll/");
    r.set_max_count(2);
    return r;
  }());
  ASSERT_TRUE(on_socket.has_value()) << "the agent's transfer socket answers no polls";
  ASSERT_TRUE(on_socket->ok()) << on_socket->status();
  ASSERT_EQ((*on_socket)->notifications_size(), 2);
  EXPECT_TRUE((*on_socket)->more());
  EXPECT_EQ((*on_socket)->notifications(0).name(), "poll/1");
  EXPECT_EQ((*on_socket)->notifications(0).payload(), std::string(1000, 'b'));
  EXPECT_EQ((*on_socket)->notifications(1).payload(), std::string(2000, 'c'));
  EXPECT_EQ((*on_socket)->notifications(1).from_node(), "node-a");
  EXPECT_EQ((*on_socket)->notifications(1).buffer(), "kv-poll");
  auto rest = b_->tensors->PollNotifications("poll/");
  ASSERT_TRUE(rest.ok()) << rest.status();
  ASSERT_EQ(rest->notifications_size(), 1);
  EXPECT_EQ(rest->notifications(0).payload(), std::string(3000, 'd'));
  EXPECT_FALSE(rest->more());

  auto big = a_->tensors->WriteBlocks((*src)->id(), "node-b", "kv-poll", {{0, 0, 4096}},
                                      "poll/big", {}, std::string(4097, 'x'));
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument) << big.status();
  EXPECT_THAT(big.status().message(), HasSubstr("notification_payload: 4097 bytes"));
  auto after = b_->tensors->PollNotifications("poll/");
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->notifications_size(), 0);
  EXPECT_TRUE(a_->client->Free((*src)->id()).ok());
  EXPECT_TRUE(b_->client->Free((*dst)->id()).ok());
}

TEST_F(TensorIntegrationTest, CancelledSendIsWithdrawnFromThePeer) {
  auto src = a_->client->Alloc(4096);
  ASSERT_TRUE(src.ok());
  const uint64_t used_b = PoolUsed(b_);
  auto canceller = std::make_shared<CallCanceller>();
  CallOptions options;
  options.canceller = canceller;
  auto send = std::async(std::launch::async, [&] {
    return a_->tensors->Send((*src)->id(), 0, MakeMeta(v1::DTYPE_FLOAT32, {1024}, "cancel-me"),
                             "node-b", options);
  });
  absl::SleepFor(absl::Milliseconds(300));
  auto pending = b_->tensors->ListPending();
  ASSERT_TRUE(pending.ok());
  ASSERT_EQ(pending->arrived_size(), 1);  // node-b holds the offer
  canceller->Cancel();
  auto sent = send.get();
  EXPECT_EQ(sent.status().code(), absl::StatusCode::kCancelled) << sent.status();
  // node-b learns: the offer is withdrawn within the sender's poll interval.
  absl::Time until = absl::Now() + absl::Seconds(5);
  while (absl::Now() < until) {
    pending = b_->tensors->ListPending();
    if (pending.ok() && pending->arrived_size() == 0) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(pending->arrived_size(), 0) << pending->DebugString();
  // A receive posted now does not get the cancelled tensor.
  auto late = b_->tensors->Recv("node-a", "cancel-me", {}, Timeout(absl::Milliseconds(300)));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded) << late.status();
  EXPECT_EQ(PoolUsed(b_), used_b);
  // The tag is free again.
  auto recv =
      std::async(std::launch::async, [] { return b_->tensors->Recv("node-a", "cancel-me"); });
  EXPECT_TRUE(
      a_->tensors->Send((*src)->id(), 0, MakeMeta(v1::DTYPE_FLOAT32, {1024}, "cancel-me"), "node-b")
          .ok());
  auto got = recv.get();
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(b_->client->Free(got->buffer->id()).ok());
  EXPECT_TRUE(a_->client->Free((*src)->id()).ok());
  ExpectNothingPending();
}

TEST_F(TensorIntegrationTest, CancelledRecvReleasesItsTagAndMatchesNothing) {
  auto recv =
      std::async(std::launch::async, [] { return b_->tensors->Recv("node-a", "recv-cancel"); });
  absl::SleepFor(absl::Milliseconds(200));
  auto cancelled = b_->tensors->Cancel("node-a", "recv-cancel");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->recvs(), 1u);
  auto got = recv.get();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kCancelled) << got.status();
  EXPECT_THAT(got.status().message(), HasSubstr("recv-cancel"));
  // A send now finds no receive: it waits and runs into its deadline.
  auto src = a_->client->Alloc(64);
  ASSERT_TRUE(src.ok());
  auto sent = a_->tensors->Send((*src)->id(), 0, MakeMeta(v1::DTYPE_UINT8, {64}, "recv-cancel"),
                                "node-b", Timeout(absl::Milliseconds(400)));
  EXPECT_EQ(sent.status().code(), absl::StatusCode::kDeadlineExceeded) << sent.status();
  EXPECT_THAT(sent.status().message(), HasSubstr("no matching receive"));
  EXPECT_EQ(b_->tensors->Cancel("node-a", "nothing-here").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(a_->client->Free((*src)->id()).ok());
  ExpectNothingPending();
}

TEST_F(TensorIntegrationTest, DeadlinesEndWaitsWithClearMessages) {
  absl::Time start = absl::Now();
  auto got = b_->tensors->Recv("node-a", "never", {}, Timeout(absl::Milliseconds(300)));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(got.status().message(), HasSubstr("no matching send arrived"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  auto n = b_->tensors->WaitNotification("never", "", Timeout(absl::Milliseconds(200)));
  EXPECT_EQ(n.status().code(), absl::StatusCode::kDeadlineExceeded);
  ExpectNothingPending();
}

TEST_F(TensorIntegrationTest, BadInputIsRefusedAndCorruptsNothing) {
  auto src = a_->client->Alloc(4096);
  auto small = b_->client->Alloc(1024, "too-small");
  ASSERT_TRUE(src.ok() && small.ok());
  Fill((*src)->data(), 4096, 6);
  std::memset((*small)->data(), 0x11, 1024);

  // Unknown dtype.
  auto meta = MakeMeta(static_cast<DType>(99), {4}, "bad-dtype");
  auto s = a_->tensors->Send((*src)->id(), 0, meta, "node-b");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("meta.dtype"));
  EXPECT_EQ(tensors::ParseDType("float128").status().code(), absl::StatusCode::kInvalidArgument);
  // Shape larger than the buffer holds.
  s = a_->tensors->Send((*src)->id(), 0, MakeMeta(v1::DTYPE_FLOAT32, {2048}, "too-big"), "node-b");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(s.status().message(), HasSubstr("meta.shape"));
  EXPECT_THAT(s.status().message(), HasSubstr("needs 8192 bytes"));
  // Strides that do not match the rank; a negative dimension.
  s = a_->tensors->Send((*src)->id(), 0, MakeMeta(v1::DTYPE_FLOAT32, {2, 2}, "st", {1}), "node-b");
  EXPECT_THAT(s.status().message(), HasSubstr("meta.strides"));
  s = a_->tensors->Send((*src)->id(), 0, MakeMeta(v1::DTYPE_FLOAT32, {-2}, "neg"), "node-b");
  EXPECT_THAT(s.status().message(), HasSubstr("meta.shape[0]"));
  // A device the buffer is not on, or that does not parse.
  s = a_->tensors->Send((*src)->id(), 0, MakeMeta(v1::DTYPE_FLOAT32, {4}, "dev", {}, "cuda:0"),
                        "node-b");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("meta.device: 'cuda:0' but buffer"));
  s = a_->tensors->Send((*src)->id(), 0, MakeMeta(v1::DTYPE_FLOAT32, {4}, "dev", {}, "tpu"),
                        "node-b");
  EXPECT_THAT(s.status().message(), HasSubstr("meta.device"));
  // Unknown peer, missing tag.
  s = a_->tensors->Send((*src)->id(), 0, MakeMeta(v1::DTYPE_FLOAT32, {4}, "x"), "node-z");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  s = a_->tensors->Send((*src)->id(), 0, MakeMeta(v1::DTYPE_FLOAT32, {4}, ""), "node-b");
  EXPECT_THAT(s.status().message(), HasSubstr("meta.tag"));

  // Tag reuse while pending: a second send and a second receive of the same tag.
  auto first = std::async(std::launch::async, [&] {
    return a_->tensors->Send((*src)->id(), 0, MakeMeta(v1::DTYPE_UINT8, {16}, "dup"), "node-b",
                             Timeout(absl::Seconds(10)));
  });
  absl::SleepFor(absl::Milliseconds(200));
  s = a_->tensors->Send((*src)->id(), 0, MakeMeta(v1::DTYPE_UINT8, {16}, "dup"), "node-b");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(s.status().message(), HasSubstr("'dup'"));
  auto r1 = std::async(std::launch::async, [] {
    return b_->tensors->Recv("node-a", "dup-recv", {}, Timeout(absl::Seconds(10)));
  });
  absl::SleepFor(absl::Milliseconds(200));
  auto r2 = b_->tensors->Recv("node-a", "dup-recv", {}, Timeout(absl::Seconds(1)));
  EXPECT_EQ(r2.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(b_->tensors->Cancel("node-a", "dup-recv").ok());
  EXPECT_EQ(r1.get().status().code(), absl::StatusCode::kCancelled);
  auto got = b_->tensors->Recv("node-a", "dup");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(first.get().ok());
  EXPECT_TRUE(b_->client->Free(got->buffer->id()).ok());

  // The receiver's buffer is too small: both sides fail, the buffer is untouched.
  RecvOptions into;
  into.buffer = (*small)->id();
  auto recv =
      std::async(std::launch::async, [&] { return b_->tensors->Recv("node-a", "small", into); });
  absl::SleepFor(absl::Milliseconds(100));
  s = a_->tensors->Send((*src)->id(), 0, MakeMeta(v1::DTYPE_FLOAT32, {1024}, "small"), "node-b");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kOutOfRange) << s.status();
  EXPECT_THAT(s.status().message(), HasSubstr("1024 bytes of room"));
  auto r = recv.get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kOutOfRange) << r.status();
  // Dtype / shape the receiver did not expect: both sides fail.
  RecvOptions expect;
  expect.expect = MakeMeta(v1::DTYPE_FLOAT16, {4}, "");
  recv =
      std::async(std::launch::async, [&] { return b_->tensors->Recv("node-a", "expect", expect); });
  absl::SleepFor(absl::Milliseconds(100));
  s = a_->tensors->Send((*src)->id(), 0, MakeMeta(v1::DTYPE_FLOAT32, {4}, "expect"), "node-b");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("meta.dtype"));
  EXPECT_THAT(recv.get().status().message(), HasSubstr("expects float16"));
  expect.expect = MakeMeta(v1::DTYPE_FLOAT32, {2, 2}, "");
  recv =
      std::async(std::launch::async, [&] { return b_->tensors->Recv("node-a", "expect", expect); });
  absl::SleepFor(absl::Milliseconds(100));
  s = a_->tensors->Send((*src)->id(), 0, MakeMeta(v1::DTYPE_FLOAT32, {4}, "expect"), "node-b");
  EXPECT_THAT(s.status().message(), HasSubstr("meta.shape"));
  EXPECT_EQ(recv.get().status().code(), absl::StatusCode::kInvalidArgument);
  // A receive into an unexported (unnamed) buffer is refused up front.
  auto unnamed = b_->client->Alloc(4096);
  ASSERT_TRUE(unnamed.ok());
  into.buffer = (*unnamed)->id();
  EXPECT_EQ(b_->tensors->Recv("node-a", "u", into).status().code(),
            absl::StatusCode::kFailedPrecondition);

  // KV blocks past the end of the remote buffer: refused, and the waiting side learns.
  auto w = a_->tensors->WriteBlocks((*src)->id(), "node-b", "too-small",
                                    {{0, 0, 512}, {512, 768, 512}}, "bad-batch");
  EXPECT_EQ(w.status().code(), absl::StatusCode::kOutOfRange) << w.status();
  EXPECT_THAT(w.status().message(), HasSubstr("blocks[1].remote_offset"));
  auto n = b_->tensors->WaitNotification("bad-batch", "", Timeout(absl::Seconds(2)));
  EXPECT_EQ(n.status().code(), absl::StatusCode::kOutOfRange) << n.status();
  EXPECT_THAT(n.status().message(), HasSubstr("did not land"));
  w = a_->tensors->WriteBlocks((*src)->id(), "node-b", "no-such-buffer", {{0, 0, 8}}, "");
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(a_->tensors->WriteBlocks((*src)->id(), "node-b", "too-small", {}, "").status().code(),
            absl::StatusCode::kInvalidArgument);

  // Nothing of it reached the small buffer.
  for (int i = 0; i < 1024; ++i) ASSERT_EQ((*small)->data()[i], 0x11) << i;
  EXPECT_TRUE(b_->client->Free((*small)->id()).ok());
  EXPECT_TRUE(b_->client->Free((*unnamed)->id()).ok());
  EXPECT_TRUE(a_->client->Free((*src)->id()).ok());
  ExpectNothingPending();
}

}  // namespace
}  // namespace ferry
