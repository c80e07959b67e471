#pragma once
// Presents a benchmark run: a table for people, JSON for tools, a gnuplot PNG.

#include <string>

#include "absl/status/status.h"
#include "bench/measurement.h"

namespace ferry::bench {

std::string FormatTable(const Report& report);
std::string FormatJson(const Report& report);
// Writes `png` with gnuplot, two panels: bandwidth against size (one line per series, KV
// batches over their block sizes, size-less baselines dashed) and p50 latency of one op
// against size, with the engine-only rates as a label. The data and script go next to it.
absl::Status PlotPng(const Report& report, const std::string& png);

}  // namespace ferry::bench
