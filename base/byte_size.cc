#include "base/byte_size.h"

#include <cctype>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ferry {

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text) {
  absl::string_view s = absl::StripAsciiWhitespace(text);
  size_t digits = 0;
  while (digits < s.size() && std::isdigit(static_cast<unsigned char>(s[digits]))) ++digits;
  uint64_t value = 0;
  if (digits == 0 || !absl::SimpleAtoi(s.substr(0, digits), &value)) {
    return absl::InvalidArgumentError(absl::StrCat("not a byte size: '", text, "'"));
  }
  std::string unit = absl::AsciiStrToLower(absl::StripAsciiWhitespace(s.substr(digits)));
  int shift = 0;
  if (unit.empty() || unit == "b") {
    shift = 0;
  } else if (unit == "k" || unit == "kb" || unit == "kib") {
    shift = 10;
  } else if (unit == "m" || unit == "mb" || unit == "mib") {
    shift = 20;
  } else if (unit == "g" || unit == "gb" || unit == "gib") {
    shift = 30;
  } else if (unit == "t" || unit == "tb" || unit == "tib") {
    shift = 40;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown size unit '", unit, "' in '", text,
                                                   "' (use B, KiB, MiB, GiB or TiB)"));
  }
  if (shift > 0 && value > (UINT64_MAX >> shift)) {
    return absl::InvalidArgumentError(absl::StrCat("byte size too large: '", text, "'"));
  }
  return value << shift;
}

std::string FormatByteSize(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (unit < 4 && bytes != 0 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++unit;
  }
  return absl::StrCat(bytes, " ", kUnits[unit]);
}

}  // namespace ferry
