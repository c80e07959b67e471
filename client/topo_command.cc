#include "client/topo_command.h"

#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "config/config.h"
#include "transport/topology/discovery.h"
#include "transport/topology/doctor.h"
#include "transport/topology/plan.h"
#include "transport/topology/plan_format.h"
#include "transport/topology/sys_root.h"

namespace ferry::client {
namespace {

constexpr char kTopoUsage[] =
    "usage: ferryctl topo [--topology FILE] [--config FILE] [--json]\n"
    "  --topology FILE  read an `lstopo --of xml` file instead of this machine\n"
    "  --config FILE    take nics.allow/deny, policy and topology from a ferry.yaml\n"
    "  --json           print JSON for scripts\n";

constexpr char kDoctorUsage[] =
    "usage: ferryctl doctor [--topology FILE] [--config FILE] [--sysfs-root DIR] [--json]\n"
    "  --topology FILE    read an `lstopo --of xml` file instead of this machine\n"
    "  --config FILE      take nics.allow/deny, policy and topology from a ferry.yaml\n"
    "  --sysfs-root DIR   read /sys and /proc under DIR (for checking a saved tree)\n"
    "  --json             print JSON for scripts\n"
    "exit code 0 when no check FAILs\n";

struct Flags {
  std::string topology;
  std::string config;
  std::optional<std::string> sysfs_root;
  bool json = false;
  bool help = false;
};

// Accepts "--flag VALUE" and "--flag=VALUE". Returns an error message, or "" when fine.
std::string ParseFlags(const std::vector<std::string>& args, bool allow_sysfs_root,
                       Flags& flags) {
  for (size_t i = 0; i < args.size(); ++i) {
    std::string name = args[i], value;
    bool inline_value = false;
    if (size_t eq = name.find('='); absl::StartsWith(name, "--") && eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    if (name == "--json" && !inline_value) {
      flags.json = true;
      continue;
    }
    if ((name == "--help" || name == "-h") && !inline_value) {
      flags.help = true;
      continue;
    }
    std::string* target = nullptr;
    std::string sysfs_root;
    if (name == "--topology") {
      target = &flags.topology;
    } else if (name == "--config") {
      target = &flags.config;
    } else if (name == "--sysfs-root" && allow_sysfs_root) {
      target = &sysfs_root;
    } else {
      return absl::StrCat("unknown argument '", args[i], "'");
    }
    if (!inline_value) {
      if (i + 1 >= args.size()) return absl::StrCat(name, " needs a value");
      value = args[++i];
    }
    if (value.empty()) return absl::StrCat(name, " needs a non-empty value");
    *target = value;
    if (target == &sysfs_root) flags.sysfs_root = value;
  }
  return "";
}

struct Prepared {
  config::Config config;
  topology::Machine machine;
  topology::TopologyPlan plan;
};

// Loads the config (if any), discovers the machine and builds the plan.
absl::StatusOr<Prepared> Prepare(const Flags& flags) {
  config::Config config;
  if (!flags.config.empty()) {
    absl::StatusOr<config::Config> loaded = config::LoadConfigFile(flags.config);
    if (!loaded.ok()) return loaded.status();
    config = *std::move(loaded);
  }
  topology::DiscoveryOptions options;
  // An explicit --topology wins over the config file's `topology:`.
  options.xml_path = !flags.topology.empty() ? flags.topology : config.topology;
  options.sys_root = flags.sysfs_root;
  absl::StatusOr<topology::Machine> machine = topology::DiscoverMachine(options);
  if (!machine.ok()) return machine.status();
  absl::StatusOr<topology::TopologyPlan> plan =
      topology::BuildPlan(*machine, config.nics, config.policy);
  if (!plan.ok()) {
    return absl::Status(plan.status().code(),
                        flags.config.empty()
                            ? std::string(plan.status().message())
                            : absl::StrCat(flags.config, ": ", plan.status().message()));
  }
  return Prepared{std::move(config), *std::move(machine), *std::move(plan)};
}

}  // namespace

int RunTopoCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  Flags flags;
  if (std::string problem = ParseFlags(args, /*allow_sysfs_root=*/false, flags);
      !problem.empty()) {
    err << "ferryctl topo: " << problem << "\n" << kTopoUsage;
    return 2;
  }
  if (flags.help) {
    out << kTopoUsage;
    return 0;
  }
  absl::StatusOr<Prepared> prepared = Prepare(flags);
  if (!prepared.ok()) {
    err << "ferryctl topo: " << prepared.status().message() << "\n";
    return 1;
  }
  out << (flags.json ? topology::FormatPlanJson(prepared->machine, prepared->plan)
                     : topology::FormatPlanText(prepared->machine, prepared->plan));
  return 0;
}

int RunDoctorCommand(const std::vector<std::string>& args, std::ostream& out,
                     std::ostream& err) {
  Flags flags;
  if (std::string problem = ParseFlags(args, /*allow_sysfs_root=*/true, flags);
      !problem.empty()) {
    err << "ferryctl doctor: " << problem << "\n" << kDoctorUsage;
    return 2;
  }
  if (flags.help) {
    out << kDoctorUsage;
    return 0;
  }
  absl::StatusOr<Prepared> prepared = Prepare(flags);
  if (!prepared.ok()) {
    err << "ferryctl doctor: " << prepared.status().message() << "\n";
    return 1;
  }
  topology::SysRoot root(flags.sysfs_root.value_or("/"));
  topology::DoctorReport report = topology::RunDoctor(
      prepared->machine, prepared->plan, root, topology::DoctorProbes(), prepared->config);
  out << (flags.json ? topology::FormatDoctorJson(report, prepared->machine, prepared->plan)
                     : topology::FormatDoctorText(report));
  return report.HasFailure() ? 1 : 0;
}

}  // namespace ferry::client
