#pragma once
// The one registry of fabric providers: which exist, building them from config, and the
// pure rule that picks the provider two agents use.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "transport/fabric.h"
#include "transport/tcp/tcp_fabric.h"
#include "transport/verbs/verbs_options.h"

namespace ferry::fabric {

struct ProviderOptions {
  // Preference order, e.g. {"verbs", "tcp"}.
  std::vector<std::string> providers;
  // One tcp fabric with `tcp`, or, when `tcp_rails` is not empty, one per rail (each names
  // its NIC and listens on that NIC's address) instead.
  tcp::TcpOptions tcp;
  std::vector<tcp::TcpOptions> tcp_rails;
  // One verbs fabric per device: `verbs.device` alone when set, else each of
  // `verbs_devices` (the topology's selectable NICs), else every device with an active port.
  verbs::VerbsOptions verbs;
  std::vector<std::string> verbs_devices;
};

// Builds every listed provider that can run here, in preference order, one fabric per NIC
// (rail) where the provider runs on NICs. A provider or NIC that cannot (verbs without an
// RDMA device, a device whose ports are down) is left out and `skipped` gets one line
// saying why. FAILED_PRECONDITION when none can run.
absl::StatusOr<std::vector<std::unique_ptr<Fabric>>> CreateFabrics(
    const ProviderOptions& options, std::vector<std::string>* skipped);

// The provider two agents use: the first of `ours` (preference order) that `theirs`
// offers. FAILED_PRECONDITION naming both lists when they share none.
absl::StatusOr<std::string> SelectProvider(const std::vector<std::string>& ours,
                                           const std::vector<std::string>& theirs);

}  // namespace ferry::fabric
