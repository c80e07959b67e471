// TransferStream between two real agents, over the transfer socket and over a gRPC call:
// many transfers over one stream, each answered once with its tag; a refused request
// answered with the field named while the stream goes on; a client that hangs up mid-stream
// leaves nothing behind (Pair checks the accounting), and a socket's connection closes once
// its stream ended.

#include <cstring>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "client/ferry_client.h"
#include "client/transfer_stream.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent_pair.h"
#include "tests/socket_clients.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kBlock = 4096;

// Each test twice: over the agent's transfer socket (the stream a connection of its own to
// it), and over a TransferStream call with the socket off.
class AgentStreamTest : public SharedPairTest<AgentStreamTest>,
                        public ::testing::WithParamInterface<bool> {
 public:
  static constexpr char kYaml[] = "host_pool:\n  size: 256MiB\n";

 protected:
  bool OverSocket() const { return GetParam(); }
  // A stream the way this run of the test wants it; checks that it went that way.
  std::unique_ptr<TransferStream> Open() {
    A().set_use_transfer_socket(OverSocket());
    if (!OverSocket()) ExpectSocketClients(A(), 0);  // Run's connections closed
    clients_before_ = SocketClients(A());
    auto stream = A().OpenTransferStream();
    EXPECT_TRUE(stream.ok()) << stream.status();
    if (!stream.ok()) return nullptr;
    ExpectSocketClients(A(), clients_before_ + (OverSocket() ? 1 : 0));
    return *std::move(stream);
  }

  uint64_t clients_before_ = 0;
};

INSTANTIATE_TEST_SUITE_P(Wire, AgentStreamTest, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "TransferSocket" : "GrpcCall";
                         });

// 3000 one-block WRITEs, sent by one thread while another reads answers (more than the
// agent's window of 1024, which the agent's reading may reach and wait at): each tag is
// answered once, every transfer succeeded, and every block is where its op put it.
TEST_P(AgentStreamTest, ManyTransfersOverOneCallAreEachAnsweredOnceWithTheirTag) {
  constexpr int kTransfers = 3000;
  auto src = A().Alloc(kTransfers * kBlock);
  auto dst = B().Alloc(kTransfers * kBlock, "streamed");
  ASSERT_TRUE(src.ok() && dst.ok());
  Fill(**src, 7);
  auto stream = Open();
  ASSERT_NE(stream, nullptr);
  // EXPECT, not ASSERT, in here and in the loop below: either side giving up early would
  // leave the other blocked (no CloseSend) or a thread unjoined.
  std::thread sender([&] {
    for (int i = 0; i < kTransfers; ++i) {
      // Block i lands in slot kTransfers - 1 - i, tagged 1000 + i.
      const uint64_t slot = kTransfers - 1 - i;
      absl::Status sent = stream->Send(
          1000 + i, {{ferry::v1::WRITE, (*src)->id(), i * kBlock, "node-b", "streamed",
                      slot * kBlock, kBlock}});
      EXPECT_TRUE(sent.ok()) << sent;
      if (!sent.ok()) break;
    }
    EXPECT_TRUE(stream->CloseSend().ok());
  });
  absl::flat_hash_map<uint64_t, int> answered;
  uint64_t bytes = 0;
  while (true) {
    auto answer = stream->Next();
    if (!answer.ok()) {
      EXPECT_EQ(answer.status().code(), absl::StatusCode::kOutOfRange) << answer.status();
      break;
    }
    ++answered[answer->tag];
    EXPECT_TRUE(answer->result.ok()) << answer->tag << ": " << answer->result.status();
    if (!answer->result.ok()) continue;
    EXPECT_EQ(answer->result->state(), ferry::v1::SUCCEEDED) << answer->tag;
    EXPECT_NE(answer->result->transfer_id(), 0u);
    bytes += answer->result->bytes();
  }
  sender.join();
  EXPECT_TRUE(stream->Finish().ok());
  // Every answer read: the agent closed the socket's connection (its end of the stream).
  ExpectSocketClients(A(), clients_before_);
  ASSERT_EQ(answered.size(), kTransfers);
  for (int i = 0; i < kTransfers; ++i) EXPECT_EQ(answered[1000 + i], 1) << "tag " << 1000 + i;
  EXPECT_EQ(bytes, kTransfers * kBlock);
  for (int i = 0; i < kTransfers; ++i) {
    const uint64_t slot = kTransfers - 1 - i;
    ASSERT_EQ(0, std::memcmp((*src)->data() + i * kBlock, (*dst)->data() + slot * kBlock, kBlock))
        << "block " << i;
  }
  EXPECT_TRUE(A().Free((*src)->id()).ok());
  EXPECT_TRUE(B().Free((*dst)->id()).ok());
}

// A bad request is answered with the status Transfer would have returned, naming the
// field, and nothing moves; the requests around it run as if it had not been sent.
TEST_P(AgentStreamTest, ARefusedRequestIsAnsweredWithTheFieldNamedAndTheStreamGoesOn) {
  auto src = A().Alloc(2 * kBlock);
  auto dst = B().Alloc(2 * kBlock, "refusals");
  ASSERT_TRUE(src.ok() && dst.ok());
  std::memset((*src)->data(), 'x', 2 * kBlock);
  std::memset((*dst)->data(), 0, 2 * kBlock);
  auto stream = Open();
  ASSERT_NE(stream, nullptr);
  const uint64_t id = (*src)->id();
  ASSERT_TRUE(
      stream->Send(1, {{ferry::v1::WRITE, id, 0, "node-b", "refusals", 0, kBlock}}).ok());
  // Past the end of the target: refused before anything moves.
  ASSERT_TRUE(
      stream
          ->Send(2, {{ferry::v1::WRITE, id, 0, "node-b", "refusals", kBlock, kBlock},
                     {ferry::v1::WRITE, id, kBlock, "node-b", "refusals", 2 * kBlock, kBlock}})
          .ok());
  ASSERT_TRUE(stream->Send(3, {{ferry::v1::WRITE, id, 0, "node-x", "refusals", 0, 8}}).ok());
  ASSERT_TRUE(stream->Send(4, {{ferry::v1::WRITE, id, 0, "node-b", "refusals", 0, 0}}).ok());
  ASSERT_TRUE(stream->CloseSend().ok());
  absl::flat_hash_map<uint64_t, absl::StatusOr<ferry::v1::TransferResult>> answers;
  for (auto answer = stream->Next(); answer.ok(); answer = stream->Next()) {
    answers.emplace(answer->tag, answer->result);
  }
  EXPECT_TRUE(stream->Finish().ok());
  ExpectSocketClients(A(), clients_before_);
  ASSERT_EQ(answers.size(), 4u);
  ASSERT_TRUE(answers.at(1).ok());
  EXPECT_EQ(answers.at(1)->state(), ferry::v1::SUCCEEDED);
  ASSERT_FALSE(answers.at(2).ok());
  EXPECT_EQ(answers.at(2).status().code(), absl::StatusCode::kOutOfRange) << answers.at(2).status();
  EXPECT_THAT(answers.at(2).status().message(), HasSubstr("ops[1].remote_offset"));
  ASSERT_FALSE(answers.at(3).ok());
  EXPECT_EQ(answers.at(3).status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(answers.at(3).status().message(), HasSubstr("ops[0].target: targets[0].peer"));
  ASSERT_FALSE(answers.at(4).ok());
  EXPECT_EQ(answers.at(4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(answers.at(4).status().message(), HasSubstr("ops[0].length"));
  // Only the good transfer moved: the refused batch's first op (a good one) did not.
  EXPECT_EQ((*dst)->data()[0], 'x');
  EXPECT_EQ((*dst)->data()[kBlock], 0);
  EXPECT_EQ((*dst)->data()[2 * kBlock - 1], 0);
  EXPECT_TRUE(A().Free(id).ok());
  EXPECT_TRUE(B().Free((*dst)->id()).ok());
}

// The client sends 600 transfers (under the window, so no Send waits on flow control), reads
// a few answers and goes: the call is cancelled, the
// transfers it left run on and answer nobody, and afterwards the agent serves as before
// and its accounting returns to zero once the buffers are freed.
TEST_P(AgentStreamTest, AClientThatHangsUpMidStreamLeavesNothingBehind) {
  constexpr int kTransfers = 600;
  auto src = A().Alloc(kTransfers * kBlock);
  auto dst = B().Alloc(kTransfers * kBlock, "abandoned");
  ASSERT_TRUE(src.ok() && dst.ok());
  {
    auto stream = Open();
    ASSERT_NE(stream, nullptr);
    for (int i = 0; i < kTransfers; ++i) {
      ASSERT_TRUE(stream
                      ->Send(i, {{ferry::v1::WRITE, (*src)->id(), i * kBlock, "node-b",
                                  "abandoned", i * kBlock, kBlock}})
                      .ok());
    }
    for (int i = 0; i < 10; ++i) ASSERT_TRUE(stream->Next().ok());
    // Gone without CloseSend: Finish cancels the stream.
    absl::Status ended = stream->Finish();
    EXPECT_EQ(ended.code(), absl::StatusCode::kCancelled) << ended;
  }
  ExpectSocketClients(A(), clients_before_);  // a hung-up socket's connection closes
  // Still serving: a stream and a plain Transfer after it.
  auto again = Open();
  ASSERT_NE(again, nullptr);
  ASSERT_TRUE(again
                  ->Send(7, {{ferry::v1::WRITE, (*src)->id(), 0, "node-b", "abandoned", 0,
                              kBlock}})
                  .ok());
  auto answer = again->Next();
  ASSERT_TRUE(answer.ok() && answer->result.ok());
  EXPECT_EQ(answer->tag, 7u);
  EXPECT_EQ(answer->result->state(), ferry::v1::SUCCEEDED);
  ASSERT_TRUE(again->CloseSend().ok());
  EXPECT_EQ(again->Next().status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(again->Finish().ok());
  ExpectSocketClients(A(), clients_before_);
  EXPECT_TRUE(
      A().Write(**src, 0, "node-b", "abandoned", kBlock, kBlock).ok());
  EXPECT_TRUE(A().Free((*src)->id()).ok());
  EXPECT_TRUE(B().Free((*dst)->id()).ok());
}

}  // namespace
}  // namespace ferry
