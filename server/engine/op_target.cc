#include "server/engine/op_target.h"

#include "absl/strings/str_cat.h"

namespace ferry::server {

std::string OpTarget::Field(int op, absl::string_view name) const {
  if (index < 0) return absl::StrCat("ops[", op, "].", name);
  return absl::StrCat("ops[", op, "].target: targets[", index, "].", name);
}

absl::StatusOr<OpTarget> TargetOf(const ferry::v1::SubmitRequest& request, int i) {
  const ferry::v1::Op& op = request.ops(i);
  if (!op.has_target()) return OpTarget{&op.peer(), &op.remote_buffer(), -1};
  if (op.target() >= static_cast<uint32_t>(request.targets_size())) {
    return absl::InvalidArgumentError(absl::StrCat("ops[", i, "].target: ", op.target(),
                                                   " is not an index of targets (",
                                                   request.targets_size(), " given)"));
  }
  if (!op.peer().empty() || !op.remote_buffer().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ops[", i, "].target: names targets[", op.target(),
                     "], so peer and remote_buffer must be empty"));
  }
  const ferry::v1::Target& target = request.targets(static_cast<int>(op.target()));
  return OpTarget{&target.peer(), &target.remote_buffer(), static_cast<int>(op.target())};
}

}  // namespace ferry::server
