#include "tests/fakes/fake_peer_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ferry::fake {

grpc::Status FakePeerService::Hello(grpc::ServerContext*, const ferry::v1::HelloRequest* req,
                                    ferry::v1::HelloResponse* resp) {
  hellos_.fetch_add(1);
  absl::MutexLock lock(&mu_);
  last_from_ = req->node();
  last_hello_version_ = req->protocol_version();
  if (refuse_hello_) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "protocol_version: not ours");
  }
  resp->set_node(node_);
  resp->set_protocol_version(protocol_version_);
  resp->set_incarnation(incarnation_);
  for (fabric::Fabric* f : fabrics_) {
    auto* ep = resp->add_endpoints();
    ep->set_provider(f->provider());
    ep->set_address(f->address());
  }
  return grpc::Status::OK;
}

grpc::Status FakePeerService::Connect(grpc::ServerContext*,
                                      const ferry::v1::ConnectRequest* req,
                                      ferry::v1::ConnectResponse* resp) {
  connects_.fetch_add(1);
  auto it = std::find_if(fabrics_.begin(), fabrics_.end(),
                         [&](fabric::Fabric* f) { return f->provider() == req->provider(); });
  if (it == fabrics_.end()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "provider: not run here");
  }
  auto reply = (*it)->AcceptConnect(req->request(), {req->node(), req->incarnation()});
  if (!reply.ok()) {
    return grpc::Status(static_cast<grpc::StatusCode>(reply.status().code()),
                        std::string(reply.status().message()));
  }
  resp->set_reply(*reply);
  absl::MutexLock lock(&mu_);
  resp->set_incarnation(incarnation_);
  return grpc::Status::OK;
}

grpc::Status FakePeerService::ResolveBuffer(grpc::ServerContext*,
                                            const ferry::v1::ResolveBufferRequest* req,
                                            ferry::v1::ResolveBufferResponse* resp) {
  resolves_.fetch_add(1);
  absl::MutexLock lock(&mu_);
  last_from_ = req->from_node();
  if (req->name() == "secret") {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "not exported to you");
  }
  auto it = buffers_.find(req->name());
  if (it == buffers_.end()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("name: no buffer named '", req->name(), "' on ", node_));
  }
  *resp = it->second;
  resp->set_incarnation(incarnation_);
  return grpc::Status::OK;
}

}  // namespace ferry::fake
