#include "server/agent/agent_flags.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/echo.h"
#include "base/status_macros.h"
#include "config/keys.h"

namespace ferry::server {
namespace {

// A flag that sets one key of the table, read and checked as the file's value is.
struct KeyFlag {
  const char* flag;
  const char* key;
};
constexpr KeyFlag kKeyFlags[] = {
    {"--node", "node"},
    {"--socket", "listen.local"},
    {"--local-tcp", "listen.local_tcp"},
    {"--peer-listen", "listen.peer"},
    {"--metrics-listen", "metrics.listen"},
    {"--host-pool", "host_pool.size"},
    {"--tcp-connections", "tcp.connections"},
    {"--log-level", "log.level"},
};

const KeyFlag* FindKeyFlag(absl::string_view flag) {
  for (const KeyFlag& f : kKeyFlags) {
    if (flag == f.flag) return &f;
  }
  return nullptr;
}

// "--peer NAME=HOST:PORT" and "--set KEY=VALUE" take their value in two parts.
absl::StatusOr<std::pair<std::string, std::string>> SplitPair(absl::string_view value,
                                                              absl::string_view form) {
  std::pair<std::string, std::string> kv = absl::StrSplit(value, absl::MaxSplits('=', 1));
  if (kv.first.empty() || !absl::StrContains(value, '=')) {
    return absl::InvalidArgumentError(absl::StrCat(Echo(value), " is not ", form));
  }
  return kv;
}

absl::Status ApplyFlag(const std::string& flag, const std::string& value, config::Config& c) {
  if (const KeyFlag* f = FindKeyFlag(flag)) {
    absl::Status set = config::SetKey(c, f->key, value);
    // The flag names the key already: "--log-level: 'loud' is not one of ...".
    absl::string_view what = set.message();
    absl::ConsumePrefix(&what, absl::StrCat("key '", f->key, "': "));
    return set.ok() ? set : absl::InvalidArgumentError(what);
  }
  if (flag == "--set") {
    ASSIGN_OR_RETURN(auto kv, SplitPair(value, "KEY=VALUE"));
    return config::SetKey(c, kv.first, kv.second);
  }
  // --peer adds one peer to the file's.
  ASSIGN_OR_RETURN(auto kv, SplitPair(value, "NAME=HOST:PORT"));
  RETURN_IF_ERROR(config::ValidateNodeName(kv.first));
  RETURN_IF_ERROR(config::ValidateAddress(kv.second));
  c.peers[kv.first] = kv.second;
  return absl::OkStatus();
}

}  // namespace

const char* AgentUsage() {
  return "usage: ferryd [--config FILE] [--print-config] [--node NAME] [--socket PATH]\n"
         "              [--local-tcp HOST:PORT] [--peer-listen HOST:PORT]\n"
         "              [--metrics-listen HOST:PORT] [--peer NAME=HOST:PORT ...]\n"
         "              [--host-pool SIZE] [--tcp-connections N] [--log-level LEVEL]\n"
         "              [--set KEY=VALUE ...] [--help] [--version]\n"
         "Flags override the file, in order; --set sets any key (docs/config-keys.md), e.g.\n"
         "--set verbs.retry_cnt=6 or --set 'nics.allow=[mlx5_0]'. --print-config prints the\n"
         "config these would run with, as a file --config reads, and exits.\n"
         "SIGHUP reloads the file; SIGTERM drains (limits.shutdown_grace_ms), SIGINT stops at\n"
         "once.\n";
}

absl::StatusOr<AgentCommandLine> ParseAgentCommandLine(const std::vector<std::string>& args) {
  AgentCommandLine line;
  // Answered whatever else the line holds.
  for (const std::string& arg : args) {
    line.help = line.help || arg == "--help" || arg == "-h";
    line.version = line.version || arg == "--version";
  }
  if (line.help || line.version) return line;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    if (flag == "--print-config") {
      line.print_config = true;
      continue;
    }
    if (FindKeyFlag(flag) == nullptr && flag != "--config" && flag != "--peer" && flag != "--set") {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", Echo(flag)));
    }
    if (i + 1 >= args.size()) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": missing value"));
    }
    const std::string& value = args[++i];
    if (flag == "--config") {
      line.config_path = value;
    } else {
      line.settings.push_back({flag, value});
    }
  }
  return line;
}

absl::StatusOr<config::Config> LoadAgentConfig(const AgentCommandLine& line) {
  config::Config c;
  if (!line.config_path.empty()) {
    ASSIGN_OR_RETURN(c, config::LoadConfigFile(line.config_path));
  }
  for (const auto& [flag, value] : line.settings) {
    absl::Status s = ApplyFlag(flag, value, c);
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(flag, ": ", s.message()));
  }
  // Again after the flags: they may break a rule between keys, or take plaintext beyond
  // loopback (--peer-listen, --peer).
  if (auto broken = config::BrokenRule(c)) {
    return absl::InvalidArgumentError(absl::StrCat("key '", broken->first, "': ", broken->second));
  }
  config::ResolveDefaults(c);
  RETURN_IF_ERROR(config::CheckSecurityReach(c));
  return c;
}

}  // namespace ferry::server
