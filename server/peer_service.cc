#include "server/peer_service.h"

#include "absl/strings/str_cat.h"
#include "server/agent_core.h"
#include "server/peers/protocol.h"
#include "spdlog/spdlog.h"

namespace ferry::server {

grpc::Status PeerService::Hello(grpc::ServerContext*, const ferry::v1::HelloRequest* req,
                                ferry::v1::HelloResponse* resp) {
  resp->set_node(core_->config().node);
  resp->set_protocol_version(kPeerProtocolVersion);
  resp->set_incarnation(core_->incarnation());
  auto* ep = resp->add_endpoints();
  ep->set_provider(core_->fabric().provider());
  ep->set_address(core_->fabric().address());
  spdlog::debug("Hello from {} (protocol {})", req->node(), req->protocol_version());
  return grpc::Status::OK;
}

grpc::Status PeerService::ResolveBuffer(grpc::ServerContext*,
                                        const ferry::v1::ResolveBufferRequest* req,
                                        ferry::v1::ResolveBufferResponse* resp) {
  auto buffer = core_->buffers().FindByName(req->name());
  if (!buffer.ok()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("name: no buffer named '", req->name(), "' on ",
                                     core_->config().node));
  }
  const fabric::MemoryRegion& region = (*buffer)->region();
  resp->set_size((*buffer)->size());
  resp->set_address(region.remote_address());
  resp->set_key(region.key());
  resp->set_device((*buffer)->device());
  resp->set_incarnation(core_->incarnation());
  return grpc::Status::OK;
}

grpc::Status PeerService::Health(grpc::ServerContext*, const ferry::v1::HealthRequest*,
                                 ferry::v1::HealthResponse* resp) {
  resp->set_node(core_->config().node);
  resp->set_incarnation(core_->incarnation());
  return grpc::Status::OK;
}

}  // namespace ferry::server
