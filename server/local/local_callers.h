#pragma once
// Who is on the other end of each local API connection, as the kernel says (SO_PEERCRED at
// accept: uid, gid, pid), never as the client says. The local listener records each
// connection before gRPC sees it (server/local/local_listener.h); a call finds its own by
// ServerContext::peer(), which gRPC names "fd:N" for a connection handed to it by fd. N
// stays open, and so names this connection, for as long as the connection lives; a number
// reused later is overwritten at its own accept, before any call can arrive on it.

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/server_context.h"
#include "server/buffers/buffer_registry.h"

namespace ferry::server {

struct LocalCaller {
  uid_t uid = 0;
  gid_t gid = 0;
  pid_t pid = 0;
};

// The gid of group `name` (config key `key`, for the message); -1 for "".
absl::StatusOr<gid_t> LookupGroup(const std::string& name, const std::string& key);

class LocalCallers {
 public:
  // `admin_group`: members (primary or supplementary group) may act on every uid's buffers,
  // as root may; -1 for none.
  explicit LocalCallers(gid_t admin_group = static_cast<gid_t>(-1)) : admin_group_(admin_group) {}

  void Record(int fd, const LocalCaller& caller);
  // The caller of `ctx`'s call; nullopt when it did not come through the local socket
  // (local_tcp, where the client's certificate is all there is).
  std::optional<LocalCaller> Of(const grpc::ServerContextBase& ctx) const;
  // Root, or in the admin group.
  bool Privileged(const LocalCaller& caller) const;
  // OK when `caller` may act on what `owner_uid` owns: the same uid, a privileged caller, an
  // owner not known (-1), or a caller not known (local_tcp, authenticated by TLS). Else
  // PERMISSION_DENIED naming `what` and both uids.
  absl::Status MayUse(const std::optional<LocalCaller>& caller, int64_t owner_uid,
                      const std::string& what) const;
  // OK when `caller` may make `call` (a row of server/local/call_rules.h): an operator call
  // needs root, the admin group or a caller not known (local_tcp, authenticated by TLS);
  // PERMISSION_DENIED naming the call and the uid else. INTERNAL for a call with no row.
  absl::Status Authorize(const std::optional<LocalCaller>& caller, absl::string_view call) const;
  // Whether a listing shows `caller` every uid's rows (privileged, or not known), or its own.
  bool SeesAll(const std::optional<LocalCaller>& caller) const;
  // The uid what `caller` makes or starts belongs to; -1 for a caller not known.
  static int64_t OwnerUid(const std::optional<LocalCaller>& caller) {
    return caller ? static_cast<int64_t>(caller->uid) : -1;
  }

 private:
  const gid_t admin_group_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<int, LocalCaller> by_fd_ ABSL_GUARDED_BY(mu_);
};

// LocalCallers::MayUse for buffer `id`: the call's caller against the buffer's owner. An
// unknown id passes (what the caller does next refuses it, with its own message).
absl::Status MayUseBuffer(const LocalCallers& callers, const grpc::ServerContextBase& ctx,
                          const BufferRegistry& buffers, uint64_t id, const std::string& what);
// The same for a caller known already (LocalCallers::Of, taken when a stream opened).
absl::Status MayUseBuffer(const LocalCallers& callers, const std::optional<LocalCaller>& caller,
                          const BufferRegistry& buffers, uint64_t id, const std::string& what);

}  // namespace ferry::server
