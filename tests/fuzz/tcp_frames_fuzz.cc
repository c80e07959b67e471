// Fuzzes the tcp provider's target side with the bytes a peer sends on a data connection: a
// real IncomingConnection on a real EventLoop, its socket one end of a socketpair, against a
// RegionTable with two small regions (read-write, and read-only). The input is the whole byte
// stream (hello frame, request headers, WRITE payloads), sent and then half-closed; what
// comes back is checked against a model of the wire contract in wire.h:
//  - no byte outside a region is read or written (each region is its own heap block, so ASan
//    sees any access beyond it; the kernel's copies are checked by its recv/sendmsg hooks);
//  - a connection whose first frame is not a hello of this kWireVersion presenting the live
//    session's secret answers nothing and touches nothing;
//  - answers come in request order, carry the request id, and refuse exactly what the region
//    table must refuse (unknown key, out of bounds, wrong access: one code; unknown op), after
//    which nothing more is answered or written (the target ends the connection);
//  - a READ returns the bytes the region holds after the WRITEs before it;
//  - a kWriteList answers kBadOp for a table that cannot be trusted, is refused when a piece
//    leaves the region, and otherwise lands its pieces in table order;
//  - what came back is a prefix of the model's answers: WRITE acks wait to be coalesced, and
//    a connection that reads the end of the stream (or a bad header) closes without sending
//    the ones still waiting. ferry's initiator never half-closes, so only a peer that has
//    left loses them.
// Region keys are random (RegionTable::Add), so inputs name the two regions by the
// placeholders "KEY1" and "KEY2" (little-endian u32 fields), which this harness replaces
// with the real keys before sending; likewise a first header whose id is "SESSION!" gets the
// session and secret of a ticket issued for this input (SessionSecrets::Issue), as a peer's
// hello carries what its Connect call returned.

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "spdlog/spdlog.h"
#include "transport/fabric.h"
#include "transport/tcp/event_loop.h"
#include "transport/tcp/incoming_connection.h"
#include "transport/tcp/session_secrets.h"
#include "transport/tcp/region_table.h"
#include "transport/tcp/wire.h"

namespace ferry::tcp {
namespace {

constexpr uint64_t kRegionBytes = 4096;
// What peers put in requests for byte 0 of each region (any number: only the table reads it).
constexpr uint64_t kRwAddress = 0x10000000;
constexpr uint64_t kRoAddress = 0x20000000;
constexpr uint32_t kPlaceholderRw = 0x3159454b;  // "KEY1"
constexpr uint32_t kPlaceholderRo = 0x3259454b;  // "KEY2"
constexpr uint64_t kPlaceholderSession = 0x214e4f4953534553;  // "SESSION!"

[[noreturn]] void Fail(const char* what) {
  fprintf(stderr, "tcp_frames_fuzz: %s\n", what);
  abort();
}

struct Region {
  uint64_t address;
  uint32_t access;
  uint32_t key;
  std::unique_ptr<char[]> memory;  // exactly kRegionBytes: ASan guards both ends
};

struct World {
  std::unique_ptr<EventLoop> loop;
  RegionTable table;
  ServedCounters served;
  SessionSecrets sessions;
  AdmissionCounters admission;
  Region rw{kRwAddress, fabric::kRemoteWrite | fabric::kRemoteRead, 0, nullptr};
  Region ro{kRoAddress, fabric::kRemoteRead, 0, nullptr};
};

World& TheWorld() {
  static World* world = [] {
    spdlog::set_level(spdlog::level::off);  // each refused connection logs a warning
    auto* w = new World;
    auto loop = EventLoop::Create("fuzz-in");
    if (!loop.ok()) Fail("cannot create the event loop");
    w->loop = std::move(*loop);
    for (Region* r : {&w->rw, &w->ro}) {
      r->memory.reset(new char[kRegionBytes]);
      auto key = w->table.Add(reinterpret_cast<const char*>(r->address), r->memory.get(),
                              kRegionBytes, r->access);
      if (!key.ok()) Fail("cannot add a region");
      r->key = *key;
    }
    return w;
  }();
  return *world;
}

char Pattern(uint64_t i, uint64_t address) { return static_cast<char>((i * 7 + address) % 251); }

// The model: what the target must answer for `stream`, and the regions' bytes afterwards.
struct Expected {
  std::string answers;  // response headers and READ payloads, in order
  uint32_t notifies = 0;
  std::vector<char> rw, ro;  // the regions' bytes after the stream
};

void Answer(Expected& e, uint64_t id, Refusal refusal) {
  const ResponseHeader r = {kResponseMagic, refusal, id, 0};
  e.answers.append(reinterpret_cast<const char*>(&r), sizeof(r));
}

// A kWriteList (wire.h) whose header `h` ended at `at`: its table, checks and pieces. False
// when the connection ends here (a refusal, or the stream ran out).
bool ModelWriteList(const std::string& stream, size_t& at, const RequestHeader& h, const World& w,
                    Expected& e) {
  if (h.imm == 0 || h.imm > kMaxWirePieces) {
    Answer(e, h.id, Refusal::kBadOp);
    return false;
  }
  std::vector<WirePiece> table(h.imm);
  const size_t table_bytes = table.size() * sizeof(WirePiece);
  if (stream.size() - at < table_bytes) return false;  // cut short: nothing answered
  memcpy(table.data(), stream.data() + at, table_bytes);
  at += table_bytes;
  // Framing, in 128-bit arithmetic: no piece empty, none past 2^64, the sum is the length.
  unsigned __int128 total = 0;
  uint64_t low = UINT64_MAX, high = 0;
  for (const WirePiece& p : table) {
    const unsigned __int128 end = static_cast<unsigned __int128>(h.address) + p.offset + p.length;
    if (p.length == 0 || end > UINT64_MAX) {
      Answer(e, h.id, Refusal::kBadOp);
      return false;
    }
    total += p.length;
    low = std::min(low, p.offset);
    high = std::max(high, p.offset + p.length);
  }
  if (total != h.length) {
    Answer(e, h.id, Refusal::kBadOp);
    return false;
  }
  const Region* region = h.key == w.rw.key ? &w.rw : h.key == w.ro.key ? &w.ro : nullptr;
  if (region == nullptr || (region->access & fabric::kRemoteWrite) == 0 ||
      h.address + low < region->address || h.address + high - region->address > kRegionBytes) {
    Answer(e, h.id, Refusal::kRefused);
    return false;
  }
  // Pieces land as they arrive, in table order; a stream cut short leaves the rest unwritten.
  std::vector<char>& bytes = region == &w.rw ? e.rw : e.ro;
  for (const WirePiece& p : table) {
    const uint64_t have = std::min<uint64_t>(p.length, stream.size() - at);
    memcpy(bytes.data() + (h.address + p.offset - region->address), stream.data() + at, have);
    at += have;
    if (have < p.length) return false;
  }
  Answer(e, h.id, Refusal::kNone);
  return true;
}

Expected Model(const std::string& stream, const World& w, const SessionTicket& ticket) {
  Expected e;
  e.rw.resize(kRegionBytes);
  e.ro.resize(kRegionBytes);
  for (uint64_t i = 0; i < kRegionBytes; ++i) {
    e.rw[i] = Pattern(i, kRwAddress);
    e.ro[i] = Pattern(i, kRoAddress);
  }
  size_t at = 0;
  auto next = [&](RequestHeader& h) {
    if (stream.size() - at < sizeof(h)) return false;
    memcpy(&h, stream.data() + at, sizeof(h));
    at += sizeof(h);
    return true;
  };
  RequestHeader h;
  if (!next(h) || h.magic != kRequestMagic || h.op != WireOp::kHello || h.imm != kWireVersion) {
    return e;
  }
  const SessionTicket shown = TicketOfHello(h);
  if (shown.session != ticket.session || shown.secret != ticket.secret) return e;
  while (next(h)) {
    if (h.magic != kRequestMagic) return e;  // dropped, unanswered
    ResponseHeader r = {kResponseMagic, Refusal::kNone, h.id, 0};
    if (h.op == WireOp::kWriteList) {
      if (!ModelWriteList(stream, at, h, w, e)) return e;
      continue;
    }
    const bool write = h.op == WireOp::kWrite || h.op == WireOp::kWriteImm;
    if (!write && h.op != WireOp::kRead) {
      r.refusal = Refusal::kBadOp;
      e.answers.append(reinterpret_cast<const char*>(&r), sizeof(r));
      return e;  // closed after the answer
    }
    const Region* region = h.key == w.rw.key ? &w.rw : h.key == w.ro.key ? &w.ro : nullptr;
    std::vector<char>* bytes = region == &w.rw ? &e.rw : &e.ro;
    const uint32_t need = write ? fabric::kRemoteWrite : fabric::kRemoteRead;
    if (region == nullptr || h.address < region->address ||
        h.address - region->address > kRegionBytes ||
        h.length > kRegionBytes - (h.address - region->address) ||
        (region->access & need) != need) {
      // One answer whatever the reason; the connection ends after it.
      r.refusal = Refusal::kRefused;
      e.answers.append(reinterpret_cast<const char*>(&r), sizeof(r));
      return e;
    }
    const uint64_t offset = region ? h.address - region->address : 0;
    if (write) {
      // A payload lands as it arrives, straight into the region: one the stream cut short
      // has landed in part, with no ack and no notification.
      const uint64_t have = std::min<uint64_t>(h.length, stream.size() - at);
      memcpy(bytes->data() + offset, stream.data() + at, have);
      if (have < h.length) return e;
      if (h.op == WireOp::kWriteImm) ++e.notifies;
      at += h.length;
      e.answers.append(reinterpret_cast<const char*>(&r), sizeof(r));
      continue;
    }
    r.length = h.length;
    e.answers.append(reinterpret_cast<const char*>(&r), sizeof(r));
    e.answers.append(bytes->data() + offset, h.length);
  }
  return e;
}

// Sends `stream` on `fd`, half-closes, and returns everything read until the target closes.
std::string Exchange(int fd, const std::string& stream) {
  std::string got;
  size_t sent = 0;
  bool writing = true;
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (true) {
    if (writing && sent == stream.size()) {
      shutdown(fd, SHUT_WR);
      writing = false;
    }
    pollfd p = {fd, static_cast<short>(POLLIN | (writing ? POLLOUT : 0)), 0};
    if (poll(&p, 1, 1000) < 0 && errno != EINTR) Fail("poll failed");
    if (absl::Now() > give_up) Fail("the connection neither answered nor closed in 20 s");
    if (writing && (p.revents & POLLOUT)) {
      ssize_t n = send(fd, stream.data() + sent, stream.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) sent += static_cast<size_t>(n);
      if (n < 0 && errno != EAGAIN && errno != EINTR) writing = false;  // the target closed
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      char buf[16384];
      ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n == 0) return got;
      if (n > 0) got.append(buf, static_cast<size_t>(n));
      if (n < 0 && errno != EAGAIN && errno != EINTR) return got;  // reset by the target
    }
  }
}

}  // namespace
}  // namespace ferry::tcp

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ferry::tcp;
  World& w = TheWorld();
  std::string stream(reinterpret_cast<const char*>(data), size);
  // A session per input: one socket, spent by this connection's hello.
  auto ticket = w.sessions.Issue({"fuzz", 1}, 1);
  if (!ticket.ok()) Fail("no random bytes for a session");
  if (stream.size() >= sizeof(RequestHeader)) {
    RequestHeader first;
    memcpy(&first, stream.data(), sizeof(first));
    if (first.id == kPlaceholderSession) {
      const RequestHeader hello = MakeHello(*ticket);
      first.id = hello.id;
      first.address = hello.address;
      first.length = hello.length;
      memcpy(stream.data(), &first, sizeof(first));
    }
  }
  for (size_t i = sizeof(RequestHeader); i + 4 <= stream.size(); ++i) {
    uint32_t v;
    memcpy(&v, stream.data() + i, 4);
    if (v == kPlaceholderRw) memcpy(stream.data() + i, &w.rw.key, 4);
    if (v == kPlaceholderRo) memcpy(stream.data() + i, &w.ro.key, 4);
  }
  for (uint64_t i = 0; i < kRegionBytes; ++i) {
    w.rw.memory[i] = Pattern(i, kRwAddress);
    w.ro.memory[i] = Pattern(i, kRoAddress);
  }
  const Expected expected = Model(stream, w, *ticket);

  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) != 0) {
    Fail("socketpair failed");
  }
  ferry::UniqueFd ours(fds[0]);
  uint32_t notifies = 0;  // loop thread only, read after `closed`
  absl::Notification closed;
  IncomingConnection::Target target;
  target.regions = &w.table;
  target.notify = [&notifies](uint32_t) { ++notifies; };
  target.closed = [&closed](IncomingConnection*) { closed.Notify(); };
  target.served = &w.served;
  target.sessions = &w.sessions;
  target.admission = &w.admission;
  auto conn = std::make_shared<IncomingConnection>(ferry::UniqueFd(fds[1]), "fuzz", w.loop.get(),
                                                   std::move(target));
  w.loop->Post([conn] { conn->Start(absl::Seconds(10)); });
  const std::string got = Exchange(ours.get(), stream);
  if (!closed.WaitForNotificationWithTimeout(absl::Seconds(20)))
    Fail("the connection never closed");
  conn.reset();

  if (got.size() > expected.answers.size() || expected.answers.compare(0, got.size(), got) != 0) {
    fprintf(stderr, "answers: %zu bytes, expected %zu\n", got.size(), expected.answers.size());
    Fail("the answers differ from the wire contract");
  }
  if (notifies != expected.notifies) Fail("WRITE_IMM notifications differ");
  if (memcmp(w.rw.memory.get(), expected.rw.data(), kRegionBytes) != 0) {
    Fail("the read-write region holds other bytes than the accepted WRITEs put there");
  }
  if (memcmp(w.ro.memory.get(), expected.ro.data(), kRegionBytes) != 0) {
    Fail("a read-only region was written");
  }
  return 0;
}
