#include "transport/tcp/tcp_fabric.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "transport/tcp/socket.h"
#include "transport/tcp/tcp_endpoint.h"
#include "transport/tcp/wire.h"

namespace ferry::tcp {
namespace {

class TcpRegion : public fabric::MemoryRegion {
 public:
  TcpRegion(RegionTable* table, void* data, uint64_t length, uint32_t key)
      : table_(table), data_(data), length_(length), key_(key) {}
  ~TcpRegion() override { table_->Remove(key_); }

  void* data() const override { return data_; }
  uint64_t length() const override { return length_; }
  uint64_t remote_address() const override { return reinterpret_cast<uint64_t>(data_); }
  uint32_t key() const override { return key_; }
  std::string registration() const override { return "tcp"; }
  absl::Status RestrictToLocal() override {
    table_->SetAccess(key_, fabric::kLocal);
    return absl::OkStatus();
  }

 private:
  RegionTable* table_;
  void* data_;
  uint64_t length_;
  uint32_t key_;
};

class TcpPendingConnection : public fabric::PendingConnection {
 public:
  TcpPendingConnection(std::string address, uint32_t connections, uint64_t stripe_min_bytes)
      : address_(std::move(address)), connections_(connections), stripe_min_bytes_(stripe_min_bytes) {}

  const std::string& request() const override { return request_; }
  absl::StatusOr<std::shared_ptr<fabric::Endpoint>> Finish(const std::string& reply) override {
    auto endpoint = TcpEndpoint::Connect(address_, connections_, stripe_min_bytes_);
    if (!endpoint.ok()) return endpoint.status();
    return std::shared_ptr<fabric::Endpoint>(std::move(*endpoint));
  }

 private:
  const std::string address_;
  const uint32_t connections_;
  const uint64_t stripe_min_bytes_;
  const std::string request_;
};

uint32_t NeededAccess(WireOp op) {
  return op == WireOp::kRead ? fabric::kRemoteRead : fabric::kRemoteWrite;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpFabric>> TcpFabric::Create(const TcpOptions& options) {
  if (options.connections == 0) return absl::InvalidArgumentError("tcp: connections must be >= 1");
  uint16_t port = 0;
  auto listener = ListenTcp(options.listen_address, &port);
  if (!listener.ok()) return listener.status();
  auto hp = ParseHostPort(options.listen_address);
  std::string host = hp->host.empty() || hp->host == "0.0.0.0" ? "127.0.0.1" : hp->host;
  if (host.find(':') != std::string::npos) host = absl::StrCat("[", host, "]");
  std::string address = absl::StrCat(host, ":", port);
  return std::unique_ptr<TcpFabric>(new TcpFabric(options, std::move(*listener), address));
}

TcpFabric::TcpFabric(TcpOptions options, UniqueFd listener, std::string address)
    : options_(std::move(options)), address_(std::move(address)), listener_(std::move(listener)),
      limits_(options_.max_connections, options_.max_connections_per_source) {
  accept_thread_ = std::thread([this] { AcceptLoop(); });
}

void TcpFabric::StopServing() {
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  stopping_ = true;
  for (auto& in : incoming_) shutdown(in->fd.get(), SHUT_RDWR);
  // shutdown() wakes a thread blocked in accept().
  shutdown(listener_.get(), SHUT_RDWR);
}

TcpFabric::~TcpFabric() {
  StopServing();
  accept_thread_.join();
  std::vector<std::unique_ptr<Incoming>> incoming;
  {
    absl::MutexLock lock(&mu_);
    incoming.swap(incoming_);
  }
  for (auto& in : incoming) in->thread.join();
}

absl::StatusOr<std::unique_ptr<fabric::MemoryRegion>> TcpFabric::Register(void* data,
                                                                          uint64_t length,
                                                                          uint32_t access) {
  if (data == nullptr || length == 0) {
    return absl::InvalidArgumentError("tcp: cannot register an empty region");
  }
  uint32_t key = regions_.Add(static_cast<char*>(data), length, access);
  return std::unique_ptr<fabric::MemoryRegion>(new TcpRegion(&regions_, data, length, key));
}

absl::StatusOr<std::unique_ptr<fabric::PendingConnection>> TcpFabric::BeginConnect(
    const std::string& peer_address) {
  return std::unique_ptr<fabric::PendingConnection>(
      new TcpPendingConnection(peer_address, options_.connections, options_.stripe_min_bytes));
}

absl::StatusOr<std::string> TcpFabric::AcceptConnect(const std::string& request) {
  if (!request.empty()) return absl::InvalidArgumentError("tcp: unexpected handshake bytes");
  return std::string();
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
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&from)->sin6_addr, text, sizeof(text));
  }
  return text;
}

}  // namespace

void TcpFabric::JoinFinishedLocked() {
  // Reap connections whose peers left, so a long-lived agent does not collect threads.
  for (auto it = incoming_.begin(); it != incoming_.end();) {
    if ((*it)->done) {
      (*it)->thread.join();
      it = incoming_.erase(it);
    } else {
      ++it;
    }
  }
}

void TcpFabric::BackOff(absl::Duration backoff) {
  absl::MutexLock lock(&mu_);
  auto stopped = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_; };
  mu_.AwaitWithTimeout(absl::Condition(&stopped), backoff);
}

void TcpFabric::AcceptLoop() {
  constexpr absl::Duration kFirstBackoff = absl::Milliseconds(5);
  constexpr absl::Duration kMaxBackoff = absl::Seconds(1);
  absl::Duration backoff = kFirstBackoff;
  uint64_t refused = 0;  // connections over a cap, logged now and then, not each
  while (true) {
    sockaddr_storage from = {};
    socklen_t from_len = sizeof(from);
    int fd = accept4(listener_.get(), reinterpret_cast<sockaddr*>(&from), &from_len, SOCK_CLOEXEC);
    UniqueFd conn(fd);
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      JoinFinishedLocked();
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
      {
        absl::MutexLock lock(&mu_);
        ++stats_.refused;
      }
      if (refused++ % 1000 == 0) {
        spdlog::warn("tcp: refused a connection from {} to {}: {} open (caps {} in total, {} per "
                     "address); {} refused so far", source, address_, limits_.total(),
                     options_.max_connections, options_.max_connections_per_source, refused);
      }
      continue;  // `conn` closes
    }
    // Acks are tiny and must not wait for Nagle (40 ms with delayed ACKs).
    int one = 1;
    setsockopt(conn.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    auto in = std::make_unique<Incoming>();
    in->fd = std::move(conn);
    in->source = source;
    Incoming* raw = in.get();
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      limits_.Release(source);
      return;
    }
    ++stats_.accepted;
    in->thread = std::thread([this, raw] {
      if (AwaitHello(raw->fd.get())) Serve(raw->fd.get());
      shutdown(raw->fd.get(), SHUT_RDWR);
      limits_.Release(raw->source);
      absl::MutexLock lock(&mu_);
      raw->done = true;
    });
    incoming_.push_back(std::move(in));
  }
}

ListenerStats TcpFabric::listener_stats() const {
  absl::MutexLock lock(&mu_);
  ListenerStats stats = stats_;
  stats.open = limits_.total();
  return stats;
}

bool TcpFabric::AwaitHello(int fd) {
  timeval limit = {static_cast<time_t>(options_.handshake_timeout_ms / 1000),
                   static_cast<suseconds_t>(options_.handshake_timeout_ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  RequestHeader hello;
  absl::Status s = RecvAll(fd, &hello, sizeof(hello));
  timeval none = {0, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof(none));
  if (!s.ok()) {
    spdlog::debug("tcp: closing a connection that sent no hello within {} ms: {}",
                  options_.handshake_timeout_ms, s.ToString());
    return false;
  }
  if (hello.magic != kRequestMagic || hello.op != WireOp::kHello || hello.imm != kWireVersion) {
    spdlog::warn("tcp: closing a connection whose first frame is not a version {} hello",
                 kWireVersion);
    return false;
  }
  return true;
}

void TcpFabric::Serve(int fd) {
  // Acks of writes wait here while more requests are already readable, and leave in one
  // send: a KV batch of thousands of small writes then costs a fraction of the syscalls.
  std::vector<ResponseHeader> acks;
  acks.reserve(kMaxCoalescedAcks);
  while (true) {
    if (!acks.empty()) {
      char probe;
      bool more = recv(fd, &probe, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
      if (!more || acks.size() >= kMaxCoalescedAcks) {
        if (!SendAll(fd, acks.data(), acks.size() * sizeof(ResponseHeader)).ok()) return;
        acks.clear();
      }
    }
    if (!ServeOne(fd, acks)) return;
  }
}

bool TcpFabric::ServeOne(int fd, std::vector<ResponseHeader>& acks) {
  RequestHeader req;
  if (!RecvAll(fd, &req, sizeof(req)).ok()) return false;
  if (req.magic != kRequestMagic) {
    spdlog::warn("tcp: dropping a connection that sent a bad request header");
    return false;
  }
  ResponseHeader resp = {kResponseMagic, Refusal::kNone, req.id, 0};
  bool is_write = req.op == WireOp::kWrite || req.op == WireOp::kWriteImm;
  if (!is_write && req.op != WireOp::kRead) {
    resp.refusal = Refusal::kBadOp;
    // The payload length of an unknown op cannot be trusted: answer, then close.
    acks.push_back(resp);
    SendAll(fd, acks.data(), acks.size() * sizeof(ResponseHeader)).IgnoreError();
    return false;
  }
  std::optional<RegionTable::Access> access;
  resp.refusal = regions_.Acquire(req.key, req.address, req.length, NeededAccess(req.op), access);
  if (is_write) {
    // Refused writes still carry their payload on the stream: drain it, touch nothing.
    absl::Status s = access ? RecvAll(fd, access->data(), req.length) : Discard(fd, req.length);
    if (!s.ok()) return false;
    access.reset();
    if (req.op == WireOp::kWriteImm && resp.refusal == Refusal::kNone) Notify(req.imm);
    acks.push_back(resp);
    return true;
  }
  // A READ answer goes out at once, behind the acks that were waiting.
  if (access) resp.length = req.length;
  acks.push_back(resp);
  iovec iov[2] = {{acks.data(), acks.size() * sizeof(ResponseHeader)},
                  {access ? access->data() : nullptr, resp.length}};
  bool sent = SendAll(fd, iov, access ? 2 : 1).ok();
  acks.clear();
  return sent;
}

}  // namespace ferry::tcp
