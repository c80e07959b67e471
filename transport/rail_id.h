#pragma once
// Which fabric instance carries bytes: a provider and the NIC it runs on. The key of every
// per-fabric map (a buffer's regions, a bounce chunk's regions, GPU registration state), so
// that one fabric per NIC (rails) adds keys, not new string conventions.

#include <compare>
#include <string>

#include "absl/strings/str_cat.h"

namespace ferry::fabric {

struct RailId {
  std::string provider;  // "verbs", "tcp"
  std::string nic;       // "mlx5_0"; "" for a provider not bound to one NIC (tcp today)

  friend bool operator==(const RailId&, const RailId&) = default;
  friend auto operator<=>(const RailId&, const RailId&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const RailId& r) {
    return H::combine(std::move(h), r.provider, r.nic);
  }
  // "verbs:mlx5_0", or "tcp" without a NIC: for logs and results.
  std::string ToString() const { return nic.empty() ? provider : absl::StrCat(provider, ":", nic); }
};

}  // namespace ferry::fabric
