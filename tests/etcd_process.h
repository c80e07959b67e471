#pragma once
// A real etcd for the integration suites (Debian's etcd-server): one member on loopback with
// free client and peer ports and its data in a folder of the test's; stopped on destruction
// (the folder is the test's to remove). It cannot outlive the test (client/child_process.h).

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/agent_process.h"
#include "client/child_process.h"
#include "server/peers/etcd_client.h"

namespace ferry {

class EtcdProcess {
 public:
  // The etcd binary: $FERRY_ETCD when set, else /usr/bin/etcd; "" when it is not there.
  static std::string Binary() {
    const char* env = std::getenv("FERRY_ETCD");
    const std::string path = env != nullptr && *env != '\0' ? env : "/usr/bin/etcd";
    return access(path.c_str(), X_OK) == 0 ? path : "";
  }

  // Starts etcd with its data under `dir` and waits until it answers.
  static absl::StatusOr<std::unique_ptr<EtcdProcess>> Start(const std::string& dir) {
    auto client_port = PickFreePort();
    auto peer_port = PickFreePort();
    if (!client_port.ok() || !peer_port.ok()) return absl::InternalError("no free port");
    std::unique_ptr<EtcdProcess> etcd(new EtcdProcess());
    etcd->endpoint_ = absl::StrCat("127.0.0.1:", *client_port);
    const std::string client_url = absl::StrCat("http://", etcd->endpoint_);
    const std::string peer_url = absl::StrCat("http://127.0.0.1:", *peer_port);
    etcd->log_ = absl::StrCat(dir, "/etcd.log");
    auto pid = SpawnChild({Binary(), "--name", "ferry-test", "--data-dir", dir + "/etcd-data",
                           "--listen-client-urls", client_url, "--advertise-client-urls",
                           client_url, "--listen-peer-urls", peer_url,
                           "--initial-advertise-peer-urls", peer_url, "--initial-cluster",
                           absl::StrCat("ferry-test=", peer_url)},
                          etcd->log_);
    if (!pid.ok()) return pid.status();
    etcd->pid_ = *pid;
    server::EtcdClient client({etcd->endpoint_}, absl::Milliseconds(500));
    const absl::Time deadline = absl::Now() + absl::Seconds(15);
    while (absl::Now() < deadline) {
      if (client.RangePrefix("/").ok()) return etcd;
      int status = 0;
      if (waitpid(etcd->pid_, &status, WNOHANG) == etcd->pid_) {
        etcd->pid_ = -1;
        return absl::InternalError(absl::StrCat("etcd exited at start; log: ", etcd->log_));
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    return absl::DeadlineExceededError(
        absl::StrCat("etcd did not answer on ", etcd->endpoint_, "; log: ", etcd->log_));
  }

  ~EtcdProcess() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    for (int i = 0; i < 300; ++i) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) return;
      absl::SleepFor(absl::Milliseconds(10));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }

  // "127.0.0.1:port" of its client URL.
  const std::string& endpoint() const { return endpoint_; }
  const std::string& log() const { return log_; }

 private:
  EtcdProcess() = default;

  std::string endpoint_;
  std::string log_;
  pid_t pid_ = -1;
};

}  // namespace ferry
