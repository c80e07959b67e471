#pragma once
// Where an op of a SubmitRequest lands (or reads from): the peer and remote buffer it names
// itself, or those of the target it names by index (Op.target into SubmitRequest.targets,
// how a batch of thousands of blocks names its remote buffer once).

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ferry/v1/agent.pb.h"

namespace ferry::server {

struct OpTarget {
  // Into the request: valid while it is.
  const std::string* peer = nullptr;
  const std::string* remote_buffer = nullptr;
  int index = -1;  // into SubmitRequest.targets; -1 when the op names them itself

  // The request field that an error about the target's `name` ("peer", "remote_buffer") of
  // op `op` names: "ops[3].peer", or "ops[3].target: targets[0].peer".
  std::string Field(int op, absl::string_view name) const;
};

// Op `i`'s target. INVALID_ARGUMENT, naming ops[i].target, when the op names a target that
// is not in the request, or names one and a peer or remote buffer of its own as well.
absl::StatusOr<OpTarget> TargetOf(const ferry::v1::SubmitRequest& request, int i);

}  // namespace ferry::server
