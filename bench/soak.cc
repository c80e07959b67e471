// ferry-soak: many clients, many ops, the receiving agent restarted under them; every byte
// checked. Not a test (it takes a minute or more): `make soak` runs it.
//
//   ferry-soak [--clients 64] [--iterations 1000] [--restarts 3] [--max-size 1MiB]
//              [--hostile 1] [--compare 1]
//
// --hostile 1: one hostile client in the mix (bench/hostile_client.h; another uid when run
// as root): the others must see no failure and no mismatch. --compare 1: the same soak
// without, then with, the hostile client, and the ratio of the other clients' 4 KiB WRITE
// p99.
//
// Each client (its own session) owns a slot of node-b's persisting buffer "soak". An
// iteration fills a local buffer with random bytes, WRITEs a random-size range to its slot,
// READs it back into a second buffer and compares. node-b is stopped (SIGTERM) and started
// again a few times meanwhile; the driver then makes "soak" anew. An iteration that a
// restart overlapped may fail (its codes are counted) but is not compared: the bytes it
// wrote are gone with that agent. Every other iteration must match: mismatches must be 0.
// Prints ops, mismatches, errors by code, and each agent's RSS, threads and pool use at
// the start and the end; exits 1 on any mismatch or if the accounting does not return.

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/byte_size.h"
#include "bench/hostile_client.h"
#include "bench/stats.h"
#include "client/agent_process.h"
#include "client/child_process.h"
#include "client/ferry_client.h"

namespace ferry::soak {
namespace {

struct Options {
  int clients = 64;
  int iterations = 1000;
  int restarts = 3;
  uint64_t max_size = 1 << 20;
  bool hostile = false;
  bool compare = false;
};

// The uid the hostile client runs as: nobody when we are root (another tenant, as on a
// shared node), else ours (and it then shares the per-uid limits with the soak's clients).
constexpr uid_t kNobody = 65534;

struct Tally {
  std::atomic<uint64_t> ops{0}, bytes{0}, compared{0}, mismatches{0}, overlapped{0};
  std::mutex mu;
  std::map<std::string, uint64_t> errors;  // by code name
  std::map<std::string, std::string> first;  // the first message of each code
  std::vector<double> small_write_us;  // WRITEs of at most 4 KiB, each one's latency
  void Error(const absl::Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    std::string code = absl::StatusCodeToString(s.code());
    if (errors[code]++ == 0) first[code] = std::string(s.message().substr(0, 160));
  }
};

// Descriptors `pid` holds now.
size_t OpenFds(pid_t pid) {
  std::error_code ec;
  auto it = std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/fd"), ec);
  if (ec) return 0;
  return static_cast<size_t>(std::distance(it, std::filesystem::directory_iterator()));
}

// CPU `pid` used so far, user and system (proc(5) /proc/<pid>/stat fields 14 and 15, in
// clock ticks); 0 when unreadable.
double CpuSeconds(pid_t pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) return 0;
  // The command name may hold spaces: fields count from after its closing parenthesis.
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  std::string field;
  uint64_t utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::strtoull(field.c_str(), nullptr, 10);
    if (i == 15) stime = std::strtoull(field.c_str(), nullptr, 10);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

std::string Figures(const std::string& when, AgentProcess& agent, Client* client) {
  std::string pool = "?", threads = "?";
  if (client != nullptr) {
    auto info = client->GetInfo();
    if (info.ok()) {
      pool = FormatByteSize(info->host_pool_used_bytes());
      threads = absl::StrCat(info->threads());
    }
  }
  return absl::StrCat("  ", agent.node(), " ", when, ": RSS ",
                      FormatByteSize(agent.MemoryBytes("VmRSS")), ", fds ", OpenFds(agent.pid()),
                      ", threads ", threads, ", host pool used ", pool, ", CPU ",
                      absl::StrFormat("%.1f s", CpuSeconds(agent.pid())));
}

// One client's life: its own session, its own slot of "soak".
void RunClient(int index, const Options& o, const std::string& socket,
               const std::atomic<uint64_t>& epoch, Tally& tally) {
  auto client = Client::Connect(socket, absl::Seconds(10), "soak");
  if (!client.ok()) {
    tally.Error(client.status());
    return;
  }
  auto src = (*client)->Alloc(o.max_size);
  auto back = (*client)->Alloc(o.max_size);
  if (!src.ok() || !back.ok()) {
    tally.Error(src.ok() ? back.status() : src.status());
    return;
  }
  std::mt19937_64 rng(0x5eed + index);
  const uint64_t slot = static_cast<uint64_t>(index) * o.max_size;
  std::vector<double> small_write_us;
  for (int i = 0; i < o.iterations; ++i) {
    // Log-uniform sizes from 1 byte to max_size: small ops as often as large ones.
    double log_max = std::log2(static_cast<double>(o.max_size));
    uint64_t size = std::max<uint64_t>(
        1,
        static_cast<uint64_t>(std::exp2(std::uniform_real_distribution<double>(0, log_max)(rng))));
    uint64_t offset = std::uniform_int_distribution<uint64_t>(0, o.max_size - size)(rng);
    for (uint64_t b = 0; b < size; b += 8) {
      uint64_t word = rng();
      std::memcpy((*src)->data() + b, &word, std::min<uint64_t>(8, size - b));
    }
    std::memset((*back)->data(), 0, size);
    uint64_t before = epoch.load();
    const absl::Time started = absl::Now();
    absl::Status w = (*client)->Write(**src, 0, "node-b", "soak", slot + offset, size);
    if (w.ok() && size <= 4096) {
      small_write_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - started));
    }
    tally.ops++;
    if (!w.ok()) {
      tally.Error(w);
      // As a client would: a peer that is away gets a moment before the next try.
      if (absl::IsUnavailable(w) || absl::IsNotFound(w)) absl::SleepFor(absl::Milliseconds(50));
      continue;
    }
    absl::Status r = (*client)->Read(**back, 0, "node-b", "soak", slot + offset, size);
    tally.ops++;
    if (!r.ok()) {
      tally.Error(r);
      continue;
    }
    tally.bytes += 2 * size;
    if (epoch.load() != before || before % 2 == 1) {
      tally.overlapped++;  // a restart came between: that agent's bytes are gone
      continue;
    }
    tally.compared++;
    if (std::memcmp((*src)->data(), (*back)->data(), size) != 0) tally.mismatches++;
  }
  std::lock_guard<std::mutex> lock(tally.mu);
  tally.small_write_us.insert(tally.small_write_us.end(), small_write_us.begin(),
                              small_write_us.end());
}

// What a soak found, for --compare.
struct Outcome {
  bool ok = false;  // no mismatch, no error outside restarts, accounting back
  double small_write_p99_us = 0;
};

// The hostile client, as a process of its own (this binary again): started once the agents
// are up, stopped (SIGTERM, then waited for) before the figures are read.
class HostileChild {
 public:
  HostileChild(const std::string& dir, const std::string& socket_a,
               const std::string& socket_b) {
    const uid_t uid = geteuid() == 0 ? kNobody : getuid();
    if (uid == getuid()) {
      std::printf("  (not root: the hostile client runs as this uid, sharing its limits)\n");
    }
    auto pid = SpawnChild(
        {"/proc/self/exe", "--hostile-actor", socket_a, socket_b, absl::StrCat(uid)},
        absl::StrCat(dir, "/hostile.log"));
    if (pid.ok()) {
      pid_ = *pid;
    } else {
      std::fprintf(stderr, "ferry-soak: hostile client: %s\n", pid.status().ToString().c_str());
    }
  }
  ~HostileChild() { Stop(); }
  void Stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    int status = 0;
    rusage usage = {};
    wait4(pid_, &status, 0, &usage);
    cpu_seconds_ = absl::ToDoubleSeconds(absl::DurationFromTimeval(usage.ru_utime) +
                                         absl::DurationFromTimeval(usage.ru_stime));
    wall_seconds_ = absl::ToDoubleSeconds(absl::Now() - started_);
    pid_ = 0;
  }
  // The CPU it used, user and system, all its threads (wait4's rusage), and how long it ran:
  // on a 2-core machine its share is CPU the agents and the other clients did not get,
  // whatever it did with it (a control that only burns as much: FERRY_HOSTILE_TRICKS=burn).
  double cpu_seconds() const { return cpu_seconds_; }
  double wall_seconds() const { return wall_seconds_; }

 private:
  pid_t pid_ = 0;
  absl::Time started_ = absl::Now();
  double cpu_seconds_ = 0, wall_seconds_ = 0;
};

Outcome Run(const Options& o) {
  Outcome outcome;
  char tmpl[] = "/tmp/ferry-soak-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  // The hostile client (another uid) reaches the agents' sockets in this folder.
  if (o.hostile) chmod(dir.c_str(), 0755);
  auto pa = PickFreePort(), pb = PickFreePort();
  if (!pa.ok() || !pb.ok()) return outcome;
  const uint64_t soak_bytes = static_cast<uint64_t>(o.clients) * o.max_size;
  std::string extra = absl::StrCat("host_pool:\n  size: ", (3 * soak_bytes >> 20) + 256,
                                   "MiB\nlog:\n  level: warn\n");
  AgentSpec spec_a{"node-a", dir, *pa, {{"node-b", absl::StrCat("127.0.0.1:", *pb)}}, extra};
  AgentSpec spec_b{"node-b", dir, *pb, {{"node-a", absl::StrCat("127.0.0.1:", *pa)}}, extra};
  if (o.hostile) spec_a.local_mode = spec_b.local_mode = "0666";
  auto a = AgentProcess::Start(spec_a);
  auto b = AgentProcess::Start(spec_b);
  if (!a.ok() || !b.ok()) {
    std::fprintf(stderr, "ferry-soak: %s\n", (a.ok() ? b.status() : a.status()).ToString().c_str());
    return outcome;
  }
  // The driver's own clients: they hold the target and read the agents' figures.
  auto make_target = [&](std::unique_ptr<Client>& cb) -> absl::Status {
    auto c = Client::Connect((*b)->socket(), absl::Seconds(10), "soak driver");
    if (!c.ok()) return c.status();
    cb = *std::move(c);
    return cb->Alloc(soak_bytes, "soak", "host", /*persist=*/true).status();
  };
  std::unique_ptr<Client> cb;
  if (absl::Status s = make_target(cb); !s.ok()) {
    std::fprintf(stderr, "ferry-soak: %s\n", s.ToString().c_str());
    return outcome;
  }
  auto ca = Client::Connect((*a)->socket(), absl::Seconds(10), "soak driver");
  if (!ca.ok()) return outcome;
  std::printf("ferry-soak: %d clients x %d WRITE+READ of 1 B .. %s, node-b restarted %d times%s\n",
              o.clients, o.iterations, FormatByteSize(o.max_size).c_str(), o.restarts,
              o.hostile ? ", one hostile client in the mix" : "");
  std::vector<std::string> start = {Figures("at start", **a, ca->get()),
                                    Figures("at start", **b, cb.get())};
  std::unique_ptr<HostileChild> hostile;
  if (o.hostile) {
    hostile = std::make_unique<HostileChild>(dir, (*a)->socket(), (*b)->socket());
    absl::SleepFor(absl::Seconds(1));  // its tricks are under way before the clients start
  }

  Tally tally;
  std::atomic<uint64_t> epoch{0};  // odd while node-b is down or its target not yet made
  absl::Time t0 = absl::Now();
  std::vector<std::thread> clients;
  for (int i = 0; i < o.clients; ++i) {
    clients.emplace_back([&, i] { RunClient(i, o, (*a)->socket(), epoch, tally); });
  }
  const uint64_t total_ops = 2ull * o.clients * o.iterations;
  for (int r = 1; r <= o.restarts; ++r) {
    // Evenly through the run, by ops done.
    while (tally.ops.load() < total_ops * r / (o.restarts + 1))
      absl::SleepFor(absl::Milliseconds(20));
    epoch++;
    cb.reset();
    int rc = (*b)->Stop();
    auto restarted = AgentProcess::Start(spec_b);
    if (!restarted.ok()) {
      std::fprintf(stderr, "ferry-soak: restart %d: %s\n", r,
                   restarted.status().ToString().c_str());
      return outcome;
    }
    *b = std::move(*restarted);
    if (absl::Status s = make_target(cb); !s.ok()) {
      std::fprintf(stderr, "ferry-soak: restart %d: %s\n", r, s.ToString().c_str());
      return outcome;
    }
    epoch++;
    std::printf("  restart %d of node-b at %llu ops (it exited %d)\n", r,
                static_cast<unsigned long long>(tally.ops.load()), rc);
  }
  for (auto& t : clients) t.join();
  double seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  // The hostile client goes; what it held must go with it.
  if (hostile) hostile->Stop();
  if (hostile) {
    std::printf("hostile client: %.1f s of CPU in %.1f s (%.2f cores; tricks %s)\n",
                hostile->cpu_seconds(), hostile->wall_seconds(),
                hostile->cpu_seconds() / std::max(hostile->wall_seconds(), 1e-9),
                std::getenv("FERRY_HOSTILE_TRICKS") ? std::getenv("FERRY_HOSTILE_TRICKS")
                                                    : "all");
  }

  // Every client gone: node-a holds nothing, node-b only the persisting target.
  absl::SleepFor(absl::Milliseconds(o.hostile ? 3000 : 500));
  std::vector<std::string> end = {Figures("at end", **a, ca->get()),
                                  Figures("at end", **b, cb.get())};
  auto info_a = (*ca)->GetInfo();
  auto info_b = cb->GetInfo();
  bool accounting = info_a.ok() && info_b.ok() && info_a->host_pool_used_bytes() == 0 &&
                    info_b->host_pool_used_bytes() == info_b->host_buffer_bytes() &&
                    info_b->buffer_count() == 1;

  std::printf("\nops %llu (%s moved in %.1f s), compared %llu, overlapped by a restart %llu\n",
              static_cast<unsigned long long>(tally.ops.load()),
              FormatByteSize(tally.bytes.load()).c_str(), seconds,
              static_cast<unsigned long long>(tally.compared.load()),
              static_cast<unsigned long long>(tally.overlapped.load()));
  std::printf("mismatches %llu\n", static_cast<unsigned long long>(tally.mismatches.load()));
  outcome.small_write_p99_us = bench::Percentile(tally.small_write_us, 0.99);
  std::printf("WRITEs of at most 4 KiB: %zu, p50 %.0f us, p99 %.0f us\n",
              tally.small_write_us.size(), bench::Percentile(tally.small_write_us, 0.5),
              outcome.small_write_p99_us);
  std::printf("errors by code:%s\n", tally.errors.empty() ? " none" : "");
  for (const auto& [code, n] : tally.errors) {
    std::printf("  %-20s %6llu  e.g. %s\n", code.c_str(), static_cast<unsigned long long>(n),
                tally.first[code].c_str());
  }
  std::printf("agents:\n");
  for (const auto& line : start) std::printf("%s\n", line.c_str());
  for (const auto& line : end) std::printf("%s\n", line.c_str());
  std::printf(
      "accounting at the end: %s\n",
      accounting ? "node-a pool 0, node-b pool = its one persisting buffer" : "NOT back to zero");
  ca->reset();
  cb.reset();
  a->reset();
  b->reset();
  std::system(("rm -rf " + dir).c_str());
  uint64_t errors = 0;
  for (const auto& [code, n] : tally.errors) errors += n;
  // Without restarts no op may fail at all.
  outcome.ok = tally.mismatches.load() == 0 && accounting && (o.restarts > 0 || errors == 0);
  return outcome;
}

}  // namespace
}  // namespace ferry::soak

int main(int argc, char** argv) {
  if (argc == 5 && std::string(argv[1]) == "--hostile-actor") {
    uint32_t uid = 0;
    if (!absl::SimpleAtoi(argv[4], &uid)) return 2;
    return ferry::soak::RunHostileClient(argv[2], argv[3], uid);
  }
  ferry::soak::Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    bool ok = true;
    if (flag == "--clients") ok = absl::SimpleAtoi(value, &o.clients) && o.clients > 0;
    else if (flag == "--iterations")
      ok = absl::SimpleAtoi(value, &o.iterations) && o.iterations > 0;
    else if (flag == "--restarts") ok = absl::SimpleAtoi(value, &o.restarts) && o.restarts >= 0;
    else if (flag == "--hostile" || flag == "--compare") {
      ok = value == "1" || value == "0";
      (flag == "--hostile" ? o.hostile : o.compare) = value == "1";
    }
    else if (flag == "--max-size") {
      auto size = ferry::ParseByteSize(value);
      ok = size.ok() && *size > 0;
      if (ok) o.max_size = *size;
    } else ok = false;
    if (!ok) {
      std::fprintf(
          stderr,
          "usage: ferry-soak [--clients N] [--iterations N] [--restarts N] [--max-size SIZE]\n"
          "                  [--hostile 0|1] [--compare 0|1]\n");
      return 2;
    }
  }
  if (!o.compare) return ferry::soak::Run(o).ok ? 0 : 1;
  // The same soak twice in one run, without and then with the hostile client: the ratio of
  // the other clients' small-op p99 is the figure (the machine's noise is in both).
  o.hostile = false;
  ferry::soak::Outcome quiet = ferry::soak::Run(o);
  std::printf("\n");
  o.hostile = true;
  ferry::soak::Outcome hostile = ferry::soak::Run(o);
  const double ratio =
      quiet.small_write_p99_us > 0 ? hostile.small_write_p99_us / quiet.small_write_p99_us : 0;
  std::printf("\n4 KiB WRITE p99 of the other clients: %.0f us alone, %.0f us beside the "
              "hostile client: %.2f x (goal <= 2)\n",
              quiet.small_write_p99_us, hostile.small_write_p99_us, ratio);
  return quiet.ok && hostile.ok ? 0 : 1;
}
