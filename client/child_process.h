#pragma once
// Starts helper processes (agents, baseline servers) that cannot outlive their parent:
// the child gets PR_SET_PDEATHSIG, so a crashed test or an interrupted demo leaves nothing
// running.

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ferry {

// Runs `argv` (argv[0] found on PATH) with stdout and stderr going to `output_path`
// ("/dev/null" to drop them). Returns the child's pid.
// `open_files`: the child's RLIMIT_NOFILE (0: inherited), e.g. to test fd exhaustion.
absl::StatusOr<pid_t> SpawnChild(const std::vector<std::string>& argv,
                                 const std::string& output_path, uint64_t open_files = 0);

}  // namespace ferry
