// Fuzzes the config loader: YAML text -> ParseConfig (every section, the policy included),
// and the same bytes as "key=value" lines through ApplyPolicySetting, which SetPolicy
// (Agent API) and `ferryctl policy set` feed with remote text. Invariants: no crash or UB,
// and whatever is accepted is valid: a parsed config's policy passes ValidatePolicy, and a
// setting that ApplyPolicySetting accepts leaves a valid policy; and a parsed config prints
// (PrintConfig, `ferryd --print-config`) as YAML that parses back and prints the same.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_split.h"
#include "config/config.h"
#include "config/keys.h"
#include "config/policy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ferry::config;
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto config = ParseConfig(text, "fuzz.yaml");
  if (config.ok() && !ValidatePolicy(config->policy).ok()) {
    fprintf(stderr, "config_fuzz: ParseConfig accepted an invalid policy\n");
    abort();
  }
  if (config.ok()) {
    const std::string printed = PrintConfig(*config, "fuzz");
    auto again = ParseConfig(printed, "printed.yaml");
    if (!again.ok() || PrintConfig(*again, "fuzz") != printed) {
      fprintf(stderr, "config_fuzz: the printed config does not read back the same: %s\n%s\n",
              again.ok() ? "printed differently" : std::string(again.status().message()).c_str(),
              printed.c_str());
      abort();
    }
  }
  Policy policy;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(line, absl::MaxSplits('=', 1));
    Policy trial = policy;
    if (ApplyPolicySetting(kv.first, kv.second, trial).ok()) {
      if (!ValidatePolicy(trial).ok()) {
        fprintf(stderr, "config_fuzz: ApplyPolicySetting accepted an invalid policy\n");
        abort();
      }
      policy = trial;
    }
  }
  return 0;
}
