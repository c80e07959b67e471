#pragma once
// The check both of libferry's shared connections pass (the gRPC line, client/transfer_line.h,
// and the transfer socket, client/socket_line.h): `threads` threads on one connection, `each`
// one-block WRITEs apiece (every 10th one refused for its length). Each gets its own answer,
// refusals name the field, and every block lands where its op put it. The threads take turns
// reading the answers, so each answer must reach the thread that sent it, whoever read it.

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "client/ferry_client.h"
#include "client/transfer_line.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent_pair.h"

namespace ferry {

// `run(ops)` runs a batch on the connection and returns its TransferLine::Outcome.
template <typename Run>
void ExpectThreadsGetTheirOwnAnswers(Pair& pair, int threads, int each, Run run) {
  constexpr uint64_t kBlock = 4096;
  const uint64_t slots = static_cast<uint64_t>(threads) * each;
  auto src = pair.ca->Alloc(slots * kBlock);
  auto dst = pair.cb->Alloc(slots * kBlock, "lined");
  ASSERT_TRUE(src.ok() && dst.ok());
  Fill(**src, 3);
  std::vector<std::thread> running;
  std::vector<int> moved(threads, 0), refused(threads, 0);
  for (int t = 0; t < threads; ++t) {
    running.emplace_back([&, t] {
      for (int i = 0; i < each; ++i) {
        const uint64_t slot = static_cast<uint64_t>(t) * each + i;
        const bool bad = i % 10 == 9;
        // Block `slot` lands in the mirrored slot of the target.
        const uint64_t to = (slots - 1 - slot) * kBlock;
        TransferLine::Outcome outcome = run(std::vector<OpSpec>{
            {ferry::v1::WRITE, (*src)->id(), slot * kBlock, "node-b", "lined", to,
             bad ? 0 : kBlock}});
        EXPECT_TRUE(outcome.sent);
        const auto& result = outcome.result;
        if (bad) {
          EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument)
              << result.status();
          EXPECT_THAT(std::string(result.status().message()),
                      ::testing::HasSubstr("ops[0].length"));
          ++refused[t];
          continue;
        }
        EXPECT_TRUE(result.ok()) << result.status();
        if (!result.ok()) return;
        EXPECT_TRUE(TransferStatus(*result).ok()) << TransferStatus(*result);
        EXPECT_EQ(result->bytes(), kBlock);
        ++moved[t];
      }
    });
  }
  for (auto& t : running) t.join();
  for (int t = 0; t < threads; ++t) {
    EXPECT_EQ(moved[t], each - each / 10) << "thread " << t;
    EXPECT_EQ(refused[t], each / 10) << "thread " << t;
  }
  for (uint64_t slot = 0; slot < slots; ++slot) {
    if (slot % each % 10 == 9) continue;
    const uint64_t to = (slots - 1 - slot) * kBlock;
    ASSERT_EQ(std::memcmp((*src)->data() + slot * kBlock, (*dst)->data() + to, kBlock), 0)
        << "slot " << slot;
  }
}

}  // namespace ferry
