#include "bench/fairness_suite.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/byte_size.h"
#include "bench/stats.h"
#include "client/agent_process.h"
#include "client/ferry_client.h"

namespace ferry::bench {
namespace {

constexpr uint64_t kOp = 64ull << 20;

struct Case {
  std::string name;
  std::string limits_yaml;
};

// Small WRITEs, one at a time, for `seconds`: their latencies in us.
absl::StatusOr<std::vector<double>> SmallLatencies(Client& c, const Buffer& src, uint64_t size,
                                                   double seconds) {
  std::vector<double> us;
  absl::Time until = absl::Now() + absl::Seconds(seconds);
  while (us.size() < 20 || absl::Now() < until) {
    absl::Time t0 = absl::Now();
    absl::Status s = c.Write(src, 0, "node-b", "fair-small", 0, size);
    if (!s.ok()) return s;
    us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
    if (us.size() > 100000) break;
  }
  return us;
}

Measurement Row(const std::string& series, uint64_t size, const std::vector<double>& us,
                const std::string& note) {
  Measurement m;
  m.series = series;
  m.size = size;
  m.ops = us.size();
  m.p50_us = Percentile(us, 0.5);
  m.p99_us = Percentile(us, 0.99);
  m.note = note;
  return m;
}

// One case: two fresh agents with `c.limits_yaml`; idle small-op latency, then small ops
// beside the batch, and the batch's throughput.
absl::Status RunCase(const FairnessOptions& o, const Case& c, Report& report) {
  char tmpl[] = "/tmp/ferry-bench-fair-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  auto pa = PickFreePort(), pb = PickFreePort();
  if (!pa.ok() || !pb.ok()) return absl::InternalError("no free port");
  std::string extra = absl::StrCat("log:\n  level: warn\n", c.limits_yaml);
  auto a = AgentProcess::Start(
      {"node-a", dir, *pa, {{"node-b", absl::StrCat("127.0.0.1:", *pb)}}, extra});
  if (!a.ok()) return a.status();
  auto b = AgentProcess::Start(
      {"node-b", dir, *pb, {{"node-a", absl::StrCat("127.0.0.1:", *pa)}}, extra});
  if (!b.ok()) return b.status();
  auto ca = Client::Connect((*a)->socket());
  auto cb = Client::Connect((*b)->socket());
  if (!ca.ok() || !cb.ok()) return absl::UnavailableError("agents do not answer");
  auto big_src = (*ca)->Alloc(kOp);
  auto big_dst = (*cb)->Alloc(kOp, "fair-big");
  auto small_src = (*ca)->Alloc(o.small);
  auto small_dst = (*cb)->Alloc(o.small, "fair-small");
  for (auto* r : {&big_src, &big_dst, &small_src, &small_dst}) {
    if (!r->ok()) return r->status();
    std::memset((**r)->data(), 0x5a, (**r)->size());
  }
  auto idle = SmallLatencies(**ca, **small_src, o.small, o.seconds / 2);
  if (!idle.ok()) return idle.status();
  report.rows.push_back(
      Row(absl::StrCat("4 KiB idle, ", c.name), o.small, *idle, "one op at a time"));

  // The batch runs on its own client, resubmitted until the small ops are done.
  std::vector<OpSpec> batch(o.batch_bytes / kOp,
                            {ferry::v1::WRITE, (*big_src)->id(), 0, "node-b", "fair-big", 0, kOp});
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> batch_bytes{0};
  absl::Status batch_status;
  absl::Time batch_start = absl::Now();
  std::thread load([&] {
    auto loader = Client::Connect((*a)->socket());
    if (!loader.ok()) {
      batch_status = loader.status();
      return;
    }
    while (!stop.load()) {
      auto r = (*loader)->Run(batch, absl::Seconds(300));
      if (!r.ok() || !TransferStatus(*r).ok()) {
        batch_status = r.ok() ? TransferStatus(*r) : r.status();
        return;
      }
      batch_bytes += r->bytes();
    }
  });
  absl::SleepFor(absl::Milliseconds(200));  // the batch is on the wire
  auto loaded = SmallLatencies(**ca, **small_src, o.small, o.seconds);
  stop = true;
  load.join();
  double batch_seconds = absl::ToDoubleSeconds(absl::Now() - batch_start);
  if (!loaded.ok()) return loaded.status();
  if (!batch_status.ok()) return batch_status;
  double idle_p50 = Percentile(*idle, 0.5);
  report.rows.push_back(
      Row(absl::StrCat("4 KiB beside batch, ", c.name), o.small, *loaded,
          absl::StrFormat("p50 %.1f x idle", Percentile(*loaded, 0.5) / idle_p50)));
  Measurement big;
  big.series = absl::StrCat("batch ", FormatByteSize(o.batch_bytes), ", ", c.name);
  big.size = kOp;
  big.batch = batch.size();
  big.bytes = batch_bytes.load();
  big.seconds = batch_seconds;
  big.gbps = GBps(big.bytes, batch_seconds);
  big.note = "64 MiB ops, beside the small ones";
  report.rows.push_back(big);
  report.findings.push_back(absl::StrFormat(
      "%s: 4 KiB WRITE p50 %.0f us idle, %.0f us beside a %s batch (p99 %.0f us); batch %.2f GB/s",
      c.name, idle_p50, Percentile(*loaded, 0.5), FormatByteSize(o.batch_bytes),
      Percentile(*loaded, 0.99), big.gbps));
  std::fprintf(stderr, "  %s\n", report.findings.back().c_str());
  ca->reset();
  cb->reset();
  (*a)->Stop();
  (*b)->Stop();
  std::system(("rm -rf " + dir).c_str());
  return absl::OkStatus();
}

}  // namespace

bool RunFairnessSuite(const FairnessOptions& o, Report& report) {
  const std::vector<Case> cases = {
      {"sliced (1 MiB slices, 16 MiB window)", "limits:\n  peer_window_bytes: 16MiB\n"},
      {"sliced (1 MiB slices, 64 MiB window)", "limits:\n  peer_window_bytes: 64MiB\n"},
      {"sliced (512 KiB slices, 4 MiB window)",
       "limits:\n  slice_bytes: 512KiB\n  peer_window_bytes: 4MiB\n"},
      // Every op whole and posted at Submit: the behaviour before slicing.
      {"unsliced", "limits:\n  slice_bytes: 1GiB\n  peer_window_bytes: 1TiB\n"},
  };
  for (const Case& c : cases) {
    absl::Status s = RunCase(o, c, report);
    if (!s.ok()) {
      std::fprintf(stderr, "fairness suite (%s): %s\n", c.name.c_str(), s.ToString().c_str());
      return false;
    }
  }
  return true;
}

}  // namespace ferry::bench
