#include "client/agent_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/unique_fd.h"
#include "client/child_process.h"
#include "client/dev_pki.h"
#include "client/ferry_client.h"

#ifndef FERRY_FERRYD_PATH
#define FERRY_FERRYD_PATH "ferryd"
#endif

namespace ferry {

namespace {

// The first port the kernel hands out for port 0 (ip_local_port_range), 32768 if unknown.
uint16_t EphemeralLow() {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  return range >> low && low > 10000 && low < 65536 ? static_cast<uint16_t>(low) : 32768;
}

}  // namespace

absl::StatusOr<uint16_t> PickFreePort() {
  // Below the ephemeral range: a port the kernel picked for us there may be handed to an
  // agent's own port-0 listener (or to another test's) before our agent binds it.
  static std::atomic<uint32_t> counter{static_cast<uint32_t>(getpid()) * 7919u};
  const uint16_t low = 10000, high = EphemeralLow();
  for (int attempt = 0; attempt < 200; ++attempt) {
    uint16_t port = static_cast<uint16_t>(low + counter.fetch_add(104729u) % (high - low));
    UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd.valid()) return absl::ErrnoToStatus(errno, "socket()");
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(port);
    if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) return port;
  }
  return absl::UnavailableError("no free port below the ephemeral range on 127.0.0.1");
}

absl::StatusOr<std::unique_ptr<AgentProcess>> AgentProcess::Start(const AgentSpec& spec,
                                                                  absl::Duration timeout) {
  std::unique_ptr<AgentProcess> agent(new AgentProcess());
  uint16_t port = spec.peer_port;
  if (port == 0) {
    auto picked = PickFreePort();
    if (!picked.ok()) return picked.status();
    port = *picked;
  }
  agent->node_ = spec.node;
  agent->socket_ = absl::StrCat(spec.dir, "/", spec.node, ".sock");
  agent->peer_address_ = absl::StrCat("127.0.0.1:", port);
  agent->config_path_ = absl::StrCat(spec.dir, "/", spec.node, ".yaml");
  agent->log_path_ = absl::StrCat(spec.dir, "/", spec.node, ".log");
  {
    std::ofstream out(agent->config_path_);
    out << "node: " << spec.node << "\n"
        << "listen:\n  local: " << agent->socket_ << "\n  peer: " << agent->peer_address_ << "\n";
    if (!spec.local_tcp.empty()) out << "  local_tcp: \"" << spec.local_tcp << "\"\n";
    if (!spec.local_mode.empty()) out << "  local_mode: \"" << spec.local_mode << "\"\n";
    if (!spec.local_group.empty()) out << "  local_group: " << spec.local_group << "\n";
    if (!spec.peers.empty()) {
      out << "peers:\n";
      for (const auto& [name, address] : spec.peers) out << "  " << name << ": " << address << "\n";
    }
    // Before extra_yaml, which stays last: tests append keys to its final section.
    if (absl::StrContains(spec.extra_yaml, "security:")) {
      // The test brings its own.
    } else if (spec.security == "mtls") {
      auto pki = DevPki::Open(spec.dir);
      if (!pki.ok()) return pki.status();
      auto yaml = pki->SecurityYaml(spec.node);
      if (!yaml.ok()) return yaml.status();
      out << *yaml;
    } else if (spec.security == "insecure") {
      out << "security:\n  mode: insecure\n";
    }
    out << spec.extra_yaml;
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", agent->config_path_));
  }
  std::string ferryd = spec.ferryd;
  if (ferryd.empty()) ferryd = std::getenv("FERRYD") ? std::getenv("FERRYD") : FERRY_FERRYD_PATH;

  auto pid =
      SpawnChild({ferryd, "--config", agent->config_path_}, agent->log_path_, spec.open_files);
  if (!pid.ok()) return pid.status();
  agent->pid_ = *pid;
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (agent->Reap(/*wait=*/false) >= 0) {
      std::ifstream log(agent->log_path_);
      std::stringstream text;
      text << log.rdbuf();
      return absl::InternalError(absl::StrCat("ferryd ", spec.node, " (", ferryd,
                                              ") exited at start:\n", text.str()));
    }
    if (access(agent->socket_.c_str(), F_OK) == 0) {
      // Ours, not an agent that still serves the socket while it stops.
      auto client = Client::Connect(agent->socket_, absl::Milliseconds(500), "launcher");
      auto info = client.ok() ? (*client)->GetInfo() : client.status();
      if (info.ok() && info->pid() == static_cast<uint32_t>(agent->pid_)) return agent;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  agent->Kill();
  return absl::DeadlineExceededError(absl::StrCat("ferryd ", spec.node, " did not start within ",
                                                  absl::FormatDuration(timeout), "; log: ",
                                                  agent->log_path_));
}

AgentProcess::~AgentProcess() {
  if (pid_ > 0) Stop();
}

int AgentProcess::Reap(bool wait) {
  if (pid_ <= 0) return -1;
  int status = 0;
  pid_t r = waitpid(pid_, &status, wait ? 0 : WNOHANG);
  if (r != pid_) return -1;
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int AgentProcess::Stop(absl::Duration grace) {
  if (pid_ <= 0) return -1;
  kill(pid_, SIGTERM);
  absl::Time deadline = absl::Now() + grace;
  while (absl::Now() < deadline) {
    int rc = Reap(false);
    if (rc >= 0) return rc;
    absl::SleepFor(absl::Milliseconds(10));
  }
  kill(pid_, SIGKILL);
  return Reap(true);
}

int AgentProcess::AwaitExit(absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  do {
    int rc = Reap(false);
    if (rc >= 0) return rc;
    absl::SleepFor(absl::Milliseconds(10));
  } while (absl::Now() < deadline);
  return Reap(false);
}

void AgentProcess::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  Reap(true);
}

uint64_t AgentProcess::MemoryBytes(const std::string& field) const {
  if (pid_ <= 0) return 0;
  std::ifstream status(absl::StrCat("/proc/", pid_, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) {
      std::vector<std::string> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
      uint64_t kib = 0;
      if (parts.size() >= 2 && absl::SimpleAtoi(parts[1], &kib)) return kib * 1024;
    }
  }
  return 0;
}

}  // namespace ferry
