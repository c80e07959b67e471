#pragma once
// A client's session with its node's ferryd: the channel, and the OpenSession call that
// makes what the client allocates its own. The agent frees the session's buffers when it
// ends: when this object is destroyed, or when the process exits or crashes (the call's
// connection closes). libferry's Client and TensorClient share one session.
//
// The session also ends when the agent does (it crashed, was killed or restarted): the
// OpenSession call ends then, alive() turns false and ended() says why. A new agent on the
// same socket knows nothing of this session (nor of its buffers, registrations and lists),
// and its session ids never reuse this one's: calls naming it are refused, and the client
// opens a new session (Python's Client does that by itself and raises AgentRestarted once).

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ferry/v1/agent.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace ferry {

class AgentSession {
 public:
  // Connects to `target` (as ConnectAgentChannel) and opens a session for `client` (what
  // this process is, e.g. "ferryctl"). UNAVAILABLE when no agent answers within `timeout`.
  static absl::StatusOr<std::shared_ptr<AgentSession>> Open(const std::string& target,
                                                            absl::Duration timeout,
                                                            const std::string& client);
  // Ends the session (the agent frees what it owns) and waits for the call to end.
  ~AgentSession();
  AgentSession(const AgentSession&) = delete;
  AgentSession& operator=(const AgentSession&) = delete;

  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  uint64_t id() const { return id_; }
  // The agent run that opened it (GetInfoResponse.incarnation), and when that run started.
  uint64_t incarnation() const { return incarnation_; }
  absl::Time agent_started() const { return agent_started_; }
  // False once the OpenSession call ended: the agent went away (or this object is going).
  bool alive() const;
  // How the call ended (UNAVAILABLE when the agent went away); OK while it is alive.
  absl::Status ended() const;
  // Waits up to `timeout` for the call to end; whether it did. For a caller that was told
  // the session is not open (a new run of the agent answered) before gRPC told this object
  // that the old run's connection closed.
  bool AwaitEnd(absl::Duration timeout) const;
  // Names this session on a call (the "ferry-session" metadata).
  void Attach(grpc::ClientContext* ctx) const;

 private:
  class Watch;
  explicit AgentSession(std::shared_ptr<grpc::Channel> channel);

  std::shared_ptr<grpc::Channel> channel_;
  uint64_t id_ = 0;
  uint64_t incarnation_ = 0;
  absl::Time agent_started_ = absl::InfinitePast();
  // The OpenSession call, on gRPC's callback API: it reads the first event (the session's
  // id) and then holds no read, yet hears the call end (no thread of ours waits on it).
  std::unique_ptr<Watch> watch_;
};

}  // namespace ferry
