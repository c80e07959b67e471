#include "client/agent_channel.h"

#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/text_file.h"
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

absl::StatusOr<std::string> ReadEnvFile(const char* var) {
  const char* path = std::getenv(var);
  if (path == nullptr || *path == '\0') {
    return absl::FailedPreconditionError(absl::StrCat(
        "an agent over TCP (listen.local_tcp) takes only mutual TLS: set FERRY_TLS_CA, "
        "FERRY_TLS_CERT, FERRY_TLS_KEY (PEM files of a certificate from the agent's CA) and "
        "FERRY_TLS_NODE (the agent's node name); ", var, " is not set"));
  }
  absl::StatusOr<std::string> text = ReadTextFile(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(), absl::StrCat(var, ": ", text.status().message()));
  }
  return text;
}

// The local API over TCP: the agent's own certificate must name FERRY_TLS_NODE, and ours,
// from the same CA, is what the agent admits.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> TcpCredentials(
    grpc::ChannelArguments& args) {
  grpc::SslCredentialsOptions options;
  auto ca = ReadEnvFile("FERRY_TLS_CA");
  if (!ca.ok()) return ca.status();
  auto cert = ReadEnvFile("FERRY_TLS_CERT");
  if (!cert.ok()) return cert.status();
  auto key = ReadEnvFile("FERRY_TLS_KEY");
  if (!key.ok()) return key.status();
  options.pem_root_certs = *ca;
  options.pem_cert_chain = *cert;
  options.pem_private_key = *key;
  if (const char* node = std::getenv("FERRY_TLS_NODE"); node != nullptr && *node != '\0') {
    args.SetSslTargetNameOverride(node);
  }
  return grpc::SslCredentials(options);
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
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!absl::StartsWith(*uri, "unix:")) {
    auto tls = TcpCredentials(args);
    if (!tls.ok()) return tls.status();
    credentials = *tls;
  }
  auto channel = grpc::CreateCustomChannel(*uri, credentials, args);
  if (!channel->WaitForConnected(absl::ToChronoTime(absl::Now() + timeout))) {
    return absl::UnavailableError(absl::StrCat("no ferryd answers at ", *uri));
  }
  return channel;
}

}  // namespace ferry
