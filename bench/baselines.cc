#include "bench/baselines.h"

#include <unistd.h>

#include <cstdio>
#include <memory>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "sink.grpc.pb.h"
#include "bench/command_output.h"
#include "bench/stats.h"
#include "client/agent_process.h"
#include "client/child_process.h"
#include "grpcpp/grpcpp.h"

namespace ferry::bench {
namespace {

// The number after `"key":` following the first `"section"` in iperf3's JSON.
absl::StatusOr<double> FindNumber(const std::string& json, const std::string& section,
                                  const std::string& key) {
  size_t at = json.find(absl::StrCat("\"", section, "\""));
  if (at == std::string::npos)
    return absl::NotFoundError(absl::StrCat("iperf3 output has no ", section));
  at = json.find(absl::StrCat("\"", key, "\""), at);
  if (at == std::string::npos)
    return absl::NotFoundError(absl::StrCat("iperf3 output has no ", key));
  at = json.find(':', at) + 1;
  size_t end = json.find_first_of(",}\n", at);
  double v = 0;
  std::string text(json.substr(at, end - at));
  text.erase(0, text.find_first_not_of(" \t"));
  if (!absl::SimpleAtod(text, &v))
    return absl::InternalError(absl::StrCat("bad number '", text, "'"));
  return v;
}

class SinkService final : public Sink::Service {
  grpc::Status Push(grpc::ServerContext*, grpc::ServerReader<Chunk>* reader,
                    Received* out) override {
    Chunk chunk;
    uint64_t bytes = 0;
    while (reader->Read(&chunk)) bytes += chunk.data().size();
    out->set_bytes(bytes);
    return grpc::Status::OK;
  }
  grpc::Status Put(grpc::ServerContext*, const Chunk* chunk, Received* out) override {
    out->set_bytes(chunk->data().size());
    return grpc::Status::OK;
  }
};

}  // namespace

absl::StatusOr<Measurement> RunIperf3(int streams, double seconds) {
  auto port = PickFreePort();
  if (!port.ok()) return port.status();
  auto server = SpawnChild({"iperf3", "-s", "-1", "-p", std::to_string(*port)}, "/dev/null");
  if (!server.ok()) return server.status();
  std::string cmd = absl::StrCat("iperf3 -c 127.0.0.1 -p ", *port, " -P ", streams, " -t ", seconds,
                                 " -J 2>&1");
  std::string out;
  for (int attempt = 0; attempt < 50 && out.find("sum_received") == std::string::npos; ++attempt) {
    usleep(100 * 1000);  // until the server listens
    out = CommandOutput(cmd);
  }
  Reap(*server);
  auto bps = FindNumber(out, "sum_received", "bits_per_second");
  auto bytes = FindNumber(out, "sum_received", "bytes");
  auto secs = FindNumber(out, "sum_received", "seconds");
  if (!bps.ok() || !bytes.ok() || !secs.ok()) {
    return absl::UnavailableError(absl::StrCat("iperf3 gave no result: ", out.substr(0, 300)));
  }
  Measurement m;
  m.series = absl::StrCat("iperf3 -P ", streams);
  m.bytes = static_cast<uint64_t>(*bytes);
  m.seconds = *secs;
  m.gbps = *bps / 8 / 1e9;
  m.note = "TCP stream, loopback";
  return m;
}

absl::StatusOr<std::unique_ptr<GrpcSink>> GrpcSink::Start(const std::string& self_exe) {
  auto port = PickFreePort();
  if (!port.ok()) return port.status();
  auto pid = SpawnChild({self_exe, "--grpc-sink", std::to_string(*port)}, "/dev/null");
  if (!pid.ok()) return pid.status();
  std::unique_ptr<GrpcSink> sink(new GrpcSink(*pid, absl::StrCat("127.0.0.1:", *port)));
  auto channel = grpc::CreateChannel(sink->address_, grpc::InsecureChannelCredentials());
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
    return absl::UnavailableError("the gRPC sink did not start");
  }
  return sink;
}

GrpcSink::~GrpcSink() { Reap(pid_); }

absl::StatusOr<Measurement> GrpcSink::Push(uint64_t size, double min_seconds, int min_iterations) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(8 << 20);
  auto stub =
      Sink::NewStub(grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(), args));
  constexpr uint64_t kChunk = 1 << 20;
  Chunk chunk;
  chunk.mutable_data()->assign(std::min(size, kChunk), 'x');
  auto push = [&]() -> absl::Status {
    grpc::ClientContext ctx;
    Received received;
    auto writer = stub->Push(&ctx, &received);
    for (uint64_t sent = 0; sent < size; sent += kChunk) {
      if (size - sent < kChunk) chunk.mutable_data()->resize(size - sent);
      if (!writer->Write(chunk)) break;
    }
    writer->WritesDone();
    grpc::Status s = writer->Finish();
    chunk.mutable_data()->resize(std::min(size, kChunk));
    if (!s.ok() || received.bytes() != size) {
      return absl::InternalError(
          absl::StrCat("gRPC push of ", size, " bytes: ", s.error_message()));
    }
    return absl::OkStatus();
  };
  // Warmed up as ferry's rows are: the channel connects on the first call.
  if (absl::Status s = push(); !s.ok()) return s;
  std::vector<double> latencies;
  uint64_t moved = 0;
  absl::Time start = absl::Now(), until = start + absl::Seconds(min_seconds);
  while (latencies.size() < static_cast<size_t>(min_iterations) || absl::Now() < until) {
    absl::Time t0 = absl::Now();
    if (absl::Status s = push(); !s.ok()) return s;
    latencies.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
    moved += size;
  }
  double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  Measurement m;
  m.series = "grpc stream";
  m.size = size;
  m.ops = latencies.size();
  m.bytes = moved;
  SetTimings(m, seconds, latencies);
  return m;
}

absl::StatusOr<Measurement> GrpcSink::PingPong(uint64_t size, double min_seconds,
                                               int min_iterations) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(8 << 20);
  auto stub =
      Sink::NewStub(grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(), args));
  Chunk chunk;
  chunk.mutable_data()->assign(size, 'x');
  std::vector<double> latencies;
  auto put = [&]() -> absl::Status {
    grpc::ClientContext ctx;
    Received received;
    grpc::Status s = stub->Put(&ctx, chunk, &received);
    if (!s.ok() || received.bytes() != size) {
      return absl::InternalError(absl::StrCat("gRPC Put of ", size, " bytes: ", s.error_message()));
    }
    return absl::OkStatus();
  };
  if (absl::Status s = put(); !s.ok()) return s;  // the channel connects on the first call
  absl::Time start = absl::Now(), until = start + absl::Seconds(min_seconds);
  while (latencies.size() < static_cast<size_t>(min_iterations) || absl::Now() < until) {
    absl::Time t0 = absl::Now();
    if (absl::Status s = put(); !s.ok()) return s;
    latencies.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
  }
  double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  Measurement m;
  m.series = "grpc unary";
  m.size = size;
  m.ops = latencies.size();
  m.bytes = m.ops * size;
  SetTimings(m, seconds, latencies);
  m.note = "one call at a time";
  return m;
}

int ServeGrpcSink(int port) {
  SinkService service;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat("127.0.0.1:", port), grpc::InsecureServerCredentials());
  builder.SetMaxReceiveMessageSize(8 << 20);
  builder.RegisterService(&service);
  auto server = builder.BuildAndStart();
  if (!server) return 1;
  server->Wait();
  return 0;
}

}  // namespace ferry::bench
