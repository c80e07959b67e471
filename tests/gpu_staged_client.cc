// The client of tests/gpu/agent_run.sh: two agents on one machine move GPU buffers to each
// other through the staged path, as an application would drive them. It allocates a GPU
// buffer on each agent, maps them by CUDA IPC (libferry's Buffer::Map), fills the source
// through its mapping, WRITEs node A -> node B and READs back B -> A, and checks every result
// by checksum through the receiving side's mapping. Bytes go in and out of GPU memory by the
// CUDA copy engine, never by the CPU; with simulated GPUs (a dry run without a GPU) the
// mapping is shared host memory and plain memcpy does.
//
//   gpu_staged_client --a SOCKET --b SOCKET [--device cuda:0] [--size 512MiB] [--repeat 3]
//                     [--json FILE]
//   gpu_staged_client --probe        is there a CUDA GPU here? (exit 77 and why, if not)
// Every transfer's legs must be "staged". Exits 0 when all went well, 1 when something
// failed (it says what), 2 on a usage error.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/byte_size.h"
#include "base/checksum.h"
#include "base/json_writer.h"
#include "base/status_macros.h"
#include "client/ferry_client.h"
#include "client/gpu_mapping.h"
#include "transport/memory/gpu_copy_wait.h"
#include "transport/memory/gpu_device.h"

namespace ferry {
namespace {

struct Options {
  std::string socket_a, socket_b, device = "cuda:0", json;
  uint64_t size = 512ull << 20;
  int repeat = 3;
  bool probe = false;
};

bool Parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--probe") {
      o->probe = true;
      continue;
    }
    if (i + 1 >= argc) return false;
    std::string v = argv[++i];
    if (a == "--a") {
      o->socket_a = v;
    } else if (a == "--b") {
      o->socket_b = v;
    } else if (a == "--device") {
      o->device = v;
    } else if (a == "--json") {
      o->json = v;
    } else if (a == "--size") {
      auto n = ParseByteSize(v);
      if (!n.ok() || *n == 0) return false;
      o->size = *n;
    } else if (a == "--repeat") {
      o->repeat = std::atoi(v.c_str());
      if (o->repeat < 1) return false;
    } else {
      return false;
    }
  }
  return o->probe || (!o->socket_a.empty() && !o->socket_b.empty());
}

// --probe: whether CUDA sees a GPU, asked the way ferryd's gpu.backend: cuda asks. 0 and
// what it found, or kSkip and why not.
constexpr int kSkip = 77;
int Probe() {
  auto gpus = memory::CreateCudaGpus();
  if (!gpus.ok()) {
    const bool built_without = gpus.status().code() == absl::StatusCode::kUnimplemented;
    std::printf("%s: %s\n", built_without ? "built without CUDA" : "no CUDA GPU",
                std::string(gpus.status().message()).c_str());
    return kSkip;
  }
  if (gpus->empty()) {
    std::printf("no CUDA GPU: the CUDA driver sees no GPU\n");
    return kSkip;
  }
  std::printf("gpu_staged_client: %zu CUDA GPU(s); GPU 0 at %s\n", gpus->size(),
              (*gpus)[0]->pci().c_str());
  return 0;
}

// Moves bytes between this process's host memory and mapped agent buffers: the CUDA copy
// engine for CUDA IPC mappings (device addresses), memcpy for the simulation's shared memory.
class Copier {
 public:
  // `gpu`: this process's GPU holding the buffers, or nullptr for simulated GPUs.
  explicit Copier(memory::GpuDevice* gpu) : gpu_(gpu) {}

  absl::Status ToHost(void* host, const Buffer& b, uint64_t n) {
    if (gpu_ == nullptr) {
      std::memcpy(host, b.data(), n);
      return absl::OkStatus();
    }
    return memory::CopyAndWait(*gpu_, true, host, b.data(), n);
  }
  absl::Status ToBuffer(const Buffer& b, const void* host, uint64_t n) {
    if (gpu_ == nullptr) {
      std::memcpy(b.data(), host, n);
      return absl::OkStatus();
    }
    return memory::CopyAndWait(*gpu_, false, b.data(), host, n);
  }

 private:
  memory::GpuDevice* gpu_;
};

// Fills `p` with a pattern that differs at every 8-byte word (splitmix64 of the position), so a
// misplaced chunk changes the checksum.
void FillWords(char* p, uint64_t n, uint64_t seed) {
  for (uint64_t i = 0; i < n; i += 8) {
    uint64_t z = seed + (i / 8 + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    std::memcpy(p + i, &z, std::min<uint64_t>(8, n - i));
  }
}

// Host memory for the copies, pinned on `gpu` (full-speed DMA) when it can be.
class HostBytes {
 public:
  HostBytes(memory::GpuDevice* gpu, uint64_t n) : gpu_(gpu), bytes_(n) {
    pinned_ = gpu_ != nullptr && gpu_->PinHost(bytes_.data(), n).ok();
  }
  ~HostBytes() {
    if (pinned_) gpu_->UnpinHost(bytes_.data());
  }
  char* data() { return bytes_.data(); }

 private:
  memory::GpuDevice* gpu_;
  std::vector<char> bytes_;
  bool pinned_ = false;
};

struct Measured {
  std::vector<double> gbps;  // by wall clock around Client::Run, one per run
  std::vector<std::string> legs;
  std::string checksum;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// "local staged (reason), remote staged (reason)" for a result's op 0, or why not staged.
absl::Status CheckStaged(const ferry::v1::TransferResult& r, std::vector<std::string>* legs) {
  if (r.ops_size() == 0) return absl::InternalError("the result has no ops");
  legs->clear();
  for (const auto& leg : r.ops(0).legs()) {
    legs->push_back(absl::StrCat(leg.side(), " ", leg.device(), " ", leg.mode(), " over ",
                                 leg.provider(), " (", leg.reason(), ")"));
    if (leg.mode() != "staged") {
      return absl::FailedPreconditionError(absl::StrCat(
          "the ", leg.side(), " leg went ", leg.mode(), ", not staged: ", leg.reason()));
    }
  }
  if (legs->size() != 2) return absl::InternalError("the result does not have two legs");
  return absl::OkStatus();
}

class Run {
 public:
  explicit Run(const Options& o) : o_(o) {}

  int Main() {
    absl::Status s = Go();
    if (!s.ok()) {
      std::printf("gpu_staged_client: FAILED: %s\n", s.ToString().c_str());
      return 1;
    }
    return 0;
  }

 private:
  absl::Status Go() {
    auto ca = Client::Connect(o_.socket_a, absl::Seconds(5), "gpu_staged_client");
    if (!ca.ok()) return Where(ca.status(), o_.socket_a, "connect");
    auto cb = Client::Connect(o_.socket_b, absl::Seconds(5), "gpu_staged_client");
    if (!cb.ok()) return Where(cb.status(), o_.socket_b, "connect");
    auto ia = (*ca)->GetInfo();
    auto ib = (*cb)->GetInfo();
    if (!ia.ok()) return ia.status();
    if (!ib.ok()) return ib.status();
    const std::string node_a = ia->node(), node_b = ib->node();
    const std::string dst_name = "gpu-staged-client-dst";

    // Freed when this client's sessions end, whatever happens below.
    auto src = (*ca)->Alloc(o_.size, "", o_.device);
    if (!src.ok()) return Where(src.status(), node_a, "alloc source");
    auto back = (*ca)->Alloc(o_.size, "", o_.device);
    if (!back.ok()) return Where(back.status(), node_a, "alloc READ destination");
    auto dst = (*cb)->Alloc(o_.size, dst_name, o_.device);
    if (!dst.ok()) return Where(dst.status(), node_b, "alloc WRITE destination");
    const std::string backend = (*src)->info().backend();
    const std::string pci = (*src)->info().gpu().pci();
    std::printf("gpu_staged_client: %s %s (%s%s) <-> %s %s (%s), %s, %d run(s) each way\n",
                node_a.c_str(), o_.device.c_str(), backend.c_str(),
                pci.empty() ? "" : (", " + pci).c_str(), node_b.c_str(), o_.device.c_str(),
                (*dst)->info().backend().c_str(), FormatByteSize(o_.size).c_str(), o_.repeat);

    std::vector<std::unique_ptr<memory::GpuDevice>> gpus;
    memory::GpuDevice* gpu = nullptr;
    if (backend == "cuda") {
      auto created = memory::CreateCudaGpus();
      if (!created.ok()) return created.status();
      gpus = *std::move(created);
      auto ordinal = CudaDeviceByPci((*src)->info().gpu().pci());
      if (!ordinal.ok()) return ordinal.status();
      if (static_cast<size_t>(*ordinal) >= gpus.size()) {
        return absl::NotFoundError(absl::StrCat("this process sees no CUDA device ", *ordinal));
      }
      gpu = gpus[*ordinal].get();
    } else if (backend != "sim") {
      return absl::FailedPreconditionError(
          absl::StrCat(o_.device, " on ", node_a, " has backend '", backend, "'"));
    }
    Copier copier(gpu);
    HostBytes expected(gpu, o_.size), scratch(gpu, o_.size), zeros(gpu, o_.size);
    std::memset(zeros.data(), 0, o_.size);
    FillWords(expected.data(), o_.size, 0x5eed);
    const uint64_t want = Checksum(expected.data(), o_.size);
    // The source's checksum as its mapping reads back, so the fill itself is checked too.
    RETURN_IF_ERROR(copier.ToBuffer(**src, expected.data(), o_.size));
    RETURN_IF_ERROR(Verify(copier, **src, scratch.data(), expected.data(), want, "source fill"));

    Measured write, read;
    for (int r = 0; r < o_.repeat; ++r) {
      RETURN_IF_ERROR(copier.ToBuffer(**dst, zeros.data(), o_.size));
      RETURN_IF_ERROR(Transfer({ferry::v1::WRITE, (*src)->id(), 0, node_b, dst_name, 0, o_.size},
                               **ca, &write));
      RETURN_IF_ERROR(Verify(copier, **dst, scratch.data(), expected.data(), want,
                             absl::StrCat("WRITE ", node_a, " -> ", node_b, " run ", r + 1)));
      RETURN_IF_ERROR(copier.ToBuffer(**back, zeros.data(), o_.size));
      RETURN_IF_ERROR(
          Transfer({ferry::v1::READ, (*back)->id(), 0, node_b, dst_name, 0, o_.size}, **ca, &read));
      RETURN_IF_ERROR(Verify(copier, **back, scratch.data(), expected.data(), want,
                             absl::StrCat("READ ", node_b, " -> ", node_a, " run ", r + 1)));
    }
    write.checksum = read.checksum = absl::StrFormat("%016x", want);
    Report("WRITE", node_a, node_b, write);
    Report("READ", node_b, node_a, read);
    if (!o_.json.empty()) WriteJson(backend, write, read);
    return absl::OkStatus();
  }

  // `s`, saying where (an agent's node or socket) and what failed.
  static absl::Status Where(const absl::Status& s, const std::string& where,
                            const std::string& what) {
    return absl::Status(s.code(), absl::StrCat(where, ": ", what, ": ", s.message()));
  }

  // One op, timed by wall clock, checked to have succeeded through staged legs.
  absl::Status Transfer(const OpSpec& op, Client& client, Measured* m) {
    auto start = std::chrono::steady_clock::now();
    auto r = client.Run({op}, absl::Seconds(120), /*include_ops=*/true);
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!r.ok()) return r.status();
    RETURN_IF_ERROR(TransferStatus(*r));
    RETURN_IF_ERROR(CheckStaged(*r, &m->legs));
    m->gbps.push_back(static_cast<double>(o_.size) / seconds / 1e9);
    return absl::OkStatus();
  }

  // Reads `b` back through its mapping and compares checksums; on a mismatch, says where.
  absl::Status Verify(Copier& copier, const Buffer& b, char* scratch, const char* expected,
                      uint64_t want, const std::string& what) {
    RETURN_IF_ERROR(copier.ToHost(scratch, b, o_.size));
    uint64_t got = Checksum(scratch, o_.size);
    if (got == want) return absl::OkStatus();
    uint64_t at = 0;
    while (at < o_.size && scratch[at] == expected[at]) ++at;
    return absl::DataLossError(absl::StrFormat(
        "%s: checksum %016x, expected %016x; first wrong byte at offset %d of buffer %d", what, got,
        want, at, b.id()));
  }

  void Report(const char* op, const std::string& from, const std::string& to, const Measured& m) {
    std::printf("%-5s %s -> %s: staged, median %.2f GB/s, best %.2f GB/s, checksum %s ok\n", op,
                from.c_str(), to.c_str(), Median(m.gbps),
                *std::max_element(m.gbps.begin(), m.gbps.end()), m.checksum.c_str());
    for (const auto& leg : m.legs) std::printf("      %s\n", leg.c_str());
  }

  void WriteJson(const std::string& backend, const Measured& write, const Measured& read) {
    JsonWriter json;
    json.BeginObject()
        .Key("backend")
        .String(backend)
        .Key("device")
        .String(o_.device)
        .Key("bytes")
        .Uint(o_.size)
        .Key("repeat")
        .Int(o_.repeat);
    auto direction = [&](const char* key, const Measured& m) {
      json.Key(key)
          .BeginObject()
          .Key("median_gbps")
          .Double(Median(m.gbps))
          .Key("best_gbps")
          .Double(*std::max_element(m.gbps.begin(), m.gbps.end()))
          .Key("checksum")
          .String(m.checksum)
          .Key("legs")
          .BeginArray();
      for (const auto& leg : m.legs) json.String(leg);
      json.EndArray().EndObject();
    };
    direction("write", write);
    direction("read", read);
    json.EndObject();
    std::ofstream(o_.json) << json.str() << "\n";
  }

  const Options& o_;
};

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  ferry::Options o;
  if (!ferry::Parse(argc, argv, &o)) {
    std::fprintf(stderr,
                 "usage: gpu_staged_client --a SOCKET --b SOCKET [--device cuda:N] [--size BYTES] "
                 "[--repeat N] [--json FILE] | --probe\n");
    return 2;
  }
  if (o.probe) return ferry::Probe();
  return ferry::Run(o).Main();
}
