#pragma once
// The transfer socket: Agent.TransferStream's messages over a Unix socket the agent serves
// itself, beside the local API's ("<path>.transfers", same mode and group; GetInfo.
// transfer_socket names it), for local clients' small transfers. Over gRPC a one-op
// transfer costs the agent hand-offs among gRPC's own threads (docs/benchmarks.md, "Where a
// one-op Transfer loses its time"); here one thread reads every connection and starts each
// request itself, the provider sends from that thread, and the thread that settles the
// transfer writes the answer: the agent wakes for the request and for the peer's answer, no more.
//
// The wire (base/frame.h), after the client's 8 bytes of hello ("ferryxf1" or "ferryxf2"):
// frames of a 4-byte little-endian length and that many bytes of a SocketRequest
// (transfer_socket.proto: a StreamedTransfer, a block move in a session, or a notification
// poll), at most kMaxFrameBytes; the agent answers in frames of SocketAnswers (StreamedResults
// to a client that only transfers), as TransferStream does (the client's tags echoed, in the
// order the transfers end, a refusal as a result with its code and message; a poll is
// answered as soon as it is read, on the socket's thread: it only takes from the board). A client
// that ends its writing (shutdown(SHUT_WR)) is answered every request it sent, and then the agent
// closes the connection; one that closes it gets no more answers, and what it sent that had not
// started is dropped. A wrong hello, a frame too long or bytes that are not a SocketRequest are
// answered with one result of tag 0, INVALID_ARGUMENT and a message saying which, and the
// connection closes. Who the caller is comes from the kernel (SO_PEERCRED), as on the local socket.
//
// A client that says the second hello, "ferryxf2" (kTransferSocketHelloAcked: libferry's),
// is answered "ferryok1" before anything else, so that it knows at connect time that it may
// use the connection.
//
// Limits: kMaxConnections at once, and kMaxConnectionsPerUid of one uid (so that one local
// user cannot take the socket from the others); the next is answered with one refusal of
// tag 0, RESOURCE_EXHAUSTED saying which limit, and closed (libferry then uses its gRPC
// calls); per connection kStreamWindow requests running or unanswered, and no reading
// while kMaxUnsentBytes of answers wait for the client to read them. A request that may
// block (it would ask a peer something) or has more than kInlineOps ops (a move: pairs)
// starts on `starters`, and its connection's next one waits for it, so a connection's
// requests start in the order sent. The thread reads each connection in turn, kRoundFrames
// requests of it at a time, and takes at most 256 KiB ahead of the requests it started
// (more only for the one large request being read).

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "base/unique_fd.h"
#include "base/worker_pool.h"
#include "server/local/local_callers.h"
#include "server/api/transfer_calls.h"

namespace ferry::server {

// Where the transfer socket of the local socket `local_socket` is: beside it.
inline std::string TransferSocketPath(const std::string& local_socket) {
  return local_socket + ".transfers";
}

class TransferSocket {
 public:
  static constexpr size_t kMaxConnections = 256;
  // Half the socket: one uid (root too) leaves the other half to the rest.
  static constexpr size_t kMaxConnectionsPerUid = kMaxConnections / 2;
  static constexpr size_t kMaxUnsentBytes = 4 << 20;
  // Requests read and not yet started that one uid's connections hold, together: past it
  // the connection that needs more is refused (RESOURCE_EXHAUSTED naming the use) and closed.
  static constexpr size_t kMaxBufferedBytesPerUid = 256 << 20;
  static constexpr size_t kRoundFrames = 16;
  // Requests of more ops start on a starter: planning a KV batch of thousands of ops takes
  // the thread a millisecond, which other connections' one-op transfers would wait out.
  static constexpr int kInlineOps = 64;
  // What a caller's requests may do: its transfers (AgentService::CallsFor), its block
  // moves (TensorService::MovesFor) and its notification polls (TensorService::PollsFor;
  // without one of those, such a request is refused UNIMPLEMENTED).
  struct Calls {
    std::shared_ptr<const TransferCalls> transfers;
    std::shared_ptr<const MoveCalls> moves;  // may be null
    std::shared_ptr<const PollCalls> polls;  // may be null
  };
  using CallsFor = std::function<Calls(const LocalCaller& caller)>;

  // Binds `path` as ListenUnix does and starts serving it. `starters` must outlive this.
  static absl::StatusOr<std::unique_ptr<TransferSocket>> Start(const std::string& path,
                                                               mode_t mode, gid_t group,
                                                               WorkerPool* starters,
                                                               CallsFor calls_for);
  // Stops (as Stop) and removes the socket file.
  ~TransferSocket();
  // Closes the socket and every connection, and returns once the thread is gone. Transfers
  // still running end as they would, and answer nobody.
  void Stop();

  const std::string& path() const { return path_; }
  // Connections open now (for GetInfo and tests: returns to 0 when the clients are gone).
  size_t connections() const { return connections_.load(std::memory_order_relaxed); }

 private:
  class Connection;
  using UidBuffered = std::atomic<size_t>;
  TransferSocket(std::string path, UniqueFd listener, std::shared_ptr<const UniqueFd> wake,
                 WorkerPool* starters, CallsFor calls_for)
      : path_(std::move(path)),
        listener_(std::move(listener)),
        wake_(std::move(wake)),
        starters_(starters),
        calls_for_(std::move(calls_for)) {}
  void Loop();
  // Takes the connections waiting at the listener.
  void Accept(std::vector<std::shared_ptr<Connection>>& open);

  const std::string path_;
  UniqueFd listener_;
  // eventfd: Stop(), and answers that leave bytes unsent or a connection ready to read
  // again, wake the thread's poll(). Shared with the connections, which may outlive this.
  const std::shared_ptr<const UniqueFd> wake_;
  WorkerPool* const starters_;
  const CallsFor calls_for_;
  std::atomic<bool> stopping_{false};
  std::atomic<size_t> connections_{0};
  // By uid: what its connections' request buffers hold (the socket thread's map; the
  // counters are shared with the connections, which may outlive their place in the loop).
  absl::flat_hash_map<uid_t, std::shared_ptr<UidBuffered>> buffered_;
  std::thread thread_;
};

}  // namespace ferry::server
