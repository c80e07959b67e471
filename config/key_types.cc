#include "config/key_types.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"

namespace ferry::config::key_types {

// ---- Values as YAML text (what `show` returns, and --print-config prints) ----

// A string as YAML: plain where a reader gets the same string back, else double-quoted. In
// a flow collection ([a, b], {k: v}) a ':' is quoted too.
std::string Quote(absl::string_view s, bool in_flow) {
  auto plain_char = [&](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) ||
           absl::string_view(in_flow ? "._/+@-" : "._/:+@-").find(ch) != absl::string_view::npos;
  };
  const bool plain = !s.empty() && s[0] != '-' && s[0] != ':' && s.back() != ':' &&
                     std::all_of(s.begin(), s.end(), plain_char) && s != "null" && s != "Null" &&
                     s != "NULL";
  if (plain) return std::string(s);
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\t') {
      out += "\\t";
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

// "1GiB", "64KiB", "4097": the way a file writes sizes.
std::string SizeText(uint64_t bytes) {
  if (bytes == 0) return "0";
  std::string text = absl::StrReplaceAll(FormatByteSize(bytes), {{" ", ""}});
  return absl::EndsWith(text, "KiB") || absl::EndsWith(text, "MiB") ||
                 absl::EndsWith(text, "GiB") || absl::EndsWith(text, "TiB")
             ? text
             : absl::StrCat(bytes);
}

std::string ShowList(const std::vector<std::string>& items) {
  std::vector<std::string> quoted;
  for (const auto& item : items) quoted.push_back(Quote(item, /*in_flow=*/true));
  return absl::StrCat("[", absl::StrJoin(quoted, ", "), "]");
}

std::string ShowMap(const std::map<std::string, std::string>& map) {
  std::vector<std::string> pairs;
  for (const auto& [k, v] : map)
    pairs.push_back(absl::StrCat(Quote(k, true), ": ", Quote(v, true)));
  return absl::StrCat("{", absl::StrJoin(pairs, ", "), "}");
}

// ---- Readers: a YAML value, checked; errors name origin, line and key ----

absl::StatusOr<std::string> ReadText(const Context& ctx, const YAML::Node& n,
                                     absl::string_view key) {
  if (!n.IsScalar()) return ctx.Error(n, key, "expected a string");
  return n.as<std::string>();
}

// A whole number within [min, max]. `millis`: a duration such as "30s" is the likely slip
// for a *_ms key, so the error says what to write instead.
absl::StatusOr<int64_t> ReadWhole(const Context& ctx, const YAML::Node& n, absl::string_view key,
                                  int64_t min, int64_t max, bool millis) {
  int64_t value = 0;
  if (!n.IsScalar() || !absl::SimpleAtoi(n.as<std::string>(), &value)) {
    absl::Duration d;
    if (millis && n.IsScalar() && absl::ParseDuration(n.as<std::string>(), &d) &&
        d >= absl::ZeroDuration()) {
      return ctx.Error(n, key,
                       absl::StrCat("expected milliseconds as a whole number: write ",
                                    absl::ToInt64Milliseconds(d), " for ", n.as<std::string>()));
    }
    return ctx.Error(n, key, "expected a whole number");
  }
  if (value < min || value > max) {
    return ctx.Error(n, key, absl::StrCat(value, " is outside ", min, "..", max));
  }
  return value;
}

absl::StatusOr<uint64_t> ReadSize(const Context& ctx, const YAML::Node& n, absl::string_view key) {
  if (!n.IsScalar()) return ctx.Error(n, key, "expected a size such as 1GiB");
  auto size = ParseByteSize(n.as<std::string>());
  if (!size.ok()) return ctx.Error(n, key, size.status().message());
  return *size;
}

absl::StatusOr<std::vector<std::string>> ReadNames(const Context& ctx, const YAML::Node& n,
                                                   absl::string_view key) {
  if (!n.IsSequence()) return ctx.Error(n, key, "expected a list of names");
  std::vector<std::string> out;
  for (const auto& item : n) {
    ASSIGN_OR_RETURN(std::string s, ReadText(ctx, item, key));
    out.push_back(std::move(s));
  }
  return out;
}

// A name -> host:port mapping (peers, tcp.rails); `bare_host_port` completes "10.0.0.1".
absl::StatusOr<std::map<std::string, std::string>> ReadAddressMap(const Context& ctx,
                                                                  const YAML::Node& n,
                                                                  absl::string_view key,
                                                                  absl::string_view expected,
                                                                  const char* bare_host_port) {
  if (!n.IsMap() && !n.IsNull()) return ctx.Error(n, key, expected);
  std::map<std::string, std::string> out;
  for (const auto& item : n) {
    std::string name = item.first.as<std::string>();
    std::string full = absl::StrCat(key, ".", name);
    ASSIGN_OR_RETURN(std::string address, ReadText(ctx, item.second, full));
    if (bare_host_port != nullptr && address.find(':') == std::string::npos)
      address = absl::StrCat(address, bare_host_port);
    absl::Status valid = ValidateAddress(address);
    if (!valid.ok()) return ctx.Error(item.second, full, valid.message());
    out[name] = address;
  }
  return out;
}

std::string OneOf(const std::vector<std::string>& choices) {
  if (choices.size() == 2) return absl::StrCat(choices[0], " or ", choices[1]);
  return absl::StrCat("one of ", absl::StrJoin(choices, ", "));
}

absl::Status CheckAddress(const std::string& a) { return ValidateAddress(a); }
absl::Status CheckAddressOrOff(const std::string& a) {
  return a.empty() ? absl::OkStatus() : ValidateAddress(a);
}
absl::Status CheckDialable(const std::string& a) { return ValidateAddress(a, false); }

// listen.local_mode: octal as chmod takes it; the owner keeps read and write (the agent).
Key SocketMode(std::string name, Reload reload, std::string doc) {
  Read read = [=](const Context& ctx, const YAML::Node& n, Config& c) -> absl::Status {
    ASSIGN_OR_RETURN(std::string text, ReadText(ctx, n, name));
    char* end = nullptr;
    unsigned long mode = std::strtoul(text.c_str(), &end, 8);
    if (text.empty() || *end != '\0' || mode > 0777 || (mode & 0600) != 0600) {
      return ctx.Error(n, name,
                       absl::StrCat(Echo(text), " is not an octal mode with owner rw (e.g. 0660)"));
    }
    c.local_socket_mode = static_cast<uint32_t>(mode);
    return absl::OkStatus();
  };
  Show show = [](const Config& c) -> std::optional<std::string> {
    char text[16];
    std::snprintf(text, sizeof(text), "\"%04o\"", c.local_socket_mode);
    return std::string(text);
  };
  return Key{name, "octal mode with owner rw", reload, std::move(doc), read, show};
}

// discovery.lease_ttl: etcd counts lease TTLs in whole seconds, and raises one below its
// minimum (about 1.5 x its election timeout, 2 s with defaults) silently.
Key LeaseTtl(std::string name, Reload reload, std::string doc) {
  const absl::Duration min = absl::Seconds(2), max = absl::Hours(1);
  Read read = [=](const Context& ctx, const YAML::Node& n, Config& c) -> absl::Status {
    absl::Duration d;
    if (!n.IsScalar() || !absl::ParseDuration(n.as<std::string>(), &d)) {
      return ctx.Error(n, name, "expected a duration such as 10s or 500ms");
    }
    if (d < min || d > max) {
      return ctx.Error(n, name,
                       absl::StrCat(absl::FormatDuration(d), " is outside ",
                                    absl::FormatDuration(min), "..", absl::FormatDuration(max)));
    }
    if (d != absl::Seconds(absl::ToInt64Seconds(d))) {
      return ctx.Error(n, name, "etcd leases count whole seconds");
    }
    c.discovery.lease_ttl = d;
    return absl::OkStatus();
  };
  Show show = [](const Config& c) -> std::optional<std::string> {
    return absl::FormatDuration(c.discovery.lease_ttl);
  };
  return Key{name, "duration, whole seconds 2s..1h", reload, std::move(doc), read, show};
}

Key Providers(std::string name, Reload reload, std::string doc) {
  Read read = [=](const Context& ctx, const YAML::Node& n, Config& c) -> absl::Status {
    ASSIGN_OR_RETURN(std::vector<std::string> providers, ReadNames(ctx, n, name));
    std::set<std::string> seen;
    for (const auto& p : providers) {
      if (p != "tcp" && p != "verbs") {
        return ctx.Error(n, name,
                         absl::StrCat("unknown provider ", Echo(p), " (expected verbs or tcp)"));
      }
      if (!seen.insert(p).second)
        return ctx.Error(n, name, absl::StrCat(Echo(p), " is listed twice"));
    }
    if (providers.empty()) return ctx.Error(n, name, "must list at least one provider");
    c.providers = std::move(providers);
    return absl::OkStatus();
  };
  Show show = [](const Config& c) -> std::optional<std::string> { return ShowList(c.providers); };
  return Key{name, "list of verbs, tcp", reload, std::move(doc), read, show};
}

Key EtcdEndpoints(std::string name, Reload reload, std::string doc) {
  Read read = [=](const Context& ctx, const YAML::Node& n, Config& c) -> absl::Status {
    if (n.IsScalar()) {
      return ctx.Error(n, name, "expected a list of host:port, e.g. [127.0.0.1:2379]");
    }
    ASSIGN_OR_RETURN(std::vector<std::string> etcd, ReadNames(ctx, n, name));
    if (etcd.empty()) return ctx.Error(n, name, "must list at least one endpoint");
    for (std::string& endpoint : etcd) {
      if (absl::StartsWith(endpoint, "https://")) {
        return ctx.Error(n, name,
                         absl::StrCat(Echo(endpoint), ": TLS to etcd is not supported yet"));
      }
      if (absl::StartsWith(endpoint, "http://")) endpoint = endpoint.substr(7);
      if (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
      absl::Status valid = ValidateAddress(endpoint, /*allow_port_0=*/false);
      if (!valid.ok()) return ctx.Error(n, name, valid.message());
    }
    c.discovery.etcd = std::move(etcd);
    return absl::OkStatus();
  };
  Show show = [](const Config& c) -> std::optional<std::string> {
    return ShowList(c.discovery.etcd);
  };
  return Key{name, "list of host:port", reload, std::move(doc), read, show};
}

// A prefix without its trailing '/' would also watch "/ferry/nodes2/...".
absl::Status CheckPrefix(const std::string& prefix) {
  if (!prefix.empty() && prefix.back() == '/') return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(Echo(prefix), " must end with '/' (keys are prefix + node)"));
}

Key Peers(std::string name, Reload reload, std::string doc) {
  Read read = [=](const Context& ctx, const YAML::Node& n, Config& c) -> absl::Status {
    ASSIGN_OR_RETURN(c.peers,
                     ReadAddressMap(ctx, n, name, "expected name: host:port pairs", nullptr));
    return absl::OkStatus();
  };
  Show show = [](const Config& c) -> std::optional<std::string> { return ShowMap(c.peers); };
  return Key{name, "node: host:port pairs", reload, std::move(doc), read, show};
}

Key TcpRails(std::string name, Reload reload, std::string doc) {
  Read read = [=](const Context& ctx, const YAML::Node& n, Config& c) -> absl::Status {
    c.tcp_rails_auto = n.IsScalar() && n.as<std::string>() == "auto";
    if (c.tcp_rails_auto) {
      c.tcp_rails.clear();
      return absl::OkStatus();
    }
    // A bare host listens on any free port of it.
    ASSIGN_OR_RETURN(
        c.tcp_rails,
        ReadAddressMap(ctx, n, name, "expected auto or nic: address pairs (mlx5_0: 10.0.0.1)",
                       ":0"));
    return absl::OkStatus();
  };
  Show show = [](const Config& c) -> std::optional<std::string> {
    return c.tcp_rails_auto ? "auto" : ShowMap(c.tcp_rails);
  };
  return Key{name, "auto, or nic: host[:port] pairs", reload, std::move(doc), read, show};
}

// policy.*: through ApplyPolicySetting, as SetPolicy and `ferryctl policy set` are.
Key PolicyKey(std::string leaf, std::string type, Reload reload, std::string doc, Show show) {
  std::string name = absl::StrCat("policy.", leaf);
  Read read = [=](const Context& ctx, const YAML::Node& n, Config& c) -> absl::Status {
    ASSIGN_OR_RETURN(std::string value, ReadText(ctx, n, name));
    absl::Status s = ApplyPolicySetting(leaf, value, c.policy);
    return s.ok() ? s : ctx.Error(n, name, s.message());
  };
  return Key{name, std::move(type), reload, std::move(doc), read, std::move(show)};
}

}  // namespace ferry::config::key_types
