#pragma once
// The Peer gRPC service: what other agents may ask of this one.

#include "ferry/v1/peer.grpc.pb.h"

namespace ferry::server {

class AgentCore;

class PeerService final : public ferry::v1::Peer::Service {
 public:
  explicit PeerService(AgentCore* core) : core_(core) {}

  grpc::Status Hello(grpc::ServerContext*, const ferry::v1::HelloRequest*,
                     ferry::v1::HelloResponse*) override;
  grpc::Status Connect(grpc::ServerContext*, const ferry::v1::ConnectRequest*,
                       ferry::v1::ConnectResponse*) override;
  grpc::Status ResolveBuffer(grpc::ServerContext*, const ferry::v1::ResolveBufferRequest*,
                             ferry::v1::ResolveBufferResponse*) override;
  grpc::Status Revoke(grpc::ServerContext*, const ferry::v1::RevokeRequest*,
                      ferry::v1::RevokeResponse*) override;
  grpc::Status Health(grpc::ServerContext*, const ferry::v1::HealthRequest*,
                      ferry::v1::HealthResponse*) override;
  grpc::Status Stage(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<ferry::v1::StageReply, ferry::v1::StageRequest>*) override;

 private:
  AgentCore* const core_;
};

}  // namespace ferry::server
