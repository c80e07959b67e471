#pragma once
// Every config key, declared once: its name, type, default, bounds, whether SIGHUP applies
// it, and one line of doc (keys.cc holds the table). The parser (config.cc), the unknown-key
// and range errors, `ferryd --print-config`, the reload report and the tests of the example
// file and docs/config-keys.md all read this table, so a key cannot be parsed in one place
// and forgotten in another.

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "config/config.h"

namespace YAML {
class Node;
}

namespace ferry::config {

// Where a value came from, for messages: "ferry.yaml:12: key 'tcp.connections': ...". An
// empty origin (a command-line flag) gives just "key 'tcp.connections': ...".
class Context {
 public:
  explicit Context(absl::string_view origin) : origin_(origin) {}
  absl::Status Error(const YAML::Node& node, absl::string_view key, absl::string_view what) const;

 private:
  std::string origin_;
};

// What a changed value needs before the agent runs with it.
enum class Reload { kRestart, kSighup };

struct Key {
  std::string name;  // "verbs.retry_cnt": section, '.', leaf; top-level keys have no dot
  std::string type;  // for people: "whole number 0..7", "size >= 1 MiB", "host:port"
  Reload reload;
  std::string doc;  // one line
  // Reads the key's YAML value into the config, checked; errors carry origin, line and key.
  std::function<absl::Status(const Context&, const YAML::Node&, Config&)> read;
  // The value as YAML flow text that `read` takes back ("1GiB", "[verbs, tcp]", "\"\"");
  // nullopt when it is unset (derived at start, or off: `tcp.listen`, `host_pool.numa`).
  std::function<std::optional<std::string>(const Config&)> show;
};

// A section (`verbs:`) whose presence means something of its own: `security` (present: the
// operator chose a mode; absent: loopback-only plaintext) and `discovery` (present: on).
struct Section {
  std::string name;
  std::string doc;  // one line
  // Whether the config has the section; printing leaves an absent one commented out.
  std::function<bool(const Config&)> present;
  // What a file that has the section, even empty of keys, sets.
  std::function<void(Config&)> mark;
};

// Every key, in the order ferry.example.yaml and --print-config show them.
const std::vector<Key>& Keys();
const std::vector<Section>& Sections();
const Key* FindKey(absl::string_view name);
const Section* FindSection(absl::string_view name);

// Sets one key from text as a command line gives it (`--set verbs.retry_cnt=6`, a flag
// such as --metrics-listen), read and checked as the file's value is.
absl::Status SetKey(Config& config, absl::string_view key, absl::string_view value);

// The rules between keys (verbs.signal_every within send_queue_depth, mtls's three files,
// ...): the first one `config` breaks, as {key, what is wrong}; nullopt when none is.
std::optional<std::pair<std::string, std::string>> BrokenRule(const Config& config);

// The config as YAML that ParseConfig reads back to the same config: every key, in table
// order, an unset value or an absent section commented out. `origin` goes in the header.
std::string PrintConfig(const Config& config, absl::string_view origin);

// The keys (and sections) whose values differ between `running` and `next` and that only a
// restart applies (Reload::kRestart).
std::vector<std::string> RestartOnlyChanges(const Config& running, const Config& next);

}  // namespace ferry::config
