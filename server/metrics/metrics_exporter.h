#pragma once
// The agent's Prometheus endpoint (`metrics.listen`, prometheus-cpp's HTTP exposer): every
// scrape reads the agent's live state, so nothing on the data path updates a metric of its
// own. What it exports (names follow Prometheus conventions: base units, _total counters):
//   ferry_build_info{version}, ferry_policy_generation
//   ferry_transfer_ops_total / _bytes_total / _failed_ops_total {peer, direction, mode, provider}
//   ferry_transfers_total{result}, ferry_transfers_active
//   ferry_op_duration_seconds{size_class} (histogram)
//   ferry_nic_bytes_total / _ops_total / _errors_total / _retries_total {nic, peer}, and
//     ferry_nic_paused{nic, peer}: what each rail carried to each peer (engine's ledger)
//   ferry_nic_served_bytes_total{nic, direction}: peers' WRITEs / READs into our memory
//   ferry_nic_up{nic}
//   ferry_host_pool_bytes / _used_bytes, ferry_gpu_pool_bytes / _used_bytes {gpu}
//   ferry_bounce_chunks{pool}, ferry_bounce_chunks_in_use{pool} (staged credits in flight)
//   ferry_registrations{nic}: buffer registrations alive, by rail
//   ferry_registration_failures{reason}: GPU buffers a NIC could not register, by reason
//   ferry_peer_up{peer}, ferry_peer_rtt_seconds{peer}, ferry_peer_connections{peer}
//   ferry_sessions

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace prometheus {
class Exposer;
}

namespace ferry::server {

class AgentCore;
class AgentCollectable;

class MetricsExporter {
 public:
  // Listens on `listen` ("host:port"; port 0 picks one). INVALID_ARGUMENT / UNAVAILABLE
  // naming the address when it cannot.
  static absl::StatusOr<std::unique_ptr<MetricsExporter>> Start(const std::string& listen,
                                                                AgentCore* core);
  ~MetricsExporter();

  // "host:port" it listens on.
  const std::string& address() const { return address_; }

  // The text a scrape returns now (tests; the same families the endpoint serves).
  std::string Render() const;

 private:
  MetricsExporter() = default;
  std::shared_ptr<AgentCollectable> collectable_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string address_;
};

}  // namespace ferry::server
