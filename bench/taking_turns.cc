#include "bench/taking_turns.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/stats.h"

namespace ferry::bench {
namespace {

// "4.96, 4.79, 4.93"
std::string Listed(const std::vector<double>& figures) {
  std::string out;
  for (double f : figures) absl::StrAppendFormat(&out, "%s%.2f", out.empty() ? "" : ", ", f);
  return out;
}

std::vector<double> GbpsOf(const std::vector<Measurement>& rows) {
  std::vector<double> out;
  for (const Measurement& m : rows) out.push_back(m.gbps);
  return out;
}

}  // namespace

absl::StatusOr<Turns> TakeTurns(const std::vector<Contender>& contenders, int rounds) {
  if (rounds < 1) return absl::InvalidArgumentError("taking turns: at least one round");
  Turns turns;
  turns.rounds = rounds;
  turns.runs.resize(contenders.size());
  for (const Contender& c : contenders) turns.series.push_back(c.series);
  std::vector<bool> sat_out(contenders.size(), false);
  for (int round = 0; round < rounds; ++round) {
    std::string line;
    // Each turn starts one contender further on, so that none always runs right after the
    // same neighbour (UCX's busy-polling processes, say) or always first.
    for (size_t k = 0; k < contenders.size(); ++k) {
      const size_t i = (k + static_cast<size_t>(round)) % contenders.size();
      if (sat_out[i]) continue;
      auto m = contenders[i].run();
      if (!m.ok() && contenders[i].required) return m.status();
      if (!m.ok()) {
        std::fprintf(stderr, "%s turns skipped: %s\n", contenders[i].series.c_str(),
                     m.status().ToString().c_str());
        sat_out[i] = true;
        turns.runs[i].clear();  // every ratio is between runs of one turn
        continue;
      }
      turns.runs[i].push_back(*m);
      absl::StrAppendFormat(&line, "%s%s %.3f", line.empty() ? "" : ", ", contenders[i].series,
                            m->gbps);
    }
    std::fprintf(stderr, "  turn %d: %s GB/s\n", round + 1, line.c_str());
  }
  return turns;
}

std::vector<Measurement> Turns::Rows() const {
  std::vector<Measurement> rows;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].empty()) continue;
    const std::vector<double> gbps = GbpsOf(runs[i]);
    const double median = Percentile(gbps, 0.5);
    Measurement row = runs[i].front();
    for (const Measurement& m : runs[i]) {
      if (m.gbps == median) row = m;
    }
    row.series = series[i] + " turns";
    row.note = absl::StrCat("median of ", runs[i].size(), " turns (GB/s: ", Listed(gbps), "); ",
                            row.note);
    rows.push_back(row);
  }
  return rows;
}

std::vector<double> Turns::Figures(const std::string& name) const {
  for (size_t i = 0; i < series.size(); ++i) {
    if (series[i] == name) return GbpsOf(runs[i]);
  }
  return {};
}

std::string RatioPerTurn(const Turns& turns, const std::string& series, const std::string& base,
                         const std::string& name) {
  const std::vector<double> top = turns.Figures(series), bottom = turns.Figures(base);
  if (top.empty() || top.size() != bottom.size()) return "";
  std::vector<double> ratios;
  for (size_t i = 0; i < top.size(); ++i) ratios.push_back(bottom[i] > 0 ? top[i] / bottom[i] : 0);
  return absl::StrFormat("%.2f x %s (per turn %s)", Percentile(ratios, 0.5), name,
                         Listed(ratios));
}

}  // namespace ferry::bench
