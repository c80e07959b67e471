#pragma once
// What the tensor calls share: the length limit of names, and the shape of a call to a
// peer's TensorPeer service (a deadline; errors that say which call failed).

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

// "3 s", "0.25 s": how long a caller gave a peer, as a person reads it.
inline std::string SecondsText(absl::Duration d) {
  return absl::StrFormat("%.3g s", absl::ToDoubleSeconds(d));
}

// A failed call `call` to peer `node` for request field `field`, made with `budget` to answer
// in. Ended at its deadline, the peer said nothing (gRPC's "Deadline Exceeded" is our own
// clock): DEADLINE_EXCEEDED "<field>: <node> did not answer <call> within <budget>", so the
// caller learns which node hangs. UNAVAILABLE is gRPC's own too (no connection: the agent
// is down or unreachable): "<field>: <node> could not be reached (<call>): ...". Else the
// peer's own answer, as PeerCallError: "<field>: <node> answered: ...".
inline absl::Status PeerCallError(const grpc::Status& s, const std::string& field,
                                  const std::string& node, const std::string& call,
                                  absl::Duration budget) {
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return absl::DeadlineExceededError(
        absl::StrCat(field, ": ", node, " did not answer ", call, " within ", SecondsText(budget)));
  }
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
    return PeerCallError(s, absl::StrCat(field, ": ", node, " could not be reached (", call, ")"));
  }
  return PeerCallError(s, absl::StrCat(field, ": ", node, " answered"));
}

}  // namespace ferry::server
