#include "bench/rails_suite.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/byte_size.h"
#include "bench/stats.h"
#include "client/agent_process.h"
#include "client/ferry_client.h"

namespace ferry::bench {
namespace {

// CPU seconds (user + system) process `pid` has used, from /proc/<pid>/stat.
double CpuSeconds(pid_t pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  // Fields after the command name, which is in parentheses and may hold spaces.
  size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

std::string RailsYaml(uint32_t rails, int subnet, uint32_t connections, uint64_t pool) {
  std::string yaml = absl::StrFormat(
      "providers: [tcp]\nhost_pool:\n  size: %dMiB\nlog:\n  level: warn\n"
      "tcp:\n  connections: %d\n  rails:\n",
      pool >> 20, connections);
  for (uint32_t n = 0; n < rails; ++n) {
    absl::StrAppend(&yaml, "    rail", n, ": 127.0.", subnet, ".", n + 1, "\n");
  }
  return yaml;
}

struct RailsRun {
  Measurement m;
  double cores = 0;  // CPU seconds of both agents per second of the run
};

absl::StatusOr<RailsRun> MeasureRails(const RailsOptions& o, uint32_t rails) {
  char tmpl[] = "/tmp/ferry-bench-rails-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  auto cleanup = [&dir] { std::system(("rm -rf " + dir).c_str()); };
  auto pa = PickFreePort(), pb = PickFreePort();
  if (!pa.ok() || !pb.ok()) return absl::InternalError("no free port");
  const uint64_t total = o.op_bytes * o.ops;
  const uint64_t pool = total + (64ull << 20);
  auto a = AgentProcess::Start({"node-a", dir, *pa, {{"node-b", absl::StrCat("127.0.0.1:", *pb)}},
                                RailsYaml(rails, 40, o.connections, pool)});
  if (!a.ok()) return cleanup(), a.status();
  auto b = AgentProcess::Start({"node-b", dir, *pb, {{"node-a", absl::StrCat("127.0.0.1:", *pa)}},
                                RailsYaml(rails, 41, o.connections, pool)});
  if (!b.ok()) return cleanup(), b.status();
  absl::StatusOr<RailsRun> out = [&]() -> absl::StatusOr<RailsRun> {
    auto ca = Client::Connect((*a)->socket());
    auto cb = Client::Connect((*b)->socket());
    if (!ca.ok() || !cb.ok()) return absl::UnavailableError("agents do not answer");
    auto src = (*ca)->Alloc(total);
    auto dst = (*cb)->Alloc(total, "rails-target");
    if (!src.ok()) return src.status();
    if (!dst.ok()) return dst.status();
    std::memset((*src)->data(), 0x5a, total);
    std::memset((*dst)->data(), 0, total);
    std::vector<OpSpec> batch;
    for (uint32_t i = 0; i < o.ops; ++i) {
      batch.push_back({ferry::v1::WRITE, (*src)->id(), i * o.op_bytes, "node-b", "rails-target",
                       i * o.op_bytes, o.op_bytes});
    }
    // One batch first: connections made, pages touched, outside the measurement.
    auto warm = (*ca)->Run(batch, absl::Seconds(120));
    if (!warm.ok()) return warm.status();
    std::vector<double> latencies;
    uint64_t bytes = 0;
    const double cpu0 = CpuSeconds((*a)->pid()) + CpuSeconds((*b)->pid());
    absl::Time start = absl::Now(), until = start + absl::Seconds(o.seconds);
    std::set<std::string> used;
    while (latencies.size() < 3 || absl::Now() < until) {
      absl::Time t0 = absl::Now();
      auto r = (*ca)->Run(batch, absl::Seconds(120), latencies.empty());
      if (!r.ok()) return r.status();
      if (absl::Status s = TransferStatus(*r); !s.ok()) return s;
      latencies.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
      bytes += r->bytes();
      for (const auto& op : r->ops()) {
        for (const auto& rail : op.legs(0).rails()) used.insert(rail);
      }
    }
    const double secs = absl::ToDoubleSeconds(absl::Now() - start);
    const double cpu = CpuSeconds((*a)->pid()) + CpuSeconds((*b)->pid()) - cpu0;
    if (used.size() != rails) {
      return absl::InternalError(absl::StrCat(rails, " rails configured, the ops used ",
                                              used.size(), ": ", absl::StrJoin(used, ", ")));
    }
    RailsRun run;
    run.m.series = absl::StrCat("rails ", rails);
    run.m.size = o.op_bytes;
    run.m.batch = o.ops;
    run.m.ops = latencies.size() * o.ops;
    run.m.bytes = bytes;
    run.m.seconds = secs;
    run.m.gbps = GBps(bytes, secs);
    run.m.ops_per_sec = run.m.ops / secs;
    run.m.p50_us = Percentile(latencies, 0.5);
    run.m.p99_us = Percentile(latencies, 0.99);
    run.cores = cpu / secs;
    return run;
  }();
  (*a)->Stop();
  (*b)->Stop();
  cleanup();
  return out;
}

}  // namespace

bool RunRailsSuite(const RailsOptions& o, Report& report) {
  const unsigned cores = std::thread::hardware_concurrency();
  double one = 0;
  std::vector<std::string> lines;
  // 1, 2, 4, .. below max_rails, then max_rails itself.
  std::vector<uint32_t> counts;
  for (uint32_t n = 1; n < o.max_rails; n *= 2) counts.push_back(n);
  counts.push_back(o.max_rails);
  for (uint32_t rails : counts) {
    auto run = MeasureRails(o, rails);
    if (!run.ok()) {
      std::fprintf(stderr, "rails suite: %s\n", run.status().ToString().c_str());
      return false;
    }
    if (rails == 1) one = run->m.gbps;
    const bool cpu_bound = run->cores >= 0.85 * cores;
    run->m.note = absl::StrFormat("%.2f x 1 rail; agents used %.2f of %u cores%s",
                                  run->m.gbps / one, run->cores, cores,
                                  cpu_bound ? " (CPU-bound)" : "");
    std::fprintf(stderr, "  rails %u: %.3f GB/s, %.2f cores\n", rails, run->m.gbps, run->cores);
    lines.push_back(absl::StrFormat("%u: %.2f GB/s (%.2fx, %.2f cores)", rails, run->m.gbps,
                                    run->m.gbps / one, run->cores));
    report.rows.push_back(run->m);
  }
  report.findings.push_back(absl::StrCat(
      "rails (tcp, every rail a loopback address, ", FormatByteSize(o.op_bytes), " WRITEs x ",
      o.ops, " per batch): ", absl::StrJoin(lines, "; "),
      ". All rails share this machine's loopback and cores: where the agents use nearly every "
      "core the CPU bounds the aggregate, not the rails"));
  return true;
}

}  // namespace ferry::bench
