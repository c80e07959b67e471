#include "config/config.h"

#include <unistd.h>

#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/echo.h"
#include "base/status_macros.h"
#include "base/text_file.h"
#include "config/keys.h"
#include "yaml-cpp/yaml.h"

namespace ferry::config {
namespace {

// The names a mapping may hold: the table's keys and sections at that level.
std::set<std::string> KnownNames(absl::string_view section) {
  std::set<std::string> known;
  for (const Key& key : Keys()) {
    absl::string_view name = key.name;
    if (section.empty()) {
      known.insert(std::string(name.substr(0, name.find('.'))));
    } else if (absl::StartsWith(name, section) && name.size() > section.size() &&
               name[section.size()] == '.') {
      known.insert(std::string(name.substr(section.size() + 1)));
    }
  }
  return known;
}

// Each key of `map` known, and there once: YAML parsers keep one of two equal keys silently,
// and a config must not mean two things.
absl::Status CheckKeys(const Context& ctx, const YAML::Node& map, absl::string_view section) {
  if (!map.IsMap()) {
    return ctx.Error(map, section.empty() ? "<top>" : section, "expected a mapping");
  }
  const std::set<std::string> known = KnownNames(section);
  std::set<std::string> seen;
  for (const auto& item : map) {
    std::string key = item.first.as<std::string>();
    std::string full = section.empty() ? key : absl::StrCat(section, ".", key);
    if (!seen.insert(key).second) return ctx.Error(item.first, full, "appears twice");
    if (!known.count(key)) {
      return ctx.Error(item.first, full,
                       absl::StrCat("unknown key (known: ", absl::StrJoin(known, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

// Where a rule's key sits in the file: the key's line, else its section's, else the top's.
YAML::Node NodeOf(const YAML::Node& root, const std::string& key) {
  size_t dot = key.find('.');
  if (dot == std::string::npos) return root[key] ? root[key] : root;
  YAML::Node section = root[key.substr(0, dot)];
  if (!section) return root;
  YAML::Node leaf = section[key.substr(dot + 1)];
  return leaf ? leaf : section;
}

// Every key through its row of the table (config/keys.cc), then the rules between keys.
absl::Status ParseInto(const Context& ctx, const YAML::Node& root, Config& c) {
  if (!root || root.IsNull()) return absl::OkStatus();  // empty file: all defaults
  RETURN_IF_ERROR(CheckKeys(ctx, root, ""));
  for (const auto& item : root) {
    const std::string name = item.first.as<std::string>();
    if (const Key* key = FindKey(name)) {
      RETURN_IF_ERROR(key->read(ctx, item.second, c));
      continue;
    }
    RETURN_IF_ERROR(CheckKeys(ctx, item.second, name));
    if (const Section* section = FindSection(name)) section->mark(c);
    for (const auto& leaf : item.second) {
      const Key* key = FindKey(absl::StrCat(name, ".", leaf.first.as<std::string>()));
      RETURN_IF_ERROR(key->read(ctx, leaf.second, c));
    }
  }
  // A discovery section is there to turn discovery on.
  if (auto d = root["discovery"]; d && !d["etcd"]) {
    return ctx.Error(d, "discovery.etcd", "missing: list etcd's client endpoints");
  }
  if (auto broken = BrokenRule(c)) {
    return ctx.Error(NodeOf(root, broken->first), broken->first, broken->second);
  }
  return absl::OkStatus();
}

absl::StatusOr<YAML::Node> ParseYaml(absl::string_view yaml, absl::string_view origin) {
  try {
    return YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ":", e.mark.line + 1, ": malformed YAML: ", e.msg));
  }
}

}  // namespace

absl::StatusOr<Config> ParseConfig(absl::string_view yaml, absl::string_view origin) {
  Context ctx(origin);
  ASSIGN_OR_RETURN(YAML::Node root, ParseYaml(yaml, origin));
  Config config;
  try {
    RETURN_IF_ERROR(ParseInto(ctx, root, config));
    absl::Status reach = CheckSecurityReach(config);
    if (!reach.ok()) return absl::InvalidArgumentError(absl::StrCat(origin, ": ", reach.message()));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ":", e.mark.line + 1, ": ", e.msg));
  }
  return config;
}

absl::StatusOr<Config> LoadConfigFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadTextFile(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("config file: ", text.status().message()));
  }
  ASSIGN_OR_RETURN(Config config, ParseConfig(*text, path));
  config.source_path = path;
  return config;
}

void ResolveDefaults(Config& config) {
  if (config.node.empty()) {
    char host[256] = {};
    if (gethostname(host, sizeof(host) - 1) == 0 && host[0] != '\0') {
      config.node = host;
    } else {
      config.node = "localhost";
    }
  }
  if (config.local_socket.empty())
    config.local_socket = absl::StrCat("/tmp/ferryd-", config.node, ".sock");
  // A relative socket path is relative to where the agent started; clients and the
  // agent's own lock need the absolute one.
  if (config.local_socket.front() != '/') {
    char cwd[4096];
    if (getcwd(cwd, sizeof(cwd)) != nullptr)
      config.local_socket = absl::StrCat(cwd, "/", config.local_socket);
  }
}

absl::Status ValidateNodeName(const std::string& node) {
  if (node.empty() || node.size() > 253 || node.find_first_of(":/ \t\n") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        node.empty() ? "''" : Echo(node), " must be non-empty without ':', '/' or spaces"));
  }
  return absl::OkStatus();
}

absl::Status ValidateAddress(const std::string& address, bool allow_port_0) {
  size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < (allow_port_0 ? 0 : 1) ||
      port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(Echo(address), " is not host:port"));
  }
  return absl::OkStatus();
}

absl::Status CheckSecurityReach(const Config& c) {
  const SecuritySettings& s = c.security;
  // A TCP port is open to every local user (and, off loopback, beyond): the local API
  // there takes only callers with a certificate of the CA, never plaintext.
  if (!c.local_tcp.empty() && !s.tls()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key 'listen.local_tcp': the local API over TCP needs mutual TLS (security.mode mtls "
        "with security.ca, cert and key); the Unix socket needs none"));
  }
  if (s.tls() || s.allow_insecure_remote) return absl::OkStatus();
  const std::string remedy =
      s.implicit ? "configure security.ca, security.cert and security.key (mutual TLS)"
                 : "use security.mode: mtls, or set security.allow_insecure_remote: true";
  auto refuse = [&](absl::string_view key, const std::string& address) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key '", key, "': ", Echo(address), " is not loopback and the Peer API would be "
        "plaintext there (", s.implicit ? "no security section" : "security.mode: insecure",
        "): ", remedy));
  };
  if (!IsLoopbackAddress(c.peer_listen)) return refuse("listen.peer", c.peer_listen);
  for (const auto& [name, address] : c.peers) {
    if (!IsLoopbackAddress(address)) return refuse(absl::StrCat("peers.", name), address);
  }
  if (c.discovery.enabled()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key 'discovery': peers found through etcd may be anywhere and the Peer API would be "
        "plaintext: ", remedy));
  }
  return absl::OkStatus();
}

bool IsLoopbackAddress(const std::string& address) {
  size_t colon = address.rfind(':');
  std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

absl::Status ValidateLogLevel(const std::string& level) {
  static const std::set<std::string> kLevels = {"trace", "debug", "info", "warn", "error"};
  if (kLevels.count(level)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("'", level.substr(0, 32), "' is not one of trace, debug, info, warn, error"));
}

absl::StatusOr<Policy> LoadPolicyFromFile(const std::string& path) {
  ASSIGN_OR_RETURN(Config config, LoadConfigFile(path));
  return config.policy;
}

}  // namespace ferry::config
