#include "client/ops_views.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace ferry::client {

std::string HumanBytes(uint64_t bytes) {
  constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  return unit == 0 ? absl::StrCat(bytes, " B") : absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

std::string FormatPeers(const ferry::v1::ListPeersResponse& peers) {
  // KEPT: its answers we keep / ours it keeps (ResolveBuffer, until revoked).
  constexpr const char* kRow = "%-12s %-22s %-11s %9s %-16s %5s %-7s %-7s %s\n";
  std::string out = absl::StrFormat(kRow, "PEER", "ADDRESS", "HEALTH", "RTT", "INCARNATION",
                                    "CONNS", "KEPT", "SOURCE", "RAILS");
  std::string errors;
  for (const auto& p : peers.peers()) {
    const std::string rtt =
        p.health() == "ok" ? absl::StrFormat("%.2f ms", p.rtt_us() / 1000.0) : "-";
    absl::StrAppendFormat(&out, kRow, p.node(), p.address(), p.health(), rtt,
                          p.incarnation() ? absl::StrFormat("%x", p.incarnation()) : "-",
                          absl::StrCat(p.endpoints()),
                          absl::StrCat(p.kept_answers(), "/", p.answers_held()), p.source(),
                          p.rails().empty() ? "-" : absl::StrJoin(p.rails(), " "));
    if (p.health() == "unreachable") {
      absl::StrAppend(&errors, "  ", p.node(), ": ", p.last_error(),
                      p.last_ok_ms_ago() >= 0
                          ? absl::StrFormat(" (last answer %.1f s ago)", p.last_ok_ms_ago() / 1e3)
                          : " (never answered)",
                      "\n");
    }
  }
  if (!errors.empty()) absl::StrAppend(&out, "\n", errors);
  return out;
}

namespace {

void AppendTransfers(const google::protobuf::RepeatedPtrField<ferry::v1::TransferSummary>& list,
                     std::string* out) {
  constexpr const char* kRow = "%-8s %-9s %-21s %-9s %-12s %-8s %-22s %s\n";
  absl::StrAppendFormat(out, kRow, "ID", "STATE", "PROGRESS", "OPS", "PEERS", "MODES", "RAILS",
                        "TIME");
  for (const auto& t : list) {
    const char* state = t.state() == ferry::v1::RUNNING     ? "running"
                        : t.state() == ferry::v1::SUCCEEDED ? "succeeded"
                                                            : "failed";
    const double pct = t.bytes_total() ? 100.0 * t.bytes_done() / t.bytes_total() : 100.0;
    std::string rails = t.rails().empty() ? "-" : absl::StrJoin(t.rails(), " ");
    if (t.retries() > 0) absl::StrAppend(&rails, " (", t.retries(), " retried)");
    absl::StrAppendFormat(out, kRow, absl::StrCat(t.transfer_id()), state,
                          absl::StrFormat("%s %.0f%%", HumanBytes(t.bytes_total()), pct),
                          absl::StrCat(t.ops_settled(), "/", t.ops_total()),
                          absl::StrJoin(t.peers(), ","),
                          t.modes().empty() ? "-" : absl::StrJoin(t.modes(), ","), rails,
                          absl::StrFormat("%.1f ms", t.duration_us() / 1000.0));
    if (!t.message().empty()) absl::StrAppend(out, "         ", t.message(), "\n");
  }
}

}  // namespace

std::string FormatTransfers(const ferry::v1::ListTransfersResponse& transfers) {
  std::string out = absl::StrCat("running: ", transfers.running_size(), "\n");
  if (transfers.running_size() > 0) AppendTransfers(transfers.running(), &out);
  absl::StrAppend(&out, "\nrecent: ", transfers.recent_size(), "\n");
  if (transfers.recent_size() > 0) AppendTransfers(transfers.recent(), &out);
  return out;
}

std::string FormatStats(const ferry::v1::GetStatsResponse& stats) {
  std::string out = absl::StrFormat("transfers: %d succeeded, %d failed\n\n",
                                    stats.transfers_succeeded(), stats.transfers_failed());
  constexpr const char* kRow = "%-12s %-6s %-8s %-9s %10s %12s %8s\n";
  absl::StrAppendFormat(&out, kRow, "PEER", "DIR", "MODE", "PROVIDER", "OPS", "BYTES", "FAILED");
  for (const auto& r : stats.rows()) {
    absl::StrAppendFormat(&out, kRow, r.peer(), r.direction(), r.mode(), r.provider(),
                          absl::StrCat(r.ops()), HumanBytes(r.bytes()), absl::StrCat(r.failed()));
  }
  constexpr const char* kLat = "%-9s %10s %12s %12s %12s\n";
  absl::StrAppendFormat(&out, "\n");
  absl::StrAppendFormat(&out, kLat, "OP SIZE", "OPS", "MEAN", "P50 <=", "P99 <=");
  for (const auto& l : stats.latency()) {
    const double mean = l.count() ? l.sum_us() / l.count() : 0;
    absl::StrAppendFormat(&out, kLat, l.size_class(), absl::StrCat(l.count()),
                          absl::StrFormat("%.0f us", mean), absl::StrFormat("%.0f us", l.p50_us()),
                          absl::StrFormat("%.0f us", l.p99_us()));
  }
  return out;
}

}  // namespace ferry::client
