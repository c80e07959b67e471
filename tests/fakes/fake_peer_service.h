#pragma once
// A peer agent's Peer service for unit tests, reduced to what PeerDirectory (and through it
// the engine) relies on: Hello naming its fabrics (one per provider, in preference order),
// Connect answered by that provider's fabric's own AcceptConnect, and canned ResolveBuffer
// answers that the test changes while it runs.

#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "ferry/v1/peer.grpc.pb.h"
#include "server/peers/protocol.h"
#include "transport/fabric.h"

namespace ferry::fake {

class FakePeerService final : public ferry::v1::Peer::Service {
 public:
  FakePeerService(std::string node, fabric::Fabric* fabric, uint64_t incarnation)
      : FakePeerService(std::move(node), std::vector<fabric::Fabric*>{fabric}, incarnation) {}
  FakePeerService(std::string node, std::vector<fabric::Fabric*> fabrics, uint64_t incarnation)
      : node_(std::move(node)), fabrics_(std::move(fabrics)), incarnation_(incarnation) {}

  void set_incarnation(uint64_t v) {
    absl::MutexLock lock(&mu_);
    incarnation_ = v;
  }
  // What Hello answers as its protocol version.
  void set_protocol_version(uint32_t v) {
    absl::MutexLock lock(&mu_);
    protocol_version_ = v;
  }
  // Hello fails FAILED_PRECONDITION, as a real agent does for a version it does not speak.
  void set_refuse_hello(bool v) {
    absl::MutexLock lock(&mu_);
    refuse_hello_ = v;
  }
  // ResolveBuffer(name) answers `resp` (its incarnation filled in at call time).
  void AddBuffer(const std::string& name, ferry::v1::ResolveBufferResponse resp) {
    absl::MutexLock lock(&mu_);
    buffers_[name] = std::move(resp);
  }
  int hellos() const { return hellos_.load(); }
  int connects() const { return connects_.load(); }
  int resolves() const { return resolves_.load(); }
  std::string last_from() const {
    absl::MutexLock lock(&mu_);
    return last_from_;
  }
  uint32_t last_hello_version() const {
    absl::MutexLock lock(&mu_);
    return last_hello_version_;
  }

  grpc::Status Hello(grpc::ServerContext*, const ferry::v1::HelloRequest* req,
                     ferry::v1::HelloResponse* resp) override;
  // Answers with the provider's fabric's own AcceptConnect, so the endpoint it makes is real.
  grpc::Status Connect(grpc::ServerContext*, const ferry::v1::ConnectRequest* req,
                       ferry::v1::ConnectResponse* resp) override;
  // The canned answer for the name; PERMISSION_DENIED for "secret", NOT_FOUND naming it else.
  grpc::Status ResolveBuffer(grpc::ServerContext*, const ferry::v1::ResolveBufferRequest* req,
                             ferry::v1::ResolveBufferResponse* resp) override;

 private:
  const std::string node_;
  const std::vector<fabric::Fabric*> fabrics_;
  std::atomic<int> hellos_{0};
  std::atomic<int> connects_{0};
  std::atomic<int> resolves_{0};
  mutable absl::Mutex mu_;
  uint64_t incarnation_ ABSL_GUARDED_BY(mu_);
  uint32_t protocol_version_ ABSL_GUARDED_BY(mu_) = server::kPeerProtocolVersion;
  bool refuse_hello_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, ferry::v1::ResolveBufferResponse> buffers_ ABSL_GUARDED_BY(mu_);
  std::string last_from_ ABSL_GUARDED_BY(mu_);
  uint32_t last_hello_version_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ferry::fake
