#pragma once
// The tcp provider: one-sided WRITE / READ over TCP for nodes without RDMA (and for tests).
// The target side validates key, bounds and access before touching memory, as an HCA does.
// Payloads go straight from the source region into the socket and from the socket straight
// into the destination region: one kernel copy per side, none in user space.

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/unique_fd.h"
#include "transport/fabric.h"
#include "transport/tcp/incoming_limits.h"
#include "transport/tcp/region_table.h"
#include "transport/tcp/wire.h"

namespace ferry::tcp {

struct TcpOptions {
  // Data listener, "host:port"; port 0 picks a free port (see address()).
  std::string listen_address = "127.0.0.1:0";
  // Connections per peer endpoint; large ops are striped across them.
  uint32_t connections = 4;
  // Ops of at least twice this size are split into parts of at least this size.
  uint64_t stripe_min_bytes = 1ull << 20;
  // Incoming connections at most, in total and from one IP address; more are closed at once.
  uint32_t max_connections = 1024;
  uint32_t max_connections_per_source = 64;
  // A new connection that has not sent its hello frame within this is closed.
  uint32_t handshake_timeout_ms = 5000;
};

// What the data listener has seen, for GetInfo and tests.
struct ListenerStats {
  uint64_t accepted = 0;       // connections admitted
  uint64_t refused = 0;        // closed at once: over a cap
  uint64_t accept_errors = 0;  // accept() failures waited out (EMFILE, ENOBUFS, ...)
  uint32_t open = 0;           // incoming connections now
};

class TcpFabric : public fabric::Fabric {
 public:
  static absl::StatusOr<std::unique_ptr<TcpFabric>> Create(const TcpOptions& options);
  // Stops serving (as StopServing) and joins the threads. Endpoints this fabric created
  // must be closed first; regions must be destroyed first.
  ~TcpFabric() override;
  void StopServing() override;
  ListenerStats listener_stats() const;

  std::string provider() const override { return "tcp"; }
  std::string address() const override { return address_; }
  absl::StatusOr<std::unique_ptr<fabric::MemoryRegion>> Register(void* data, uint64_t length,
                                                                 uint32_t access) override;
  // tcp needs no handshake bytes: the connection is the sockets Finish() opens.
  absl::StatusOr<std::unique_ptr<fabric::PendingConnection>> BeginConnect(
      const std::string& peer_address) override;
  absl::StatusOr<std::string> AcceptConnect(const std::string& request) override;
  void SetImmediateHandler(ImmediateHandler handler) override;

 private:
  TcpFabric(TcpOptions options, UniqueFd listener, std::string address);
  void AcceptLoop();
  // Waits `backoff` after a failed accept(), or less if the fabric stops meanwhile.
  void BackOff(absl::Duration backoff);
  void JoinFinishedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Serves one incoming connection until it closes: the target side of every op.
  void Serve(int fd);
  // Reads the hello frame within the handshake timeout; false: close the connection.
  bool AwaitHello(int fd);
  // Serves one request; write acks are appended to `acks` for Serve to send. Returns false
  // when the connection must close.
  bool ServeOne(int fd, std::vector<ResponseHeader>& acks);
  static constexpr size_t kMaxCoalescedAcks = 64;
  void Notify(uint32_t imm);

  struct Incoming {
    UniqueFd fd;
    std::string source;  // IP address, for the per-source cap
    std::thread thread;
    bool done = false;
  };

  const TcpOptions options_;
  const std::string address_;
  RegionTable regions_;
  UniqueFd listener_;
  IncomingLimits limits_;
  std::thread accept_thread_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  ListenerStats stats_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Incoming>> incoming_ ABSL_GUARDED_BY(mu_);
  ImmediateHandler immediate_handler_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry::tcp
