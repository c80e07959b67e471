#pragma once
// The gRPC side of sessions: the OpenSession call that a session lives in, and the session
// a call names in its metadata.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "ferry/v1/agent.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/local/local_callers.h"
#include "server/local/sessions.h"

namespace ferry::server {

// Serves one OpenSession call: opens the session, tells the client its id, and closes the
// session when the call ends (cancelled by the client, its connection gone, or the server
// shutting down). Deletes itself when gRPC is done with it. The session records `caller`'s
// pid and uid (the kernel's, over the Unix socket) rather than the request's pid.
grpc::ServerWriteReactor<ferry::v1::SessionEvent>* StartSessionCall(
    SessionRegistry* sessions, const ferry::v1::OpenSessionRequest& request,
    const std::optional<LocalCaller>& caller);

// The session named by the call's "ferry-session" metadata; 0 when it names none.
// PERMISSION_DENIED when another uid opened it (session ids are small numbers: anyone on
// the socket could name one), unless the caller is privileged.
absl::StatusOr<uint64_t> SessionOfCall(const grpc::ServerContextBase& ctx,
                                       const SessionRegistry& sessions,
                                       const LocalCallers& callers);
// The same for a session a request names itself (`field`, for messages: the transfer
// socket's "move.session"), for a caller the kernel named; 0 for 0.
absl::StatusOr<uint64_t> SessionOfCaller(uint64_t id, const std::string& field,
                                         const LocalCaller& caller,
                                         const SessionRegistry& sessions,
                                         const LocalCallers& callers);

}  // namespace ferry::server
