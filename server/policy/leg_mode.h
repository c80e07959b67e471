#pragma once
// How bytes leave or reach one buffer (DESIGN.md, "mode"): the NIC touches host memory
// (`host`) or GPU memory (`gdr`), or the bytes go through a bounce chunk in host memory
// next to the NIC (`staged`); `unavailable` when the policy's fallback is `fail`. Used as a
// type by the planner, the engine and the peers; words only in protos and logs.

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace ferry::server {

// kLocal: both buffers are on this node, and the agent copies between them without a fabric
// (server/engine/local_copy.h); only this agent plans it, never a peer's answer.
enum class LegMode { kHost, kGdr, kStaged, kUnavailable, kLocal };

// "host", "gdr", "staged", "unavailable", "local": the words of the protos (Leg.mode,
// ResolveBuffer).
inline const char* LegModeName(LegMode mode) {
  switch (mode) {
    case LegMode::kHost: return "host";
    case LegMode::kGdr: return "gdr";
    case LegMode::kStaged: return "staged";
    case LegMode::kUnavailable: return "unavailable";
    case LegMode::kLocal: return "local";
  }
  return "unavailable";
}

// The mode a peer named; nullopt for a word this agent does not know.
inline std::optional<LegMode> ParseLegMode(absl::string_view name) {
  for (LegMode m : {LegMode::kHost, LegMode::kGdr, LegMode::kStaged, LegMode::kUnavailable}) {
    if (name == LegModeName(m)) return m;
  }
  return std::nullopt;
}

// Whether the NIC touches the buffer's memory itself (no bounce chunk on this side).
inline bool IsDirect(LegMode mode) { return mode == LegMode::kHost || mode == LegMode::kGdr; }

}  // namespace ferry::server
