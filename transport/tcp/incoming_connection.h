#pragma once
// The target side of one accepted connection, driven by one of the fabric's incoming event
// loops: hello within the handshake timeout, then request after request, each validated by
// the region table before any memory is touched, answered in request order. A payload that
// spans several wakeups keeps its region pinned across them. All state lives on the loop
// thread; other threads only ask it to close.

#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "base/unique_fd.h"
#include "transport/tcp/event_loop.h"
#include "transport/tcp/region_table.h"
#include "transport/tcp/wire.h"

namespace ferry::tcp {

// What peers moved through a fabric's incoming connections (Fabric::served()); shared by
// all of them, updated on their loop threads.
struct ServedCounters {
  std::atomic<uint64_t> written{0};
  std::atomic<uint64_t> read{0};
  std::atomic<uint64_t> ops{0};
};

class IncomingConnection : public EventLoop::Handler,
                           public std::enable_shared_from_this<IncomingConnection> {
 public:
  // What the connection needs from its fabric; everything outlives the connection.
  struct Target {
    RegionTable* regions;
    // A WRITE-with-immediate landed; runs on the loop thread.
    std::function<void(uint32_t imm)> notify;
    // The connection closed (socket gone, pins released); runs once, on the loop thread.
    std::function<void(IncomingConnection*)> closed;
    // Accepted WRITEs and READs are counted here.
    ServedCounters* served;
  };

  // `fd` is accepted and non-blocking; nothing happens until Start runs on `loop`.
  IncomingConnection(UniqueFd fd, std::string source, EventLoop* loop, Target target);

  // Loop thread: watches the socket and closes it unless a hello arrives within `handshake`.
  void Start(absl::Duration handshake);
  // Any thread: closes the connection soon, on its loop thread.
  void CloseSoon();
  // Loop thread: closes now. Idempotent.
  void Close();

  const std::string& source() const { return source_; }
  EventLoop* loop() const { return loop_; }

  void OnEvents(uint32_t events) override;

 private:
  enum class Phase { kHello, kHeader, kPayload, kClosed };

  // Reads requests until the socket is empty, an answer must go out first, or this round's
  // share is spent.
  void ReadRequests();
  // A whole header is in: hello check, or validation and the start of the request.
  void OnHeader();
  void OnRequest();
  // The WRITE payload is in (or drained): unpin, notify, queue the ack.
  void FinishWrite();
  // Moves the coalesced acks (and a READ answer with its payload) to the output.
  void QueueOutput(char* payload, uint64_t length, std::optional<RegionTable::Access> pin);
  // Sends output until it is gone, the socket is full, or this round's share is spent.
  void Flush();
  bool output_pending() const { return out_sent_ < out_total_; }
  void UpdateInterest();

  UniqueFd fd_;
  const std::string source_;
  EventLoop* const loop_;
  const Target target_;
  std::optional<uint64_t> token_;
  uint32_t interest_ = 0;
  Phase phase_ = Phase::kHello;

  RequestHeader header_ = {};
  size_t header_have_ = 0;

  // The WRITE payload being received: into the pinned region, or (refused) into sink_.
  ResponseHeader write_answer_ = {};
  std::optional<RegionTable::Access> write_pin_;
  char* write_into_ = nullptr;
  uint64_t write_left_ = 0;
  uint32_t write_imm_ = 0;
  bool write_notify_ = false;
  std::vector<char> sink_;

  // Acks of writes wait here while more requests are readable and leave in one send: a KV
  // batch of thousands of small writes then costs a fraction of the syscalls.
  static constexpr size_t kMaxCoalescedAcks = 64;
  std::vector<ResponseHeader> acks_;

  // Output being sent: headers, then a READ payload straight from its pinned region. No
  // request is read while it is pending, so answers keep request order.
  std::vector<ResponseHeader> out_headers_;
  char* out_payload_ = nullptr;
  std::optional<RegionTable::Access> out_pin_;
  uint64_t out_sent_ = 0;
  uint64_t out_total_ = 0;
  bool close_after_output_ = false;  // an unknown op: its payload length cannot be trusted
};

}  // namespace ferry::tcp
