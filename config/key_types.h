#pragma once
// The kinds of config key (text, host:port, whole number, size, ...): how each reads its YAML
// value, checked, and shows it back as YAML. keys.cc builds its table of keys from these.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/byte_size.h"
#include "base/echo.h"
#include "base/status_macros.h"
#include "config/keys.h"
#include "yaml-cpp/yaml.h"

namespace ferry::config::key_types {

// ---- Values as YAML text (what `show` returns, and --print-config prints) ----

// A string as YAML: plain where a reader gets the same string back, else double-quoted. In
// a flow collection ([a, b], {k: v}) a ':' is quoted too.
std::string Quote(absl::string_view s, bool in_flow = false);

// "1GiB", "64KiB", "4097": the way a file writes sizes.
std::string SizeText(uint64_t bytes);

// [a, b] and {k: v}, each item quoted as it needs.
std::string ShowList(const std::vector<std::string>& items);
std::string ShowMap(const std::map<std::string, std::string>& map);

// ---- Readers: a YAML value, checked; errors name origin, line and key ----

absl::StatusOr<std::string> ReadText(const Context& ctx, const YAML::Node& n,
                                     absl::string_view key);

// A whole number within [min, max]. `millis`: a duration such as "30s" is the likely slip
// for a *_ms key, so the error says what to write instead.
absl::StatusOr<int64_t> ReadWhole(const Context& ctx, const YAML::Node& n, absl::string_view key,
                                  int64_t min, int64_t max, bool millis);

absl::StatusOr<uint64_t> ReadSize(const Context& ctx, const YAML::Node& n, absl::string_view key);

absl::StatusOr<std::vector<std::string>> ReadNames(const Context& ctx, const YAML::Node& n,
                                                   absl::string_view key);

// A name -> host:port mapping (peers, tcp.rails); `bare_host_port` completes "10.0.0.1".
absl::StatusOr<std::map<std::string, std::string>> ReadAddressMap(const Context& ctx,
                                                                  const YAML::Node& n,
                                                                  absl::string_view key,
                                                                  absl::string_view expected,
                                                                  const char* bare_host_port);

// "a or b", "one of a, b, c": the choices as messages and docs name them.
std::string OneOf(const std::vector<std::string>& choices);

// ---- Checks of text values ----

// host:port (port 0: any free one); the same or "" (off); host:port that peers can dial.
absl::Status CheckAddress(const std::string& a);
absl::Status CheckAddressOrOff(const std::string& a);
absl::Status CheckDialable(const std::string& a);

// ---- Row builders: one per kind of value. `get` is FIELD(path) in keys.cc: it reaches the
// field from a Config or a const Config alike, so reading and showing share it. ----

using Read = std::function<absl::Status(const Context&, const YAML::Node&, Config&)>;
using Show = std::function<std::optional<std::string>(const Config&)>;

// Text; `check` (may be null) refuses values, `unset` is the value shown commented out.
template <typename Get>
Key Text(std::string name, Get get, Reload reload, std::string doc,
         absl::Status (*check)(const std::string&) = nullptr,
         std::optional<std::string> unset = std::nullopt) {
  Read read = [=](const Context& ctx, const YAML::Node& n, Config& c) -> absl::Status {
    ASSIGN_OR_RETURN(std::string value, ReadText(ctx, n, name));
    if (check != nullptr) {
      absl::Status valid = check(value);
      if (!valid.ok()) return ctx.Error(n, name, valid.message());
    }
    get(c) = std::move(value);
    return absl::OkStatus();
  };
  Show show = [=](const Config& c) -> std::optional<std::string> {
    if (unset && get(c) == *unset) return std::nullopt;
    return Quote(get(c));
  };
  return Key{name, "text", reload, std::move(doc), read, show};
}

// host:port; `check` is CheckAddress, CheckAddressOrOff ("" = off) or CheckDialable.
template <typename Get>
Key Address(std::string name, Get get, Reload reload, std::string doc,
            absl::Status (*check)(const std::string&),
            std::optional<std::string> unset = std::nullopt) {
  Key key = Text(std::move(name), get, reload, std::move(doc), check, std::move(unset));
  key.type = check == CheckAddressOrOff ? "host:port, or \"\" (off)" : "host:port";
  return key;
}

template <typename Get>
Key Choice(std::string name, Get get, std::vector<std::string> choices, Reload reload,
           std::string doc) {
  Read read = [=](const Context& ctx, const YAML::Node& n, Config& c) -> absl::Status {
    ASSIGN_OR_RETURN(std::string value, ReadText(ctx, n, name));
    if (std::find(choices.begin(), choices.end(), value) == choices.end()) {
      return ctx.Error(n, name, absl::StrCat(Echo(value), " is not ", OneOf(choices)));
    }
    get(c) = std::move(value);
    return absl::OkStatus();
  };
  Show show = [=](const Config& c) -> std::optional<std::string> { return Quote(get(c)); };
  return Key{name, OneOf(choices), reload, std::move(doc), read, show};
}

// A whole number in [min, max]; `millis` for *_ms keys; `unset` shown commented out.
template <typename Get>
Key Whole(std::string name, Get get, int64_t min, int64_t max, Reload reload, std::string doc,
          bool millis = false, std::optional<int64_t> unset = std::nullopt) {
  using Field = std::remove_reference_t<decltype(get(std::declval<Config&>()))>;
  Read read = [=](const Context& ctx, const YAML::Node& n, Config& c) -> absl::Status {
    ASSIGN_OR_RETURN(int64_t value, ReadWhole(ctx, n, name, min, max, millis));
    get(c) = static_cast<Field>(value);
    return absl::OkStatus();
  };
  Show show = [=](const Config& c) -> std::optional<std::string> {
    if (unset && static_cast<int64_t>(get(c)) == *unset) return std::nullopt;
    return absl::StrCat(get(c));
  };
  return Key{name,   absl::StrCat(millis ? "milliseconds " : "whole number ", min, "..", max),
             reload, std::move(doc),
             read,   show};
}

template <typename Get>
Key Millis(std::string name, Get get, int64_t min, int64_t max, Reload reload, std::string doc) {
  return Whole(std::move(name), get, min, max, reload, std::move(doc), /*millis=*/true);
}

// A size ("1GiB"); `zero_means` (not empty) also takes 0, which is then that.
template <typename Get>
Key Size(std::string name, Get get, uint64_t min, Reload reload, std::string doc,
         std::string zero_means = "") {
  Read read = [=](const Context& ctx, const YAML::Node& n, Config& c) -> absl::Status {
    ASSIGN_OR_RETURN(uint64_t value, ReadSize(ctx, n, name));
    if (value < min && !(value == 0 && !zero_means.empty())) {
      return ctx.Error(n, name,
                       !zero_means.empty() ? absl::StrCat("must be 0 (", zero_means,
                                                          ") or at least ", SizeText(min))
                       : min == 1          ? std::string("must be positive")
                                  : absl::StrCat("must be at least ", FormatByteSize(min)));
    }
    get(c) = value;
    return absl::OkStatus();
  };
  Show show = [=](const Config& c) -> std::optional<std::string> { return SizeText(get(c)); };
  std::string type = min <= 1 ? "size" : absl::StrCat("size >= ", SizeText(min));
  if (!zero_means.empty()) absl::StrAppend(&type, " or 0");
  return Key{name, type, reload, std::move(doc), read, show};
}

template <typename Get>
Key Flag(std::string name, Get get, Reload reload, std::string doc) {
  Read read = [=](const Context& ctx, const YAML::Node& n, Config& c) -> absl::Status {
    if (!n.IsScalar() || (n.as<std::string>() != "true" && n.as<std::string>() != "false")) {
      return ctx.Error(n, name, "expected true or false");
    }
    get(c) = n.as<std::string>() == "true";
    return absl::OkStatus();
  };
  Show show = [=](const Config& c) -> std::optional<std::string> {
    return get(c) ? "true" : "false";
  };
  return Key{name, "true or false", reload, std::move(doc), read, show};
}

template <typename Get>
Key Names(std::string name, Get get, Reload reload, std::string doc) {
  Read read = [=](const Context& ctx, const YAML::Node& n, Config& c) -> absl::Status {
    ASSIGN_OR_RETURN(get(c), ReadNames(ctx, n, name));
    return absl::OkStatus();
  };
  Show show = [=](const Config& c) -> std::optional<std::string> { return ShowList(get(c)); };
  return Key{name, "list of names", reload, std::move(doc), read, show};
}

// listen.local_mode: octal as chmod takes it; the owner keeps read and write (the agent).
Key SocketMode(std::string name, Reload reload, std::string doc);

// discovery.lease_ttl: etcd counts lease TTLs in whole seconds, and raises one below its
// minimum (about 1.5 x its election timeout, 2 s with defaults) silently.
Key LeaseTtl(std::string name, Reload reload, std::string doc);

Key Providers(std::string name, Reload reload, std::string doc);

Key EtcdEndpoints(std::string name, Reload reload, std::string doc);

// A prefix without its trailing '/' would also watch "/ferry/nodes2/...".
absl::Status CheckPrefix(const std::string& prefix);

Key Peers(std::string name, Reload reload, std::string doc);

Key TcpRails(std::string name, Reload reload, std::string doc);

// policy.*: through ApplyPolicySetting, as SetPolicy and `ferryctl policy set` are.
Key PolicyKey(std::string leaf, std::string type, Reload reload, std::string doc, Show show);

}  // namespace ferry::config::key_types
