// bench/taking_turns.h: contenders take turns in a rotating order, a baseline that fails sits
// out and is dropped whole (no ratio pairs runs of different turns), a required one fails
// the turns, and the per-turn ratios and median rows say what was measured.

#include "bench/taking_turns.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry::bench {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A contender whose runs give `gbps` in turn and note their calls in `calls`.
Contender Fixed(const std::string& series, std::vector<double> gbps, std::string* calls,
                bool required = false) {
  auto next = std::make_shared<size_t>(0);
  return {series,
          [=]() -> absl::StatusOr<Measurement> {
            *calls += series;
            const size_t i = (*next)++;
            if (i >= gbps.size() || gbps[i] < 0) {
              return absl::UnavailableError(series + " could not run");
            }
            Measurement m;
            m.series = series;
            m.gbps = gbps[i];
            m.note = "n";
            return m;
          },
          required};
}

TEST(BenchTurnsTest, EachTurnStartsOneContenderFurtherOn) {
  std::string calls;
  auto turns = TakeTurns(
      {Fixed("a", {1, 1, 1}, &calls), Fixed("b", {1, 1, 1}, &calls), Fixed("c", {1, 1, 1}, &calls)},
      3);
  ASSERT_TRUE(turns.ok()) << turns.status();
  EXPECT_EQ(calls, "abcbcacab");
  EXPECT_EQ(turns->rounds, 3);
}

TEST(BenchTurnsTest, RatiosArePerTurnAndRowsAreTheMedianTurn) {
  std::string calls;
  auto turns = TakeTurns({Fixed("ferry", {2, 4, 6}, &calls), Fixed("base", {1, 2, 2}, &calls)}, 3);
  ASSERT_TRUE(turns.ok()) << turns.status();
  EXPECT_THAT(turns->Figures("ferry"), ElementsAre(2, 4, 6));
  EXPECT_EQ(RatioPerTurn(*turns, "ferry", "base", "the base"),
            "2.00 x the base (per turn 2.00, 2.00, 3.00)");
  std::vector<Measurement> rows = turns->Rows();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].series, "ferry turns");
  EXPECT_EQ(rows[0].gbps, 4);
  EXPECT_THAT(rows[0].note, HasSubstr("median of 3 turns (GB/s: 2.00, 4.00, 6.00)"));
  EXPECT_EQ(rows[1].gbps, 2);
}

TEST(BenchTurnsTest, ABaselineThatFailsSitsOutAndIsDroppedWhole) {
  std::string calls;
  // "base" runs in turn 1 and fails in turn 2: its turn-1 run must not be paired with
  // anything, and it is not asked again.
  auto turns = TakeTurns({Fixed("ferry", {2, 4, 6}, &calls), Fixed("base", {1, -1, 1}, &calls)}, 3);
  ASSERT_TRUE(turns.ok()) << turns.status();
  EXPECT_EQ(calls, "ferrybasebaseferryferry");
  EXPECT_TRUE(turns->Figures("base").empty());
  EXPECT_EQ(RatioPerTurn(*turns, "ferry", "base", "the base"), "");
  std::vector<Measurement> rows = turns->Rows();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].series, "ferry turns");
}

TEST(BenchTurnsTest, ARequiredContenderThatFailsFailsTheTurns) {
  std::string calls;
  auto turns = TakeTurns(
      {Fixed("ferry", {2, -1, 6}, &calls, /*required=*/true), Fixed("base", {1, 1, 1}, &calls)},
      3);
  EXPECT_EQ(turns.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(turns.status().message(), HasSubstr("ferry could not run"));
}

TEST(BenchTurnsTest, NoTurnsIsRefused) {
  std::string calls;
  EXPECT_EQ(TakeTurns({Fixed("ferry", {1}, &calls)}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(calls, "");
  EXPECT_EQ(RatioPerTurn(Turns{}, "ferry", "base", "the base"), "");
}

}  // namespace
}  // namespace ferry::bench
