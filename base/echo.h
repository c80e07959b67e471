#pragma once
// Inputs quoted back in error messages, bounded: a 1 MB name must not come back in a 1 MB
// message.

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ferry {

// `input` in single quotes; longer than `max` bytes: its first `max` bytes, then how long
// it was ("'aaaa...' (1048576 bytes)").
inline std::string Echo(absl::string_view input, size_t max = 64) {
  if (input.size() <= max) return absl::StrCat("'", input, "'");
  return absl::StrCat("'", input.substr(0, max), "...' (", input.size(), " bytes)");
}

}  // namespace ferry
