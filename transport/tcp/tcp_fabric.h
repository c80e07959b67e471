#pragma once
// The tcp provider: one-sided WRITE / READ over TCP for nodes without RDMA (and for tests).
// The target side admits only sockets that present a session secret AcceptConnect issued
// (session_secrets.h), and validates key, bounds, access and the region's peer scope before
// touching memory, as an HCA does (the scope is more than an HCA can check).
// Payloads go straight from the source region into the socket and from the socket straight
// into the destination region: one kernel copy per side, none in user space.
//
// Threads: a few epoll loops for our endpoints' connections (they run every completion), a
// few for accepted connections (they hold region pins while payloads move), and the accept
// thread. Neither set grows with peers or connections. The two sets are apart so that a
// completion that destroys a region (which waits for remote accesses inside it) never waits
// for its own thread.

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/unique_fd.h"
#include "transport/fabric.h"
#include "transport/tcp/event_loop.h"
#include "transport/tcp/incoming_connection.h"
#include "transport/tcp/incoming_limits.h"
#include "transport/tcp/region_table.h"
#include "transport/tcp/session_secrets.h"
#include "transport/tcp/wire.h"

namespace ferry::tcp {

struct TcpOptions {
  // Data listener, "host:port"; port 0 picks a free port (see address()).
  std::string listen_address = "127.0.0.1:0";
  // Bulk connections per peer endpoint; large ops are striped across them.
  uint32_t connections = 4;
  // Ops of at most this many bytes leave on one more connection of the endpoint, the express
  // one, which carries nothing larger: a small op then never waits behind megabytes of bulk
  // slices in a socket's queue. A burst of them spills onto the bulk connections once the
  // express one holds 512 KiB (tcp_endpoint.cc). 0: no express connection.
  uint64_t express_max_bytes = 64 << 10;
  // Ops of at least twice this size are split into parts of at least this size.
  uint64_t stripe_min_bytes = 1ull << 20;
  // Incoming connections at most, in total and from one IP address; more are closed at once.
  uint32_t max_connections = 1024;
  uint32_t max_connections_per_source = 64;
  // A new connection that has not sent its hello frame within this is closed.
  uint32_t handshake_timeout_ms = 5000;
  // The NIC this fabric is the rail of ("mlx5_0", config `tcp.rails`): it names rail(),
  // and outgoing connections leave from the listen address's host (that NIC's address).
  // "" for the one tcp fabric of a node without rails.
  std::string nic;
  // Event loops (threads) for outgoing connections, and as many again for incoming ones;
  // 0: one per core, at most four.
  uint32_t event_loops = 0;
};

// What the data listener has seen, for GetInfo and tests.
struct ListenerStats {
  uint64_t accepted = 0;       // connections admitted
  uint64_t refused = 0;        // closed at once: over a cap
  // Closed without an answer: no hello in time, or one without a live session and secret.
  uint64_t unauthenticated = 0;
  // Requests refused (each ends its connection; peers are told only "refused"), by reason.
  uint64_t refused_key = 0;     // unknown or revoked key
  uint64_t refused_bounds = 0;  // range outside the region
  uint64_t refused_access = 0;  // access the region does not give
  uint64_t refused_peer = 0;    // a region not exported to the connection's peer
  uint64_t faulted = 0;  // ops answered kFault (memory gone); their connections went on
  uint64_t accept_errors = 0;  // accept() failures waited out (EMFILE, ENOBUFS, ...)
  uint32_t open = 0;           // incoming connections now
};

class TcpFabric : public fabric::Fabric {
 public:
  static absl::StatusOr<std::unique_ptr<TcpFabric>> Create(const TcpOptions& options);
  // Stops serving (as StopServing) and joins the threads. Endpoints this fabric created
  // must be closed first; regions must be destroyed first.
  ~TcpFabric() override;
  // Returns once the incoming connections are closed (their pins released), except when
  // called on one of their loops (an immediate handler), which cannot wait for itself.
  void StopServing() override;
  ListenerStats listener_stats() const;
  // Loop threads per direction (TcpOptions::event_loops, resolved).
  uint32_t event_loops() const { return static_cast<uint32_t>(outgoing_->size()); }

  std::string provider() const override { return "tcp"; }
  fabric::RailId rail() const override { return {"tcp", options_.nic}; }
  absl::Status health() const override;
  Served served() const override;
  // Closes the incoming connections and refuses new ones (closed before their hello) and
  // every AcceptConnect until Resume.
  absl::Status Suspend(const std::string& why) override;
  void Resume() override;
  std::string address() const override { return address_; }
  absl::StatusOr<std::unique_ptr<fabric::MemoryRegion>> Register(void* data, uint64_t length,
                                                                 uint32_t access) override;
  // The request asks for a session of TcpOptions::connections sockets; Finish() parses the
  // reply's session secret and presents it in the hello of every socket it opens.
  absl::StatusOr<std::unique_ptr<fabric::PendingConnection>> BeginConnect(
      const std::string& peer_address) override;
  // Issues a session (session_secrets.h) for `from`: its secret admits the sockets asked
  // for, as `from.node`, within kSessionLifetime. A newer incarnation of a node revokes
  // the unspent sessions of the older ones.
  absl::StatusOr<std::string> AcceptConnect(const std::string& request,
                                            const fabric::PeerInstance& from) override;
  // Unspent sessions (tests).
  size_t open_sessions() const { return sessions_.size(); }
  void SetImmediateHandler(ImmediateHandler handler) override;

 private:
  TcpFabric(TcpOptions options, UniqueFd listener, std::string address, std::string source_host,
            std::unique_ptr<EventLoopPool> outgoing, std::unique_ptr<EventLoopPool> incoming);
  // Closes `open` on their loops; waits for them unless called on one of those loops.
  void CloseIncoming(std::vector<std::shared_ptr<IncomingConnection>> open);
  void AcceptLoop();
  // Waits `backoff` after a failed accept(), or less if the fabric stops meanwhile.
  void BackOff(absl::Duration backoff);
  // Hands an admitted connection to an incoming loop; false when the fabric is stopping.
  bool Serve(UniqueFd fd, const std::string& source);
  // An incoming connection closed (on its loop): its slot and its entry go.
  void OnIncomingClosed(IncomingConnection* conn);
  void Notify(uint32_t imm);

  const TcpOptions options_;
  const std::string address_;
  const std::string source_host_;  // the listen host: where a rail's connections leave from
  RegionTable regions_;
  SessionSecrets sessions_;
  ServedCounters served_;
  AdmissionCounters admission_;
  UniqueFd listener_;
  IncomingLimits limits_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::string suspended_ ABSL_GUARDED_BY(mu_);  // why, while suspended
  ListenerStats stats_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<IncomingConnection*, std::shared_ptr<IncomingConnection>> incoming_
      ABSL_GUARDED_BY(mu_);
  ImmediateHandler immediate_handler_ ABSL_GUARDED_BY(mu_);

  // After everything they use: the destructor stops them first, explicitly.
  std::unique_ptr<EventLoopPool> outgoing_;        // our endpoints' connections
  std::unique_ptr<EventLoopPool> incoming_loops_;  // accepted connections
  std::thread accept_thread_;
};

}  // namespace ferry::tcp
