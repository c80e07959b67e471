#pragma once
// Human-readable byte sizes ("64KiB", "1 GiB", "4096") for config and CLIs.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ferry {

// Parses "4096", "64K", "64KiB", "1 GiB", "2MB" (binary units either way).
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text);

// Formats bytes with the largest binary unit that keeps the value exact, e.g. "64 KiB".
std::string FormatByteSize(uint64_t bytes);

}  // namespace ferry
