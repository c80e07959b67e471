#pragma once
// Who is calling the Peer API. Over mutual TLS it is the node named in the caller's
// certificate (its DNS subjectAltName; gRPC verified the chain to security.ca before the
// method ran), never what the message says; a message that names another sender is refused,
// so a forged from_node reaches nothing. Over plaintext (security.mode insecure) nobody is
// authenticated and the message's own claim is all there is.

#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/server_context.h"

namespace ferry::server {

// The calling node. `claimed` is the message's node / from_node field ("" = not given).
// PERMISSION_DENIED when the call is authenticated and `claimed` names another node, or the
// certificate names none.
absl::StatusOr<std::string> CallerNode(const grpc::ServerContext& ctx, const std::string& claimed);

}  // namespace ferry::server
