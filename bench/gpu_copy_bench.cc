// ferry-gpu-bench: what staging through host memory costs on this GPU. Copies device memory
// to NUMA-local pinned bounce chunks through the CUDA backend (GpuDevice::CopyToHost /
// CopyToDevice, the calls the staging pipeline makes), chunk sizes 256 KiB..16 MiB with 1..8
// chunks in flight, and compares each with the cudaMemcpy peak into one big pinned buffer on
// the same NUMA node, measured in the same run.
//
//   ferry-gpu-bench [--device N] [--total BYTES] [--repeat R] [--json FILE] [--backend sim]
//
// The bounce memory sits on the GPU's NUMA node (hwloc membind before first touch) and is
// pinned (cudaHostRegister), as a bounce pool is. Without a GPU it prints why and exits 0.

#include <hwloc.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "base/byte_size.h"
#include "base/json_writer.h"
#include "bench/gpu_peak.h"
#include "transport/memory/gpu_device.h"

namespace ferry::bench {
namespace {

using memory::GpuDevice;

constexpr uint64_t kKiB = 1024, kMiB = 1024 * 1024;
const uint64_t kChunkSizes[] = {256 * kKiB, 1 * kMiB, 4 * kMiB, 16 * kMiB};
const uint32_t kDepths[] = {1, 2, 4, 8};

struct Options {
  int device = 0;
  uint64_t total = 1024 * kMiB;  // bytes moved per measurement
  int repeat = 3;                // measurements per cell; the median is reported
  std::string json;
  // "sim": the simulation backend, peak by one copy-engine copy; checks this program on
  // machines without a GPU (its numbers mean nothing about PCIe).
  std::string backend = "cuda";
};

// Host memory bound to one NUMA node before first touch, then pinned; undone on destruction.
class NumaPinned {
 public:
  // `why_unbound`: why `nodes` is null, if it is.
  NumaPinned(GpuDevice* gpu, hwloc_topology_t topo, hwloc_const_nodeset_t nodes, uint64_t n,
             const std::string& why_unbound)
      : gpu_(gpu), n_(n) {
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      status_ = absl::ErrnoToStatus(errno, absl::StrCat("mmap(", FormatByteSize(n), ")"));
      return;
    }
    data_ = static_cast<char*>(p);
    if (topo != nullptr && nodes != nullptr) {
      if (hwloc_set_area_membind(topo, p, n, nodes, HWLOC_MEMBIND_BIND,
                                 HWLOC_MEMBIND_BYNODESET | HWLOC_MEMBIND_STRICT) != 0) {
        placement_ = absl::StrCat("not bound (hwloc_set_area_membind: ", strerror(errno), ")");
      } else {
        char* text = nullptr;
        hwloc_bitmap_list_asprintf(&text, nodes);
        placement_ = absl::StrCat("bound to NUMA node ", text != nullptr ? text : "?");
        free(text);
      }
    } else {
      placement_ = absl::StrCat("not bound (GPU's NUMA node unknown: ", why_unbound, ")");
    }
    std::fill(data_, data_ + n, 0);  // first touch: the pages land where bound
    // Unpinned copies still run (staged through the driver's own buffers), so a failure
    // here is reported with the numbers rather than ending the run.
    absl::Status pin = gpu->PinHost(data_, n);
    pinned_ = pin.ok();
    absl::StrAppend(&placement_, pinned_ ? "; pinned (GpuDevice::PinHost)"
                                         : absl::StrCat("; NOT pinned: ", pin.ToString()));
  }
  ~NumaPinned() {
    if (pinned_) gpu_->UnpinHost(data_);
    if (data_ != nullptr) munmap(data_, n_);
  }
  NumaPinned(const NumaPinned&) = delete;
  NumaPinned& operator=(const NumaPinned&) = delete;

  const absl::Status& status() const { return status_; }
  char* data() const { return data_; }
  const std::string& placement() const { return placement_; }

 private:
  GpuDevice* gpu_;
  uint64_t n_;
  char* data_ = nullptr;
  bool pinned_ = false;
  absl::Status status_;
  std::string placement_;
};

// The GPU's NUMA node set from hwloc (the PCI device's nearest non-I/O ancestor), or null
// with `why` set. The caller frees the bitmap.
hwloc_bitmap_t GpuNodes(hwloc_topology_t topo, const std::string& pci, std::string* why) {
  if (topo == nullptr) {
    *why = "hwloc topology not loaded";
    return nullptr;
  }
  hwloc_obj_t dev = pci.empty() ? nullptr : hwloc_get_pcidev_by_busidstring(topo, pci.c_str());
  if (dev == nullptr) {
    *why = absl::StrCat("hwloc does not see PCI device ", pci.empty() ? "(no address)" : pci);
    return nullptr;
  }
  hwloc_obj_t parent = hwloc_get_non_io_ancestor_obj(topo, dev);
  if (parent == nullptr || parent->nodeset == nullptr || hwloc_bitmap_iszero(parent->nodeset)) {
    *why = "hwloc knows no NUMA node for it";
    return nullptr;
  }
  if (hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE) > 1 &&
      hwloc_bitmap_isequal(parent->nodeset, hwloc_topology_get_topology_nodeset(topo))) {
    *why = "hwloc places it under the whole machine (no single local node)";
    return nullptr;
  }
  return hwloc_bitmap_dup(parent->nodeset);
}

// `total` bytes between the device and `bounce`, in chunks of `chunk` with at most `depth` in
// flight, each next chunk submitted from the completion that freed a slot (as the staging
// pipeline does). Seconds from the first submit to the last completion.
absl::StatusOr<double> TimeChunked(GpuDevice* gpu, char* device, char* bounce, uint64_t total,
                                   uint64_t chunk, uint32_t depth, bool to_host) {
  absl::Mutex mu;
  uint64_t next = 0;       // offset of the next chunk to claim
  uint32_t in_flight = 0;  // claimed and not completed; never 0 while a claim is unposted
  absl::Status error;
  // Claims the next chunk for a slot; false when none is left (or a copy failed).
  auto claim = [&](uint64_t* at) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!error.ok() || next >= total) return false;
    *at = next;
    next += chunk;
    ++in_flight;
    return true;
  };
  std::function<void(uint32_t, uint64_t)> post = [&](uint32_t slot, uint64_t at) {
    uint64_t n = std::min(chunk, total - at);
    char* host = bounce + static_cast<uint64_t>(slot) * chunk;
    auto done = [&, slot](absl::Status s) {
      uint64_t at_next = 0;
      bool more;
      {
        absl::MutexLock lock(&mu);
        if (!s.ok() && error.ok()) error = s;
        --in_flight;
        more = claim(&at_next);
      }
      if (more) post(slot, at_next);  // the slot is free again: the next chunk goes in it
    };
    absl::Status posted = to_host ? gpu->CopyToHost(host, device + at, n, std::move(done))
                                  : gpu->CopyToDevice(device + at, host, n, std::move(done));
    if (!posted.ok()) {
      absl::MutexLock lock(&mu);
      if (error.ok()) error = posted;
      --in_flight;
    }
  };
  auto start = std::chrono::steady_clock::now();
  for (uint32_t slot = 0; slot < depth; ++slot) {
    uint64_t at = 0;
    bool claimed;
    {
      absl::MutexLock lock(&mu);
      claimed = claim(&at);
    }
    if (claimed) post(slot, at);
  }
  absl::MutexLock lock(&mu);
  auto finished = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu) {
    return in_flight == 0 && (next >= total || !error.ok());
  };
  mu.Await(absl::Condition(&finished));
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!error.ok()) return error;
  return seconds;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

bool Parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--device") {
      if (!absl::SimpleAtoi(value(), &o->device)) return false;
    } else if (a == "--total") {
      auto v = ParseByteSize(value());
      if (!v.ok() || *v < 16 * kMiB) return false;
      o->total = *v;
    } else if (a == "--repeat") {
      if (!absl::SimpleAtoi(value(), &o->repeat) || o->repeat < 1) return false;
    } else if (a == "--backend") {
      o->backend = value();
      if (o->backend != "cuda" && o->backend != "sim") return false;
    } else if (a == "--json") {
      o->json = value();
    } else {
      return false;
    }
  }
  return true;
}

int Run(int argc, char** argv) {
  Options o;
  if (!Parse(argc, argv, &o)) {
    std::fprintf(stderr,
                 "usage: ferry-gpu-bench [--device N] [--total BYTES>=16MiB] [--repeat R] [--json "
                 "FILE] [--backend cuda|sim]\n");
    return 2;
  }
  std::string why;
  memory::GpuOptions sim;
  sim.backend = "sim";
  sim.count = 1;
  auto gpus = o.backend == "sim" ? memory::CreateGpus(sim, &why) : memory::CreateCudaGpus();
  if (!gpus.ok() || gpus->empty()) {
    std::printf(
        "ferry-gpu-bench: no GPU: skipped (%s)\n",
        gpus.ok() ? "the CUDA driver sees no GPU" : std::string(gpus.status().message()).c_str());
    return 0;
  }
  if (o.device < 0 || static_cast<size_t>(o.device) >= gpus->size()) {
    std::fprintf(stderr, "ferry-gpu-bench: no GPU %d (%zu visible)\n", o.device, gpus->size());
    return 2;
  }
  GpuDevice* gpu = (*gpus)[o.device].get();

  hwloc_topology_t topo = nullptr;
  if (hwloc_topology_init(&topo) == 0) {
    hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(topo) != 0) {
      hwloc_topology_destroy(topo);
      topo = nullptr;
    }
  }
  std::string numa_why;
  hwloc_bitmap_t nodes = GpuNodes(topo, gpu->pci(), &numa_why);

  auto slab = gpu->AllocateSlab(o.total);
  if (!slab.ok()) {
    std::fprintf(stderr, "ferry-gpu-bench: %s\n", slab.status().ToString().c_str());
    return 1;
  }
  char* dev = static_cast<char*>((*slab)->data());
  NumaPinned big(gpu, topo, nodes, o.total, numa_why);
  NumaPinned bounce(gpu, topo, nodes, 8 * 16 * kMiB, numa_why);
  if (!big.status().ok() || !bounce.status().ok()) {
    std::fprintf(stderr, "ferry-gpu-bench: %s\n",
                 (big.status().ok() ? bounce.status() : big.status()).ToString().c_str());
    return 1;
  }

  std::printf("ferry-gpu-bench: GPU %d (%s, backend %s), %s per measurement, median of %d\n",
              o.device, gpu->pci().c_str(), gpu->backend().c_str(), FormatByteSize(o.total).c_str(),
              o.repeat);
  std::printf("host memory: %s\n\n", bounce.placement().c_str());

  JsonWriter json;
  json.BeginObject().Key("gpu").String(gpu->pci()).Key("device").Int(o.device)
      .Key("total_bytes").Uint(o.total).Key("repeat").Int(o.repeat)
      .Key("host_memory").String(bounce.placement())
      .Key("directions").BeginArray();
  int rc = 0;
  for (bool to_host : {true, false}) {
    const char* dir = to_host ? "D2H" : "H2D";
    // Peak: one cudaMemcpy of the whole buffer, after one warm-up.
    std::vector<double> peak_runs;
    absl::Status peak_status;
    for (int r = 0; r <= o.repeat && peak_status.ok(); ++r) {
      // The simulation's peak: one copy of the whole buffer on its copy engine (its device
      // memory is no more the CPU's to memcpy than a real GPU's).
      auto t = o.backend == "sim"
                   ? TimeChunked(gpu, dev, big.data(), o.total, o.total, 1, to_host)
               : to_host ? TimeCudaMemcpy(o.device, big.data(), dev, o.total, true)
                         : TimeCudaMemcpy(o.device, dev, big.data(), o.total, false);
      if (!t.ok()) peak_status = t.status();
      else if (r > 0) peak_runs.push_back(*t);
    }
    if (!peak_status.ok()) {
      std::fprintf(stderr, "ferry-gpu-bench: %s peak: %s\n", dir, peak_status.ToString().c_str());
      rc = 1;
      continue;
    }
    double peak = o.total / Median(peak_runs) / 1e9;
    std::printf("%s  %s peak (one %s pinned buffer): %.2f GB/s\n", dir,
                o.backend == "sim" ? "one engine copy" : "cudaMemcpy",
                FormatByteSize(o.total).c_str(), peak);
    std::printf("%s  chunked through bounce chunks, GB/s (%% of peak):\n", dir);
    std::printf("  %-10s", "chunk");
    for (uint32_t d : kDepths) std::printf("  %-17s", absl::StrCat("depth ", d).c_str());
    std::printf("\n");
    json.BeginObject()
        .Key("direction")
        .String(dir)
        .Key("peak_gbps")
        .Double(peak)
        .Key("cells")
        .BeginArray();
    double best_ratio = 0;
    std::string best;
    for (uint64_t chunk : kChunkSizes) {
      std::printf("  %-10s", FormatByteSize(chunk).c_str());
      for (uint32_t depth : kDepths) {
        std::vector<double> runs;
        absl::Status s;
        for (int r = 0; r <= o.repeat && s.ok(); ++r) {
          auto t = TimeChunked(gpu, dev, bounce.data(), o.total, chunk, depth, to_host);
          if (!t.ok()) s = t.status();
          else if (r > 0) runs.push_back(*t);  // the first run warms up
        }
        if (!s.ok()) {
          std::printf("  %-17s", "error");
          std::fprintf(stderr, "\n%s chunk %s depth %u: %s\n", dir, FormatByteSize(chunk).c_str(),
                       depth, s.ToString().c_str());
          rc = 1;
          continue;
        }
        double gbps = o.total / Median(runs) / 1e9;
        double ratio = gbps / peak;
        if (ratio > best_ratio) {
          best_ratio = ratio;
          best = absl::StrCat(FormatByteSize(chunk), " x ", depth);
        }
        std::printf("  %-17s", absl::StrFormat("%6.2f (%5.1f%%)", gbps, 100 * ratio).c_str());
        json.BeginObject().Key("chunk_bytes").Uint(chunk).Key("depth").Uint(depth)
            .Key("gbps").Double(gbps).Key("ratio").Double(ratio).EndObject();
      }
      std::printf("\n");
    }
    json.EndArray().Key("best").String(best).Key("best_ratio").Double(best_ratio).EndObject();
    std::printf("%s  best: %s at %.1f%% of peak\n\n", dir, best.c_str(), 100 * best_ratio);
  }
  json.EndArray().EndObject();
  if (!o.json.empty()) {
    std::ofstream(o.json) << json.str() << "\n";
  }
  if (nodes != nullptr) hwloc_bitmap_free(nodes);
  if (topo != nullptr) hwloc_topology_destroy(topo);
  return rc;
}

}  // namespace
}  // namespace ferry::bench

int main(int argc, char** argv) { return ferry::bench::Run(argc, argv); }
