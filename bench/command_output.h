#pragma once
// Running the baseline tools (iperf3, ucx_perftest): a client command's output, and the end
// of a server child.

#include <sys/types.h>

#include <string>

namespace ferry::bench {

// Everything `command` writes on stdout (add "2>&1" for stderr), after it exits.
std::string CommandOutput(const std::string& command);

// Kills and reaps a server child started with SpawnChild; pid <= 0 is ignored.
void Reap(pid_t pid);

}  // namespace ferry::bench
