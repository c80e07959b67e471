// ferryd: the per-node transfer agent.
//
//   ferryd [--config FILE] [--node NAME] [--socket PATH] [--local-tcp HOST:PORT]
//          [--peer-listen HOST:PORT] [--peer NAME=HOST:PORT ...] [--host-pool SIZE]
//          [--tcp-connections N] [--log-level LEVEL] [--help] [--version]
//
// Flags override the file. SIGHUP reloads the file. SIGTERM drains (server/agent/drain.h): new
// transfers are refused, running ones get limits.shutdown_grace_ms to finish, then it exits 0.
// SIGINT (Ctrl-C) stops at once: the same steps with no grace. A second SIGTERM or SIGINT
// during a drain ends its grace.

#include <malloc.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <map>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "base/byte_size.h"
#include "config/config.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "base/port_owner.h"
#include "base/status_macros.h"
#include "server/buffers/open_files.h"
#include "server/agent/agent_core.h"
#include "server/agent/agent_discovery.h"
#include "server/agent/config_reload.h"
#include "server/agent/drain.h"
#include "server/local/instance_lock.h"
#include "server/local/fd_inbox.h"
#include "server/local/local_listener.h"
#include "server/agent/log_setup.h"
#include "server/metrics/metrics_exporter.h"
#include "server/api/agent_service.h"
#include "server/api/peer_service.h"
#include "server/tensors/tensor_service.h"
#include "server/api/transfer_socket.h"
#include "server/version.h"
#include "spdlog/spdlog.h"
#include "transport/tcp/socket.h"

namespace ferry::server {
namespace {

constexpr const char* kUsage =
    "usage: ferryd [--config FILE] [--node NAME] [--socket PATH] [--local-tcp HOST:PORT]\n"
    "              [--peer-listen HOST:PORT] [--peer NAME=HOST:PORT ...] [--host-pool SIZE]\n"
    "              [--tcp-connections N] [--log-level LEVEL] [--help] [--version]\n"
    "Flags override the file (every key: config/ferry.example.yaml). SIGHUP reloads the file;\n"
    "SIGTERM drains (limits.shutdown_grace_ms), SIGINT stops at once.\n";

// Exits with the usage text: 0 when asked for it, 2 after a usage error.
[[noreturn]] void ExitUsage(int code, const std::string& why = "") {
  if (!why.empty()) std::cerr << "ferryd: " << why << "\n";
  (code == 0 ? std::cout : std::cerr) << kUsage;
  std::exit(code);
}

// Applies command-line flags on top of the file's values, validated as the file's are.
absl::StatusOr<config::Config> LoadConfig(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  // Flags that take no value, answered before anything else is read.
  for (const auto& a : args) {
    if (a == "--help" || a == "-h") ExitUsage(0);
    if (a == "--version") {
      std::cout << "ferryd " << kFerryVersion << "\n";
      std::exit(0);
    }
  }
  using Apply = std::function<absl::Status(config::Config&, const std::string&)>;
  // A flag that sets one string field of the config.
  auto SetString = [](std::string config::Config::*field) -> Apply {
    return [field](config::Config& c, const std::string& v) {
      c.*field = v;
      return absl::OkStatus();
    };
  };
  const std::map<std::string, Apply> kFlags = {
      {"--config", [](config::Config&, const std::string&) { return absl::OkStatus(); }},
      {"--node", SetString(&config::Config::node)},
      {"--socket", SetString(&config::Config::local_socket)},
      {"--local-tcp", SetString(&config::Config::local_tcp)},
      {"--peer-listen", SetString(&config::Config::peer_listen)},
      {"--peer", [](config::Config& c, const std::string& v) {
         std::pair<std::string, std::string> kv = absl::StrSplit(v, absl::MaxSplits('=', 1));
         if (kv.first.empty() || kv.second.empty()) {
           return absl::InvalidArgumentError(absl::StrCat("'", v, "' is not NAME=HOST:PORT"));
         }
         c.peers[kv.first] = kv.second;
         return absl::OkStatus();
       }},
      {"--host-pool", [](config::Config& c, const std::string& v) {
         auto size = ParseByteSize(v);
         if (!size.ok()) return size.status();
         if (*size == 0) return absl::InvalidArgumentError("must be positive");
         c.host_pool_bytes = *size;
         return absl::OkStatus();
       }},
      {"--tcp-connections", [](config::Config& c, const std::string& v) {
         if (!absl::SimpleAtoi(v, &c.tcp_connections) || c.tcp_connections < 1 ||
             c.tcp_connections > 64) {
           return absl::InvalidArgumentError(absl::StrCat("'", v, "' is not 1..64"));
         }
         return absl::OkStatus();
       }},
      {"--log-level", [](config::Config& c, const std::string& v) {
         RETURN_IF_ERROR(config::ValidateLogLevel(v));
         c.log_level = v;
         return absl::OkStatus();
       }},
  };
  // Every flag is known and has its value before the file is read.
  std::vector<std::pair<const Apply*, std::pair<std::string, std::string>>> given;
  std::string path;
  for (size_t i = 0; i < args.size(); ++i) {
    auto flag = kFlags.find(args[i]);
    if (flag == kFlags.end())
      ExitUsage(2, absl::StrCat("unknown flag '", args[i].substr(0, 64), "'"));
    if (i + 1 >= args.size()) ExitUsage(2, absl::StrCat(args[i], ": missing value"));
    const std::string& value = args[++i];
    if (flag->first == "--config") path = value;
    given.push_back({&flag->second, {flag->first, value}});
  }
  config::Config c;
  if (!path.empty()) {
    auto loaded = config::LoadConfigFile(path);
    if (!loaded.ok()) return loaded.status();
    c = *loaded;
  }
  for (const auto& [apply, flag] : given) {
    absl::Status s = (*apply)(c, flag.second);
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(flag.first, ": ", s.message()));
  }
  config::ResolveDefaults(c);
  // Again after the flags: --peer-listen and --peer may take plaintext beyond loopback.
  RETURN_IF_ERROR(config::CheckSecurityReach(c));
  return c;
}

// Builds and starts a gRPC server on `address`. One agent per address: SO_REUSEPORT (gRPC's
// default) would let a second agent listen beside the first and take half its calls.
std::unique_ptr<grpc::Server> Listen(grpc::ServerBuilder& builder, const std::string& address,
                                     std::shared_ptr<grpc::ServerCredentials> credentials,
                                     int* port) {
  builder.AddListeningPort(address, std::move(credentials), port);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  return builder.BuildAndStart();
}

// Why `address` could not be listened on, naming the process that holds it when we can.
std::string ListenError(const std::string& what, const std::string& address) {
  auto hp = tcp::ParseHostPort(address);
  pid_t owner = hp.ok() ? ListeningPortOwner(hp->port) : 0;
  return absl::StrCat("cannot listen for ", what, " on ", address,
                      owner > 0 ? absl::StrCat(": the port is in use by pid ", owner,
                                               owner == getpid() ? " (this agent)" : "")
                                : ": the address is in use or not ours");
}

// SIGHUP: the file again (with the same flags on top), applied where it can be, and every
// change that could not be applied named in the log.
void Reload(int argc, char** argv, AgentCore& core, config::Config& running) {
  if (running.source_path.empty()) {
    spdlog::warn("SIGHUP: started without --config, nothing to reload");
    return;
  }
  auto next = LoadConfig(argc, argv);
  if (!next.ok()) {
    spdlog::error("SIGHUP: {} not reloaded, nothing changed: {}", running.source_path,
                  std::string(next.status().message()));
    return;
  }
  ReloadReport report = ApplyReload(core, running, *next);
  for (const auto& line : report.applied) spdlog::info("SIGHUP: {}", line);
  for (const auto& line : report.not_applied) spdlog::warn("SIGHUP: {}", line);
}

// True when SIGTERM or SIGINT came (again) since the last look; takes it, never waits.
bool StopSignalPending() {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  timespec now{0, 0};
  return sigtimedwait(&stop, nullptr, &now) > 0;
}

int Run(int argc, char** argv) {
  auto loaded = LoadConfig(argc, argv);
  if (!loaded.ok()) {
    std::cerr << "ferryd: " << loaded.status().message() << "\n";
    return 2;
  }
  const config::Config& config = *loaded;
  SetUpLogging(config.node, config.log_level, config.log_format);
  RaiseOpenFileLimit();

  // Signals are taken synchronously by this thread; every other thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // Before anything is bound: a second agent with the same socket stops here.
  auto lock = InstanceLock::Acquire(config.local_socket, absl::Seconds(10));
  if (!lock.ok()) {
    spdlog::error("cannot start: {}", std::string(lock.status().message()));
    return 1;
  }
  auto core = AgentCore::Create(config);
  if (!core.ok()) {
    spdlog::error("cannot start: {}", core.status().ToString());
    return 1;
  }
  AgentService agent_service(core->get());
  PeerService peer_service(core->get());
  TensorService tensor_service(core->get());
  TensorPeerService tensor_peer_service(core->get());

  // grpc.health.v1 on both listeners: Kubernetes' `grpc:` readiness probe asks the Peer
  // API's. SERVING from start; NOT_SERVING as soon as a drain begins (the hook below).
  grpc::EnableDefaultHealthCheckService(true);
  // Peer API first: a local client's first transfer may target this node itself.
  grpc::ServerBuilder peer_builder;
  int peer_port = 0;
  peer_builder.RegisterService(&peer_service);
  peer_builder.RegisterService(&tensor_peer_service);
  std::unique_ptr<grpc::Server> peer_server =
      Listen(peer_builder, config.peer_listen,
             (*core)->peers().credentials().ServerCredentials(), &peer_port);
  if (!peer_server || peer_port == 0) {
    spdlog::error("cannot start: {}", ListenError("peers", config.peer_listen));
    return 1;
  }

  grpc::ServerBuilder local_builder;
  if (!config.local_tcp.empty()) {
    // Over TCP the socket's permissions protect nothing: only callers holding a certificate
    // of the cluster's CA (config.cc refuses local_tcp without mutual TLS).
    local_builder.AddListeningPort(config.local_tcp,
                                   (*core)->peers().credentials().ServerCredentials());
  }
  // Batches of tens of thousands of ops exceed gRPC's 4 MiB default.
  local_builder.SetMaxReceiveMessageSize(64 << 20);
  local_builder.SetMaxSendMessageSize(64 << 20);
  local_builder.RegisterService(&agent_service);
  local_builder.RegisterService(&tensor_service);
  local_builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  std::unique_ptr<grpc::Server> local_server = local_builder.BuildAndStart();
  // The Unix socket is accepted by us, not gRPC: each connection's uid is known first.
  absl::StatusOr<std::unique_ptr<LocalListener>> local = absl::UnknownError("not bound");
  if (local_server) {
    absl::StatusOr<gid_t> group = LookupGroup(config.local_socket_group, "listen.local_group");
    local = group.ok() ? LocalListener::Bind(config.local_socket, config.local_socket_mode, *group,
                                             &(*core)->local_callers())
                       : group.status();
  }
  if (!local_server || !local.ok()) {
    spdlog::error("cannot start: cannot listen on unix:{}{}{}", config.local_socket,
                  config.local_tcp.empty() ? "" : absl::StrCat(" and ", config.local_tcp),
                  local_server ? absl::StrCat(": ", local.status().message()) : "");
    if (local_server) local_server->Shutdown();
    peer_server->Shutdown();
    return 1;
  }
  // Beside the local socket, with its permissions: descriptors for RegisterMemory. Known to
  // the core before the first local call can ask for it.
  auto fd_inbox = FdInbox::Start(FdSocketPath(config.local_socket), config.local_socket_mode,
                                 *LookupGroup(config.local_socket_group, "listen.local_group"));
  if (!fd_inbox.ok()) {
    spdlog::error("cannot start: {}", fd_inbox.status().ToString());
    local_server->Shutdown();
    peer_server->Shutdown();
    return 1;
  }
  (*core)->set_fd_inbox(fd_inbox->get());
  // Beside it too: small transfers and block moves without gRPC (server/api/transfer_socket.h).
  auto transfer_socket = TransferSocket::Start(
      TransferSocketPath(config.local_socket), config.local_socket_mode,
      *LookupGroup(config.local_socket_group, "listen.local_group"), agent_service.starters(),
      [&agent_service, &tensor_service](const LocalCaller& caller) {
        return TransferSocket::Calls{agent_service.CallsFor(caller),
                                     tensor_service.MovesFor(caller)};
      });
  if (!transfer_socket.ok()) {
    spdlog::error("cannot start: {}", transfer_socket.status().ToString());
    local_server->Shutdown();
    peer_server->Shutdown();
    return 1;
  }
  agent_service.set_transfer_socket(transfer_socket->get());
  (*local)->Serve(local_server.get());
  // After the hooks AgentCore::Create added (discovery deregistration runs before this).
  (*core)->drain_hooks().Add("readiness: gRPC health NOT_SERVING", [&] {
    for (grpc::Server* server : {peer_server.get(), local_server.get()}) {
      if (grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService()) {
        health->SetServingStatus(false);
      }
    }
  });
  (*lock)->NoteSocketBound();
  // Off unless metrics.listen names an address; a listener that cannot start is fatal, as
  // the other listeners are: an operator who asked for metrics would otherwise not notice.
  std::unique_ptr<MetricsExporter> metrics;
  if (!config.metrics_listen.empty()) {
    auto started = MetricsExporter::Start(config.metrics_listen, core->get());
    if (!started.ok()) {
      spdlog::error("cannot start: {}", std::string(started.status().message()));
      local_server->Shutdown();
      peer_server->Shutdown();
      return 1;
    }
    metrics = *std::move(started);
    spdlog::info("metrics on http://{}/metrics", metrics->address());
  }
  spdlog::info("ferryd {} ready: local unix:{}{}, peers on {} ({}), {} peer(s) configured",
               kFerryVersion, config.local_socket,
               config.local_tcp.empty() ? "" : absl::StrCat(" and ", config.local_tcp),
               config.peer_listen, (*core)->peers().credentials().Describe(),
               config.peers.size());

  // After the Peer API serves: a peer that finds us in etcd can reach us at once.
  std::unique_ptr<EtcdDiscovery> discovery = StartDiscovery(config, **core, peer_port);

  config::Config running = config;
  int sig = 0;
  while (true) {
    sigwait(&signals, &sig);
    if (sig == SIGHUP) {
      Reload(argc, argv, **core, running);
      continue;
    }
    break;
  }
  // Out of etcd first, so that peers stop choosing this node while it stops.
  if (discovery) discovery->Deregister();
  // The socket goes first, so a successor started now sees no live agent there and waits
  // for our lock instead of refusing; it is still ours (checked), never a successor's.
  // Clients already connected keep their connection through the drain: their Waits get
  // results, their new Submits the "draining" refusal.
  (*lock)->RemoveSocket();
  (*local)->Stop();
  if (sig == SIGTERM) {
    spdlog::info("SIGTERM: draining (SIGTERM or SIGINT again: stop at once)");
    Drain(**core, (*core)->engine().limits().shutdown_grace, StopSignalPending);
  } else {
    spdlog::info("signal {}: stopping at once (SIGTERM drains)", sig);
    Drain(**core, absl::ZeroDuration(), nullptr);
  }
  // Calls still open (sessions, watches of ended transfers) get a moment to end.
  auto grace = std::chrono::system_clock::now() + std::chrono::seconds(2);
  local_server->Shutdown(grace);
  peer_server->Shutdown(grace);
  // Its connections close; transfers still running answer nobody.
  agent_service.set_transfer_socket(nullptr);
  transfer_socket->reset();
  metrics.reset();  // it reads the core
  discovery.reset();  // before the directory it feeds
  core->reset();
  fd_inbox->reset();  // unlinks its socket while the instance lock is still ours
  lock->reset();
  spdlog::info("stopped");
  return 0;
}

}  // namespace
}  // namespace ferry::server

int main(int argc, char** argv) {
  // Abseil's lock-order graph (on in Debian's libabsl) records every Mutex acquisition: about
  // a quarter of the engine's CPU per op (ferry-engine-bench, 131k -> 173k ops/s for 64 B
  // blocks). The tests keep it on, to catch lock-order cycles; the agent does not pay it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // A client's large request buffers (a transfer-socket frame of tens of MiB) are mapped and
  // given back whole when freed. glibc raises its mmap threshold to the size of each such
  // block freed, and from then on keeps them in its heap: one hostile client's 56 MiB frames
  // left the agent 70 MB larger after it was gone. A fixed threshold stops that.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  return ferry::server::Run(argc, argv);
}
