#pragma once
// The reports other-uid helpers print (tests/other_uid_client.cc, tests/tenant_attacker.cc):
// one line per attempt, "<what>: <gRPC code> <message>".

#include <cstdlib>
#include <string>

namespace ferry {

// The line about `what`, without "<what>: " ("<code> <message>"); "(missing)" when none.
inline std::string Line(const std::string& report, const std::string& what) {
  size_t at = report.find(what + ": ");
  if (at == std::string::npos) return "(missing)";
  size_t end = report.find('\n', at);
  return report.substr(at + what.size() + 2, end - at - what.size() - 2);
}

// The code a Line starts with.
inline int CodeOf(const std::string& line) { return std::atoi(line.c_str()); }

}  // namespace ferry
