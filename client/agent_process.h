#pragma once
// Starts a real ferryd as a child process with a generated config, waits until it serves,
// and stops it on destruction. Used by the demo, the integration tests and the benchmark,
// so none of them can leave an agent running: the child also dies with its parent
// (PR_SET_PDEATHSIG).

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ferry {

struct AgentSpec {
  std::string node;
  // Folder for the config, socket and log (must exist).
  std::string dir;
  // Peer API port on 127.0.0.1 (0: pick a free one).
  uint16_t peer_port = 0;
  // Other agents: node -> "host:port".
  std::map<std::string, std::string> peers;
  // YAML appended to the generated config (e.g. "host_pool:\n  size: 2GiB\n"); not a
  // `listen` section (that one is generated).
  std::string extra_yaml;
  // Opt-in TCP listener for the local API ("host:port"), written into `listen`.
  std::string local_tcp;
  // listen.local_mode / listen.local_group ("" = the defaults: 0660, the agent's group).
  std::string local_mode, local_group;
  // ferryd binary; empty: $FERRYD, else the one this build made.
  std::string ferryd;
  // The agent's RLIMIT_NOFILE (0: inherited).
  uint64_t open_files = 0;
  // The Peer API's `security`: "mtls" (a certificate for `node` from the DevPki in `dir`,
  // client/dev_pki.h: agents in one folder trust each other), "insecure", or "" (none
  // written: extra_yaml's own, or the default). extra_yaml with a `security:` section wins.
  std::string security = "mtls";
};

// A free TCP port on 127.0.0.1 at the time of the call, below the ephemeral range (so that
// no port-0 bind of an agent started meanwhile takes it first).
absl::StatusOr<uint16_t> PickFreePort();

class AgentProcess {
 public:
  // Returns as soon as the agent serves its socket, or with its log once it exited. The
  // timeout only bounds a hang: under ASan on a 2-core CI machine beside a 32-agent mesh an
  // agent once took over 15 s to come up (or to reach a config refusal), so it is generous.
  static absl::StatusOr<std::unique_ptr<AgentProcess>> Start(
      const AgentSpec& spec, absl::Duration timeout = absl::Seconds(60));
  ~AgentProcess();

  // SIGTERM, then SIGKILL if it has not stopped within `grace`. Returns its exit status.
  int Stop(absl::Duration grace = absl::Seconds(5));
  // SIGKILL now (a crashed peer).
  void Kill();
  // Waits, sending nothing, up to `timeout` for the agent to exit (after a signal the test
  // sent itself). Returns its exit status, or -1 if it still runs.
  int AwaitExit(absl::Duration timeout);
  bool running() const { return pid_ > 0; }

  const std::string& node() const { return node_; }
  const std::string& socket() const { return socket_; }
  const std::string& peer_address() const { return peer_address_; }
  const std::string& config_path() const { return config_path_; }
  const std::string& log_path() const { return log_path_; }
  pid_t pid() const { return pid_; }
  // A memory figure of the agent from /proc/<pid>/status, in bytes (0 if unknown):
  // "VmHWM" (peak resident), "VmRSS" (resident now), "RssAnon" (heap and stacks, without
  // the shared pool pages).
  uint64_t MemoryBytes(const std::string& field) const;

 private:
  AgentProcess() = default;
  int Reap(bool wait);

  std::string node_, socket_, peer_address_, config_path_, log_path_;
  pid_t pid_ = -1;
};

}  // namespace ferry
