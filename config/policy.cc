#include "config/policy.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/byte_size.h"
#include "base/status_macros.h"

namespace ferry::config {

const char* PathClassName(PathClass path) {
  switch (path) {
    case PathClass::kPix: return "PIX";
    case PathClass::kPxb: return "PXB";
    case PathClass::kPhb: return "PHB";
    case PathClass::kNode: return "NODE";
    case PathClass::kSys: return "SYS";
  }
  return "?";
}

absl::StatusOr<PathClass> ParsePathClass(absl::string_view text) {
  std::string upper = absl::AsciiStrToUpper(text);
  for (PathClass p : {PathClass::kPix, PathClass::kPxb, PathClass::kPhb, PathClass::kNode,
                      PathClass::kSys}) {
    if (upper == PathClassName(p)) return p;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown path class '", text, "' (expected PIX, PXB, PHB, NODE or SYS)"));
}

const char* GdrModeName(GdrMode mode) {
  switch (mode) {
    case GdrMode::kAuto: return "auto";
    case GdrMode::kAlways: return "always";
    case GdrMode::kNever: return "never";
  }
  return "?";
}

absl::StatusOr<GdrMode> ParseGdrMode(absl::string_view text) {
  for (GdrMode m : {GdrMode::kAuto, GdrMode::kAlways, GdrMode::kNever}) {
    if (text == GdrModeName(m)) return m;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown gdr mode '", text, "' (expected auto, always or never)"));
}

const char* FallbackName(Fallback fallback) {
  return fallback == Fallback::kStaged ? "staged" : "fail";
}

absl::StatusOr<Fallback> ParseFallback(absl::string_view text) {
  if (text == "staged") return Fallback::kStaged;
  if (text == "fail") return Fallback::kFail;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown fallback '", text, "' (expected staged or fail)"));
}

absl::Status ApplyPolicySetting(absl::string_view key, absl::string_view value, Policy& policy) {
  if (key == "gdr") {
    ASSIGN_OR_RETURN(policy.gdr, ParseGdrMode(value));
  } else if (key == "gdr_max_path") {
    ASSIGN_OR_RETURN(policy.gdr_max_path, ParsePathClass(value));
  } else if (key == "fallback") {
    ASSIGN_OR_RETURN(policy.fallback, ParseFallback(value));
  } else if (key == "staging_chunk") {
    ASSIGN_OR_RETURN(policy.staging_chunk_bytes, ParseByteSize(value));
  } else if (key == "staging_depth") {
    if (!absl::SimpleAtoi(value, &policy.staging_depth)) {
      return absl::InvalidArgumentError(
          absl::StrCat("staging_depth: '", value, "' is not a whole number"));
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown policy key '", key,
        "' (expected gdr, gdr_max_path, fallback, staging_chunk or staging_depth)"));
  }
  return ValidatePolicy(policy);
}

absl::Status ValidatePolicy(const Policy& policy) {
  constexpr uint64_t kMinChunk = 4096, kMaxChunk = 1ull << 30;
  if (policy.staging_chunk_bytes < kMinChunk || policy.staging_chunk_bytes > kMaxChunk) {
    return absl::InvalidArgumentError(absl::StrCat(
        "staging_chunk: ", policy.staging_chunk_bytes, " bytes is outside 4 KiB..1 GiB"));
  }
  if (policy.staging_depth < 1 || policy.staging_depth > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("staging_depth: ", policy.staging_depth, " is outside 1..256"));
  }
  return absl::OkStatus();
}

}  // namespace ferry::config
