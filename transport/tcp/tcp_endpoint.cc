#include "transport/tcp/tcp_endpoint.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "transport/parts_completion.h"
#include "transport/tcp/event_loop.h"
#include "transport/tcp/socket.h"
#include "transport/tcp/tcp_connection.h"
#include "transport/tcp/tcp_region.h"

namespace ferry::tcp {
namespace {

using fabric::PartsCompletion;

constexpr uint64_t kStripeAlign = 4096;
// A small op waits on the express socket for at most this much ahead of it (a fraction of a
// millisecond); past it, a burst of small ops spills onto the bulk sockets, which then carry
// it faster than one socket would.
constexpr uint64_t kExpressSpillBytes = 512 << 10;

}  // namespace

absl::StatusOr<std::unique_ptr<TcpEndpoint>> TcpEndpoint::Connect(const std::string& address,
                                                                  const SessionTicket& ticket,
                                                                  const TcpLanes& lanes,
                                                                  EventLoopPool* loops,
                                                                  const std::string& source_host) {
  std::vector<std::shared_ptr<TcpConnection>> conns;
  // Connections made before a failure are closed: the caller sees the error, not an endpoint.
  auto close_made = [&conns, &address](const absl::Status& why) {
    for (auto& c : conns) {
      c->Close(absl::UnavailableError(absl::StrCat("tcp: connecting to ", address, ": ",
                                                   why.message())));
    }
    return why;
  };
  for (uint32_t i = 0; i < lanes.sockets(); ++i) {
    auto fd = ConnectTcp(address, source_host);
    if (!fd.ok()) return close_made(fd.status());
    const RequestHeader hello = MakeHello(ticket);
    absl::Status said = SendAll(fd->get(), &hello, sizeof(hello));
    if (!said.ok()) return close_made(said);
    // Consecutive loops: one endpoint's stripes move on several threads at once.
    auto conn = TcpConnection::Start(std::move(*fd), address, loops->Next());
    if (!conn.ok()) return close_made(conn.status());
    conns.push_back(std::move(*conn));
  }
  return std::unique_ptr<TcpEndpoint>(new TcpEndpoint(address, std::move(conns), lanes));
}

TcpEndpoint::TcpEndpoint(std::string address,
                         std::vector<std::shared_ptr<TcpConnection>> connections,
                         const TcpLanes& lanes)
    : address_(std::move(address)), connections_(std::move(connections)), lanes_(lanes) {}

TcpConnection& TcpEndpoint::ConnectionFor(uint64_t length) {
  if (length <= lanes_.express_max_bytes &&
      connections_.back()->load_bytes() < kExpressSpillBytes) {
    return *connections_.back();
  }
  return *connections_[next_connection_.fetch_add(1, std::memory_order_relaxed) %
                       lanes_.connections];
}

TcpEndpoint::~TcpEndpoint() { Close(); }

bool TcpEndpoint::broken() const {
  return std::any_of(connections_.begin(), connections_.end(),
                     [](const auto& c) { return c->failed(); });
}

std::vector<TcpEndpoint::SocketCounts> TcpEndpoint::socket_counts() const {
  std::vector<SocketCounts> counts;
  for (const auto& c : connections_) counts.push_back({c->load_bytes(), c->ops_queued()});
  return counts;
}

void TcpEndpoint::Close() {
  const absl::Status why =
      absl::UnavailableError(absl::StrCat("tcp: endpoint to ", address_, " closed"));
  for (auto& c : connections_) c->Close(why);
}

absl::Status TcpEndpoint::PostWrite(const fabric::LocalSlice& src, const fabric::RemoteSlice& dst,
                                    fabric::Completion done) {
  return Post(static_cast<uint32_t>(WireOp::kWrite), src, dst, 0, std::move(done));
}

absl::Status TcpEndpoint::PostWriteWithImmediate(const fabric::LocalSlice& src,
                                                 const fabric::RemoteSlice& dst, uint32_t imm,
                                                 fabric::Completion done) {
  return Post(static_cast<uint32_t>(WireOp::kWriteImm), src, dst, imm, std::move(done));
}

absl::Status TcpEndpoint::PostRead(const fabric::LocalSlice& dst, const fabric::RemoteSlice& src,
                                   fabric::Completion done) {
  return Post(static_cast<uint32_t>(WireOp::kRead), dst, src, 0, std::move(done));
}

absl::StatusOr<const TcpRegion*> TcpEndpoint::Usable(const fabric::MemoryRegion* region) const {
  if (broken()) {
    // Named by the first connection's cause: "is broken" alone hid a refusal the peer gave.
    std::string why;
    for (const auto& c : connections_) {
      if (absl::Status f = c->failure(); !f.ok()) {
        why = absl::StrCat(" (", f.message(), ")");
        break;
      }
    }
    return absl::UnavailableError(absl::StrCat("tcp: endpoint to ", address_, " is broken", why));
  }
  // The bytes move through the region's CPU mapping, never its (possibly device) address.
  const auto* tcp = dynamic_cast<const TcpRegion*>(region);
  if (tcp == nullptr) {
    return absl::InvalidArgumentError("tcp: the local slice's region is not a tcp registration");
  }
  return tcp;
}

absl::Status TcpEndpoint::PostWriteList(const fabric::MemoryRegion* region,
                                        const fabric::RemoteSlice& base,
                                        std::span<const fabric::Piece> pieces,
                                        fabric::Completion done) {
  if (pieces.size() > kMaxWirePieces) {
    return fabric::Endpoint::PostWriteList(region, base, pieces, std::move(done));
  }
  RETURN_IF_ERROR(CheckPieces("tcp", region, pieces));
  ASSIGN_OR_RETURN(const TcpRegion* tcp, Usable(region));
  auto list = std::make_unique<TcpConnection::PieceList>();
  list->table.reserve(pieces.size());
  list->from.reserve(pieces.size());
  uint64_t total = 0;
  for (const fabric::Piece& p : pieces) {
    list->table.push_back({p.remote_offset, p.length});
    list->from.push_back(tcp->memory() + p.local_offset);
    total += p.length;  // each piece lies in the region: no overflow
  }
  TcpConnection::Request request;
  request.header = {kRequestMagic, WireOp::kWriteList,         0, base.address, total,
                    base.key,      static_cast<uint32_t>(pieces.size())};
  request.local = nullptr;
  request.done = std::move(done);
  request.pieces = std::move(list);
  return ConnectionFor(total).Enqueue(std::move(request));
}

absl::Status TcpEndpoint::Post(uint32_t op_code, const fabric::LocalSlice& local,
                               const fabric::RemoteSlice& remote, uint32_t imm,
                               fabric::Completion done) {
  if (local.region == nullptr || local.length == 0 ||
      local.offset > local.region->length() ||
      local.length > local.region->length() - local.offset) {
    return absl::OutOfRangeError(absl::StrCat("tcp: local slice [", local.offset, ", +",
                                              local.length, ") is outside its region"));
  }
  ASSIGN_OR_RETURN(const TcpRegion* region, Usable(local.region));
  auto op = static_cast<WireOp>(op_code);
  char* base = region->memory() + local.offset;

  // Large ops are striped over the bulk connections, in parts aligned to 4 KiB. An immediate
  // must arrive after all the data, so WRITE-with-immediate is never split.
  const uint64_t stripe_min = std::max<uint64_t>(lanes_.stripe_min_bytes, kStripeAlign);
  uint64_t parts = 1;
  if (op != WireOp::kWriteImm && lanes_.connections > 1 && local.length >= 2 * stripe_min) {
    parts = std::min<uint64_t>(lanes_.connections, local.length / stripe_min);
  }
  uint64_t part_len = (local.length / parts + kStripeAlign - 1) / kStripeAlign * kStripeAlign;
  auto joined = parts > 1
                    ? std::make_shared<PartsCompletion>(static_cast<int>(parts), std::move(done))
                    : nullptr;
  const uint32_t first =
      parts > 1 ? next_connection_.fetch_add(static_cast<uint32_t>(parts)) : 0;
  for (uint64_t i = 0; i < parts; ++i) {
    uint64_t offset = i * part_len;
    uint64_t length = std::min(part_len, local.length - std::min(offset, local.length));
    TcpConnection::Request request;
    request.header = {kRequestMagic, op, 0, remote.address + offset, length, remote.key, imm};
    request.local = base + offset;
    if (joined) {
      request.done = [joined](absl::Status s) { joined->PartDone(std::move(s)); };
    } else {
      request.done = std::move(done);
    }
    TcpConnection& conn =
        parts > 1 ? *connections_[(first + i) % lanes_.connections] : ConnectionFor(length);
    if (length == 0) {
      joined->PartDone(absl::OkStatus());
      continue;
    }
    absl::Status s = conn.Enqueue(std::move(request));
    if (!s.ok()) {
      // Nothing accepted yet: refuse the op now; its completion never runs.
      if (i == 0) return s;
      // Earlier parts are in flight: the op fails through their joined completion.
      joined->PartDone(s);
    }
  }
  return absl::OkStatus();
}

}  // namespace ferry::tcp
