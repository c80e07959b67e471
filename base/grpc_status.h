#pragma once
// absl::Status <-> grpc::Status, for the layers that speak gRPC (server/, client/).

#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/support/status.h"

namespace ferry {

// The longest message a status carries over gRPC; inputs are echoed shorter (base/echo.h),
// this is the backstop.
inline constexpr size_t kMaxStatusMessage = 4096;

// `message` without leading "CODE_NAME: " prefixes (a status that was printed into another
// status's message) and cut to kMaxStatusMessage: the code travels once, in the code.
inline std::string StatusMessage(absl::StatusCode code, absl::string_view message) {
  const std::string prefix = absl::StrCat(absl::StatusCodeToString(code), ": ");
  while (absl::StartsWith(message, prefix)) message.remove_prefix(prefix.size());
  if (message.size() <= kMaxStatusMessage) return std::string(message);
  return absl::StrCat(message.substr(0, kMaxStatusMessage), "... (message cut)");
}

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      StatusMessage(s.code(), s.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  auto code = static_cast<absl::StatusCode>(s.error_code());
  return absl::Status(code, StatusMessage(code, s.error_message()));
}

}  // namespace ferry
