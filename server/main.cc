// ferryd: the per-node transfer agent.
//
//   ferryd [--config FILE] [--node NAME] [--socket PATH] [--local-tcp HOST:PORT]
//          [--peer-listen HOST:PORT] [--peer NAME=HOST:PORT ...] [--host-pool SIZE]
//          [--tcp-connections N] [--log-level LEVEL]
//
// Flags override the file. SIGTERM / SIGINT stop it cleanly.

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/byte_size.h"
#include "config/config.h"
#include "grpcpp/grpcpp.h"
#include "server/agent_core.h"
#include "server/agent_service.h"
#include "server/peer_service.h"
#include "server/tensors/tensor_service.h"
#include "server/version.h"
#include "spdlog/spdlog.h"

namespace ferry::server {
namespace {

constexpr const char* kUsage =
    "usage: ferryd [--config FILE] [--node NAME] [--socket PATH] [--local-tcp HOST:PORT]\n"
    "              [--peer-listen HOST:PORT] [--peer NAME=HOST:PORT ...] [--host-pool SIZE]\n"
    "              [--tcp-connections N] [--log-level LEVEL]\n";

// Applies command-line flags on top of the file's values.
absl::StatusOr<config::Config> LoadConfig(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  std::string path;
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "--config") path = args[i + 1];
  }
  config::Config c;
  if (!path.empty()) {
    auto loaded = config::LoadConfigFile(path);
    if (!loaded.ok()) return loaded.status();
    c = *loaded;
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    if (flag == "--help" || flag == "-h") {
      std::cout << kUsage;
      std::exit(0);
    }
    if (flag == "--version") {
      std::cout << "ferryd " << kFerryVersion << "\n";
      std::exit(0);
    }
    if (i + 1 >= args.size()) return absl::InvalidArgumentError(absl::StrCat(flag, ": missing value"));
    const std::string& v = args[++i];
    if (flag == "--config") {
      continue;
    } else if (flag == "--node") {
      c.node = v;
    } else if (flag == "--socket") {
      c.local_socket = v;
    } else if (flag == "--local-tcp") {
      c.local_tcp = v;
    } else if (flag == "--peer-listen") {
      c.peer_listen = v;
    } else if (flag == "--peer") {
      std::pair<std::string, std::string> kv = absl::StrSplit(v, absl::MaxSplits('=', 1));
      if (kv.first.empty() || kv.second.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("--peer: '", v, "' is not NAME=HOST:PORT"));
      }
      c.peers[kv.first] = kv.second;
    } else if (flag == "--host-pool") {
      auto size = ParseByteSize(v);
      if (!size.ok()) return absl::InvalidArgumentError(absl::StrCat("--host-pool: ", size.status().message()));
      c.host_pool_bytes = *size;
    } else if (flag == "--tcp-connections") {
      if (!absl::SimpleAtoi(v, &c.tcp_connections) || c.tcp_connections < 1 || c.tcp_connections > 64) {
        return absl::InvalidArgumentError(absl::StrCat("--tcp-connections: '", v, "' is not 1..64"));
      }
    } else if (flag == "--log-level") {
      c.log_level = v;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag '", flag, "'\n", kUsage));
    }
  }
  config::ResolveDefaults(c);
  return c;
}

int Run(int argc, char** argv) {
  auto loaded = LoadConfig(argc, argv);
  if (!loaded.ok()) {
    std::cerr << "ferryd: " << loaded.status().message() << "\n";
    return 2;
  }
  const config::Config& config = *loaded;
  spdlog::set_level(spdlog::level::from_str(config.log_level));
  spdlog::set_pattern(absl::StrCat("%Y-%m-%d %H:%M:%S.%e ", config.node, " %^%l%$ %v"));

  // Signals are taken synchronously by this thread; every other thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto core = AgentCore::Create(config);
  if (!core.ok()) {
    spdlog::error("cannot start: {}", core.status().ToString());
    return 1;
  }
  AgentService agent_service(core->get());
  PeerService peer_service(core->get());
  TensorService tensor_service(core->get());
  TensorPeerService tensor_peer_service(core->get());

  // Peer API first: a local client's first transfer may target this node itself.
  grpc::ServerBuilder peer_builder;
  int peer_port = 0;
  peer_builder.AddListeningPort(config.peer_listen, grpc::InsecureServerCredentials(), &peer_port);
  peer_builder.RegisterService(&peer_service);
  peer_builder.RegisterService(&tensor_peer_service);
  std::unique_ptr<grpc::Server> peer_server = peer_builder.BuildAndStart();
  if (!peer_server || peer_port == 0) {
    spdlog::error("cannot listen for peers on {}", config.peer_listen);
    return 1;
  }

  ::unlink(config.local_socket.c_str());  // a stale socket from a crashed agent
  grpc::ServerBuilder local_builder;
  local_builder.AddListeningPort(absl::StrCat("unix:", config.local_socket),
                                 grpc::InsecureServerCredentials());
  if (!config.local_tcp.empty()) {
    local_builder.AddListeningPort(config.local_tcp, grpc::InsecureServerCredentials());
  }
  // Batches of tens of thousands of ops exceed gRPC's 4 MiB default.
  local_builder.SetMaxReceiveMessageSize(64 << 20);
  local_builder.SetMaxSendMessageSize(64 << 20);
  local_builder.RegisterService(&agent_service);
  local_builder.RegisterService(&tensor_service);
  std::unique_ptr<grpc::Server> local_server = local_builder.BuildAndStart();
  if (!local_server) {
    spdlog::error("cannot listen on unix:{}", config.local_socket);
    peer_server->Shutdown();
    return 1;
  }
  if (chmod(config.local_socket.c_str(), 0660) != 0) {
    spdlog::warn("chmod(0660, {}): {}", config.local_socket, strerror(errno));
  }
  spdlog::info("ferryd {} ready: local unix:{}{}, peers on {}, {} peer(s) configured", kFerryVersion,
               config.local_socket, config.local_tcp.empty() ? "" : absl::StrCat(" and ", config.local_tcp),
               config.peer_listen, config.peers.size());

  while (true) {
    int sig = 0;
    sigwait(&signals, &sig);
    if (sig == SIGHUP) {
      // Only the policy is reloadable: the rest (sockets, pools, peers) needs a restart.
      if (config.source_path.empty()) {
        spdlog::warn("SIGHUP: started without --config, nothing to reload");
        continue;
      }
      auto policy = config::LoadPolicyFromFile(config.source_path);
      auto applied = policy.ok() ? (*core)->policies().Replace(*policy)
                                 : absl::StatusOr<std::shared_ptr<const PolicySnapshot>>(policy.status());
      if (!applied.ok()) {
        spdlog::error("SIGHUP: policy not reloaded, the current one stays: {}", applied.status().ToString());
      } else {
        spdlog::info("SIGHUP: policy reloaded from {} (generation {})", config.source_path,
                     (*applied)->generation);
      }
      continue;
    }
    spdlog::info("signal {}: stopping", sig);
    break;
  }
  auto grace = std::chrono::system_clock::now() + std::chrono::seconds(2);
  local_server->Shutdown(grace);
  peer_server->Shutdown(grace);
  core->reset();
  ::unlink(config.local_socket.c_str());
  spdlog::info("stopped");
  return 0;
}

}  // namespace
}  // namespace ferry::server

int main(int argc, char** argv) { return ferry::server::Run(argc, argv); }
