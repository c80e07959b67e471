#include "server/local/local_callers.h"

#include <grp.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/local/call_rules.h"

namespace ferry::server {
namespace {

// Supplementary groups are not in SO_PEERCRED; /proc/<pid>/status has them ("Groups:").
bool InSupplementaryGroup(pid_t pid, gid_t group) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (!absl::StartsWith(line, "Groups:")) continue;
    for (absl::string_view word : absl::StrSplit(line.substr(7), ' ', absl::SkipWhitespace())) {
      uint32_t gid = 0;
      if (absl::SimpleAtoi(word, &gid) && gid == group) return true;
    }
  }
  return false;
}

}  // namespace

absl::StatusOr<gid_t> LookupGroup(const std::string& name, const std::string& key) {
  if (name.empty()) return static_cast<gid_t>(-1);
  group entry = {};
  group* found = nullptr;
  std::vector<char> scratch(16384);
  int err = getgrnam_r(name.c_str(), &entry, scratch.data(), scratch.size(), &found);
  if (err != 0) {
    return absl::ErrnoToStatus(err, absl::StrCat(key, ": getgrnam_r(", name, ")"));
  }
  if (found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(key, ": no group named '", name, "'"));
  }
  return found->gr_gid;
}

void LocalCallers::Record(int fd, const LocalCaller& caller) {
  absl::MutexLock lock(&mu_);
  by_fd_[fd] = caller;
}

std::optional<LocalCaller> LocalCallers::Of(const grpc::ServerContextBase& ctx) const {
  const std::string peer = ctx.peer();
  int fd = -1;
  if (!absl::StartsWith(peer, "fd:") || !absl::SimpleAtoi(peer.substr(3), &fd)) {
    return std::nullopt;
  }
  absl::MutexLock lock(&mu_);
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return std::nullopt;
  return it->second;
}

bool LocalCallers::Privileged(const LocalCaller& caller) const {
  if (caller.uid == 0) return true;
  if (admin_group_ == static_cast<gid_t>(-1)) return false;
  return caller.gid == admin_group_ || InSupplementaryGroup(caller.pid, admin_group_);
}

absl::Status LocalCallers::Authorize(const std::optional<LocalCaller>& caller,
                                     absl::string_view call) const {
  const CallRuleRow* row = FindCallRule(call);
  if (row == nullptr) {
    return absl::InternalError(absl::StrCat(call, ": no access rule (server/local/call_rules.cc)"));
  }
  if (row->rule != CallRule::kOperator || !caller || Privileged(*caller)) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      call, " is an operator call (it ", row->what, "): uid ", caller->uid,
      " is neither root nor in security.admin_group"));
}

bool LocalCallers::SeesAll(const std::optional<LocalCaller>& caller) const {
  return !caller || Privileged(*caller);
}

absl::Status LocalCallers::MayUse(const std::optional<LocalCaller>& caller, int64_t owner_uid,
                                  const std::string& what) const {
  if (!caller || owner_uid < 0 || static_cast<int64_t>(caller->uid) == owner_uid) {
    return absl::OkStatus();
  }
  if (Privileged(*caller)) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat(what, " belongs to uid ", owner_uid, "; uid ", caller->uid,
                   " may not use it (only its owner, root or the admin group may)"));
}

absl::Status MayUseBuffer(const LocalCallers& callers, const grpc::ServerContextBase& ctx,
                          const BufferRegistry& buffers, uint64_t id, const std::string& what) {
  return MayUseBuffer(callers, callers.Of(ctx), buffers, id, what);
}

absl::Status MayUseBuffer(const LocalCallers& callers, const std::optional<LocalCaller>& caller,
                          const BufferRegistry& buffers, uint64_t id, const std::string& what) {
  if (!caller) return absl::OkStatus();
  auto buffer = buffers.Get(id, "buffer");
  if (!buffer.ok()) return absl::OkStatus();
  return callers.MayUse(caller, (*buffer)->owner_uid(), absl::StrCat(what, ": buffer ", id));
}

}  // namespace ferry::server
