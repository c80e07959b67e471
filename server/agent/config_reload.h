#pragma once
// A SIGHUP reload: what of a changed config file a running agent takes on (the policy,
// under the run-time settings; peers; log level; request limits), and, by key, what it
// cannot without a restart (sockets, pools, providers, topology: config::RestartOnlyChanges,
// from the table of keys), so that nothing changes or stays silently.

#include <string>
#include <vector>

#include "config/config.h"

namespace ferry::server {

class AgentCore;

struct ReloadReport {
  std::vector<std::string> applied;      // "peers: peer node-c added at 127.0.0.1:7300"
  std::vector<std::string> not_applied;  // "host_pool.size: needs a restart (runs with 1 GiB)"
};

// Applies `next` to `core`, which runs with `running`: on return the reloadable parts of
// `running` are `next`'s (the rest stays as it runs).
ReloadReport ApplyReload(AgentCore& core, config::Config& running, const config::Config& next);

}  // namespace ferry::server
