#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace ferry {

// The whole of a small file (a config, a PEM) as bytes. A file that cannot be opened or read
// is an error naming the path with errno's text ("cannot read /etc/ferry/ca.pem: No such
// file or directory"); its code follows errno (NOT_FOUND, PERMISSION_DENIED, ...).
absl::StatusOr<std::string> ReadTextFile(const std::string& path);

}  // namespace ferry
