#include "bench/engine_figure.h"

#include <cinttypes>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/command_output.h"

namespace ferry::bench {

absl::StatusOr<std::vector<Measurement>> RunEngineBench(const std::string& engine_bench,
                                                        int blocks,
                                                        const std::vector<uint64_t>& sizes,
                                                        double seconds, const std::string& layout) {
  const std::string cmd =
      absl::StrCat(engine_bench, " --blocks ", blocks, " --sizes ", absl::StrJoin(sizes, ","),
                   " --seconds ", seconds, " --layout ", layout, " 2>&1");
  const std::string out = CommandOutput(cmd);
  // The table's rows: block, batch, ns/op, ops/s, ops/CPU-second.
  std::vector<Measurement> rows;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    uint64_t size = 0;
    int batch = 0;
    double ns = 0, ops = 0, per_cpu = 0;
    if (std::sscanf(std::string(line).c_str(), "%" SCNu64 " %d %lf %lf %lf", &size, &batch, &ns,
                    &ops, &per_cpu) != 5) {
      continue;
    }
    Measurement m;
    m.series = "engine only";
    m.size = size;
    m.batch = batch;
    m.ops_per_sec = ops;
    m.gbps = ops * size / 1e9;
    m.note = absl::StrFormat("%s, %.0f ns/op wall, %.0f ops per CPU-second", layout, ns, per_cpu);
    rows.push_back(m);
  }
  if (rows.size() != sizes.size()) {
    return absl::InternalError(
        absl::StrCat("ferry-engine-bench gave ", rows.size(), " rows: ", out.substr(0, 400)));
  }
  return rows;
}

}  // namespace ferry::bench
