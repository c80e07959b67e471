#pragma once
// Presents a benchmark run: a table for people, JSON for tools, a gnuplot PNG.

#include <string>

#include "absl/status/status.h"
#include "bench/measurement.h"

namespace ferry::bench {

std::string FormatTable(const Report& report);
std::string FormatJson(const Report& report);
// Writes `png` (bandwidth against size, one line per series) with gnuplot; the data and
// script files go next to it.
absl::Status PlotPng(const Report& report, const std::string& png);

}  // namespace ferry::bench
