#pragma once
// The one place where config becomes the options of the fabric providers and the engine, so
// that a setting cannot arrive in one caller (start-up) and be forgotten in another (SIGHUP).
// tests/agent_options_test.cc checks that every field arrives.

#include <cstdint>
#include <string>

#include "config/config.h"
#include "server/engine/transfer_engine.h"
#include "transport/providers.h"

namespace ferry::server {

// The providers' options from `config`. The tcp data listener defaults to the peer API's
// host on any free port, and its incoming connections are capped at
// `connection_fd_budget` (ConnectionFdBudget, base/open_files.h: connections must never
// take the agent's last fds). When that cap lowers limits.tcp_max_connections and
// `clamp_note` is not null, *clamp_note gets one line for the log; else it is left empty.
// A tcp rail: `base` (the tcp options from config) on NIC `nic`, listening on and sending
// from `address` ("host:port"), one event loop per direction (rails share the cores).
tcp::TcpOptions TcpRailOptions(const tcp::TcpOptions& base, const std::string& nic,
                               const std::string& address);

fabric::ProviderOptions ProviderOptionsFromConfig(const config::Config& config,
                                                  uint64_t connection_fd_budget,
                                                  std::string* clamp_note = nullptr);

// The engine's request limits from `config` (its `limits:` section). Fields without a key
// (history) keep their defaults.
EngineLimits EngineLimitsFromConfig(const config::Config& config);

}  // namespace ferry::server
