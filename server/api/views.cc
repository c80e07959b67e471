#include "server/api/views.h"

#include <algorithm>
#include <set>

#include "server/agent/agent_core.h"
#include "server/peers/peer_source.h"

namespace ferry::server {

void DescribePeers(AgentCore& core, ferry::v1::ListPeersResponse* out) {
  const absl::Time now = absl::Now();
  for (const auto& [node, check] : core.peer_health().Snapshot()) {
    auto* p = out->add_peers();
    p->set_node(node);
    std::optional<PeerDirectory::View> view = core.peers().ViewOf(node);
    if (view) {
      p->set_address(view->address);
      for (const auto& rail : view->rails) p->add_rails(rail.ToString());
      p->set_endpoints(static_cast<uint32_t>(view->endpoints));
      p->set_incarnation(view->incarnation);
      p->set_kept_answers(static_cast<uint32_t>(view->kept_answers));
      p->set_kept_lists(static_cast<uint32_t>(view->kept_lists));
    }
    p->set_answers_held(static_cast<uint32_t>(core.leases().HeldBy(node)));
    p->set_answers_granted(core.leases().GrantedTo(node));
    p->set_lists_held(static_cast<uint32_t>(core.leases().ListsHeldBy(node)));
    p->set_lists_granted(core.leases().ListsGrantedTo(node));
    p->set_health(!check.checked ? "unchecked" : check.healthy ? "ok" : "unreachable");
    p->set_rtt_us(static_cast<uint64_t>(absl::ToInt64Microseconds(check.rtt)));
    if (check.incarnation != 0) p->set_incarnation(check.incarnation);
    p->set_last_error(check.healthy ? "" : check.last_error);
    p->set_last_ok_ms_ago(check.last_ok == absl::InfinitePast()
                              ? -1
                              : absl::ToInt64Milliseconds(now - check.last_ok));
    std::optional<PeerSource> source = core.peers().SourceOf(node);
    p->set_source(source ? PeerSourceName(*source) : "");
  }
}

namespace {

ferry::v1::TransferSummary Summarize(const Transfer& t) {
  ferry::v1::TransferSummary s;
  const ferry::v1::TransferResult r = t.Result();
  uint64_t version = 0;
  const ferry::v1::TransferProgress progress = t.Progress(&version);
  s.set_transfer_id(t.id());
  s.set_state(r.state());
  s.set_ops_total(r.ops_total());
  s.set_ops_failed(r.ops_failed());
  s.set_ops_settled(r.ops_succeeded() + r.ops_failed());
  s.set_bytes_total(progress.bytes_total());
  s.set_bytes_done(progress.bytes_done());
  s.set_duration_us(r.duration_us());
  s.set_message(r.message());
  for (const auto& peer : t.peers()) s.add_peers(peer);
  std::set<std::string> modes, rails;
  uint64_t retries = 0;
  t.VisitOps([&](const Transfer::OpView& op) {
    if (!op.mode.empty()) modes.insert(op.mode);
    for (const auto& rail : op.rails) rails.insert(rail);
    retries += op.retries;
  });
  for (const auto& m : modes) s.add_modes(m);
  for (const auto& r : rails) s.add_rails(r);
  s.set_retries(retries);
  return s;
}

}  // namespace

void DescribeTransfers(AgentCore& core, uint32_t recent, ferry::v1::ListTransfersResponse* out,
                       int64_t owner_uid) {
  auto shown = [owner_uid](const Transfer& t) {
    return owner_uid == Transfer::kUnknownOwner || t.owner_uid() == owner_uid;
  };
  for (const auto& t : core.engine().Running()) {
    if (shown(*t)) *out->add_running() = Summarize(*t);
  }
  for (const auto& t : core.engine().Recent(recent == 0 ? 20 : recent)) {
    if (shown(*t)) *out->add_recent() = Summarize(*t);
  }
}

double BucketQuantile(const std::vector<double>& bounds, const std::vector<uint64_t>& buckets,
                      double q) {
  uint64_t total = 0;
  for (uint64_t b : buckets) total += b;
  if (total == 0) return 0;
  const double want = q * static_cast<double>(total);
  uint64_t seen = 0;
  for (size_t i = 0; i < buckets.size() && i < bounds.size(); ++i) {
    seen += buckets[i];
    if (static_cast<double>(seen) >= want) return bounds[i];
  }
  return bounds.empty() ? 0 : bounds.back();
}

void DescribeStats(AgentCore& core, ferry::v1::GetStatsResponse* out) {
  const TransferStats& stats = core.engine().stats();
  for (const auto& [key, totals] : stats.Totals()) {
    auto* row = out->add_rows();
    const auto& [peer, direction, mode, provider] = key;
    row->set_peer(peer);
    row->set_direction(direction);
    row->set_mode(mode);
    row->set_provider(provider);
    row->set_ops(totals.ops);
    row->set_bytes(totals.bytes);
    row->set_failed(totals.failed);
  }
  const std::vector<double> bounds(kLatencyBoundsUs.begin(), kLatencyBoundsUs.end());
  for (const auto& [size_class, h] : stats.Latency()) {
    auto* l = out->add_latency();
    l->set_size_class(size_class);
    l->set_count(h.count);
    l->set_sum_us(h.sum_us);
    std::vector<uint64_t> buckets(h.buckets.begin(), h.buckets.end());
    for (double b : bounds) l->add_bounds_us(b);
    for (uint64_t b : buckets) l->add_buckets(b);
    l->set_p50_us(BucketQuantile(bounds, buckets, 0.5));
    l->set_p99_us(BucketQuantile(bounds, buckets, 0.99));
  }
  out->set_transfers_succeeded(stats.transfers_succeeded());
  out->set_transfers_failed(stats.transfers_failed());
}

}  // namespace ferry::server
