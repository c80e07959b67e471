#pragma once
// The initiator side of the tcp provider: several connections to one peer, ops striped
// across them. The connections are spread over the fabric's outgoing event loops, which send
// (headers + payload from the region) and receive (acks, and READ payloads straight into the
// region) for every endpoint of the fabric: no thread per endpoint or connection.

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

class TcpEndpoint : public fabric::Endpoint {
 public:
  // Connects (blocking: connect, and a hello that presents `ticket`, the session the peer's
  // AcceptConnect issued for `connections` sockets) and hands the sockets to `loops`, which
  // must outlive the endpoint's Close.
  static absl::StatusOr<std::unique_ptr<TcpEndpoint>> Connect(const std::string& address,
                                                              const SessionTicket& ticket,
                                                              uint32_t connections,
                                                              uint64_t stripe_min_bytes,
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
  // longer than kMaxWirePieces goes piece by piece (Endpoint's default).
  absl::Status PostWriteList(const fabric::MemoryRegion* region, const fabric::RemoteSlice& base,
                             std::span<const fabric::Piece> pieces,
                             fabric::Completion done) override;
  bool broken() const override;
  void Close() override;

 private:
  TcpEndpoint(std::string address, std::vector<std::shared_ptr<TcpConnection>> connections,
              uint64_t stripe_min_bytes);
  absl::Status Post(uint32_t op, const fabric::LocalSlice& local, const fabric::RemoteSlice& remote,
                    uint32_t imm, fabric::Completion done);
  // The tcp registration behind `region`, or why an op on it is refused now.
  absl::StatusOr<const TcpRegion*> Usable(const fabric::MemoryRegion* region) const;

  const std::string address_;
  const std::vector<std::shared_ptr<TcpConnection>> connections_;
  const uint64_t stripe_min_bytes_;
  std::atomic<uint32_t> next_connection_{0};
};

}  // namespace ferry::tcp
