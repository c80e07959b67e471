#pragma once
// The policy in force and the topology plan made from it, as immutable snapshots with a
// generation number. A transfer takes the snapshot current at Submit and keeps it to the
// end, so a change never alters a transfer in flight; a change that does not validate is
// refused and the current snapshot stays.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "config/config.h"
#include "config/policy.h"
#include "transport/topology/machine.h"
#include "transport/topology/plan.h"

namespace ferry::server {

struct PolicySnapshot {
  uint64_t generation = 0;
  config::Policy policy;
  topology::TopologyPlan plan;
  // The run-time settings (SetPolicy) in force over the file's policy, in the order set.
  std::vector<std::pair<std::string, std::string>> overrides;
};

class PolicyStore {
 public:
  // `machine` must outlive the store.
  static absl::StatusOr<std::unique_ptr<PolicyStore>> Create(const topology::Machine* machine,
                                                             config::NicFilter nics,
                                                             config::Policy policy);

  std::shared_ptr<const PolicySnapshot> Current() const;
  // Run-time settings: `key=value` on top of the current policy, all or nothing; they stay
  // in force over the file's policy (also across Replace) until cleared. `clear` drops the
  // earlier run-time settings first.
  absl::StatusOr<std::shared_ptr<const PolicySnapshot>> Apply(
      const std::vector<std::pair<std::string, std::string>>& settings, bool clear = false);
  // Replaces the file's policy (a SIGHUP reload); the run-time settings stay on top.
  absl::StatusOr<std::shared_ptr<const PolicySnapshot>> Replace(const config::Policy& policy);

 private:
  PolicyStore(const topology::Machine* machine, config::NicFilter nics)
      : machine_(machine), nics_(std::move(nics)) {}
  // Installs `file` with `overrides` on top, if that validates; else nothing changes.
  absl::StatusOr<std::shared_ptr<const PolicySnapshot>> Install(
      const config::Policy& file, std::vector<std::pair<std::string, std::string>> overrides)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const topology::Machine* const machine_;
  const config::NicFilter nics_;
  mutable absl::Mutex mu_;
  config::Policy file_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const PolicySnapshot> current_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry::server
