#pragma once
// Who is calling a Peer API handler: the one place every handler (Connect, ResolveBuffer,
// Stage) asks, and what exports are scoped by and tcp data connections are admitted as.

#include <string>

#include "grpcpp/server_context.h"

namespace ferry::server {

// The caller's node name. For now the node the message claims (`claimed`: its from_node or
// node field), which any client can forge. With mutual TLS (issue 15) this returns the node
// named by the peer's authenticated certificate, and a claim that differs is ignored.
// `ctx` may be null (handlers called directly in tests).
std::string CallerNode(const grpc::ServerContext* ctx, const std::string& claimed);

}  // namespace ferry::server
