#pragma once
// A client's session with its node's ferryd: the channel, and the OpenSession call that
// makes what the client allocates its own. The agent frees the session's buffers when it
// ends: when this object is destroyed, or when the process exits or crashes (the call's
// connection closes). libferry's Client and TensorClient share one session.

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
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
  // Names this session on a call (the "ferry-session" metadata).
  void Attach(grpc::ClientContext* ctx) const;

 private:
  explicit AgentSession(std::shared_ptr<grpc::Channel> channel) : channel_(std::move(channel)) {}

  std::shared_ptr<grpc::Channel> channel_;
  grpc::ClientContext call_;
  uint64_t id_ = 0;
  std::unique_ptr<grpc::ClientReader<ferry::v1::SessionEvent>> reader_;
  // Reads the first event (the session's id), then ends.
  std::thread first_reader_;
  bool finished_ = false;  // reader_->Finish was called (by first_reader_, before it ended)
};

}  // namespace ferry
