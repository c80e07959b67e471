#pragma once
// What the tensor calls share: the length limit of names, and the shape of a call to a
// peer's TensorPeer service (a deadline; errors that say which call failed).

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace ferry::server {

// Peers, tags, buffer, list and notification names: longer ones are refused.
inline constexpr size_t kMaxNameLength = 1024;

// INVALID_ARGUMENT naming `field` for an empty or too long name.
inline absl::Status CheckName(const std::string& value, const std::string& field) {
  if (value.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": must be set"));
  if (value.size() > kMaxNameLength) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", value.size(), " characters is more than ", kMaxNameLength));
  }
  return absl::OkStatus();
}

// A peer call's context, ending at `deadline`.
inline std::unique_ptr<grpc::ClientContext> PeerContext(absl::Time deadline) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(deadline));
  return ctx;
}

// A failed peer call as a status: its code, and `what` before its message.
inline absl::Status PeerCallError(const grpc::Status& s, const std::string& what) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

}  // namespace ferry::server
