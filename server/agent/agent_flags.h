#pragma once
// ferryd's command line: which flags there are, and the config they make (the file, then
// the flags on top, each checked as the file's value is: a named flag sets one key of the
// table of keys, config/keys.h). main.cc answers --help, --version and --print-config.

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "config/config.h"

namespace ferry::server {

// The usage text `ferryd --help` prints.
const char* AgentUsage();

struct AgentCommandLine {
  bool help = false;
  bool version = false;
  bool print_config = false;  // print the effective config as YAML and exit
  std::string config_path;    // --config; "" = none (every key's default)
  // The flags that set keys, in the order given: {"--node", "a"}, {"--set", "k=v"}.
  std::vector<std::pair<std::string, std::string>> settings;
};

// Reads argv[1..]: INVALID_ARGUMENT "unknown flag '--x'" or "--node: missing value" for a
// usage mistake. Values are not checked here (LoadAgentConfig does).
absl::StatusOr<AgentCommandLine> ParseAgentCommandLine(const std::vector<std::string>& args);

// The config the command line asks for: the file (if any), each flag on top in order, then
// the rules between keys and the loopback rule of insecure peers, and the machine's defaults
// (ResolveDefaults). A bad value: INVALID_ARGUMENT naming the flag ("--log-level: 'loud' is
// not one of ...") or, for a file, file, line and key.
absl::StatusOr<config::Config> LoadAgentConfig(const AgentCommandLine& line);

}  // namespace ferry::server
