// The table of config keys (config/keys.h): printing reads back, the example file and the
// docs agree with it, flags are checked as the file is, and reloads follow its Reload column.

#include <unistd.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "config/config.h"
#include "config/keys.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry::config {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string ReadSource(const std::string& path) {
  std::ifstream in(absl::StrCat(FERRY_SOURCE_DIR, "/", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Each key's value as the table shows it ("unset" for none).
std::map<std::string, std::string> Values(const Config& c) {
  std::map<std::string, std::string> values;
  for (const Key& key : Keys()) values[key.name] = key.show(c).value_or("unset");
  return values;
}

Config Defaults() {
  auto c = ParseConfig("", "defaults");
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : Config{};
}

TEST(ConfigKeysTest, EveryRowIsWhole) {
  std::set<std::string> names;
  for (const Key& key : Keys()) {
    EXPECT_TRUE(names.insert(key.name).second) << key.name << " twice";
    EXPECT_FALSE(key.type.empty()) << key.name;
    EXPECT_FALSE(key.doc.empty()) << key.name;
    EXPECT_EQ(key.doc.find('\n'), std::string::npos) << key.name;
    // A default the table shows is one the table reads (but a section that is absent by
    // default, discovery, is there to change them: its etcd default [] is refused).
    const size_t dot = key.name.find('.');
    const Section* section = FindSection(key.name.substr(0, dot));
    if (section != nullptr && !section->present(Defaults())) continue;
    if (auto shown = key.show(Defaults())) {
      const std::string yaml =
          dot == std::string::npos
              ? absl::StrCat(key.name, ": ", *shown, "\n")
              : absl::StrCat(key.name.substr(0, dot), ":\n  ", key.name.substr(dot + 1), ": ",
                             *shown, "\n");
      auto c = ParseConfig(yaml, "one-key.yaml");
      EXPECT_TRUE(c.ok()) << c.status();
    }
  }
  EXPECT_GE(names.size(), 60u);
}

// What --print-config prints, ferryd reads back to the same config, and prints the same.
void ExpectRoundTrip(const Config& config) {
  const std::string printed = PrintConfig(config, "test");
  auto again = ParseConfig(printed, "printed.yaml");
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << printed;
  EXPECT_EQ(Values(*again), Values(config)) << printed;
  EXPECT_EQ(PrintConfig(*again, "test"), printed);
}

TEST(ConfigKeysTest, PrintedConfigReadsBackTheSame) {
  Config defaults = Defaults();
  ResolveDefaults(defaults);
  ExpectRoundTrip(defaults);
  auto full = ParseConfig(R"(
node: node-b
listen: {local: "/run/ferry d.sock", local_tcp: "127.0.0.1:9000", peer: "0.0.0.0:7101",
         local_mode: "0600", local_group: ferry}
peers: {node-a: "10.0.0.1:7100", node-c: "[::1]:7100", "null": "h:1"}
security: {mode: mtls, ca: /etc/ferry/ca.pem, cert: /etc/ferry/b.pem, key: "/etc/#b.key",
           admin_group: "x: y"}
discovery: {etcd: ["http://10.0.0.5:2379/"], prefix: /f/, lease_ttl: 90s, advertise: "h:7101"}
host_pool: {size: 2GiB, numa: 1}
providers: [tcp]
tcp: {connections: 8, listen: "0.0.0.0:7200", rails: {mlx5_0: 10.0.0.1}}
verbs: {gid_index: 3, max_message_bytes: 4097, cq_depth: 4096, send_queue_depth: 4096}
limits: {max_op_bytes: 16MiB, shutdown_grace_ms: 0, per_uid_buffers: 0}
log: {level: debug, format: json}
metrics: {listen: "127.0.0.1:9465"}
topology: "/etc/ferry/topo.xml"
nics: {allow: [mlx5_0, "a,b"], deny: []}
policy: {gdr: always, gdr_max_path: pxb, fallback: fail, staging_chunk: 1MiB, staging_depth: 8}
gpu: {backend: sim, count: 2, sim_copy_rate: 12GiB}
)",
                          "full.yaml");
  ASSERT_TRUE(full.ok()) << full.status();
  ExpectRoundTrip(*full);
  auto rails = ParseConfig("tcp: {rails: auto}\nsecurity: {mode: insecure}\n", "rails.yaml");
  ASSERT_TRUE(rails.ok()) << rails.status();
  ExpectRoundTrip(*rails);
  // Absent sections stay absent: no security section is not `security: {mode: mtls}`.
  const std::string printed = PrintConfig(defaults, "test");
  EXPECT_THAT(printed, HasSubstr("\n# security: absent"));
  EXPECT_THAT(printed, HasSubstr("\n# discovery: absent"));
  EXPECT_THAT(printed, HasSubstr("\n  # numa: unset"));
}

// The names ferry.example.yaml mentions, set or commented out: "verbs.retry_cnt", "node".
std::set<std::string> NamesInExample(const std::string& text) {
  static const std::regex kTop(R"(^(?:# )?([a-z_]+):( |$).*)");
  static const std::regex kLeaf(R"(^#? +(?:# ?)?([a-z_]+):( |$).*)");
  std::set<std::string> names;
  std::string section;
  std::smatch m;
  for (const auto& line : absl::StrSplit(text, '\n')) {
    const std::string l(line);
    if (std::regex_match(l, m, kTop)) {
      section = m[1];
      names.insert(section);
    } else if (!section.empty() && std::regex_match(l, m, kLeaf)) {
      names.insert(absl::StrCat(section, ".", std::string(m[1])));
    }
  }
  return names;
}

TEST(ConfigKeysTest, ExampleListsEveryKeyWithItsDefault) {
  const std::string text = ReadSource("config/ferry.example.yaml");
  const std::set<std::string> names = NamesInExample(text);
  for (const Key& key : Keys()) {
    EXPECT_TRUE(names.count(key.name)) << "config/ferry.example.yaml does not show " << key.name;
  }
  auto example = ParseConfig(text, "config/ferry.example.yaml");
  ASSERT_TRUE(example.ok()) << example.status();
  const auto defaults = Values(Defaults());
  for (const auto& [name, value] : Values(*example)) {
    EXPECT_EQ(value, defaults.at(name))
        << "config/ferry.example.yaml: " << name << " is not its default";
  }
  // And node-b's parses, and differs from the defaults only where two agents must.
  auto b = LoadConfigFile(FERRY_SOURCE_DIR "/config/ferry.node-b.example.yaml");
  ASSERT_TRUE(b.ok()) << b.status();
  std::vector<std::string> differ;
  for (const auto& [name, value] : Values(*b)) {
    if (value != defaults.at(name)) differ.push_back(name);
  }
  EXPECT_THAT(differ, ElementsAre("listen.local", "listen.peer", "node"));
}

// docs/config-keys.md's table, as the table of keys writes it.
std::string KeysMarkdown() {
  const Config defaults = Defaults();
  std::string out =
      "| key | type | default | SIGHUP | what it sets |\n| --- | --- | --- | --- | --- |\n";
  auto cell = [](const std::string& text) { return absl::StrReplaceAll(text, {{"|", "\\|"}}); };
  for (const Key& key : Keys()) {
    auto shown = key.show(defaults);
    absl::StrAppend(&out, "| `", key.name, "` | ", cell(key.type), " | ",
                    shown ? absl::StrCat("`", cell(*shown), "`") : "unset", " | ",
                    key.reload == Reload::kSighup ? "applies" : "restart", " | ", cell(key.doc),
                    " |\n");
  }
  return out;
}

TEST(ConfigKeysTest, DocsTableIsTheTable) {
  const std::string doc = ReadSource("docs/config-keys.md");
  const std::string begin = "<!-- keys: begin -->\n", end = "<!-- keys: end -->";
  const size_t from = doc.find(begin), to = doc.find(end);
  ASSERT_NE(from, std::string::npos) << "docs/config-keys.md has no " << begin;
  ASSERT_NE(to, std::string::npos);
  const std::string table = doc.substr(from + begin.size(), to - from - begin.size());
  const std::string expected = KeysMarkdown();
  if (table != expected) {
    char cwd[4096];
    const std::string path = absl::StrCat(getcwd(cwd, sizeof(cwd)), "/config-keys.table.md");
    std::ofstream(path) << expected;
    ADD_FAILURE() << "docs/config-keys.md's table is not the table of keys (config/keys.cc): "
                  << "the table it should hold is in " << path;
  }
}

// Where the operator guide gives a key's default in a table row (| `limits.x` | 4096 | ...),
// it is the key's default.
TEST(ConfigKeysTest, OperatorGuideDefaultsAreTheTables) {
  const std::string doc = ReadSource("docs/operator-guide.md");
  const auto defaults = Values(Defaults());
  static const std::regex kRow(R"(^\| `([a-z_]+\.[a-z_]+)` \| ([^|]+) \|.*)");
  int rows = 0;
  std::smatch m;
  for (const auto& line : absl::StrSplit(doc, '\n')) {
    const std::string l(line);
    if (!std::regex_match(l, m, kRow) || !defaults.count(m[1])) continue;
    ++rows;
    std::string given = absl::StrReplaceAll(std::string(m[2]), {{" ", ""}, {"`", ""}});
    EXPECT_EQ(given, defaults.at(m[1])) << "docs/operator-guide.md: " << l;
  }
  EXPECT_GT(rows, 0) << "the operator guide's key tables moved: point this test at them";
}

TEST(ConfigKeysTest, FlagsAreCheckedAsTheFileIs) {
  Config c;
  ASSERT_TRUE(SetKey(c, "metrics.listen", "127.0.0.1:9465").ok());
  EXPECT_EQ(c.metrics_listen, "127.0.0.1:9465");
  ASSERT_TRUE(SetKey(c, "limits.per_uid_buffers", "0").ok());
  EXPECT_EQ(c.per_uid_buffers, 0u);
  ASSERT_TRUE(SetKey(c, "peers", "{b: 127.0.0.1:7101}").ok());
  EXPECT_EQ(c.peers.at("b"), "127.0.0.1:7101");
  EXPECT_EQ(SetKey(c, "verbs.retry_cnt", "8").message(),
            "key 'verbs.retry_cnt': 8 is outside 0..7");
  EXPECT_THAT(std::string(SetKey(c, "limits.shutdown_grace_ms", "30s").message()),
              HasSubstr("write 30000 for 30s"));
  EXPECT_THAT(std::string(SetKey(c, "metrics.port", "1").message()),
              HasSubstr("unknown key 'metrics.port'"));
  // A key of a section that means something by being there marks it.
  Config s;
  ASSERT_TRUE(SetKey(s, "security.mode", "insecure").ok());
  EXPECT_FALSE(s.security.implicit);
  // The rules between keys hold for flags too.
  Config v;
  ASSERT_TRUE(SetKey(v, "verbs.send_queue_depth", "16").ok());
  ASSERT_TRUE(BrokenRule(v).has_value());
  EXPECT_EQ(BrokenRule(v)->first, "verbs.signal_every");
}

TEST(ConfigKeysTest, ReloadNamesTheRestartOnlyKeysThatChanged) {
  Config running = Defaults();
  Config next = running;
  next.host_pool_bytes = 2ull << 30;
  next.verbs.retry_cnt = 5;
  next.log_level = "debug";            // SIGHUP applies it
  next.policy.gdr = GdrMode::kNever;   // and this
  next.peers["b"] = "127.0.0.1:7101";  // and this
  next.per_uid_buffers = 1;            // read once at start
  EXPECT_THAT(RestartOnlyChanges(running, next),
              ElementsAre("host_pool.size", "verbs.retry_cnt", "limits.per_uid_buffers"));
  next = running;
  next.security.implicit = false;
  next.security.mode = "insecure";
  EXPECT_THAT(RestartOnlyChanges(running, next), ElementsAre("security", "security.mode"));
  EXPECT_TRUE(RestartOnlyChanges(running, running).empty());
}

}  // namespace
}  // namespace ferry::config
