#pragma once
// The tcp data plane's admission: the secrets AcceptConnect issues to a peer (through the
// Peer API's Connect call, which authenticates the peer) and every data socket of that
// connection presents in its hello frame (wire.h). A socket without a live secret is closed
// before anything else is read from it.
//
// A session admits the number of sockets the initiator asked for (its Connect request), once
// each, within kSessionLifetime of being issued: the initiator opens them right after its
// Connect returns. A spent or expired session admits nothing more; the sockets it admitted
// live on, each remembering the peer it belongs to. At most kSessionsPerPeer unspent sessions
// per node (the oldest goes first) and kMaxSessions in all (about 100 bytes each). A node that
// connects with a new incarnation (it restarted) revokes the unspent sessions of its older
// incarnations. Thread-safe.

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/fabric.h"
#include "transport/tcp/wire.h"

namespace ferry::tcp {

// 128 random bits: guessing one of kMaxSessions live secrets takes ~2^116 tries.
using SessionSecret = std::array<uint8_t, 16>;

struct SessionTicket {
  uint64_t session = 0;  // which session: a lookup key, not secret
  SessionSecret secret = {};
};

inline constexpr absl::Duration kSessionLifetime = absl::Seconds(30);
// Unspent sessions of one node: room for every endpoint it opens at once (rails times
// endpoints per peer) while our loops are still admitting the sockets of the earlier ones
// (64 endpoints connected back to back on a loaded machine had 17 unspent at one time).
inline constexpr uint32_t kSessionsPerPeer = 256;
inline constexpr size_t kMaxSessions = 4096;
// Sockets one session may admit (TcpOptions::connections of the initiator, capped).
inline constexpr uint32_t kMaxSocketsPerSession = 64;

// The Connect request (initiator -> target): the sockets it will open, uint32 in host order.
std::string EncodeSessionRequest(uint32_t sockets);
absl::StatusOr<uint32_t> DecodeSessionRequest(const std::string& request);
// The Connect reply (target -> initiator): session (8 bytes) then secret (16 bytes).
inline constexpr size_t kSessionReplyBytes = 24;
std::string EncodeSessionReply(const SessionTicket& ticket);
// INVALID_ARGUMENT naming `peer` for a reply of another size (an older ferryd, or garbage).
absl::StatusOr<SessionTicket> DecodeSessionReply(const std::string& reply, const std::string& peer);

// The hello frame that admits a socket to `ticket`'s session, and the ticket a hello shows
// (wire.h has the layout).
RequestHeader MakeHello(const SessionTicket& ticket);
SessionTicket TicketOfHello(const RequestHeader& hello);

// Compares in time independent of where the secrets differ.
bool SecretsEqual(const SessionSecret& a, const SessionSecret& b);

class SessionSecrets {
 public:
  // Why a hello was not admitted: for the target's own log and counters only; the socket is
  // closed the same way in every case.
  enum class Refused { kUnknown, kWrongSecret, kExpired };
  struct Admitted {
    fabric::PeerInstance peer;
  };

  // A session for `from` admitting `sockets` sockets. Fails only when the kernel gives no
  // random bytes.
  absl::StatusOr<SessionTicket> Issue(const fabric::PeerInstance& from, uint32_t sockets,
                                      absl::Time now = absl::Now());
  // A hello presented `session` and `secret`: takes one of its sockets, or says why not.
  std::optional<Admitted> Admit(uint64_t session, const SessionSecret& secret, Refused* why,
                                absl::Time now = absl::Now());
  // Unspent sessions now (tests).
  size_t size() const;

 private:
  struct Entry {
    fabric::PeerInstance peer;
    SessionSecret secret;
    uint32_t sockets_left;
    absl::Time expires;
  };
  void DropExpiredLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  // Ordered by session id, which grows with each Issue: begin() is the oldest.
  std::map<uint64_t, Entry> sessions_ ABSL_GUARDED_BY(mu_);
  uint64_t next_session_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ferry::tcp
