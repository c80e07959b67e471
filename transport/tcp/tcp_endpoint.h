#pragma once
// The initiator side of the tcp provider: several connections to one peer, large ops striped
// across the bulk ones, small ops on an express one of their own. The connections are spread
// over the fabric's outgoing event loops, which send (headers + payload from the region) and
// receive (acks, and READ payloads straight into the region) for every endpoint of the
// fabric: no thread per endpoint or connection.

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "transport/fabric.h"
#include "transport/tcp/session_secrets.h"

namespace ferry::tcp {

class EventLoopPool;
class TcpConnection;
class TcpRegion;

// How an endpoint spreads its ops over its sockets (TcpOptions).
struct TcpLanes {
  uint32_t connections = 4;  // bulk: ops of 2 x stripe_min_bytes or more are striped over them
  uint64_t stripe_min_bytes = 1 << 20;
  uint64_t express_max_bytes = 0;  // ops up to this size take the express socket; 0: none
  uint32_t sockets() const { return connections + (express_max_bytes > 0 ? 1 : 0); }
};

class TcpEndpoint : public fabric::Endpoint {
 public:
  // Connects (blocking: connect, and a hello that presents `ticket`, the session the peer's
  // AcceptConnect issued for lanes.sockets() sockets) and hands the sockets to `loops`, which
  // must outlive the endpoint's Close.
  static absl::StatusOr<std::unique_ptr<TcpEndpoint>> Connect(const std::string& address,
                                                              const SessionTicket& ticket,
                                                              const TcpLanes& lanes,
                                                              EventLoopPool* loops,
                                                              const std::string& source_host = "");
  ~TcpEndpoint() override;

  absl::Status PostWrite(const fabric::LocalSlice& src, const fabric::RemoteSlice& dst,
                         fabric::Completion done) override;
  absl::Status PostWriteWithImmediate(const fabric::LocalSlice& src,
                                      const fabric::RemoteSlice& dst, uint32_t imm,
                                      fabric::Completion done) override;
  absl::Status PostRead(const fabric::LocalSlice& dst, const fabric::RemoteSlice& src,
                        fabric::Completion done) override;
  // One kWriteList request on one connection (wire.h): one frame table, one ack. A list
  // longer than kMaxWirePieces goes piece by piece (Endpoint's default). A list of at most
  // express_max_bytes in all is a small op: it takes the express socket.
  absl::Status PostWriteList(const fabric::MemoryRegion* region, const fabric::RemoteSlice& base,
                             std::span<const fabric::Piece> pieces,
                             fabric::Completion done) override;
  bool broken() const override;
  void Close() override;
  // By socket, the bulk ones then the express one (tests).
  struct SocketCounts {
    uint64_t load_bytes;  // payload bytes queued or unanswered
    uint64_t ops_queued;  // requests ever queued
  };
  std::vector<SocketCounts> socket_counts() const;

 private:
  TcpEndpoint(std::string address, std::vector<std::shared_ptr<TcpConnection>> connections,
              const TcpLanes& lanes);
  // The express socket for an op of `length` bytes up to express_max_bytes while it holds
  // less than kExpressSpillBytes, else the next bulk one in turn.
  TcpConnection& ConnectionFor(uint64_t length);
  absl::Status Post(uint32_t op, const fabric::LocalSlice& local, const fabric::RemoteSlice& remote,
                    uint32_t imm, fabric::Completion done);
  // The tcp registration behind `region`, or why an op on it is refused now.
  absl::StatusOr<const TcpRegion*> Usable(const fabric::MemoryRegion* region) const;

  const std::string address_;
  // Every socket: the bulk ones, then the express one when lanes_ has it.
  const std::vector<std::shared_ptr<TcpConnection>> connections_;
  const TcpLanes lanes_;
  std::atomic<uint32_t> next_connection_{0};
};

}  // namespace ferry::tcp
