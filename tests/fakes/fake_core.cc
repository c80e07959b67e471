#include "tests/fakes/fake_core.h"

#include <cstdio>
#include <cstring>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ferry::fake::internal {

const char* OpName(OpKind kind) {
  switch (kind) {
    case OpKind::kWrite:
      return "WRITE";
    case OpKind::kWriteImm:
      return "WRITE_WITH_IMM";
    case OpKind::kRead:
      return "READ";
  }
  return "?";
}

Registry& Global() {
  static Registry* registry = new Registry;  // never destroyed: fabrics may die at exit
  return *registry;
}

std::shared_ptr<Core> Find(const std::string& address) {
  Registry& r = Global();
  absl::MutexLock lock(&r.mu);
  auto it = r.fabrics.find(address);
  return it == r.fabrics.end() ? nullptr : it->second.lock();
}

void RecordViolation(std::string what) {
  std::fprintf(stderr, "fake fabric: contract violation: %s\n", what.c_str());
  Registry& r = Global();
  absl::MutexLock lock(&r.mu);
  r.violations.push_back(std::move(what));
}

void Core::Run() {
  mu.Lock();
  while (true) {
    mu.Await(absl::Condition(this, &Core::HasWork));
    if (!immediates.empty()) {
      uint32_t imm = immediates.front();
      immediates.pop_front();
      fabric::Fabric::ImmediateHandler h = handler;
      in_handler = true;
      ++stats.immediates;
      mu.Unlock();
      if (h) h(imm);
      h = nullptr;  // a handler's captures die outside the lock too
      mu.Lock();
      in_handler = false;
    } else if (!failing.empty()) {
      std::unique_ptr<Op> op = std::move(failing.front());
      failing.pop_front();
      absl::Status why = op->fail;
      mu.Unlock();
      Complete(std::move(op), std::move(why));
      mu.Lock();
    } else if (!hold && !queue.empty()) {
      std::unique_ptr<Op> op = std::move(queue.front());
      queue.pop_front();
      mu.Unlock();
      absl::Status status = op->fail.ok() ? Execute(*op) : op->fail;
      Complete(std::move(op), std::move(status));
      mu.Lock();
    } else if (stopping) {
      break;
    }
  }
  mu.Unlock();
}

void Core::Complete(std::unique_ptr<Op> op, absl::Status status) {
  const bool ok = status.ok();
  std::move(op->done)(std::move(status));
  // The completion's captures (buffers, and with them regions) are released with no lock
  // held: destroying a region takes the lock of the fabric it belongs to.
  std::shared_ptr<Link> link = std::move(op->link);
  op.reset();
  absl::MutexLock lock(&mu);
  --link->outstanding;
  --stats.outstanding;
  ++stats.completions;
  if (!ok) ++stats.failed_completions;
}

void Core::BreakLocked(Link& link, absl::Status why) {
  if (!link.broken.ok()) return;
  link.broken = why;
  // Held or not, the link's waiting ops fail now (verbs: flushed with IBV_WC_WR_FLUSH_ERR),
  // in the order they were posted.
  for (auto it = queue.begin(); it != queue.end();) {
    if ((*it)->link.get() != &link) {
      ++it;
      continue;
    }
    (*it)->fail = why;
    failing.push_back(std::move(*it));
    it = queue.erase(it);
  }
}

absl::Status Core::AcquireRemote(uint32_t key, uint64_t address, uint64_t length, uint32_t access,
                                 absl::FunctionRef<std::string()> what, Pin* pin) {
  absl::MutexLock lock(&mu);
  auto it = regions.find(key);
  // tcp (transport/tcp/region_table.cc) and an HCA check in this order: key, range, access.
  if (it == regions.end() || it->second.removing) {
    ++stats.remote_refusals;
    return absl::PermissionDeniedError(
        absl::StrCat("fake: remote key unknown or revoked: ", what()));
  }
  RegionEntry& e = it->second;
  // Written so that no sum can overflow.
  if (address < e.remote_base || address - e.remote_base > e.length ||
      length > e.length - (address - e.remote_base)) {
    ++stats.remote_refusals;
    return absl::OutOfRangeError(absl::StrCat("fake: range outside the remote region: ", what()));
  }
  if ((e.access & access) != access) {
    ++stats.remote_refusals;
    return absl::PermissionDeniedError(
        absl::StrCat("fake: remote region does not allow it: ", what()));
  }
  ++e.users;
  ++stats.remote_accesses;
  pin->Set(this, key, e.data + (address - e.remote_base));
  return absl::OkStatus();
}

absl::Status Core::AcquireLocal(uint32_t key, uint64_t offset,
                                absl::FunctionRef<std::string()> what, Pin* pin) {
  {
    absl::MutexLock lock(&mu);
    auto it = regions.find(key);
    if (it != regions.end() && !it->second.removing) {
      ++it->second.users;
      pin->Set(this, key, it->second.data + offset);
      return absl::OkStatus();
    }
  }
  // transport/fabric.h: "src/dst must stay registered until done runs". verbs completes such
  // a WR with IBV_WC_LOC_PROT_ERR (WcStatusToStatus: FAILED_PRECONDITION).
  std::string why =
      absl::StrCat("fake: the local region of ", what(), " was destroyed before the op completed");
  RecordViolation(why);
  return absl::FailedPreconditionError(why);
}

void Core::Unpin(uint32_t key) {
  absl::MutexLock lock(&mu);
  auto it = regions.find(key);
  if (it != regions.end()) --it->second.users;
}

void Core::RemoveRegion(uint32_t key) {
  std::string violation;
  {
    absl::MutexLock lock(&mu);
    auto it = regions.find(key);
    if (it == regions.end()) return;
    int waiting = 0;
    for (const auto* q : {&queue, &failing}) {
      for (const auto& op : *q) waiting += op->local_key == key ? 1 : 0;
    }
    if (waiting > 0) {
      violation = absl::StrFormat(
          "region key 0x%x of %s destroyed while %d op(s) posted with it had not completed", key,
          address, waiting);
    }
    // Revoked now; accesses in progress finish first (transport/fabric.h MemoryRegion).
    it->second.removing = true;
    RegionEntry* entry = &it->second;
    mu.Await(absl::Condition(
        +[](RegionEntry* e) { return e->users == 0; }, entry));
    regions.erase(key);
  }
  if (!violation.empty()) RecordViolation(std::move(violation));
}

void Core::PushImmediate(uint32_t imm) {
  absl::MutexLock lock(&mu);
  immediates.push_back(imm);
}

absl::Status Core::Execute(Op& op) {
  // Only an error says it: built then, not for every op (ferry-engine-bench counts our cost).
  auto what = [&op] {
    return absl::StrFormat("%s%s of %d bytes at 0x%x key 0x%x on %s", OpName(op.kind),
                           op.pieces.empty() ? "" : " list", op.length, op.remote.address,
                           op.remote.key, op.link->peer);
  };
  Pin local;
  absl::Status s = AcquireLocal(op.local_key, 0, what, &local);
  if (!s.ok()) return s;
  std::shared_ptr<Core> target = op.link->target.lock();
  if (target == nullptr) {
    absl::Status gone =
        absl::UnavailableError(absl::StrCat("fake: ", what(), ": the peer is gone"));
    absl::MutexLock lock(&mu);
    BreakLocked(*op.link, gone);
    return gone;
  }
  const uint32_t need = op.kind == OpKind::kRead ? fabric::kRemoteRead : fabric::kRemoteWrite;
  // A single op is one piece at the remote address itself.
  const fabric::Piece single{op.local_offset, 0, op.length};
  const std::span<const fabric::Piece> pieces =
      op.pieces.empty() ? std::span<const fabric::Piece>(&single, 1) : op.pieces;
  uint64_t moved = 0;
  for (const fabric::Piece& piece : pieces) {
    // Piece by piece, as an HCA runs a chain of WRs: those before a refused one have landed
    // (fabric.h: a failed gathered op may have moved some of its pieces).
    Pin remote;
    s = target->AcquireRemote(op.remote.key, op.remote.address + piece.remote_offset,
                              piece.length, need, what, &remote);
    if (!s.ok()) {
      if (options.refusal_breaks_endpoint) {
        // verbs: the R_Key violation moved the QP to the error state; what follows flushes.
        absl::MutexLock lock(&mu);
        BreakLocked(*op.link, absl::UnavailableError(absl::StrCat(
                                  "fake: endpoint to ", op.link->peer, " broke: ", s.message())));
      }
      break;
    }
    char* mine = local.data() + piece.local_offset;
    if (op.kind == OpKind::kRead) {
      std::memcpy(mine, remote.data(), piece.length);
    } else {
      std::memcpy(remote.data(), mine, piece.length);
    }
    moved += piece.length;
  }
  {
    absl::MutexLock lock(&mu);
    (op.kind == OpKind::kRead ? stats.bytes_read : stats.bytes_written) += moved;
  }
  if (!s.ok()) return s;
  // The immediate is seen after its data landed, on the target's thread.
  if (op.kind == OpKind::kWriteImm) target->PushImmediate(op.imm);
  return absl::OkStatus();
}

}  // namespace ferry::fake::internal
