#include "server/metrics/metrics_exporter.h"

#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"
#include "server/agent/agent_core.h"
#include "server/version.h"
#include "transport/tcp/socket.h"

namespace ferry::server {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

namespace {

using Labels = std::vector<std::pair<std::string, std::string>>;

// Families by name, filled metric by metric.
class Families {
 public:
  void Add(const std::string& name, MetricType type, const std::string& help,
           const Labels& labels, double value) {
    ClientMetric m;
    for (const auto& [k, v] : labels) m.label.push_back({k, v});
    if (type == MetricType::Counter) {
      m.counter.value = value;
    } else {
      m.gauge.value = value;
    }
    Family(name, type, help).metric.push_back(std::move(m));
  }
  MetricFamily& Family(const std::string& name, MetricType type, const std::string& help) {
    auto [it, added] = index_.try_emplace(name, families_.size());
    if (added) families_.push_back({name, help, type, {}});
    return families_[it->second];
  }
  std::vector<MetricFamily> Take() { return std::move(families_); }

 private:
  std::vector<MetricFamily> families_;
  std::map<std::string, size_t> index_;
};

}  // namespace

class AgentCollectable : public prometheus::Collectable {
 public:
  explicit AgentCollectable(AgentCore* core) : core_(core) {}

  std::vector<MetricFamily> Collect() const override {
    Families f;
    AgentCore& core = *core_;
    f.Add("ferry_build_info", MetricType::Gauge, "ferryd's version, as a label.",
          {{"version", kFerryVersion}, {"node", core.config().node}}, 1);
    auto snapshot = core.policies().Current();
    f.Add("ferry_policy_generation", MetricType::Gauge,
          "Generation of the GDR / staging policy in force.", {}, snapshot->generation);

    const TransferStats& stats = core.engine().stats();
    for (const auto& [key, t] : stats.Totals()) {
      const auto& [peer, direction, mode, provider] = key;
      Labels l = {{"peer", peer}, {"direction", direction}, {"mode", mode}, {"provider", provider}};
      f.Add("ferry_transfer_ops_total", MetricType::Counter, "Ops of finished transfers.", l,
            t.ops);
      f.Add("ferry_transfer_bytes_total", MetricType::Counter,
            "Bytes moved by ops of finished transfers.", l, t.bytes);
      f.Add("ferry_transfer_failed_ops_total", MetricType::Counter,
            "Ops of finished transfers that failed.", l, t.failed);
    }
    f.Add("ferry_transfers_total", MetricType::Counter, "Finished transfers, by result.",
          {{"result", "succeeded"}}, stats.transfers_succeeded());
    f.Add("ferry_transfers_total", MetricType::Counter, "Finished transfers, by result.",
          {{"result", "failed"}}, stats.transfers_failed());
    f.Add("ferry_transfers_active", MetricType::Gauge, "Transfers running now.", {},
          core.engine().active());
    MetricFamily& latency = f.Family("ferry_op_duration_seconds", MetricType::Histogram,
                                     "Op latency (post to completion), by op size class.");
    for (const auto& [size_class, h] : stats.Latency()) {
      ClientMetric m;
      m.label.push_back({"size_class", size_class});
      m.histogram.sample_count = h.count;
      m.histogram.sample_sum = h.sum_us / 1e6;
      uint64_t cumulative = 0;
      for (size_t i = 0; i < kLatencyBoundsUs.size(); ++i) {
        cumulative += h.buckets[i];
        m.histogram.bucket.push_back({cumulative, kLatencyBoundsUs[i] / 1e6});
      }
      m.histogram.bucket.push_back({h.count, std::numeric_limits<double>::infinity()});
      latency.metric.push_back(std::move(m));
    }

    for (const RailPeerCounters& c : core.engine().ledger().Snapshot(absl::Now())) {
      Labels l = {{"nic", c.rail.ToString()}, {"peer", c.peer}};
      f.Add("ferry_nic_bytes_total", MetricType::Counter,
            "Bytes each rail carried to or from each peer.", l, c.bytes);
      f.Add("ferry_nic_ops_total", MetricType::Counter, "Slices each rail carried.", l, c.ops);
      f.Add("ferry_nic_errors_total", MetricType::Counter,
            "Slices that failed on the rail with a transport error.", l, c.errors);
      f.Add("ferry_nic_retries_total", MetricType::Counter,
            "Of those, slices another rail carried.", l, c.retries);
      f.Add("ferry_nic_paused", MetricType::Gauge,
            "1 while the rail is paused for the peer (or waits for its probe).", l,
            c.state == "ok" ? 0 : 1);
    }
    std::map<std::string, uint64_t> registrations;
    std::map<std::string, uint64_t> failures;
    for (const auto& buffer : core.buffers().List()) {
      for (const auto& [rail, region] : buffer->regions()) ++registrations[rail.ToString()];
      for (const auto& attempt : buffer->attempts()) {
        if (!attempt.status.ok()) ++failures[absl::StatusCodeToString(attempt.status.code())];
      }
    }
    for (const auto& fabric : core.fabrics()) {
      const std::string nic = fabric->rail().ToString();
      const fabric::Fabric::Served served = fabric->served();
      f.Add("ferry_nic_served_bytes_total", MetricType::Counter,
            "Bytes peers moved through the rail into (write) or out of (read) our memory.",
            {{"nic", nic}, {"direction", "write"}}, served.written_bytes);
      f.Add("ferry_nic_served_bytes_total", MetricType::Counter,
            "Bytes peers moved through the rail into (write) or out of (read) our memory.",
            {{"nic", nic}, {"direction", "read"}}, served.read_bytes);
      f.Add("ferry_nic_up", MetricType::Gauge, "1 while the rail can carry traffic.",
            {{"nic", nic}}, fabric->health().ok() ? 1 : 0);
      f.Add("ferry_registrations", MetricType::Gauge, "Buffer registrations alive, by rail.",
            {{"nic", nic}}, registrations[nic]);
    }
    for (const auto& [reason, count] : failures) {
      f.Add("ferry_registration_failures", MetricType::Gauge,
            "Live GPU buffers a rail could not register, by reason (status code).",
            {{"reason", reason}}, count);
    }

    f.Add("ferry_host_pool_bytes", MetricType::Gauge, "Size of the host pool.", {},
          core.pool().size());
    f.Add("ferry_host_pool_used_bytes", MetricType::Gauge, "Host pool bytes in use.", {},
          core.pool().used());
    GpuPools* gpus = core.gpus();
    for (size_t g = 0; gpus != nullptr && g < gpus->count(); ++g) {
      const GpuPoolStats s = gpus->Stats(static_cast<int>(g));
      Labels l = {{"gpu", absl::StrCat("cuda:", g)}};
      f.Add("ferry_gpu_pool_bytes", MetricType::Gauge, "Size of each GPU's pool.", l,
            s.pool_bytes);
      f.Add("ferry_gpu_pool_used_bytes", MetricType::Gauge, "GPU pool bytes in use.", l,
            s.used_bytes);
    }
    for (const BouncePoolStats& b : core.bounce().Stats()) {
      Labels l = {{"pool", b.name}, {"chunk_bytes", absl::StrCat(b.chunk_bytes)}};
      f.Add("ferry_bounce_chunks", MetricType::Gauge, "Chunks of each bounce pool.", l, b.chunks);
      f.Add("ferry_bounce_chunks_in_use", MetricType::Gauge,
            "Bounce chunks held by staged legs (ours and peers' credits) now.", l,
            b.chunks_in_use);
    }
    for (const auto& [node, check] : core.peer_health().Snapshot()) {
      Labels l = {{"peer", node}};
      f.Add("ferry_peer_up", MetricType::Gauge, "1 while the peer answers Health calls.", l,
            check.healthy ? 1 : 0);
      f.Add("ferry_peer_rtt_seconds", MetricType::Gauge, "Round trip of the last Health call.",
            l, absl::ToDoubleSeconds(check.rtt));
      std::optional<PeerDirectory::View> view = core.peers().ViewOf(node);
      f.Add("ferry_peer_connections", MetricType::Gauge,
            "Fabric endpoints to the peer that are up.", l, view ? view->endpoints : 0);
    }
    f.Add("ferry_sessions", MetricType::Gauge, "Local clients connected.", {},
          core.sessions().count());
    return f.Take();
  }

 private:
  AgentCore* const core_;
};

absl::StatusOr<std::unique_ptr<MetricsExporter>> MetricsExporter::Start(const std::string& listen,
                                                                        AgentCore* core) {
  absl::StatusOr<tcp::HostPort> hp = tcp::ParseHostPort(listen);
  if (!hp.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics.listen: ", listen, ": ", hp.status().message()));
  }
  std::unique_ptr<MetricsExporter> out(new MetricsExporter());
  out->collectable_ = std::make_shared<AgentCollectable>(core);
  try {
    // civetweb's listening port syntax: "host:port".
    out->exposer_ = std::make_unique<prometheus::Exposer>(listen, 1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("metrics.listen: cannot listen on ", listen, ": ", e.what()));
  }
  out->exposer_->RegisterCollectable(out->collectable_);
  std::vector<int> ports = out->exposer_->GetListeningPorts();
  out->address_ = absl::StrCat(hp->host, ":", ports.empty() ? hp->port : ports[0]);
  return out;
}

MetricsExporter::~MetricsExporter() {
  // The exposer's threads read the agent: they stop first.
  exposer_.reset();
}

std::string MetricsExporter::Render() const {
  prometheus::TextSerializer serializer;
  return serializer.Serialize(collectable_->Collect());
}

}  // namespace ferry::server
