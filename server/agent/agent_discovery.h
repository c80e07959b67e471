#pragma once
// ferryd's part of discovery: what this agent registers in etcd (its node, the peer address
// it bound or the one to advertise, its providers, its incarnation), from the config.

#include <memory>

#include "config/config.h"
#include "server/peers/discovery.h"

namespace ferry::server {

class AgentCore;

// Starts discovery when the config has `discovery.etcd` (nullptr otherwise). `peer_port` is
// the port the Peer API bound (listen.peer may say 0).
std::unique_ptr<EtcdDiscovery> StartDiscovery(const config::Config& config, AgentCore& core,
                                              int peer_port);

}  // namespace ferry::server
