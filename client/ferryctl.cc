// ferryctl: the operator's and script's view of a node's ferryd.
//
// Exit codes scripts can rely on:
//   0  success
//   1  the agent refused the request or the transfer failed (message on stderr)
//   2  usage error
//   3  no agent answers at the socket
//
// Read commands take --json for machine-readable output (64-bit integers as JSON numbers,
// client/proto_json.h).

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "base/byte_size.h"
#include "base/grpc_status.h"
#include "base/unique_fd.h"
#include "client/agent_channel.h"
#include "client/certs_command.h"
#include "client/ferry_client.h"
#include "client/nics_view.h"
#include "client/ops_views.h"
#include "client/peers_edit.h"
#include "client/proto_json.h"
#include "client/topo_command.h"
#include "grpcpp/grpcpp.h"
#include "server/version.h"

namespace ferry::ctl {
namespace {

constexpr int kOk = 0, kFailed = 1, kUsage = 2, kNoAgent = 3;

constexpr const char* kUsageText = R"(usage: ferryctl [--socket PATH] COMMAND [ARGS]
       ferryctl --help | --version
Options may come before or after COMMAND; "--" ends them.

Agent commands (the local ferryd, at --socket, $FERRY_SOCKET or /tmp/ferryd-<host>.sock,
where ferryd's socket is when its config names neither node nor socket; PATH may be
relative, or HOST:PORT for the agent's TCP listener):
  info [--json]                         node, version, providers, pool use, peers, NICs
  nics [--json]                         each rail (provider:NIC): health, the memory it
                                        carries, bytes by peer, paused rails and why
  peers [--json]                        each peer: health (background checks), round trip,
                                        incarnation, rails, connections, how it was found
  transfers [--recent N] [--json]       running transfers and the last N finished ones
  stats [--json]                        ops, bytes and failures by peer, direction, mode
                                        and provider; op latency by size class
  nics down NIC [--reason TEXT] | nics up NIC
                                        take a NIC (or one rail, tcp:mlx5_0) out of
                                        service and back: peers move to their other rails
  buffers [--json]                      the agent's buffers and their owners ("persist":
                                        until freed)
  alloc SIZE [--name NAME] [--device D] [--allow-peers NODE,...] [--json]
                                        allocate a buffer (SIZE like 64MiB; D host or cuda:N)
                                        that persists after ferryctl exits, until `free ID`;
                                        --allow-peers: only these peers may reach it
  free ID                               free a buffer
  put FILE --to NODE:BUFFER [--offset SIZE] [--timeout DURATION]
                                        write a file into a (remote) named buffer
  get NODE:BUFFER FILE [--offset SIZE] [--length SIZE] [--timeout DURATION]
                                        read a (remote) named buffer into a file: --length
                                        bytes from --offset (default: to its end). Deadline:
                                        --timeout (90s, 5m), else 60 s and 1 s per 16 MiB
  cancel TRANSFER_ID [--json]           end a running transfer; prints how it ended
  policy get [--json]                   the GDR / staging policy in force
  policy set KEY=VALUE ...              change it now (gdr, gdr_max_path, fallback,
                                        staging_chunk, staging_depth); these run-time
                                        settings override the config file, also after
                                        SIGHUP, until
  policy reset                          drops them: the config file's policy again
  peers add NODE HOST:PORT [--json]     add a peer now (or move one added so); kept across
                                        SIGHUP, until `peers remove` or a restart
  peers remove NODE [--json]            drop a peer added with `peers add` (the config
                                        file's and etcd's peers stay)
On a terminal, put and get show their progress on stderr.

Offline commands (no agent needed):
  topo [--topology FILE] [--config FILE] [--json]
  doctor [--topology FILE] [--config FILE] [--sysfs-root DIR] [--json]
  certs ca --out DIR [--days N]         a CA for the agents' mutual TLS: DIR/ca.pem and
                                        DIR/ca.key (keep the key off the nodes)
  certs node NAME --ca DIR --out DIR [--days N]
                                        a certificate for node NAME (DNS name NAME) signed
                                        by that CA: tls.crt, tls.key, ca.crt (default 365
                                        days); prints the config's security section

Exit codes: 0 ok, 1 refused or failed, 2 usage, 3 no agent.
)";

// A put or get moves the whole range within this time (the agent's deadline for it).
// put and get: 60 s, and a second more per 16 MiB (a 1 GiB file over a slow link once ran
// out of a fixed 60 s with 880 MiB moved), at most the agent's own cap (limits.max_timeout,
// 10 min by default); --timeout sets it.
constexpr absl::Duration kTransferTimeout = absl::Seconds(60);
constexpr uint64_t kBytesPerExtraSecond = 16 << 20;
constexpr absl::Duration kMaxTransferTimeout = absl::Minutes(10);

absl::Duration TransferTimeout(uint64_t bytes) {
  return std::min(
      kMaxTransferTimeout,
      kTransferTimeout + absl::Seconds(static_cast<double>(bytes / kBytesPerExtraSecond)));
}

// Options that take a value, for every command: a scan for the command and the shared
// options must skip their values ("--name info" names a buffer "info").
constexpr absl::string_view kValueOptions[] = {
    "--socket", "--name",        "--device", "--to",         "--offset",
    "--length", "--topology",    "--config", "--sysfs-root", "--reason",
    "--recent", "--allow-peers", "--out",    "--ca",         "--days",  "--timeout"};

// Every command, for the hint after an unknown one.
constexpr absl::string_view kCommandNames[] = {
    "info", "nics", "peers",  "transfers", "stats", "buffers", "alloc", "free",
    "put",  "get",  "cancel", "policy",    "topo",  "doctor",  "certs", "help"};

// The command line before the command's own options are read.
struct CommandLine {
  std::string socket;
  std::string command;
  std::vector<std::string> rest;  // the command's words and options, in order
  bool help = false;              // also kept in `rest`: topo and doctor have their own
  bool version = false;
};

// The agent commands' words and options.
struct Args {
  std::vector<std::string> words;   // positional
  bool json = false;
  std::string name, to, device = "host", reason, allow_peers, out, ca;
  std::optional<uint64_t> offset, length, recent, days;
  std::optional<absl::Duration> timeout;  // put, get: --timeout
};

// One line saying what is wrong and where the full usage is: the usage text is 50 lines,
// which would push the line that matters off a terminal.
int Usage(const std::string& why) {
  std::cerr << "ferryctl: " << why << "\n"
            << "(ferryctl --help lists every command and option)\n";
  return kUsage;
}

// Edits (insert, delete, replace) from `a` to `b`: for a "did you mean".
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

int UnknownCommand(const std::string& command) {
  std::string nearest;
  size_t best = 3;  // farther than 2 edits is no suggestion
  for (absl::string_view name : kCommandNames) {
    if (size_t d = EditDistance(command, name); d < best) best = d, nearest = std::string(name);
  }
  return Usage(
      absl::StrCat("unknown command '", command, "'",
                   nearest.empty() ? "" : absl::StrCat(" (did you mean '", nearest, "'?)")));
}

int Fail(const absl::Status& s) {
  std::cerr << "ferryctl: " << absl::StatusCodeToString(s.code()) << ": " << s.message() << "\n";
  return kFailed;
}

// "--offset=1MiB" -> {"--offset", "1MiB"}; anything else -> {word, nullopt}.
std::pair<std::string, std::optional<std::string>> SplitOption(const std::string& word) {
  size_t eq = word.find('=');
  if (!absl::StartsWith(word, "--") || eq == std::string::npos) return {word, std::nullopt};
  return {word.substr(0, eq), word.substr(eq + 1)};
}

bool IsOption(const std::string& word) { return word.size() > 1 && word[0] == '-'; }

// Finds the command and the options every command shares (--socket, --help, --version),
// before or after the command. Returns a usage problem, or "".
std::string ScanCommandLine(const std::vector<std::string>& argl, CommandLine& cl) {
  bool options_ended = false;
  for (size_t i = 0; i < argl.size(); ++i) {
    const std::string& word = argl[i];
    if (options_ended || !IsOption(word)) {
      if (cl.command.empty()) {
        cl.command = word;
      } else {
        cl.rest.push_back(word);
      }
      continue;
    }
    if (word == "--") {
      options_ended = true;
      cl.rest.push_back(word);
      continue;
    }
    auto [name, value] = SplitOption(word);
    if (name == "--socket") {
      if (!value && i + 1 < argl.size()) value = argl[++i];
      if (!value || value->empty()) return "--socket needs a PATH";
      cl.socket = *value;
    } else if (name == "--version") {
      cl.version = true;
    } else if (name == "--help" || name == "-h") {
      cl.help = true;
      cl.rest.push_back(word);
    } else if (name == "--json") {
      cl.rest.push_back(word);
    } else if (std::find(std::begin(kValueOptions), std::end(kValueOptions), name) !=
               std::end(kValueOptions)) {
      cl.rest.push_back(word);
      if (!value && i + 1 < argl.size()) cl.rest.push_back(argl[++i]);
    } else {
      return absl::StrCat("unknown option ", name);
    }
  }
  return "";
}

// An agent command's words and options (`rest` of the command line). Returns a usage
// problem, or "".
std::string ParseArgs(const std::vector<std::string>& rest, Args& a) {
  bool options_ended = false;
  for (size_t k = 0; k < rest.size(); ++k) {
    if (options_ended || !IsOption(rest[k])) {
      a.words.push_back(rest[k]);
      continue;
    }
    if (rest[k] == "--") {
      options_ended = true;
      continue;
    }
    auto [name, value] = SplitOption(rest[k]);
    if (name == "--json") {
      if (value) return "--json takes no value";
      a.json = true;
      continue;
    }
    std::string* text = nullptr;
    std::optional<uint64_t>* size = nullptr;
    const char* what = "SIZE";
    if (name == "--name") {
      text = &a.name, what = "NAME";
    } else if (name == "--device") {
      text = &a.device, what = "host or cuda:N";
    } else if (name == "--to") {
      text = &a.to, what = "NODE:BUFFER";
    } else if (name == "--reason") {
      text = &a.reason, what = "REASON";
    } else if (name == "--allow-peers") {
      text = &a.allow_peers, what = "NODE[,NODE...]";
    } else if (name == "--out") {
      text = &a.out, what = "DIR";
    } else if (name == "--ca") {
      text = &a.ca, what = "DIR";
    } else if (name == "--days") {
      size = &a.days, what = "N";
    } else if (name == "--offset") {
      size = &a.offset;
    } else if (name == "--length") {
      size = &a.length;
    } else if (name == "--recent") {
      size = &a.recent, what = "N";
    } else if (name == "--timeout") {
      if (!value && k + 1 < rest.size()) value = rest[++k];
      absl::Duration d;
      if (!value || !absl::ParseDuration(*value, &d) || d <= absl::ZeroDuration()) {
        return "--timeout needs a duration like 90s or 5m";
      }
      a.timeout = d;
      continue;
    } else {
      return absl::StrCat("unknown option ", name);
    }
    if (!value && k + 1 < rest.size()) value = rest[++k];
    if (!value || value->empty()) return absl::StrCat(name, " needs ", what);
    if (text != nullptr) {
      *text = *value;
      continue;
    }
    absl::StatusOr<uint64_t> bytes = ParseByteSize(*value);
    if (!bytes.ok()) return absl::StrCat(name, ": ", bytes.status().message());
    *size = *bytes;
  }
  return "";
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

// "12.5 MiB": a progress line's numbers, which change too fast to be read exactly.
std::string ApproxBytes(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (unit < 4 && bytes >= 1024) {
    bytes /= 1024;
    ++unit;
  }
  return unit == 0 ? absl::StrFormat("%.0f B", bytes)
                   : absl::StrFormat("%.1f %s", bytes, kUnits[unit]);
}

// One line on stderr, rewritten in place ('\r'), while a put or get runs. Shown only once the
// transfer has run ~0.5 s (a quick one prints nothing extra), a few times a second; erased
// when it ends, so that the result line starts clean.
class ProgressLine {
 public:
  explicit ProgressLine(absl::Time start) : start_(start) {}
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;
  ~ProgressLine() {
    if (width_ > 0) std::fprintf(stderr, "\r%*s\r", width_, "");
  }

  void Update(const ferry::v1::TransferProgress& p) {
    const absl::Time now = absl::Now();
    if (p.state() != ferry::v1::RUNNING || now - start_ < absl::Milliseconds(500) ||
        now - shown_ < absl::Milliseconds(250)) {
      return;
    }
    shown_ = now;
    const double done = static_cast<double>(p.bytes_done());
    const double total = static_cast<double>(p.bytes_total());
    std::string line = absl::StrFormat("%s / %s  %3.0f%%  %s/s", ApproxBytes(done),
                                       ApproxBytes(total), total > 0 ? 100 * done / total : 0.0,
                                       ApproxBytes(done / absl::ToDoubleSeconds(now - start_)));
    // Padded to the longest line so far: a shorter one leaves no old characters behind.
    std::fprintf(stderr, "\r%-*s", width_, line.c_str());
    std::fflush(stderr);
    width_ = std::max(width_, static_cast<int>(line.size()));
  }

 private:
  const absl::Time start_;
  absl::Time shown_ = absl::InfinitePast();
  int width_ = 0;
};

// A put or get of `length` bytes as ops over consecutive pieces: the agent counts bytes done
// per finished op, so one op would show 0% until the end, and one op may not exceed the
// agent's limits.max_op_bytes (1 GiB by default). Pieces of 8 MiB to 256 MiB, about 256 of
// them, stay well under limits.max_ops_per_submit (65536) up to 16 TiB.
std::vector<OpSpec> RangeOps(ferry::v1::OpType type, uint64_t local_buffer, const std::string& node,
                             const std::string& remote_buffer, uint64_t remote_offset,
                             uint64_t length) {
  constexpr uint64_t kMinPiece = uint64_t{8} << 20, kMaxPiece = uint64_t{256} << 20;
  uint64_t piece = std::clamp(length / 256 + 1, kMinPiece, kMaxPiece);
  // A range past 2^64 stays one op, refused whole by the agent, rather than wrapping around.
  if (remote_offset > UINT64_MAX - length) piece = length;
  std::vector<OpSpec> ops;
  for (uint64_t done = 0; done < length; done += piece) {
    ops.push_back({type, local_buffer, done, node, remote_buffer, remote_offset + done,
                   std::min(piece, length - done)});
  }
  return ops;
}

// Client::Run with `timeout`, with a progress line when stderr is a terminal.
absl::StatusOr<ferry::v1::TransferResult> RunTransfer(Client& c, const std::vector<OpSpec>& ops,
                                                      absl::Duration timeout) {
  if (!isatty(STDERR_FILENO)) return c.Run(ops, timeout);
  const absl::Time start = absl::Now();
  absl::StatusOr<uint64_t> id = c.Submit(ops, timeout);
  if (!id.ok()) return id.status();
  {
    ProgressLine line(start);
    // Watch ends when the transfer does; if it fails (an agent without Watch, one that went
    // away), Wait below still has the verdict or the error.
    c.Watch(*id, [&line](const ferry::v1::TransferProgress& p) { line.Update(p); }).IgnoreError();
  }
  return c.Wait(*id, timeout + absl::Seconds(5));
}

int Info(Client& c, const Args& a) {
  auto info = c.GetInfo();
  if (!info.ok()) return Fail(info.status());
  if (a.json) {
    std::cout << client::ProtoToJson(*info) << "\n";
    return kOk;
  }
  std::string providers, peers;
  for (const auto& p : info->providers())
    absl::StrAppend(&providers, providers.empty() ? "" : ", ", p);
  for (const auto& p : info->peers()) absl::StrAppend(&peers, peers.empty() ? "" : ", ", p);
  std::printf("node        %s\nversion     %s\nproviders   %s\nbuffers     %llu\n"
              "host pool   %s used of %s\npeers       %s\ntransfers   %llu running, %llu done\n",
              info->node().c_str(), info->version().c_str(), providers.c_str(),
              static_cast<unsigned long long>(info->buffer_count()),
              FormatByteSize(info->host_pool_used_bytes()).c_str(),
              FormatByteSize(info->host_pool_bytes()).c_str(), peers.empty() ? "-" : peers.c_str(),
              static_cast<unsigned long long>(info->transfers_active()),
              static_cast<unsigned long long>(info->transfers_done()));
  std::printf("policy      generation %llu\n",
              static_cast<unsigned long long>(info->policy_generation()));
  std::printf(
      "sessions    %llu, buffers hold %s of the host pool\nprocess     pid %u, %llu threads\n",
      static_cast<unsigned long long>(info->sessions()),
      FormatByteSize(info->host_buffer_bytes()).c_str(), info->pid(),
      static_cast<unsigned long long>(info->threads()));
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
  for (const auto& n : info->nics()) {
    std::printf("nic         %s\n", client::FormatNicSummary(n).c_str());
  }
  return kOk;
}

// An Agent API call with no request fields, printed as a table or JSON.
template <typename Request, typename Response>
int View(Client& c, const Args& a,
         grpc::Status (ferry::v1::Agent::Stub::*call)(grpc::ClientContext*, const Request&,
                                                      Response*),
         std::string (*format)(const Response&), const Request& req = Request()) {
  Response resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::Status s = (c.stub().*call)(&ctx, req, &resp);
  if (!s.ok()) return Fail(FromGrpcStatus(s));
  std::cout << (a.json ? client::ProtoToJson(resp) + "\n" : format(resp));
  return kOk;
}

// `peers` lists them; `peers add` / `peers remove` change the run-time ones (EditPeers).
int EditPeers(Client& c, const Args& a);

int Peers(Client& c, const Args& a) {
  if (!a.words.empty()) return EditPeers(c, a);
  return View(c, a, &ferry::v1::Agent::Stub::ListPeers, &client::FormatPeers);
}

int Transfers(Client& c, const Args& a) {
  if (!a.words.empty()) return Usage("transfers [--recent N]");
  ferry::v1::ListTransfersRequest req;
  req.set_recent(static_cast<uint32_t>(a.recent.value_or(20)));
  return View(c, a, &ferry::v1::Agent::Stub::ListTransfers, &client::FormatTransfers, req);
}

int Stats(Client& c, const Args& a) {
  if (!a.words.empty()) return Usage("stats takes no arguments");
  return View(c, a, &ferry::v1::Agent::Stub::GetStats, &client::FormatStats);
}

std::string FormatNicChange(const ferry::v1::SetNicStateResponse& changed) {
  return client::FormatNics(changed.nics());
}

int Nics(Client& c, const Args& a) {
  if (a.words.empty()) {
    auto info = c.GetInfo();
    if (!info.ok()) return Fail(info.status());
    if (a.json) {
      ferry::v1::SetNicStateResponse only;  // the nics, without the rest of GetInfo
      *only.mutable_nics() = info->nics();
      std::cout << client::ProtoToJson(only) << "\n";
    } else {
      std::cout << client::FormatNics(info->nics());
    }
    return kOk;
  }
  if (a.words.size() != 2 || (a.words[0] != "down" && a.words[0] != "up")) {
    return Usage("nics | nics down NIC [--reason TEXT] | nics up NIC");
  }
  ferry::v1::SetNicStateRequest req;
  req.set_nic(a.words[1]);
  req.set_up(a.words[0] == "up");
  req.set_reason(a.reason);
  return View(c, a, &ferry::v1::Agent::Stub::SetNicState, &FormatNicChange, req);
}

// `peers add` / `peers remove`; the listing (`peers` alone) is the peers view's.
int EditPeers(Client& c, const Args& a) {
  absl::StatusOr<ferry::v1::PeerChange> change;
  if (a.words.size() == 3 && a.words[0] == "add") {
    change = client::AddPeer(c.stub(), a.words[1], a.words[2]);
  } else if (a.words.size() == 2 && a.words[0] == "remove") {
    change = client::RemovePeer(c.stub(), a.words[1]);
  } else {
    return Usage("peers | peers add NODE HOST:PORT | peers remove NODE");
  }
  if (!change.ok()) return Fail(change.status());
  if (a.json) {
    std::cout << client::ProtoToJson(*change) << "\n";
  } else {
    std::cout << client::FormatPeerChange(a.words[1], *change) << "\n";
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
      if (eq == std::string::npos || eq == 0)
        return Usage(absl::StrCat("'", a.words[i], "' is not KEY=VALUE"));
      settings.emplace_back(a.words[i].substr(0, eq), a.words[i].substr(eq + 1));
    }
    state = c.SetPolicy(settings);
  } else if (a.words[0] == "reset" && a.words.size() == 1) {
    state = c.SetPolicy({}, /*clear_overrides=*/true);
  } else {
    return Usage("policy get | policy set KEY=VALUE ... | policy reset");
  }
  if (!state.ok()) return Fail(state.status());
  if (a.json) {
    std::cout << client::ProtoToJson(*state) << "\n";
  } else {
    std::printf("generation     %llu\ngdr            %s\ngdr_max_path   %s\nfallback       %s\n"
                "staging_chunk  %s\nstaging_depth  %u\n",
                static_cast<unsigned long long>(state->generation()), state->gdr().c_str(),
                state->gdr_max_path().c_str(), state->fallback().c_str(),
                FormatByteSize(state->staging_chunk_bytes()).c_str(), state->staging_depth());
    // Which keys the run-time settings hold, over the config file's (until policy reset).
    std::string overrides;
    for (const auto& o : state->overrides())
      absl::StrAppend(&overrides, " ", o.key(), "=", o.value());
    std::string line = overrides.empty()
                           ? " none (the config file's policy)"
                           : absl::StrCat(overrides, " (over the config file; reset drops them)");
    std::printf("run-time      %s\n", line.c_str());
  }
  return kOk;
}

int Buffers(Client& c, const Args& a) {
  auto list = c.ListBuffers();
  if (!list.ok()) return Fail(list.status());
  if (a.json) {
    ferry::v1::ListBuffersResponse resp;
    for (auto& b : *list) *resp.add_buffers() = b;
    std::cout << client::ProtoToJson(resp) << "\n";
    return kOk;
  }
  std::printf("%-8s %-24s %-8s %14s  %s\n", "ID", "NAME", "DEVICE", "SIZE", "OWNER");
  for (const auto& b : *list) {
    // "-": an agent too old to say.
    const std::string owner = b.persist() ? "persist" : b.owner().empty() ? "-" : b.owner();
    std::printf("%-8llu %-24s %-8s %14s  %s\n", static_cast<unsigned long long>(b.id()),
                b.name().empty() ? "-" : b.name().c_str(), b.device().c_str(),
                FormatByteSize(b.size()).c_str(), owner.c_str());
  }
  return kOk;
}

int Alloc(Client& c, const Args& a) {
  if (a.words.size() != 1) return Usage("alloc needs SIZE");
  auto size = ParseByteSize(a.words[0]);
  if (!size.ok()) return Usage(std::string(size.status().message()));
  // Persist: this process ends at once, and the buffer is what it was asked for (e.g. a
  // named target peers write into); a session's buffer would be freed with it.
  std::vector<std::string> allowed;
  if (!a.allow_peers.empty()) allowed = absl::StrSplit(a.allow_peers, ',', absl::SkipEmpty());
  auto buffer = c.Alloc(*size, a.name, a.device, /*persist=*/true, allowed);
  if (!buffer.ok()) return Fail(buffer.status());
  if (a.json) {
    std::cout << client::ProtoToJson((*buffer)->info()) << "\n";
  } else {
    std::printf("%llu\n", static_cast<unsigned long long>((*buffer)->id()));
  }
  return kOk;
}

int Free(Client& c, const Args& a) {
  uint64_t id = 0;
  if (a.words.size() != 1 || !absl::SimpleAtoi(a.words[0], &id))
    return Usage("free needs a buffer ID");
  absl::Status s = c.Free(id);
  return s.ok() ? kOk : Fail(s);
}

// put and get stage the file in a buffer of this session (not persist): freed here, or by the
// agent when ferryctl dies half-way.
int Put(Client& c, const Args& a) {
  std::string node, remote;
  if (a.words.size() != 1) return Usage("put needs FILE");
  if (!SplitTarget(a.to, &node, &remote)) return Usage("put needs --to NODE:BUFFER");
  if (a.length) return Usage("put writes all of FILE; --length is for get");
  UniqueFd fd(open(a.words[0].c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st = {};
  if (!fd.valid() || fstat(fd.get(), &st) != 0) {
    return Fail(absl::ErrnoToStatus(errno, absl::StrCat("open(", a.words[0], ")")));
  }
  if (st.st_size == 0)
    return Fail(absl::InvalidArgumentError(absl::StrCat(a.words[0], " is empty")));
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
  auto result = RunTransfer(
      c, RangeOps(ferry::v1::WRITE, (*buffer)->id(), node, remote, a.offset.value_or(0), size),
      a.timeout.value_or(TransferTimeout(size)));
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
  const uint64_t offset = a.offset.value_or(0);
  uint64_t length = 0;
  if (a.length) {
    if (*a.length == 0) return Usage("--length must be positive");
    length = *a.length;  // a range past the end is the agent's to refuse, with its message
  } else {
    auto size = c.StatRemoteBuffer(node, remote);
    if (!size.ok()) return Fail(size.status());
    if (offset >= *size) {
      return Fail(absl::OutOfRangeError(absl::StrCat(
          "--offset ", offset, " is not inside ", a.words[0], " (", FormatByteSize(*size), ")")));
    }
    length = *size - offset;
  }
  auto buffer = c.Alloc(length);
  if (!buffer.ok()) return Fail(buffer.status());
  auto result =
      RunTransfer(c, RangeOps(ferry::v1::READ, (*buffer)->id(), node, remote, offset, length),
                  a.timeout.value_or(TransferTimeout(length)));
  absl::Status s = result.ok() ? TransferStatus(*result) : result.status();
  if (s.ok()) {
    UniqueFd fd(open(a.words[1].c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd.valid()) s = absl::ErrnoToStatus(errno, absl::StrCat("open(", a.words[1], ")"));
    for (uint64_t done = 0; s.ok() && done < length;) {
      ssize_t n = write(fd.get(), (*buffer)->data() + done, length - done);
      if (n <= 0) s = absl::ErrnoToStatus(errno, absl::StrCat("write(", a.words[1], ")"));
      else done += static_cast<uint64_t>(n);
    }
  }
  c.Free((*buffer)->id()).IgnoreError();
  if (!s.ok()) return Fail(s);
  PrintResult("read", *result, absl::StrCat("from ", a.words[0]));
  return kOk;
}

int Cancel(Client& c, const Args& a) {
  uint64_t id = 0;
  if (a.words.size() != 1 || !absl::SimpleAtoi(a.words[0], &id)) {
    return Usage("cancel needs a TRANSFER_ID");
  }
  auto result = c.Cancel(id);
  if (!result.ok()) return Fail(result.status());
  if (a.json) {
    std::cout << client::ProtoToJson(*result) << "\n";
    return kOk;
  }
  // A transfer that had ended already is left as it was: its state says how it ended.
  std::string why;
  if (result->state() == ferry::v1::FAILED) {
    why =
        absl::StrCat(" (", absl::StatusCodeToString(static_cast<absl::StatusCode>(result->code())),
                     ": ", result->message(), ")");
  }
  std::printf("transfer %llu %s%s: %llu of %llu ops succeeded, %s moved\n",
              static_cast<unsigned long long>(id),
              ferry::v1::TransferState_Name(result->state()).c_str(), why.c_str(),
              static_cast<unsigned long long>(result->ops_succeeded()),
              static_cast<unsigned long long>(result->ops_total()),
              FormatByteSize(result->bytes()).c_str());
  return kOk;
}

// `ferryctl topo`: without a file to read, the running agent's plan is the truth (it reflects
// the policy the agent runs under now). With no agent, or --help, read this machine.
int Topo(const CommandLine& cl) {
  bool offline = cl.help;
  for (const auto& w : cl.rest) {
    offline |= absl::StartsWith(w, "--topology") || absl::StartsWith(w, "--config");
  }
  if (!offline) {
    if (auto c = Client::Connect(cl.socket, absl::Milliseconds(300), "ferryctl"); c.ok()) {
      ferry::v1::GetTopologyResponse topo;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      if ((*c)->stub().GetTopology(&ctx, {}, &topo).ok()) {
        bool json = std::find(cl.rest.begin(), cl.rest.end(), "--json") != cl.rest.end();
        std::cout << (json ? topo.json() : topo.text());
        return kOk;
      }
    }
  }
  return client::RunTopoCommand(cl.rest, std::cout, std::cerr);
}

// `ferryctl certs ca|node`: offline, with client/certs_command.h.
int Certs(const Args& a) {
  constexpr const char* kForms = "certs ca --out DIR | certs node NAME --ca DIR --out DIR";
  const std::string what = a.words.empty() ? "" : a.words[0];
  if (what != "ca" && what != "node") {
    return Usage(absl::StrCat("certs needs ca or node: ", kForms));
  }
  if (a.out.empty()) return Usage(absl::StrCat("certs ", what, " needs --out DIR"));
  const uint64_t days = a.days.value_or(365);
  if (days < 1 || days > 36500) return Usage("--days must be 1..36500");
  // "dir/" and "dir" are one folder; the files are named under it.
  auto folder = [](std::string dir) {
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    return dir;
  };
  absl::StatusOr<std::string> made;
  if (what == "ca") {
    if (a.words.size() != 1 || !a.ca.empty()) {
      return Usage("certs ca takes only --out DIR [--days N]");
    }
    made = client::MakeCertificateAuthority(folder(a.out), static_cast<int>(days));
  } else {
    if (a.words.size() != 2) return Usage(absl::StrCat("certs node needs one NAME: ", kForms));
    if (a.ca.empty()) return Usage("certs node needs --ca DIR (made by ferryctl certs ca)");
    made = client::MakeNodeCertificate(a.words[1], folder(a.ca), folder(a.out),
                                       static_cast<int>(days));
  }
  if (!made.ok()) return Fail(made.status());
  std::cout << *made;
  return kOk;
}

int Main(int argc, char** argv) {
  CommandLine cl;
  cl.socket = DefaultAgentSocket();
  const std::vector<std::string> argl(argv + 1, argv + argc);
  if (std::string problem = ScanCommandLine(argl, cl); !problem.empty()) {
    return Usage(problem);
  }
  if (cl.version) {
    std::printf("ferryctl %s\n", kFerryVersion);
    return kOk;
  }
  if (cl.command == "topo") return Topo(cl);
  if (cl.command == "doctor") return client::RunDoctorCommand(cl.rest, std::cout, std::cerr);
  if (cl.help || cl.command == "help") {
    std::cout << kUsageText;
    return kOk;
  }
  if (cl.command.empty()) {
    std::cerr << kUsageText;
    return kUsage;
  }
  if (cl.command == "certs") {
    Args a;
    if (std::string problem = ParseArgs(cl.rest, a); !problem.empty()) return Usage(problem);
    return Certs(a);
  }

  using Handler = int (*)(Client&, const Args&);
  const std::pair<const char*, Handler> kCommands[] = {
      {"info", Info}, {"buffers", Buffers}, {"alloc", Alloc},   {"free", Free},
      {"put", Put},   {"get", Get},         {"cancel", Cancel}, {"policy", Policy},
      {"nics", Nics},  {"peers", Peers},     {"transfers", Transfers}, {"stats", Stats}};
  for (const auto& [name, handler] : kCommands) {
    if (cl.command != name) continue;
    Args a;
    if (std::string problem = ParseArgs(cl.rest, a); !problem.empty()) return Usage(problem);
    auto client = Client::Connect(cl.socket, absl::Seconds(3), "ferryctl");
    if (!client.ok()) {
      // The message names the socket tried and how to point at another one.
      std::cerr << "ferryctl: " << client.status().message() << "\n";
      return kNoAgent;
    }
    return handler(**client, a);
  }
  return UnknownCommand(cl.command);
}

}  // namespace
}  // namespace ferry::ctl

int main(int argc, char** argv) { return ferry::ctl::Main(argc, argv); }
