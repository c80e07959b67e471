#include "bench/staging_suite.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/byte_size.h"
#include "bench/stats.h"
#include "client/agent_process.h"
#include "client/ferry_client.h"

namespace ferry::bench {
namespace {

absl::StatusOr<Measurement> Measure(Client& client, const std::vector<OpSpec>& batch,
                                    const std::string& series, double seconds) {
  std::vector<double> latencies;
  uint64_t bytes = 0;
  absl::Time start = absl::Now(), until = start + absl::Seconds(seconds);
  while (latencies.size() < 3 || absl::Now() < until) {
    absl::Time t0 = absl::Now();
    auto r = client.Run(batch, absl::Seconds(120), true);
    if (!r.ok()) return r.status();
    if (absl::Status s = TransferStatus(*r); !s.ok()) return s;
    latencies.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
    bytes += r->bytes();
    if (series.rfind("staged", 0) == 0 && r->ops(0).legs(0).mode() != "staged") {
      return absl::InternalError(absl::StrCat(series, " ran ", r->ops(0).legs(0).mode()));
    }
  }
  double secs = absl::ToDoubleSeconds(absl::Now() - start);
  Measurement m;
  m.series = series;
  m.size = batch[0].length;
  m.ops = latencies.size();
  m.bytes = bytes;
  SetTimings(m, secs, latencies);
  return m;
}

}  // namespace

bool RunStagingSuite(const StagingOptions& o, Report& report) {
  char tmpl[] = "/tmp/ferry-bench-staging-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  auto fail = [&](const absl::Status& s) {
    std::fprintf(stderr, "staging suite: %s\n", s.ToString().c_str());
    std::system(("rm -rf " + dir).c_str());
    return false;
  };
  auto pa = PickFreePort(), pb = PickFreePort();
  if (!pa.ok() || !pb.ok()) return fail(absl::InternalError("no free port"));
  // Both nodes are the dual-socket machine: the GPU under CPU0, the NIC under CPU1.
  std::string extra = absl::StrFormat(
      "topology: %s/topology/dual_socket_sys.xml\ngpu:\n  backend: sim\n  count: 1\n"
      "  pool_size: %dMiB\n  sim_copy_rate: %d\nlog:\n  level: warn\n",
      o.fixtures, 2 * (o.size >> 20) + 64, o.copy_rate);
  auto a = AgentProcess::Start(
      {"node-a", dir, *pa, {{"node-b", absl::StrCat("127.0.0.1:", *pb)}}, extra});
  if (!a.ok()) return fail(a.status());
  auto b = AgentProcess::Start(
      {"node-b", dir, *pb, {{"node-a", absl::StrCat("127.0.0.1:", *pa)}}, extra});
  if (!b.ok()) return fail(b.status());
  auto ca = Client::Connect((*a)->socket());
  auto cb = Client::Connect((*b)->socket());
  if (!ca.ok() || !cb.ok()) return fail(absl::UnavailableError("agents do not answer"));
  auto src = (*ca)->Alloc(o.size, "", "cuda:0");
  auto dst = (*cb)->Alloc(o.size, "staging-target", "cuda:0");
  if (!src.ok()) return fail(src.status());
  if (!dst.ok()) return fail(dst.status());
  std::memset((*src)->data(), 0x3c, o.size);
  std::memset((*dst)->data(), 0, o.size);
  std::vector<OpSpec> batch = {
      {ferry::v1::WRITE, (*src)->id(), 0, "node-b", "staging-target", 0, o.size}};

  auto set = [&](const std::vector<std::pair<std::string, std::string>>& kv) {
    auto x = (*ca)->SetPolicy(kv);
    auto y = (*cb)->SetPolicy(kv);
    return x.ok() ? y.status() : x.status();
  };
  if (absl::Status s = set({{"gdr", "always"}}); !s.ok()) return fail(s);
  auto direct = Measure(**ca, batch, "direct (gdr)", o.seconds);
  if (!direct.ok()) return fail(direct.status());
  direct->note = "GPU -> GPU, NIC reads/writes GPU memory";
  report.rows.push_back(*direct);
  const double copy_gbps = static_cast<double>(o.copy_rate) / 1e9;
  const double slowest = std::min(copy_gbps, direct->gbps);
  for (uint32_t depth : {1u, 2u, 4u, 8u}) {
    if (absl::Status s = set({{"gdr", "never"}, {"staging_chunk", absl::StrCat(o.chunk)},
                              {"staging_depth", absl::StrCat(depth)}});
        !s.ok()) {
      return fail(s);
    }
    auto m = Measure(**ca, batch, absl::StrCat("staged d=", depth), o.seconds);
    if (!m.ok()) return fail(m.status());
    m->note = absl::StrFormat("%.2f x direct, %.2f x slowest stage", m->gbps / direct->gbps,
                              m->gbps / slowest);
    report.rows.push_back(*m);
    std::fprintf(stderr, "  staged depth %u: %.3f GB/s\n", depth, m->gbps);
  }
  report.findings.push_back(
      absl::StrFormat("staging (sim GPUs, copy engines at %.2f GB/s, %s chunks, %s writes): "
                      "slowest stage %.2f GB/s "
                      "(min of copy %.2f and direct wire %.2f); see the staged rows for depth 1..8",
                      copy_gbps, FormatByteSize(o.chunk), FormatByteSize(o.size), slowest,
                      copy_gbps, direct->gbps));
  (*src).reset();
  (*dst).reset();
  (*a)->Stop();
  (*b)->Stop();
  std::system(("rm -rf " + dir).c_str());
  return true;
}

}  // namespace ferry::bench
