// test-rdma's small-WRITE latency driver (guest-perf.sh): one client, kept connected, WRITEs
// the same few bytes of one buffer into the peer's named buffer again and again, as
// ib_write_lat posts its writes on one connected QP, and prints the median and the tail of
// what each Client::Write took as this program saw it (submit to settled, over the agent's
// transfer socket). `ferryctl put` of 4 KiB measures something else: a new process, a new
// session, a file read and a buffer allocated for every op.
//
//   rdma_write_latency --peer node-b --buffer buf [--bytes 4096] [--count 200] [--warmup 20]
//
// Prints one line, `latency n=N bytes=B median_us=M p90_us=P min_us=L`, and exits 0; on a
// failed write, `error <status>` and exits 1; 2 on a usage error.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/byte_size.h"
#include "base/status_macros.h"
#include "client/ferry_client.h"

namespace ferry {
namespace {

struct Options {
  std::string peer, buffer;
  uint64_t bytes = 4096, count = 200, warmup = 20;
};

bool Parse(int argc, char** argv, Options* o) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--peer") {
      o->peer = value;
    } else if (key == "--buffer") {
      o->buffer = value;
    } else if (key == "--bytes" && ParseByteSize(value).ok()) {
      o->bytes = *ParseByteSize(value);
    } else if (key == "--count" && absl::SimpleAtoi(value, &o->count)) {
    } else if (key == "--warmup" && absl::SimpleAtoi(value, &o->warmup)) {
    } else {
      return false;
    }
  }
  return argc % 2 == 1 && !o->peer.empty() && !o->buffer.empty() && o->bytes >= 1 &&
         o->count >= 1;
}

// The `q` quantile (0..1) of sorted `v`: the element at rank ceil(q * n).
double Quantile(const std::vector<double>& v, double q) {
  size_t rank = static_cast<size_t>(q * static_cast<double>(v.size()) + 0.999999);
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

absl::Status Measure(const Options& o) {
  ASSIGN_OR_RETURN(auto client, Client::Connect());
  ASSIGN_OR_RETURN(auto buffer, client->Alloc(o.bytes));
  std::memset(buffer->data(), 0x5a, o.bytes);
  // The first writes open the connection to the peer and resolve its buffer: not latency.
  for (uint64_t i = 0; i < o.warmup; ++i) {
    RETURN_IF_ERROR(client->Write(*buffer, 0, o.peer, o.buffer, 0, o.bytes));
  }
  std::vector<double> us;
  us.reserve(o.count);
  for (uint64_t i = 0; i < o.count; ++i) {
    const absl::Time start = absl::Now();
    RETURN_IF_ERROR(client->Write(*buffer, 0, o.peer, o.buffer, 0, o.bytes));
    us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
  }
  std::sort(us.begin(), us.end());
  std::printf("latency n=%zu bytes=%llu median_us=%.1f p90_us=%.1f min_us=%.1f\n", us.size(),
              static_cast<unsigned long long>(o.bytes), Quantile(us, 0.5), Quantile(us, 0.9),
              us.front());
  return absl::OkStatus();
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  ferry::Options o;
  if (!ferry::Parse(argc, argv, &o)) {
    std::fprintf(stderr,
                 "usage: rdma_write_latency --peer NODE --buffer NAME [--bytes SIZE] "
                 "[--count N] [--warmup N]\n");
    return 2;
  }
  const absl::Status s = ferry::Measure(o);
  if (!s.ok()) {
    std::fprintf(stderr, "rdma_write_latency: %s\n", s.ToString().c_str());
    std::printf("error %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
