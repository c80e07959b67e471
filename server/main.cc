// ferryd: the per-node transfer agent.
//
//   ferryd [--config FILE] [--print-config] [flags that set keys ...] [--help] [--version]
//
// Flags override the file (server/agent/agent_flags.h); --print-config prints the config they
// make. SIGHUP reloads the file. SIGTERM drains (server/agent/drain.h): new
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
#include "config/keys.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "base/port_owner.h"
#include "base/status_macros.h"
#include "server/buffers/open_files.h"
#include "server/agent/agent_core.h"
#include "server/agent/agent_flags.h"
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

// Exits with the usage text: 0 when asked for it, 2 after a usage error.
[[noreturn]] void ExitUsage(int code, const std::string& why = "") {
  if (!why.empty()) std::cerr << "ferryd: " << why << "\n";
  (code == 0 ? std::cout : std::cerr) << AgentUsage();
  std::exit(code);
}

// The config the command line asks for. --help, --version and a usage mistake (exit 2) are
// answered before anything is read; --print-config prints the config and exits.
absl::StatusOr<config::Config> LoadConfig(int argc, char** argv) {
  auto line = ParseAgentCommandLine(std::vector<std::string>(argv + 1, argv + argc));
  if (!line.ok()) ExitUsage(2, std::string(line.status().message()));
  if (line->help) ExitUsage(0);
  if (line->version) {
    std::cout << "ferryd " << kFerryVersion << "\n";
    std::exit(0);
  }
  ASSIGN_OR_RETURN(config::Config config, LoadAgentConfig(*line));
  if (line->print_config) {
    std::cout << config::PrintConfig(config, "ferryd --print-config: defaults, file, flags");
    std::exit(0);
  }
  return config;
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

// What ferryd serves, started in order by the Start* steps below and stopped by Stop. The
// services it serves outlive it (Run keeps them).
struct Serving {
  std::unique_ptr<grpc::Server> peer_server;
  int peer_port = 0;
  std::unique_ptr<grpc::Server> local_server;
  std::unique_ptr<LocalListener> local;
  std::unique_ptr<FdInbox> fd_inbox;
  std::unique_ptr<TransferSocket> transfer_socket;
  std::unique_ptr<MetricsExporter> metrics;

  // A start that failed half way: the gRPC servers already running are shut down.
  void ShutdownServers() {
    if (local_server) local_server->Shutdown();
    if (peer_server) peer_server->Shutdown();
  }
};

// The Peer API, first: a local client's first transfer may target this node itself.
absl::Status StartPeerApi(const config::Config& config, AgentCore& core, PeerService& peers,
                          TensorPeerService& tensor_peers, Serving& serving) {
  grpc::ServerBuilder builder;
  builder.RegisterService(&peers);
  builder.RegisterService(&tensor_peers);
  serving.peer_server = Listen(builder, config.peer_listen,
                               core.peers().credentials().ServerCredentials(), &serving.peer_port);
  if (!serving.peer_server || serving.peer_port == 0) {
    return absl::UnavailableError(ListenError("peers", config.peer_listen));
  }
  return absl::OkStatus();
}

// The Agent and Tensors APIs on the Unix socket (and local_tcp), and the two sockets beside
// it: the fd socket (descriptors for RegisterMemory) and the transfer socket.
absl::Status StartLocalApi(const config::Config& config, AgentCore& core,
                           AgentService& agent_service, TensorService& tensor_service,
                           Serving& serving) {
  grpc::ServerBuilder builder;
  if (!config.local_tcp.empty()) {
    // Over TCP the socket's permissions protect nothing: only callers holding a certificate
    // of the cluster's CA (config.cc refuses local_tcp without mutual TLS).
    builder.AddListeningPort(config.local_tcp, core.peers().credentials().ServerCredentials());
  }
  // Batches of tens of thousands of ops exceed gRPC's 4 MiB default.
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.SetMaxSendMessageSize(64 << 20);
  builder.RegisterService(&agent_service);
  builder.RegisterService(&tensor_service);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  serving.local_server = builder.BuildAndStart();
  // The Unix socket is accepted by us, not gRPC: each connection's uid is known first.
  absl::StatusOr<std::unique_ptr<LocalListener>> local = absl::UnknownError("not bound");
  absl::StatusOr<gid_t> group = LookupGroup(config.local_socket_group, "listen.local_group");
  if (serving.local_server) {
    local = group.ok() ? LocalListener::Bind(config.local_socket, config.local_socket_mode,
                                             *group, &core.local_callers())
                       : group.status();
  }
  if (!serving.local_server || !local.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on unix:", config.local_socket,
        config.local_tcp.empty() ? "" : absl::StrCat(" and ", config.local_tcp),
        serving.local_server ? absl::StrCat(": ", local.status().message()) : ""));
  }
  serving.local = *std::move(local);
  // Beside the local socket, with its permissions: descriptors for RegisterMemory. Known to
  // the core before the first local call can ask for it.
  auto fd_inbox =
      FdInbox::Start(FdSocketPath(config.local_socket), config.local_socket_mode, *group);
  if (!fd_inbox.ok()) return absl::UnavailableError(fd_inbox.status().ToString());
  serving.fd_inbox = *std::move(fd_inbox);
  core.set_fd_inbox(serving.fd_inbox.get());
  // Beside it too: small transfers and block moves without gRPC (server/api/transfer_socket.h).
  auto transfer_socket = TransferSocket::Start(
      TransferSocketPath(config.local_socket), config.local_socket_mode, *group,
      agent_service.starters(), [&agent_service, &tensor_service](const LocalCaller& caller) {
        return TransferSocket::Calls{agent_service.CallsFor(caller),
                                     tensor_service.MovesFor(caller),
                                     tensor_service.PollsFor(caller)};
      });
  if (!transfer_socket.ok()) return absl::UnavailableError(transfer_socket.status().ToString());
  serving.transfer_socket = *std::move(transfer_socket);
  agent_service.set_transfer_socket(serving.transfer_socket.get());
  serving.local->Serve(serving.local_server.get());
  return absl::OkStatus();
}

// Off unless metrics.listen names an address; a listener that cannot start is fatal, as the
// other listeners are: an operator who asked for metrics would otherwise not notice.
absl::Status StartMetrics(const config::Config& config, AgentCore& core, Serving& serving) {
  if (config.metrics_listen.empty()) return absl::OkStatus();
  auto started = MetricsExporter::Start(config.metrics_listen, &core);
  if (!started.ok()) return absl::UnavailableError(started.status().message());
  serving.metrics = *std::move(started);
  spdlog::info("metrics on http://{}/metrics", serving.metrics->address());
  return absl::OkStatus();
}

// Blocks until SIGTERM or SIGINT, reloading the file on each SIGHUP; returns the signal.
int ServeUntilStopped(int argc, char** argv, const sigset_t& signals, AgentCore& core,
                      const config::Config& config) {
  config::Config running = config;
  int sig = 0;
  while (true) {
    sigwait(&signals, &sig);
    if (sig != SIGHUP) return sig;
    Reload(argc, argv, core, running);
  }
}

// Stops in the order that lets clients and peers see it coming: out of etcd, the socket
// gone, a drain (SIGTERM: with grace), then the servers, and the core last. `serving` stays
// Run's: the drain's readiness hook reads its servers.
void Stop(int sig, std::unique_ptr<AgentCore> core, InstanceLock& lock, Serving& serving,
          std::unique_ptr<EtcdDiscovery> discovery, AgentService& agent_service) {
  // Out of etcd first, so that peers stop choosing this node while it stops.
  if (discovery) discovery->Deregister();
  // The socket goes first, so a successor started now sees no live agent there and waits
  // for our lock instead of refusing; it is still ours (checked), never a successor's.
  // Clients already connected keep their connection through the drain: their Waits get
  // results, their new Submits the "draining" refusal.
  lock.RemoveSocket();
  serving.local->Stop();
  if (sig == SIGTERM) {
    spdlog::info("SIGTERM: draining (SIGTERM or SIGINT again: stop at once)");
    Drain(*core, core->engine().limits().shutdown_grace, StopSignalPending);
  } else {
    spdlog::info("signal {}: stopping at once (SIGTERM drains)", sig);
    Drain(*core, absl::ZeroDuration(), nullptr);
  }
  // Calls still open (sessions, watches of ended transfers) get a moment to end.
  auto grace = std::chrono::system_clock::now() + std::chrono::seconds(2);
  serving.local_server->Shutdown(grace);
  serving.peer_server->Shutdown(grace);
  // Its connections close; transfers still running answer nobody.
  agent_service.set_transfer_socket(nullptr);
  serving.transfer_socket.reset();
  serving.metrics.reset();  // it reads the core
  discovery.reset();        // before the directory it feeds
  core.reset();
  serving.fd_inbox.reset();  // unlinks its socket while the instance lock is still ours
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
  Serving serving;
  absl::Status started = StartPeerApi(config, **core, peer_service, tensor_peer_service, serving);
  if (started.ok()) started = StartLocalApi(config, **core, agent_service, tensor_service, serving);
  if (started.ok()) {
    // After the hooks AgentCore::Create added (discovery deregistration runs before this).
    (*core)->drain_hooks().Add("readiness: gRPC health NOT_SERVING", [&serving] {
      for (grpc::Server* server : {serving.peer_server.get(), serving.local_server.get()}) {
        if (grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService()) {
          health->SetServingStatus(false);
        }
      }
    });
    (*lock)->NoteSocketBound();
    started = StartMetrics(config, **core, serving);
  }
  if (!started.ok()) {
    spdlog::error("cannot start: {}", std::string(started.message()));
    serving.ShutdownServers();
    return 1;
  }
  spdlog::info("ferryd {} ready: local unix:{}{}, peers on {} ({}), {} peer(s) configured",
               kFerryVersion, config.local_socket,
               config.local_tcp.empty() ? "" : absl::StrCat(" and ", config.local_tcp),
               config.peer_listen, (*core)->peers().credentials().Describe(),
               config.peers.size());

  // After the Peer API serves: a peer that finds us in etcd can reach us at once.
  std::unique_ptr<EtcdDiscovery> discovery = StartDiscovery(config, **core, serving.peer_port);
  const int sig = ServeUntilStopped(argc, argv, signals, **core, config);
  Stop(sig, *std::move(core), **lock, serving, std::move(discovery), agent_service);
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
