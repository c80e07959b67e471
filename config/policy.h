#pragma once
// The GPUDirect RDMA policy: data, validated, swappable at run time (DESIGN.md "Contracts").

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ferry::config {

// PCIe distance between two devices, nvidia-smi topo legend, nearest first. The numeric
// order is meaningful: a smaller class is a shorter path.
enum class PathClass { kPix = 0, kPxb = 1, kPhb = 2, kNode = 3, kSys = 4 };

// "PIX", "PXB", ... ; parsing is case-insensitive.
const char* PathClassName(PathClass path);
absl::StatusOr<PathClass> ParsePathClass(absl::string_view text);

enum class GdrMode { kAuto, kAlways, kNever };
const char* GdrModeName(GdrMode mode);
absl::StatusOr<GdrMode> ParseGdrMode(absl::string_view text);

enum class Fallback { kStaged, kFail };
const char* FallbackName(Fallback fallback);
absl::StatusOr<Fallback> ParseFallback(absl::string_view text);

struct Policy {
  GdrMode gdr = GdrMode::kAuto;
  // Default PHB: the same root complex (NVIDIA's GPUDirect RDMA guide: devices "must share
  // the same upstream PCI Express root complex"). NCCL's default is the stricter PXB.
  PathClass gdr_max_path = PathClass::kPhb;
  Fallback fallback = Fallback::kStaged;
  // Staging pipeline: chunk size and chunks in flight per leg.
  uint64_t staging_chunk_bytes = 4ull << 20;
  uint32_t staging_depth = 4;

  bool operator==(const Policy&) const = default;
};

// A bounce pool holds staging_depth chunks for each of this many staged legs at once, so
// it pins staging_chunk_bytes x staging_depth x kBounceLegs per NUMA node.
inline constexpr uint32_t kBounceLegs = 4;

// Applies one `key=value` setting (keys: gdr, gdr_max_path, fallback, staging_chunk,
// staging_depth) to `policy`. Errors name the key and the accepted values.
absl::Status ApplyPolicySetting(absl::string_view key, absl::string_view value, Policy& policy);

// Checks cross-field rules (chunk size and depth bounds).
absl::Status ValidatePolicy(const Policy& policy);

}  // namespace ferry::config
