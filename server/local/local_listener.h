#pragma once
// The local API's Unix socket, accepted by the agent itself rather than by gRPC, so that
// each connection's peer credentials (SO_PEERCRED) are known before its first call: they go
// into LocalCallers, then the connection to the gRPC server (AddInsecureChannelFromFd),
// which serves it as it would have. The socket's mode and group come from config
// (listen.local_mode, listen.local_group): who may connect at all is the file's permission.

#include <sys/types.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "base/unique_fd.h"
#include "grpcpp/server.h"
#include "server/local/local_callers.h"

namespace ferry::server {

class LocalListener {
 public:
  // Binds `path` (a stale socket file there is replaced: the instance lock is held), gives
  // it `mode` and, unless -1, `group`. Errors name the call and errno.
  static absl::StatusOr<std::unique_ptr<LocalListener>> Bind(const std::string& path, mode_t mode,
                                                             gid_t group, LocalCallers* callers);
  // Stops accepting (as Stop).
  ~LocalListener();

  // Accepts for `server` (built and started) from now until Stop.
  void Serve(grpc::Server* server);
  // No new connections from here on; the ones handed to gRPC stay until the server ends
  // them. Returns once the accept thread is gone.
  void Stop();

 private:
  LocalListener(UniqueFd listener, UniqueFd wake, LocalCallers* callers)
      : listener_(std::move(listener)), wake_(std::move(wake)), callers_(callers) {}
  void AcceptLoop(grpc::Server* server);

  UniqueFd listener_;
  UniqueFd wake_;  // eventfd: Stop() wakes the accept thread's poll()
  LocalCallers* const callers_;
  std::thread thread_;
};

}  // namespace ferry::server
