#include "bench/taking_turns.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/byte_size.h"
#include "bench/socket_ceiling.h"
#include "bench/ucx_baseline.h"

namespace ferry::bench {
namespace {

// "4.96, 4.79, 4.93"
std::string Listed(const std::vector<double>& figures) {
  std::string out;
  for (double f : figures) absl::StrAppendFormat(&out, "%s%.2f", out.empty() ? "" : ", ", f);
  return out;
}

// Each measurement's GB/s, in order.
std::vector<double> Figures(const std::vector<Measurement>& rows) {
  std::vector<double> out;
  for (const Measurement& m : rows) out.push_back(m.gbps);
  return out;
}

// A series' turns (at least one) as one row: the median turn's measurement, renamed, every
// turn in its note.
Measurement MedianRow(const std::vector<Measurement>& turns, const std::string& series) {
  const std::vector<double> gbps = Figures(turns);
  const double median = Median(gbps);
  Measurement row = turns.front();
  for (const Measurement& m : turns) {
    if (m.gbps == median) row = m;
  }
  row.series = series;
  row.note =
      absl::StrCat("median of ", turns.size(), " turns (GB/s: ", Listed(gbps), "); ", row.note);
  return row;
}

// "0.99 x ucx_perftest put_bw (per turn 0.99, 0.99, 2.72)": ferry's GB/s over the
// baseline's, turn by turn, and their median.
std::string Against(const std::vector<double>& ferry, const std::vector<double>& base,
                    const std::string& name) {
  std::vector<double> ratios;
  for (size_t i = 0; i < base.size() && i < ferry.size(); ++i) {
    ratios.push_back(base[i] > 0 ? ferry[i] / base[i] : 0);
  }
  return absl::StrFormat("%.2f x %s (per turn %s)", Median(ratios), name, Listed(ratios));
}

}  // namespace

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[(values.size() - 1) / 2];
}

std::string DescribeTurns(const Turns& turns, uint64_t size) {
  if (turns.ferry.empty()) return "";
  const double ferry = Median(turns.ferry);
  std::string out = absl::StrFormat(
      "%s writes taking turns with the baselines (%d turns, one run each a turn): ferry %.2f GB/s",
      FormatByteSize(size), turns.rounds, ferry);
  if (!turns.ucx.empty()) {
    // ucx_perftest's put is bimodal here (both its processes busy-poll, and two cores do
    // not always hold them both): against its best turn too, so that a slow UCX turn does
    // not flatter ferry.
    const double best = *std::max_element(turns.ucx.begin(), turns.ucx.end());
    absl::StrAppendFormat(&out, " = %s, %.2f x its best turn (%.2f GB/s); goal >= 1.5",
                          Against(turns.ferry, turns.ucx, "ucx_perftest put_bw"),
                          best > 0 ? ferry / best : 0, best);
  }
  if (!turns.sockets.empty()) {
    absl::StrAppend(&out, "; ", Against(turns.ferry, turns.sockets, "plain TCP sockets"));
  }
  return out;
}

absl::StatusOr<Turns> RunTakingTurns(FerryRunner& runner, const RunOptions& options,
                                     int connections, uint64_t size, int ucx_iterations,
                                     int rounds) {
  if (rounds < 1) return absl::InvalidArgumentError("taking turns: at least one round");
  std::vector<Measurement> ferry, sockets, ucx;
  // A baseline that fails once sits out the later turns and is left out, so that every
  // ratio is between runs of one turn.
  bool sockets_run = true, ucx_run = true;
  auto skip = [](const char* series, const absl::Status& why) {
    std::fprintf(stderr, "%s turns skipped: %s\n", series, why.ToString().c_str());
    return false;
  };
  for (int round = 0; round < rounds; ++round) {
    auto f = runner.RunSize(size, options);
    if (!f.ok()) return f.status();
    ferry.push_back(*f);
    double socket_gbps = 0, ucx_gbps = 0;
    if (sockets_run) {
      auto s = RunSocketCeiling(connections, size, options.min_seconds, /*runs=*/1);
      if (s.ok()) {
        sockets.push_back(*s);
        socket_gbps = s->gbps;
      } else {
        sockets_run = skip("tcp sockets", s.status());
      }
    }
    if (ucx_run) {
      auto u = RunUcxPutBw(size, ucx_iterations, /*runs=*/1);
      if (u.ok()) {
        ucx.push_back(*u);
        ucx_gbps = u->gbps;
      } else {
        ucx_run = skip("ucx put_bw", u.status());
      }
    }
    std::fprintf(stderr, "  turn %d, %s: ferry %.3f, tcp sockets %.3f, ucx put_bw %.3f GB/s\n",
                 round + 1, FormatByteSize(size).c_str(), f->gbps, socket_gbps, ucx_gbps);
  }
  Turns turns;
  turns.rounds = rounds;
  turns.rows.push_back(MedianRow(ferry, "ferry write turns"));
  turns.ferry = Figures(ferry);
  if (sockets_run) {
    turns.rows.push_back(MedianRow(sockets, "tcp sockets turns"));
    turns.sockets = Figures(sockets);
  }
  if (ucx_run) {
    turns.rows.push_back(MedianRow(ucx, "ucx put_bw turns"));
    turns.ucx = Figures(ucx);
  }
  return turns;
}

}  // namespace ferry::bench
