#include "transport/tcp/tcp_fabric.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "base/status_macros.h"
#include "spdlog/spdlog.h"
#include "transport/memory/peer_memory.h"
#include "transport/tcp/socket.h"
#include "transport/tcp/tcp_endpoint.h"
#include "transport/tcp/tcp_region.h"
#include "transport/tcp/wire.h"

namespace ferry::tcp {
namespace {

class TcpPendingConnection : public fabric::PendingConnection {
 public:
  TcpPendingConnection(std::string address, const TcpOptions& options, EventLoopPool* loops,
                       std::string source_host)
      : address_(std::move(address)),
        lanes_({options.connections, options.stripe_min_bytes, options.express_max_bytes}),
        loops_(loops),
        source_host_(std::move(source_host)),
        request_(EncodeSessionRequest(lanes_.sockets())) {}

  const std::string& request() const override { return request_; }
  absl::StatusOr<std::shared_ptr<fabric::Endpoint>> Finish(const std::string& reply) override {
    auto ticket = DecodeSessionReply(reply, address_);
    if (!ticket.ok()) return ticket.status();
    auto endpoint = TcpEndpoint::Connect(address_, *ticket, lanes_, loops_, source_host_);
    if (!endpoint.ok()) return endpoint.status();
    return std::shared_ptr<fabric::Endpoint>(std::move(*endpoint));
  }

 private:
  const std::string address_;
  const TcpLanes lanes_;
  EventLoopPool* const loops_;
  const std::string source_host_;
  const std::string request_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TcpFabric>> TcpFabric::Create(const TcpOptions& options) {
  // One socket of a session may be the express connection.
  if (options.connections == 0 || options.connections >= kMaxSocketsPerSession) {
    return absl::InvalidArgumentError(absl::StrCat("tcp: connections must be 1 to ",
                                                   kMaxSocketsPerSession - 1, ", not ",
                                                   options.connections));
  }
  uint16_t port = 0;
  auto listener = ListenTcp(options.listen_address, &port);
  if (!listener.ok()) return listener.status();
  auto hp = ParseHostPort(options.listen_address);
  std::string host = hp->host.empty() || hp->host == "0.0.0.0" ? "127.0.0.1" : hp->host;
  if (host.find(':') != std::string::npos) host = absl::StrCat("[", host, "]");
  std::string address = absl::StrCat(host, ":", port);
  std::string source_host = hp->host;
  auto outgoing = EventLoopPool::Create(options.event_loops, "ferry-tcp-out");
  if (!outgoing.ok()) return outgoing.status();
  auto incoming = EventLoopPool::Create(options.event_loops, "ferry-tcp-in");
  if (!incoming.ok()) return incoming.status();
  return std::unique_ptr<TcpFabric>(new TcpFabric(options, std::move(*listener), address,
                                                  std::move(source_host), std::move(*outgoing),
                                                  std::move(*incoming)));
}

TcpFabric::TcpFabric(TcpOptions options, UniqueFd listener, std::string address,
                     std::string source_host, std::unique_ptr<EventLoopPool> outgoing,
                     std::unique_ptr<EventLoopPool> incoming)
    : options_(std::move(options)),
      address_(std::move(address)),
      source_host_(std::move(source_host)),
      listener_(std::move(listener)),
      limits_(options_.max_connections, options_.max_connections_per_source),
      outgoing_(std::move(outgoing)),
      incoming_loops_(std::move(incoming)) {
  accept_thread_ = std::thread([this] { AcceptLoop(); });
}

void TcpFabric::StopServing() {
  std::vector<std::shared_ptr<IncomingConnection>> open;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    for (auto& [raw, conn] : incoming_) open.push_back(conn);
    // shutdown() wakes a thread blocked in accept().
    shutdown(listener_.get(), SHUT_RDWR);
  }
  CloseIncoming(std::move(open));
}

absl::Status TcpFabric::health() const {
  absl::MutexLock lock(&mu_);
  if (suspended_.empty()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("tcp ", address_, ": ", suspended_));
}

absl::Status TcpFabric::Suspend(const std::string& why) {
  std::vector<std::shared_ptr<IncomingConnection>> open;
  {
    absl::MutexLock lock(&mu_);
    suspended_ = why.empty() ? "suspended" : why;
    for (auto& [raw, conn] : incoming_) open.push_back(conn);
  }
  CloseIncoming(std::move(open));
  return absl::OkStatus();
}

void TcpFabric::Resume() {
  absl::MutexLock lock(&mu_);
  suspended_.clear();
}

fabric::Fabric::Served TcpFabric::served() const {
  return {served_.written.load(std::memory_order_relaxed),
          served_.read.load(std::memory_order_relaxed),
          served_.ops.load(std::memory_order_relaxed)};
}

void TcpFabric::CloseIncoming(std::vector<std::shared_ptr<IncomingConnection>> open) {
  // Each connection closes on its own loop, between two of its rounds of I/O.
  EventLoop* current = EventLoop::Current();
  bool can_wait = current == nullptr || !incoming_loops_->Contains(current);
  auto left = std::make_shared<absl::BlockingCounter>(static_cast<int>(open.size()));
  for (auto& conn : open) {
    if (!conn->loop()->Post([conn, left] {
          conn->Close();
          left->DecrementCount();
        })) {
      left->DecrementCount();
    }
  }
  if (can_wait) left->Wait();
}

TcpFabric::~TcpFabric() {
  StopServing();
  accept_thread_.join();
  // Loops run the tasks already posted before they stop; the incoming ones hold pins, so
  // they go first, then ours.
  incoming_loops_.reset();
  outgoing_.reset();
  absl::flat_hash_map<IncomingConnection*, std::shared_ptr<IncomingConnection>> left;
  {
    absl::MutexLock lock(&mu_);
    left.swap(incoming_);
  }
}

absl::StatusOr<std::unique_ptr<fabric::MemoryRegion>> TcpFabric::Register(void* data,
                                                                          uint64_t length,
                                                                          uint32_t access) {
  if (data == nullptr || length == 0) {
    return absl::InvalidArgumentError("tcp: cannot register an empty region");
  }
  char* memory = static_cast<char*>(data);
  std::shared_ptr<char> pages;
  if (access & fabric::kDeviceMemory) {
    // tcp moves bytes with the CPU (send/recv), and the CPU faults on a device address. It
    // reaches device memory only where a peer-memory client maps it, as an HCA does through
    // nvidia_peermem: the simulated GPUs'. Real GPU memory is never there, so it stages.
    pages = memory::PeerMemory().Find(data, length);
    if (pages == nullptr) {
      return absl::FailedPreconditionError(
          "tcp: cannot register GPU memory (it moves bytes with the CPU and no peer-memory "
          "client maps this range); staging instead");
    }
    memory = pages.get();
  }
  auto key = regions_.Add(static_cast<char*>(data), memory, length, access);
  if (!key.ok()) {
    return absl::Status(key.status().code(), absl::StrCat("tcp: registering ", length,
                                                          " bytes: ", key.status().message()));
  }
  return std::unique_ptr<fabric::MemoryRegion>(
      new TcpRegion(&regions_, data, memory, std::move(pages), length, *key));
}

absl::StatusOr<std::unique_ptr<fabric::PendingConnection>> TcpFabric::BeginConnect(
    const std::string& peer_address) {
  return std::unique_ptr<fabric::PendingConnection>(
      new TcpPendingConnection(peer_address, options_, outgoing_.get(),
                               options_.nic.empty() ? "" : source_host_));
}

absl::StatusOr<std::string> TcpFabric::AcceptConnect(const std::string& request,
                                                     const fabric::PeerInstance& from) {
  ASSIGN_OR_RETURN(uint32_t sockets, DecodeSessionRequest(request));
  RETURN_IF_ERROR(health());
  // A tcp incoming connection ends with its socket: nothing else outlives a gone peer, and
  // an unspent session expires by itself.
  ASSIGN_OR_RETURN(SessionTicket ticket, sessions_.Issue(from, sockets));
  return EncodeSessionReply(ticket);
}

void TcpFabric::SetImmediateHandler(ImmediateHandler handler) {
  absl::MutexLock lock(&mu_);
  immediate_handler_ = std::move(handler);
}

void TcpFabric::Notify(uint32_t imm) {
  ImmediateHandler handler;
  {
    absl::MutexLock lock(&mu_);
    handler = immediate_handler_;
  }
  if (handler) handler(imm);
}

namespace {

std::string SourceAddress(const sockaddr_storage& from) {
  char text[INET6_ADDRSTRLEN] = "?";
  if (from.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&from)->sin_addr, text, sizeof(text));
  } else if (from.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&from)->sin6_addr, text,
              sizeof(text));
  }
  return text;
}

}  // namespace

void TcpFabric::BackOff(absl::Duration backoff) {
  absl::MutexLock lock(&mu_);
  auto stopped = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_; };
  mu_.AwaitWithTimeout(absl::Condition(&stopped), backoff);
}

void TcpFabric::AcceptLoop() {
  constexpr absl::Duration kFirstBackoff = absl::Milliseconds(5);
  constexpr absl::Duration kMaxBackoff = absl::Seconds(1);
  absl::Duration backoff = kFirstBackoff;
  while (true) {
    sockaddr_storage from = {};
    socklen_t from_len = sizeof(from);
    int fd = accept4(listener_.get(), reinterpret_cast<sockaddr*>(&from), &from_len, SOCK_CLOEXEC);
    UniqueFd conn(fd);
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    if (!conn.valid()) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      {
        absl::MutexLock lock(&mu_);
        ++stats_.accept_errors;
      }
      // Out of fds (EMFILE, ENFILE) or kernel memory (ENOBUFS, ENOMEM): they come back as
      // connections close. The listener must outlive a bad moment: wait, and try again.
      if (backoff == kFirstBackoff || backoff == kMaxBackoff) {
        spdlog::warn("tcp: accept() on {} failed: {}; retrying in {}", address_, strerror(errno),
                     absl::FormatDuration(backoff));
      }
      BackOff(backoff);
      backoff = std::min(backoff * 2, kMaxBackoff);
      continue;
    }
    backoff = kFirstBackoff;
    std::string source = SourceAddress(from);
    if (!limits_.Admit(source)) {
      uint64_t refused;
      {
        absl::MutexLock lock(&mu_);
        refused = ++stats_.refused;
      }
      // Logged now and then, not for each one of a flood.
      if (refused % 1000 == 1) {
        spdlog::warn("tcp: refused a connection from {} to {}: {} open (caps {} in total, {} per "
                     "address); {} refused so far", source, address_, limits_.total(),
                     options_.max_connections, options_.max_connections_per_source, refused);
      }
      continue;  // `conn` closes
    }
    if (!Serve(std::move(conn), source)) return;
  }
}

bool TcpFabric::Serve(UniqueFd fd, const std::string& source) {
  // Acks are tiny and must not wait for Nagle (40 ms with delayed ACKs).
  int one = 1;
  setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  absl::Status nonblocking = SetNonBlocking(fd.get());
  if (!nonblocking.ok()) {
    spdlog::warn("tcp: dropping a connection from {}: {}", source, nonblocking.ToString());
    limits_.Release(source);
    return true;
  }
  IncomingConnection::Target target = {
      &regions_, [this](uint32_t imm) { Notify(imm); },
      [this](IncomingConnection* conn) { OnIncomingClosed(conn); }, &served_, &sessions_,
      &admission_,
      [this](IncomingConnection* conn, const std::string& node) {
        return limits_.Authenticate(conn->source(), node);
      }};
  auto conn = std::make_shared<IncomingConnection>(std::move(fd), source,
                                                   incoming_loops_->Next(), std::move(target));
  const absl::Duration handshake = absl::Milliseconds(options_.handshake_timeout_ms);
  absl::MutexLock lock(&mu_);
  // A suspended fabric serves nobody: the connection closes before its hello is read.
  if (!suspended_.empty()) {
    limits_.Release(source);
    ++stats_.refused;
    return true;
  }
  // Posted under mu_: StopServing's close of this connection is posted after its Start.
  if (stopping_ || !conn->loop()->Post([conn, handshake] { conn->Start(handshake); })) {
    limits_.Release(source);
    return false;
  }
  ++stats_.accepted;
  incoming_.emplace(conn.get(), conn);
  return true;
}

void TcpFabric::OnIncomingClosed(IncomingConnection* conn) {
  limits_.Release(conn->source(), conn->counted_node());
  absl::MutexLock lock(&mu_);
  incoming_.erase(conn);
}

ListenerStats TcpFabric::listener_stats() const {
  absl::MutexLock lock(&mu_);
  ListenerStats stats = stats_;
  stats.open = limits_.total();
  stats.unauthenticated = admission_.unauthenticated.load(std::memory_order_relaxed);
  stats.refused_key = admission_.refused_key.load(std::memory_order_relaxed);
  stats.refused_bounds = admission_.refused_bounds.load(std::memory_order_relaxed);
  stats.refused_access = admission_.refused_access.load(std::memory_order_relaxed);
  stats.refused_peer = admission_.refused_peer.load(std::memory_order_relaxed);
  stats.faulted = admission_.faulted.load(std::memory_order_relaxed);
  return stats;
}

}  // namespace ferry::tcp
