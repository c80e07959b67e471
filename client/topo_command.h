#pragma once
// `ferryctl topo` and `ferryctl doctor`, offline: they read the machine (or a topology
// file) themselves, so they work with no agent running.

#include <ostream>
#include <string>
#include <vector>

namespace ferry::client {

// `ferryctl topo [--topology FILE] [--config FILE] [--json]`. `args` are the words after
// "topo". Returns the process exit code: 0 on success, 1 on an error (message on `err`),
// 2 on a usage error.
int RunTopoCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// `ferryctl doctor [--topology FILE] [--config FILE] [--sysfs-root DIR] [--json]`. Returns
// 0 when no finding FAILs, 1 when one does or on an error, 2 on a usage error.
int RunDoctorCommand(const std::vector<std::string>& args, std::ostream& out,
                     std::ostream& err);

}  // namespace ferry::client
