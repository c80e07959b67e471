// How a TransferStream's messages travel: over a gRPC call (Agent.TransferStream), or over
// the agent's transfer socket (server/api/transfer_socket.h), which carries the same messages
// in frames without gRPC's threads between the client and the agent. One thread may Write
// while another Reads.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "ferry/v1/agent.grpc.pb.h"

namespace ferry {

class StreamWire {
 public:
  virtual ~StreamWire() = default;
  // Sends `request` whole, blocking while the agent reads no more; false once the wire
  // broke (Finish says why).
  virtual bool Write(const ferry::v1::StreamedTransfer& request) = 0;
  // No more requests: the agent answers those written, then the wire ends.
  virtual bool WritesDone() = 0;
  // The next message of answers, blocking until it comes; false at the end (every answer
  // read, or the wire broke or was cancelled).
  virtual bool Read(ferry::v1::StreamedResults* results) = 0;
  // Gives up: a Write or Read blocked on another thread returns false, and so do later ones.
  virtual void Cancel() = 0;
  // How the wire ended, once Read returned false.
  virtual absl::Status Finish() = 0;
};

// Agent.TransferStream, a call made with `ctx` (its metadata and deadline).
absl::StatusOr<std::unique_ptr<StreamWire>> GrpcStreamWire(
    ferry::v1::Agent::Stub& stub, std::unique_ptr<grpc::ClientContext> ctx);
// A connection of its own to the transfer socket at `path` (GetInfo.transfer_socket).
// Errors name the call and errno.
absl::StatusOr<std::unique_ptr<StreamWire>> SocketStreamWire(const std::string& path);

}  // namespace ferry
