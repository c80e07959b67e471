#pragma once
// Goals judged head to head: the rows a goal compares take turns, `rounds` times, one run
// each per turn, and the goal is judged on the ratios within each turn. The suite otherwise
// sets rows measured minutes apart against each other (a single ferry row against a best
// of three for each baseline, the KV rows against the sweep's 64 MiB row), and on the shared
// 2-core VM loopback TCP swings by half within minutes (bench/results): more than the gaps
// being judged. Taking turns, every row gets what the others get, in the same moments.

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/measurement.h"

namespace ferry::bench {

// One row in the turns.
struct Contender {
  std::string series;  // the series of its "... turns" row
  std::function<absl::StatusOr<Measurement>()> run;
  // A failure of a required row fails the turns (ferry's own); any other sits out the
  // later turns and is left out (a baseline that cannot run here), said on stderr.
  bool required = false;
};

struct Turns {
  int rounds = 0;
  // Per contender, in the order given: its runs, one per turn; empty where it sat out.
  std::vector<std::string> series;
  std::vector<std::vector<Measurement>> runs;

  // Each contender that ran every turn as one row: its median turn's measurement, its
  // series with " turns" added, every turn's GB/s in its note.
  std::vector<Measurement> Rows() const;
  // `series`' GB/s, one per turn, in order; empty where it sat out or is not there.
  std::vector<double> Figures(const std::string& series) const;
};

// `rounds` turns of the contenders: turn r runs them in their order starting at contender
// r (mod their count).
absl::StatusOr<Turns> TakeTurns(const std::vector<Contender>& contenders, int rounds);

// "0.99 x NAME (per turn 0.99, 0.99, 2.72)": `series`' GB/s over `base`'s turn by turn, and
// the median of those; "" where either did not run every turn.
std::string RatioPerTurn(const Turns& turns, const std::string& series, const std::string& base,
                         const std::string& name);

}  // namespace ferry::bench
