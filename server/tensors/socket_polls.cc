// Notification polls on the transfer socket (server/api/transfer_socket.h, SocketRequest.poll):
// Tensors.PollNotifications without gRPC, for a connector that drains its notifications every
// engine step. The kernel names the caller (SO_PEERCRED): it takes its uid's notifications, as
// over the local socket.

#include "server/agent/agent_core.h"
#include "server/tensors/tensor_service.h"

namespace ferry::server {
namespace {

class CallerPolls final : public PollCalls {
 public:
  CallerPolls(AgentCore* core, const LocalCaller& caller)
      : core_(core), taker_(LocalCallers::OwnerUid(caller)) {}

  ferry::v1::PollNotificationsResponse Poll(
      const ferry::v1::PollNotificationsRequest& request) const override {
    return core_->tensors().board().Poll(request.prefix(), request.max_count(), taker_);
  }

 private:
  AgentCore* const core_;
  const int64_t taker_;
};

}  // namespace

std::shared_ptr<const PollCalls> TensorService::PollsFor(const LocalCaller& caller) {
  return std::make_shared<CallerPolls>(core_, caller);
}

}  // namespace ferry::server
