#include "server/agent/agent_discovery.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/agent/agent_core.h"

namespace ferry::server {

std::unique_ptr<EtcdDiscovery> StartDiscovery(const config::Config& config, AgentCore& core,
                                              int peer_port) {
  if (!config.discovery.enabled()) return nullptr;
  DiscoveryOptions options;
  options.endpoints = config.discovery.etcd;
  options.prefix = config.discovery.prefix;
  options.lease_ttl = config.discovery.lease_ttl;
  options.self.node = config.node;
  options.self.address = config.discovery.advertise;
  if (options.self.address.empty()) {
    // listen.peer's host (config validation refused a wildcard) with the port it bound.
    options.self.address = absl::StrCat(
        config.peer_listen.substr(0, config.peer_listen.rfind(':')), ":", peer_port);
  }
  for (const auto& f : core.fabrics()) {
    auto& p = options.self.providers;
    if (std::find(p.begin(), p.end(), f->provider()) == p.end()) p.push_back(f->provider());
  }
  options.self.incarnation = core.incarnation();
  return EtcdDiscovery::Start(std::move(options), &core.peers());
}

}  // namespace ferry::server
