#pragma once
// The target side of one accepted connection, driven by one of the fabric's incoming event
// loops: a hello with a live session secret within the handshake timeout (anything else and
// it closes without an answer), then request after request, each validated by the region
// table for the admitted peer before any memory is touched, answered in request order. A
// refused request is answered, and the connection then ends (see wire.h). A payload that
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
#include "transport/tcp/iov_cursor.h"
#include "transport/fabric.h"
#include "transport/tcp/region_table.h"
#include "transport/tcp/session_secrets.h"
#include "transport/tcp/wire.h"

namespace ferry::tcp {

// What peers moved through a fabric's incoming connections (Fabric::served()); shared by
// all of them, updated on their loop threads.
struct ServedCounters {
  std::atomic<uint64_t> written{0};
  std::atomic<uint64_t> read{0};
  std::atomic<uint64_t> ops{0};
};

// Why incoming connections were closed, for ListenerStats; shared like ServedCounters.
struct AdmissionCounters {
  std::atomic<uint64_t> unauthenticated{0};  // no hello, or no live session and secret in it
  // Requests refused (each ended its connection), by the reason only we know.
  std::atomic<uint64_t> refused_key{0};
  std::atomic<uint64_t> refused_bounds{0};
  std::atomic<uint64_t> refused_access{0};
  std::atomic<uint64_t> refused_peer{0};  // a region not exported to the connection's peer
  // Ops answered kFault (the region's memory went away); their connections went on.
  std::atomic<uint64_t> faulted{0};
  // Admitted hellos answered kBusy: their node had tcp_max_connections_per_peer already.
  std::atomic<uint64_t> busy{0};
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
    // Admits the hello's session.
    SessionSecrets* sessions;
    AdmissionCounters* admission;
    // The hello admitted the connection for peer node `node`: false when that node has no
    // room left (the connection is then answered kBusy and ends). Null: always room.
    std::function<bool(IncomingConnection*, const std::string& node)> authenticated;
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
  // The peer node its hello was admitted for, once it counts against that node's cap ("" until
  // then); loop thread, or after the connection closed.
  const std::string& counted_node() const { return counted_node_; }
  // Loop thread: whom the hello admitted the connection for (empty node before that).
  const fabric::PeerInstance& peer() const { return peer_; }
  EventLoop* loop() const { return loop_; }

  void OnEvents(uint32_t events) override;

 private:
  // kDiscard: a refusal went out; nothing more is read into memory or answered, only drained
  // until the peer closes (or a timer does), so that the kernel does not reset the connection
  // before the refusal reached the peer.
  // kTable: a kWriteList's frame table is coming (wire.h).
  // kSkip: a WRITE's target memory went away (kFault): the rest of its payload is drained,
  // then answered kFault, and the connection goes on.
  enum class Phase { kHello, kHeader, kTable, kPayload, kSkip, kDiscard, kClosed };

  // Reads requests until the socket is empty, an answer must go out first, or this round's
  // share is spent.
  void ReadRequests();
  // A whole header is in: hello check, or validation and the start of the request.
  void OnHeader();
  void OnRequest();
  // A kWriteList's frame table is in: checked, then its pieces are received in place.
  void OnTable();
  // Counts and logs a request the region table refused, answers it and ends the connection.
  void RefuseChecked(RegionCheck check, const RequestHeader& req);
  // Starts receiving an accepted WRITE's payload into write_into_, which lies in `access`
  // (pinned until it is in).
  void StartWrite(const RequestHeader& req, RegionTable::Access access);
  // Admits the connection to the hello's session, or closes it without an answer.
  void OnHello();
  // Answers `resp` (a refusal) after the waiting acks, then ends the connection.
  void RefuseAndEnd(const ResponseHeader& resp);
  // The refusal is out: stop sending, drain until the peer leaves.
  void StartDiscard();
  // The WRITE payload is in (or drained): unpin, notify, queue the ack.
  void FinishWrite();
  // The region's memory went away under `req` (`what`: "READ" or "WRITE"): counted, logged
  // now and then, answered kFault; a WRITE's payload (req.length bytes to come) is drained
  // first. The connection goes on (wire.h).
  void AnswerFault(const RequestHeader& req, const char* what);
  // recvmsg of the WRITE payload failed EFAULT: the region is marked faulted, the rest drained.
  void StartSkip();
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
  fabric::PeerInstance peer_;
  std::string counted_node_;
  uint32_t interest_ = 0;
  Phase phase_ = Phase::kHello;

  RequestHeader header_ = {};
  size_t header_have_ = 0;

  // The WRITE payload being received into the pinned region: where its bytes land (one
  // piece, or a kWriteList's pieces), consumed as recvmsg fills them.
  ResponseHeader write_answer_ = {};
  std::optional<RegionTable::Access> write_pin_;
  IovCursor write_into_;
  uint64_t write_left_ = 0;
  uint32_t write_imm_ = 0;
  bool write_notify_ = false;
  std::vector<char> sink_;  // kDiscard, kSkip: the bytes drained
  // A READ answer from memory that may go away, copied under a FaultGuard (kMayShrink).
  std::vector<char> read_copy_;
  // A kWriteList's frame table, being received, then checked.
  std::vector<WirePiece> table_;
  size_t table_have_ = 0;  // bytes of table_ received

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
  // A refusal is in the output: the connection ends once it is out.
  bool end_after_output_ = false;
};

}  // namespace ferry::tcp
