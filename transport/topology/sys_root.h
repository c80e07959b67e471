#pragma once
// Reads sysfs and procfs through a root prefix, so tests (and `ferryctl doctor
// --sysfs-root`) can point every read at a fixture tree instead of the live machine.

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace ferry::topology {

class SysRoot {
 public:
  // `root` "" or "/" means the live machine.
  explicit SysRoot(std::string root = "/");

  const std::string& root() const { return root_; }
  bool is_live() const { return root_ == "/"; }

  // `absolute` is a path as on the live machine, e.g. "/proc/cmdline".
  std::string Path(absl::string_view absolute) const;
  bool Exists(absl::string_view absolute) const;
  // The whole file (binary safe); nullopt when it cannot be read.
  std::optional<std::string> Read(absl::string_view absolute) const;
  // The file's first line without surrounding whitespace.
  std::optional<std::string> ReadLine(absl::string_view absolute) const;
  // What the symbolic link points at, as written (e.g. "../../../kernel/iommu_groups/7");
  // nullopt when it is missing or not a link.
  std::optional<std::string> LinkTarget(absl::string_view absolute) const;
  // Entry names of a directory, sorted; empty when it is missing.
  std::vector<std::string> List(absl::string_view absolute) const;

 private:
  std::string root_;
};

}  // namespace ferry::topology
