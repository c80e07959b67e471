#pragma once
// Builds a Machine with hwloc: from the live machine or from an `lstopo --of xml` file.

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "transport/topology/machine.h"

namespace ferry::topology {

struct DiscoveryOptions {
  // "" = the live machine; otherwise an `lstopo --of xml` file.
  std::string xml_path;
  // Where to read NIC port state, link layer and rate (/sys/class/infiniband/...). Unset
  // means the live root for the live machine and no sysfs at all for a file, which
  // describes some other machine; the file's own port infos are used then.
  std::optional<std::string> sys_root;
};

absl::StatusOr<Machine> DiscoverMachine(const DiscoveryOptions& options);

// Shorthand: `xml_path` "" = live.
absl::StatusOr<Machine> DiscoverMachine(const std::string& xml_path);

// Orders names so that "mlx5_2" comes before "mlx5_10".
bool NaturalLess(const std::string& a, const std::string& b);

}  // namespace ferry::topology
