// A NIC reaches GPU memory through the GPU's BAR1 aperture: peer memory and DMA-BUF map
// the pinned pages there (NVIDIA's GPUDirect RDMA guide, "PCI BAR sizes"; `nvidia-smi -q`
// shows it as "BAR1 Memory Usage"), so a BAR1 smaller than the GPU pool makes the pool's
// registration fail. Data-center GPUs expose a BAR1 as large as their memory when the BIOS
// enables Above 4G Decoding and Resizable BAR; with either off the firmware leaves a
// legacy 256 MiB window, or cannot place the BAR at all.
//
// sysfs `resource` has one "start end flags" line (hex) per resource, line i = BAR i.
// NVIDIA GPUs have BAR0 (registers, 32-bit) on line 0, BAR1 (64-bit prefetchable, so it
// also takes BAR2's register and line 2 is empty) on line 1, and BAR3 on line 3.
#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/byte_size.h"
#include "transport/topology/doctor_checks.h"

namespace ferry::topology {
namespace {

// include/linux/ioport.h. A BAR the kernel could not place keeps its size but is flagged
// UNSET, with start 0.
constexpr uint64_t kIoResourceMem = 0x200;
constexpr uint64_t kIoResourceUnset = 0x20000000;

struct Bar {
  uint64_t start = 0, end = 0, flags = 0;
  bool Memory() const { return (flags & kIoResourceMem) != 0 && end > start; }
  bool Placed() const { return (flags & kIoResourceUnset) == 0 && start != 0; }
  uint64_t Size() const { return end - start + 1; }
};

std::optional<Bar> ReadBar(const SysRoot& root, const std::string& pci, int index) {
  std::optional<std::string> text =
      root.Read(absl::StrCat("/sys/bus/pci/devices/", pci, "/resource"));
  if (!text) return std::nullopt;
  std::vector<std::string> lines = absl::StrSplit(*text, '\n');
  if (static_cast<int>(lines.size()) <= index) return std::nullopt;
  std::vector<std::string> fields = absl::StrSplit(lines[index], ' ', absl::SkipEmpty());
  if (fields.size() != 3) return std::nullopt;
  Bar bar;
  bar.start = std::strtoull(fields[0].c_str(), nullptr, 16);
  bar.end = std::strtoull(fields[1].c_str(), nullptr, 16);
  bar.flags = std::strtoull(fields[2].c_str(), nullptr, 16);
  return bar;
}

}  // namespace

void CheckBar1(const Machine& machine, const SysRoot& root, uint64_t gpu_pool_bytes,
               DoctorReport& report) {
  const std::string bios =
      "enable Above 4G Decoding and Resizable BAR in the BIOS (BAR1 then spans the GPU's "
      "memory)";
  for (size_t g = 0; g < machine.gpus.size(); ++g) {
    const Gpu& gpu = machine.gpus[g];
    std::optional<Bar> bar = ReadBar(root, gpu.pci, 1);
    // No sysfs (a saved topology, a container), or not the layout this check knows.
    if (!bar || !bar->Memory()) continue;
    std::string check = absl::StrCat("bar1 gpu", g);
    std::string who = absl::StrCat("GPU", g, " (", gpu.pci, ") BAR1");
    if (!bar->Placed()) {
      report.findings.push_back(
          {Severity::kWarn, check,
           absl::StrCat(who, " (", FormatByteSize(bar->Size()),
                        ") has no address (no room for it in the MMIO space the firmware "
                        "set up): the NIC cannot reach this GPU's memory"),
           bios});
    } else if (bar->Size() < gpu_pool_bytes) {
      report.findings.push_back(
          {Severity::kWarn, check,
           absl::StrCat(who, " is ", FormatByteSize(bar->Size()), ", smaller than the ",
                        FormatByteSize(gpu_pool_bytes),
                        " GPU pool ferryd registers with the NIC: GDR registration of the "
                        "pool fails"),
           absl::StrCat(bios, ", or lower gpu.pool_size below the BAR1 size")});
    } else {
      report.findings.push_back(
          {Severity::kOk, check,
           absl::StrCat(who, " is ", FormatByteSize(bar->Size()), ", room for the ",
                        FormatByteSize(gpu_pool_bytes), " GPU pool"),
           ""});
    }
  }
}

}  // namespace ferry::topology
