#include "server/policy/policy_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "spdlog/spdlog.h"

namespace ferry::server {

absl::StatusOr<std::unique_ptr<PolicyStore>> PolicyStore::Create(const topology::Machine* machine,
                                                                 config::NicFilter nics,
                                                                 config::Policy policy) {
  std::unique_ptr<PolicyStore> store(new PolicyStore(machine, std::move(nics)));
  absl::MutexLock lock(&store->mu_);
  RETURN_IF_ERROR(store->Install(policy, {}).status());
  return store;
}

std::shared_ptr<const PolicySnapshot> PolicyStore::Current() const {
  absl::MutexLock lock(&mu_);
  return current_;
}

absl::StatusOr<std::shared_ptr<const PolicySnapshot>> PolicyStore::Apply(
    const std::vector<std::pair<std::string, std::string>>& settings, bool clear) {
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<std::string, std::string>> overrides;
  if (!clear) overrides = current_->overrides;
  for (const auto& setting : settings) {
    // A key set again replaces its earlier run-time value.
    overrides.erase(std::remove_if(overrides.begin(), overrides.end(),
                                   [&](const auto& o) { return o.first == setting.first; }),
                    overrides.end());
    overrides.push_back(setting);
  }
  return Install(file_, std::move(overrides));
}

absl::StatusOr<std::shared_ptr<const PolicySnapshot>> PolicyStore::Replace(
    const config::Policy& policy) {
  absl::MutexLock lock(&mu_);
  return Install(policy, current_->overrides);
}

absl::StatusOr<std::shared_ptr<const PolicySnapshot>> PolicyStore::Install(
    const config::Policy& file, std::vector<std::pair<std::string, std::string>> overrides) {
  config::Policy policy = file;
  for (const auto& [key, value] : overrides) {
    RETURN_IF_ERROR(config::ApplyPolicySetting(key, value, policy));
  }
  RETURN_IF_ERROR(config::ValidatePolicy(policy));
  ASSIGN_OR_RETURN(topology::TopologyPlan plan, topology::BuildPlan(*machine_, nics_, policy));
  auto next = std::make_shared<PolicySnapshot>();
  next->generation = current_ ? current_->generation + 1 : 1;
  next->policy = policy;
  next->plan = std::move(plan);
  next->overrides = std::move(overrides);
  file_ = file;
  current_ = next;
  spdlog::info("policy generation {}: gdr={} gdr_max_path={} fallback={} staging {} x {}",
               next->generation, config::GdrModeName(policy.gdr),
               config::PathClassName(policy.gdr_max_path), config::FallbackName(policy.fallback),
               policy.staging_chunk_bytes, policy.staging_depth);
  for (const auto& gpu : next->plan.gpus) spdlog::info("topology: {}", gpu.reason);
  return next;
}

}  // namespace ferry::server
