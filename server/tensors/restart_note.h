#pragma once
// What a peer hears when it asks this agent for a block list it does not have, soon after
// this agent started: lists live in the agent's memory and die with it, so "no block list
// named 'kv'" alone sends the asker hunting for a typo when the real cause is a restart.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"

namespace ferry::server {

// How long after its start an agent mentions it in NOT_FOUND answers. A client reconnects
// and prepares its lists again within seconds of a restart (ferry.AgentRestarted); peers
// asking in that window are the ones that held the old list. Later, a missing list is far
// more likely a name never prepared, and the note would mislead.
inline constexpr absl::Duration kRecentStart = absl::Minutes(5);

// `missing` (NOT_FOUND for a list) said by `node`, started at `started` as run `incarnation`:
// "node-a restarted 12 s ago (or first started: incarnation 5f3a09c1); <missing's message>"
// within kRecentStart of the start; anything else unchanged. The agent cannot tell a restart
// from its first start (nothing survives it), so the note says both; the asker knows which.
inline absl::Status NoteRecentStart(const absl::Status& missing, const std::string& node,
                                    absl::Time started, uint64_t incarnation, absl::Time now) {
  if (!absl::IsNotFound(missing) || !absl::StartsWith(missing.message(), "no block list") ||
      now - started > kRecentStart) {
    return missing;
  }
  return absl::NotFoundError(
      absl::StrCat(node, " restarted ", absl::ToInt64Seconds(now - started),
                   " s ago (or first started: agent incarnation ",
                   absl::StrFormat("%08x", static_cast<uint32_t>(incarnation >> 32)), "); it has ",
                   missing.message()));
}

}  // namespace ferry::server
