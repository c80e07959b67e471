#include "client/agent_channel.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

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

// How a user points a client at an agent, for errors that must say so.
constexpr absl::string_view kPointAtAgent =
    "point the client at the agent's socket (ferryctl --socket PATH, "
    "ferry.Client(PATH), Client::Connect(PATH)) or set FERRY_SOCKET=PATH";

// The agents' sockets in `dir` (ferryd-*.sock, as the default names them), for a hint.
std::vector<std::string> AgentSocketsIn(const std::string& dir) {
  std::vector<std::string> found;
  struct CloseDir {
    void operator()(DIR* d) const { closedir(d); }
  };
  std::unique_ptr<DIR, CloseDir> d(opendir(dir.c_str()));
  if (d == nullptr) return found;
  while (const dirent* e = readdir(d.get())) {
    const absl::string_view name = e->d_name;
    if (!absl::StartsWith(name, "ferryd-") || !absl::EndsWith(name, ".sock")) continue;
    const std::string path = absl::StrCat(dir, dir == "/" ? "" : "/", name);
    struct stat st;
    if (stat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) found.push_back(path);
  }
  std::sort(found.begin(), found.end());
  return found;
}

// Whether an agent holds `socket`.lock (server/local/instance_lock.h): one that is starting
// has it before its socket exists, and one that restarts keeps it while the socket is gone
// for a moment. A shared lock taken and dropped at once cannot hold such an agent up: it
// tries its exclusive lock again until it has it.
bool AgentHoldsLock(const std::string& socket) {
  const std::string lock = absl::StrCat(socket, ".lock");
  const int fd = open(lock.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;  // no agent ever ran here, or it cannot be read: do not wait
  const bool held = flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  close(fd);  // drops our lock if we took it
  return held;
}

// No agent at `path`, said at once (UNAVAILABLE, as when none answers): a client given the
// wrong path would otherwise wait out its whole timeout and learn less.
absl::Status NoSocket(const std::string& path) {
  const size_t slash = path.rfind('/');
  std::string dir = ".";
  if (slash != std::string::npos) dir = slash == 0 ? "/" : path.substr(0, slash);
  std::string others;
  for (const std::string& s : AgentSocketsIn(dir)) {
    absl::StrAppend(&others, others.empty() ? "; agents' sockets there: " : ", ", s);
  }
  return absl::UnavailableError(absl::StrCat(
      "no ferryd socket at ", path, " (no such file): start ferryd, or ", kPointAtAgent, others));
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

std::string DefaultAgentSocket() {
  if (const char* env = std::getenv("FERRY_SOCKET"); env != nullptr && *env != '\0') return env;
  // As ResolveDefaults names the agent's node when its config does not.
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') {
    return "/tmp/ferryd-localhost.sock";
  }
  return absl::StrCat("/tmp/ferryd-", host, ".sock");
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> ConnectAgentChannel(const std::string& target,
                                                                   absl::Duration timeout) {
  absl::StatusOr<std::string> uri = ChannelUri(target.empty() ? DefaultAgentSocket() : target);
  if (!uri.ok()) return uri.status();
  if (absl::StartsWith(*uri, "unix:")) {
    // Relative only where the absolute path is too long for sun_path; gRPC then reads it
    // from the current directory, as access() does.
    const std::string path = uri->substr(5);
    if (access(path.c_str(), F_OK) != 0 && errno == ENOENT && !AgentHoldsLock(path)) {
      return NoSocket(path);
    }
  }
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
    return absl::UnavailableError(
        absl::StrCat("no ferryd answers at ", *uri, " within ", absl::FormatDuration(timeout),
                     absl::StartsWith(*uri, "unix:") ? absl::StrCat("; ", kPointAtAgent) : ""));
  }
  return channel;
}

}  // namespace ferry
