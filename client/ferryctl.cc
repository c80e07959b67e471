// ferryctl: the operator's and script's view of a node's ferryd.
//
// Exit codes scripts can rely on:
//   0  success
//   1  the agent refused the request or the transfer failed (message on stderr)
//   2  usage error
//   3  no agent answers at the socket
//
// Read commands take --json for machine-readable output.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/byte_size.h"
#include "base/unique_fd.h"
#include "client/ferry_client.h"
#include "client/topo_command.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"

namespace ferry::ctl {
namespace {

constexpr int kOk = 0, kFailed = 1, kUsage = 2, kNoAgent = 3;

constexpr const char* kUsageText = R"(usage: ferryctl [--socket PATH] COMMAND [ARGS]

Agent commands (the local ferryd, at --socket, $FERRY_SOCKET or /tmp/ferryd-<host>.sock):
  info [--json]                         node, version, providers, pool use, peers
  buffers [--json]                      the agent's buffers
  alloc SIZE [--name NAME] [--device D] [--json]
                                        allocate a buffer (SIZE like 64MiB; D host or cuda:N)
  free ID                               free a buffer
  put FILE --to NODE:BUFFER [--offset N]  write a file into a (remote) named buffer
  get NODE:BUFFER FILE                  read a (remote) named buffer into a file
  policy get [--json]                   the GDR / staging policy in force
  policy set KEY=VALUE ...              change it now (gdr, gdr_max_path, fallback,
                                        staging_chunk, staging_depth)

Offline commands (no agent needed):
  topo [--topology FILE] [--config FILE] [--json]
  doctor [--topology FILE] [--config FILE] [--sysfs-root DIR] [--json]

Exit codes: 0 ok, 1 refused or failed, 2 usage, 3 no agent.
)";

struct Args {
  std::vector<std::string> words;   // positional
  bool json = false;
  std::string name, to, device = "host";
  uint64_t offset = 0;
};

int Usage(const std::string& why) {
  std::cerr << "ferryctl: " << why << "\n\n" << kUsageText;
  return kUsage;
}

int Fail(const absl::Status& s) {
  std::cerr << "ferryctl: " << absl::StatusCodeToString(s.code()) << ": " << s.message() << "\n";
  return kFailed;
}

std::string Json(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, options);
  return out;
}

std::string DefaultSocket() {
  if (const char* env = std::getenv("FERRY_SOCKET")) return env;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return absl::StrCat("/tmp/ferryd-", host, ".sock");
}

// "node-b:kv" -> {"node-b", "kv"}.
bool SplitTarget(const std::string& target, std::string* node, std::string* buffer) {
  size_t colon = target.find(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == target.size()) return false;
  *node = target.substr(0, colon);
  *buffer = target.substr(colon + 1);
  return true;
}

void PrintResult(const char* verb, const ferry::v1::TransferResult& r, const std::string& where) {
  std::printf("%s %llu bytes %s in %.1f ms (%.2f GB/s)\n", verb,
              static_cast<unsigned long long>(r.bytes()), where.c_str(), r.duration_us() / 1e3,
              r.duration_us() ? static_cast<double>(r.bytes()) / r.duration_us() / 1e3 : 0.0);
}

int Info(Client& c, const Args& a) {
  auto info = c.GetInfo();
  if (!info.ok()) return Fail(info.status());
  if (a.json) {
    std::cout << Json(*info) << "\n";
    return kOk;
  }
  std::string providers, peers;
  for (const auto& p : info->providers()) absl::StrAppend(&providers, providers.empty() ? "" : ", ", p);
  for (const auto& p : info->peers()) absl::StrAppend(&peers, peers.empty() ? "" : ", ", p);
  std::printf("node        %s\nversion     %s\nproviders   %s\nbuffers     %llu\n"
              "host pool   %s used of %s\npeers       %s\ntransfers   %llu running, %llu done\n",
              info->node().c_str(), info->version().c_str(), providers.c_str(),
              static_cast<unsigned long long>(info->buffer_count()),
              FormatByteSize(info->host_pool_used_bytes()).c_str(),
              FormatByteSize(info->host_pool_bytes()).c_str(), peers.empty() ? "-" : peers.c_str(),
              static_cast<unsigned long long>(info->transfers_active()),
              static_cast<unsigned long long>(info->transfers_done()));
  std::printf("policy      generation %llu\n", static_cast<unsigned long long>(info->policy_generation()));
  for (const auto& g : info->gpus()) {
    std::printf("gpu %-7d %s %s, pool %s used of %s, fragmentation %.2f\n", g.index(),
                g.backend().c_str(), g.pci().empty() ? "-" : g.pci().c_str(),
                FormatByteSize(g.pool_used_bytes()).c_str(), FormatByteSize(g.pool_bytes()).c_str(),
                g.pool_fragmentation());
  }
  for (const auto& b : info->bounce_pools()) {
    std::printf("bounce %-4s %u x %s, %u in use (peak %u), %s\n", b.name().c_str(), b.chunks(),
                FormatByteSize(b.chunk_bytes()).c_str(), b.chunks_in_use(), b.peak_chunks_in_use(),
                b.placement().c_str());
  }
  return kOk;
}

int Policy(Client& c, const Args& a) {
  if (a.words.empty()) return Usage("policy needs get or set");
  absl::StatusOr<ferry::v1::PolicyState> state;
  if (a.words[0] == "get" && a.words.size() == 1) {
    state = c.GetPolicy();
  } else if (a.words[0] == "set" && a.words.size() > 1) {
    std::vector<std::pair<std::string, std::string>> settings;
    for (size_t i = 1; i < a.words.size(); ++i) {
      size_t eq = a.words[i].find('=');
      if (eq == std::string::npos || eq == 0) return Usage(absl::StrCat("'", a.words[i], "' is not KEY=VALUE"));
      settings.emplace_back(a.words[i].substr(0, eq), a.words[i].substr(eq + 1));
    }
    state = c.SetPolicy(settings);
  } else {
    return Usage("policy get | policy set KEY=VALUE ...");
  }
  if (!state.ok()) return Fail(state.status());
  if (a.json) {
    std::cout << Json(*state) << "\n";
  } else {
    std::printf("generation     %llu\ngdr            %s\ngdr_max_path   %s\nfallback       %s\n"
                "staging_chunk  %s\nstaging_depth  %u\n",
                static_cast<unsigned long long>(state->generation()), state->gdr().c_str(),
                state->gdr_max_path().c_str(), state->fallback().c_str(),
                FormatByteSize(state->staging_chunk_bytes()).c_str(), state->staging_depth());
  }
  return kOk;
}

int Buffers(Client& c, const Args& a) {
  auto list = c.ListBuffers();
  if (!list.ok()) return Fail(list.status());
  if (a.json) {
    ferry::v1::ListBuffersResponse resp;
    for (auto& b : *list) *resp.add_buffers() = b;
    std::cout << Json(resp) << "\n";
    return kOk;
  }
  std::printf("%-8s %-24s %-8s %14s\n", "ID", "NAME", "DEVICE", "SIZE");
  for (const auto& b : *list) {
    std::printf("%-8llu %-24s %-8s %14s\n", static_cast<unsigned long long>(b.id()),
                b.name().empty() ? "-" : b.name().c_str(), b.device().c_str(),
                FormatByteSize(b.size()).c_str());
  }
  return kOk;
}

int Alloc(Client& c, const Args& a) {
  if (a.words.size() != 1) return Usage("alloc needs SIZE");
  auto size = ParseByteSize(a.words[0]);
  if (!size.ok()) return Usage(std::string(size.status().message()));
  auto buffer = c.Alloc(*size, a.name, a.device);
  if (!buffer.ok()) return Fail(buffer.status());
  if (a.json) {
    std::cout << Json((*buffer)->info()) << "\n";
  } else {
    std::printf("%llu\n", static_cast<unsigned long long>((*buffer)->id()));
  }
  return kOk;
}

int Free(Client& c, const Args& a) {
  uint64_t id = 0;
  if (a.words.size() != 1 || !absl::SimpleAtoi(a.words[0], &id)) return Usage("free needs a buffer ID");
  absl::Status s = c.Free(id);
  return s.ok() ? kOk : Fail(s);
}

int Put(Client& c, const Args& a) {
  std::string node, remote;
  if (a.words.size() != 1) return Usage("put needs FILE");
  if (!SplitTarget(a.to, &node, &remote)) return Usage("put needs --to NODE:BUFFER");
  UniqueFd fd(open(a.words[0].c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st = {};
  if (!fd.valid() || fstat(fd.get(), &st) != 0) {
    return Fail(absl::ErrnoToStatus(errno, absl::StrCat("open(", a.words[0], ")")));
  }
  if (st.st_size == 0) return Fail(absl::InvalidArgumentError(absl::StrCat(a.words[0], " is empty")));
  uint64_t size = static_cast<uint64_t>(st.st_size);
  auto buffer = c.Alloc(size);
  if (!buffer.ok()) return Fail(buffer.status());
  // Straight from the file into the shared buffer: the agent never copies it again.
  for (uint64_t done = 0; done < size;) {
    ssize_t n = read(fd.get(), (*buffer)->data() + done, size - done);
    if (n <= 0) {
      c.Free((*buffer)->id()).IgnoreError();
      return Fail(absl::ErrnoToStatus(errno, absl::StrCat("read(", a.words[0], ")")));
    }
    done += static_cast<uint64_t>(n);
  }
  auto result = c.Run({{ferry::v1::WRITE, (*buffer)->id(), 0, node, remote, a.offset, size}});
  c.Free((*buffer)->id()).IgnoreError();
  if (!result.ok()) return Fail(result.status());
  if (absl::Status s = TransferStatus(*result); !s.ok()) return Fail(s);
  PrintResult("wrote", *result, absl::StrCat("to ", a.to));
  return kOk;
}

int Get(Client& c, const Args& a) {
  std::string node, remote;
  if (a.words.size() != 2 || !SplitTarget(a.words[0], &node, &remote)) {
    return Usage("get needs NODE:BUFFER FILE");
  }
  auto size = c.StatRemoteBuffer(node, remote);
  if (!size.ok()) return Fail(size.status());
  auto buffer = c.Alloc(*size);
  if (!buffer.ok()) return Fail(buffer.status());
  auto result = c.Run({{ferry::v1::READ, (*buffer)->id(), 0, node, remote, 0, *size}});
  absl::Status s = result.ok() ? TransferStatus(*result) : result.status();
  if (s.ok()) {
    UniqueFd fd(open(a.words[1].c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd.valid()) s = absl::ErrnoToStatus(errno, absl::StrCat("open(", a.words[1], ")"));
    for (uint64_t done = 0; s.ok() && done < *size;) {
      ssize_t n = write(fd.get(), (*buffer)->data() + done, *size - done);
      if (n <= 0) s = absl::ErrnoToStatus(errno, absl::StrCat("write(", a.words[1], ")"));
      else done += static_cast<uint64_t>(n);
    }
  }
  c.Free((*buffer)->id()).IgnoreError();
  if (!s.ok()) return Fail(s);
  PrintResult("read", *result, absl::StrCat("from ", a.words[0]));
  return kOk;
}

int Main(int argc, char** argv) {
  std::vector<std::string> argl(argv + 1, argv + argc);
  std::string socket = DefaultSocket();
  size_t i = 0;
  for (; i < argl.size() && argl[i].rfind("--", 0) == 0; ++i) {
    if (argl[i] == "--help") {
      std::cout << kUsageText;
      return kOk;
    }
    if (argl[i] == "--socket" && i + 1 < argl.size()) {
      socket = argl[++i];
    } else {
      return Usage(absl::StrCat("unknown option ", argl[i]));
    }
  }
  if (i >= argl.size()) return Usage("no command");
  const std::string command = argl[i++];
  std::vector<std::string> rest(argl.begin() + static_cast<long>(i), argl.end());
  if (command == "topo") {
    // Without a file to read, the running agent's plan is the truth: it reflects the
    // policy the agent runs under now. With no agent, read this machine.
    bool offline = false;
    for (const auto& w : rest) offline |= w.rfind("--topology", 0) == 0 || w.rfind("--config", 0) == 0;
    if (!offline) {
      if (auto c = Client::Connect(socket, absl::Milliseconds(300)); c.ok()) {
        ferry::v1::GetTopologyResponse topo;
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
        if ((*c)->stub().GetTopology(&ctx, {}, &topo).ok()) {
          bool json = std::find(rest.begin(), rest.end(), "--json") != rest.end();
          std::cout << (json ? topo.json() : topo.text());
          return kOk;
        }
      }
    }
    return client::RunTopoCommand(rest, std::cout, std::cerr);
  }
  if (command == "doctor") return client::RunDoctorCommand(rest, std::cout, std::cerr);

  Args a;
  for (size_t k = 0; k < rest.size(); ++k) {
    const std::string& w = rest[k];
    auto value = [&](std::string* out) {
      if (k + 1 >= rest.size()) return false;
      *out = rest[++k];
      return true;
    };
    std::string v;
    if (w == "--json") {
      a.json = true;
    } else if (w == "--name") {
      if (!value(&a.name)) return Usage("--name needs a value");
    } else if (w == "--device") {
      if (!value(&a.device)) return Usage("--device needs host or cuda:N");
    } else if (w == "--to") {
      if (!value(&a.to)) return Usage("--to needs NODE:BUFFER");
    } else if (w == "--offset") {
      if (!value(&v) || !absl::SimpleAtoi(v, &a.offset)) return Usage("--offset needs a number");
    } else if (w.rfind("--", 0) == 0) {
      return Usage(absl::StrCat("unknown option ", w));
    } else {
      a.words.push_back(w);
    }
  }
  using Handler = int (*)(Client&, const Args&);
  const std::pair<const char*, Handler> kCommands[] = {
      {"info", Info}, {"buffers", Buffers}, {"alloc", Alloc}, {"free", Free}, {"put", Put}, {"get", Get},
      {"policy", Policy}};
  for (const auto& [name, handler] : kCommands) {
    if (command != name) continue;
    auto client = Client::Connect(socket, absl::Seconds(3));
    if (!client.ok()) {
      std::cerr << "ferryctl: " << client.status().message() << " (is ferryd running? --socket PATH)\n";
      return kNoAgent;
    }
    return handler(**client, a);
  }
  return Usage(absl::StrCat("unknown command '", command, "'"));
}

}  // namespace
}  // namespace ferry::ctl

int main(int argc, char** argv) { return ferry::ctl::Main(argc, argv); }
