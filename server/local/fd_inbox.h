#pragma once
// The fd socket: how a client hands the agent a file descriptor (its shared memory, for
// RegisterMemory), and how the agent hands a client the file of a buffer it owns (to map
// it). gRPC carries no descriptors, so they go over a Unix socket of their own beside the
// local API's (same mode and group; GetInfo.fd_socket names it). One request a connection:
//
//   pass: the client sends the 8 bytes "ferryfd1" with exactly one descriptor attached
//   (SCM_RIGHTS, unix(7)); the agent answers with 8 bytes, a ticket (little-endian; 0:
//   refused) and closes the connection.
//
//   lend: the client sends the 8 bytes "ferrymap" and a buffer id (8 bytes little-endian),
//   no descriptor; the agent answers with a status code (4 bytes little-endian,
//   absl::StatusCode), a message's length (4 bytes little-endian) and the message, with
//   the buffer's file attached (SCM_RIGHTS) when the code is 0, and closes the connection.
//   Only the buffer's owner uid, root or the admin group get it (the Lender decides, from
//   the kernel's SO_PEERCRED): a client of another uid cannot open /proc/<agent pid>/fd/N,
//   so this is how a non-root client maps what it allocated from a root agent.
//
//   A malformed message (other bytes, descriptors where none belong) closes the connection
//   without an answer.
//
// The ticket then names the descriptor in RegisterMemory, once, by the same uid (the
// kernel's SO_PEERCRED of both connections, never what the client says), within kTicketTtl.
// At most kMaxHeld descriptors wait at a time, kMaxHeldPerUid of one uid, so a client that
// never registers can neither exhaust the agent's descriptors nor crowd out other uids.
// Connections are served side by side, not one after the other: one that says nothing is
// closed after kReceiveTimeout and holds up nobody meanwhile (20 idle ones once made every
// other client's RegisterMemory wait 20 s); at most kMaxPending wait for their message,
// kMaxPendingPerUid of one uid, and more are closed at once.

#include <sys/socket.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/unique_fd.h"

namespace ferry::server {

// Where the fd socket of the local socket `local_socket` is: beside it, "<path>.fd".
inline std::string FdSocketPath(const std::string& local_socket) { return local_socket + ".fd"; }

class FdInbox {
 public:
  static constexpr char kHello[] = "ferryfd1";  // 8 bytes on the wire, without the NUL
  static constexpr char kLendHello[] = "ferrymap";
  static constexpr size_t kMaxLendMessage = 1024;  // bytes of an answer's message, at most
  static constexpr absl::Duration kTicketTtl = absl::Seconds(60);
  static constexpr size_t kMaxHeld = 1024;
  static constexpr size_t kMaxHeldPerUid = 256;
  static constexpr absl::Duration kReceiveTimeout = absl::Seconds(1);
  static constexpr size_t kMaxPending = 256;
  static constexpr size_t kMaxPendingPerUid = 16;

  // The file of buffer `id` for `caller`, or why not (the code and message go to the
  // client). Runs on the accept thread: it must not block.
  using Lender = std::function<absl::StatusOr<UniqueFd>(uint64_t id, const ucred& caller)>;

  // Binds `path` as ListenUnix does and starts accepting.
  static absl::StatusOr<std::unique_ptr<FdInbox>> Start(const std::string& path, mode_t mode,
                                                        gid_t group);
  // Who answers lend requests from here on; until set, they are answered UNIMPLEMENTED.
  void SetLender(Lender lender) {
    absl::MutexLock lock(&mu_);
    lender_ = std::move(lender);
  }
  // Stops accepting (as Stop); descriptors not taken are closed.
  ~FdInbox();
  // No new connections from here on; returns once the accept thread is gone.
  void Stop();

  const std::string& path() const { return path_; }
  // The descriptor passed with `ticket` (a ticket is good once). NOT_FOUND naming
  // "fd_ticket" for one unknown or expired, PERMISSION_DENIED for one that another uid
  // passed (the descriptor stays for its owner).
  absl::StatusOr<UniqueFd> Take(uint64_t ticket, uid_t uid);
  // Descriptors passed, not yet taken and not expired (for tests: returns to 0).
  size_t held();

 private:
  FdInbox(std::string path, UniqueFd listener, UniqueFd wake)
      : path_(std::move(path)), listener_(std::move(listener)), wake_(std::move(wake)) {}
  void AcceptLoop();
  // A connection waiting for its message.
  struct Pending {
    UniqueFd conn;
    ucred cred;
    absl::Time until;
  };
  // Takes the connections waiting at the listener into `pending` (or closes them: over a cap).
  void AcceptAll(std::vector<Pending>& pending);
  // Reads one connection's message (it is readable) and answers it; `conn` is closed by the
  // caller.
  void Receive(int conn, const ucred& cred);
  // Answers a lend request for buffer `id`.
  void Lend(int conn, uint64_t id, const ucred& cred);
  // A ticket for `fd` passed by `uid`; 0 when full.
  uint64_t Hold(UniqueFd fd, uid_t uid);
  void DropExpiredLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  UniqueFd listener_;
  UniqueFd wake_;  // eventfd: Stop() wakes the accept thread's poll()
  std::thread thread_;
  struct Held {
    UniqueFd fd;
    uid_t uid;
    absl::Time expires;
  };
  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Held> held_ ABSL_GUARDED_BY(mu_);
  Lender lender_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry::server
