#include "client/agent_channel.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace ferry {

absl::StatusOr<std::shared_ptr<grpc::Channel>> ConnectAgentChannel(const std::string& target,
                                                                   absl::Duration timeout) {
  std::string uri = target;
  if (absl::StartsWith(target, "/") || absl::StartsWith(target, ".")) uri = absl::StrCat("unix:", target);
  grpc::ChannelArguments args;
  // Batches of tens of thousands of ops exceed gRPC's 4 MiB default.
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  auto channel = grpc::CreateCustomChannel(uri, grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(absl::ToChronoTime(absl::Now() + timeout))) {
    return absl::UnavailableError(absl::StrCat("no ferryd answers at ", uri));
  }
  return channel;
}

}  // namespace ferry
