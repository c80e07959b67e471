#include "client/agent_channel.h"

#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace ferry {
namespace {

// The gRPC target for what a user typed: "unix:..." as given; HOST:PORT (a ':' and no '/',
// so "[::1]:7070" too) as given; anything else is a socket path ("a.sock" alone would go to
// gRPC's DNS resolver). A relative path is made absolute against the current directory: the
// error then names the file tried, and a channel that reconnects later finds the same file.
// Unless only the relative path fits sun_path (108 bytes on Linux): gRPC reads "unix:a.sock"
// from the current directory too.
absl::StatusOr<std::string> ChannelUri(const std::string& target) {
  if (absl::StartsWith(target, "unix:")) return target;
  if (absl::StrContains(target, ':') && !absl::StrContains(target, '/')) return target;
  if (target.empty()) return absl::InvalidArgumentError("empty agent socket path");
  if (absl::StartsWith(target, "/")) return absl::StrCat("unix:", target);
  std::unique_ptr<char, decltype(&free)> cwd(getcwd(nullptr, 0), &free);
  if (cwd == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat("getcwd() to find socket ", target));
  }
  const absl::string_view dir = cwd.get();
  std::string relative = absl::StartsWith(target, "./") ? target.substr(2) : target;
  std::string absolute = absl::StrCat(dir, dir == "/" ? "" : "/", relative);
  constexpr size_t kSunPath = sizeof(sockaddr_un{}.sun_path);
  if (absolute.size() >= kSunPath && relative.size() < kSunPath) {
    return absl::StrCat("unix:", relative);
  }
  return absl::StrCat("unix:", absolute);
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::Channel>> ConnectAgentChannel(const std::string& target,
                                                                   absl::Duration timeout) {
  absl::StatusOr<std::string> uri = ChannelUri(target);
  if (!uri.ok()) return uri.status();
  grpc::ChannelArguments args;
  // Batches of tens of thousands of ops exceed gRPC's 4 MiB default.
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  auto channel = grpc::CreateCustomChannel(*uri, grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(absl::ToChronoTime(absl::Now() + timeout))) {
    return absl::UnavailableError(absl::StrCat("no ferryd answers at ", *uri));
  }
  return channel;
}

}  // namespace ferry
