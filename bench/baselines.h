#pragma once
// What a user would otherwise use, measured in the same run as ferry:
//  - iperf3 on loopback with the same number of TCP streams: the ceiling of the tcp path;
//  - gRPC client-streaming of the same bytes between two processes: pushing the tensor
//    through a control channel;
//  - gRPC unary ping-pong (one message, one small reply, one call at a time): the floor of
//    one small op through an RPC stack on loopback.
// ucx_perftest over tcp is in bench/ucx_baseline.h.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "bench/measurement.h"

namespace ferry::bench {

// Runs `iperf3 -c 127.0.0.1 -P streams -t seconds` against a server it starts.
absl::StatusOr<Measurement> RunIperf3(int streams, double seconds);

// A gRPC Sink server in a child process (this binary with --grpc-sink PORT).
class GrpcSink {
 public:
  static absl::StatusOr<std::unique_ptr<GrpcSink>> Start(const std::string& self_exe);
  ~GrpcSink();
  // Streams `size` bytes in chunks of at most 1 MiB per Push, repeated for `min_seconds`.
  absl::StatusOr<Measurement> Push(uint64_t size, double min_seconds, int min_iterations);
  // Unary Put of `size` bytes answered by its byte count, one call at a time on one channel,
  // repeated for `min_seconds`: series "grpc unary", p50/p99 per call.
  absl::StatusOr<Measurement> PingPong(uint64_t size, double min_seconds, int min_iterations);

 private:
  GrpcSink(int pid, std::string address) : pid_(pid), address_(std::move(address)) {}
  int pid_;
  std::string address_;
};

// The child's main: serves Sink on 127.0.0.1:port until killed.
int ServeGrpcSink(int port);

}  // namespace ferry::bench
