// TransferEngine::Plan: a batch validated op by op, every buffer it names resolved (ours in
// the registry, a peer's by its ResolveBuffer answer, kept where the peer allows, and this
// node's own by name here), every range checked. Nothing moves when any op is bad.

#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/byte_range.h"
#include "base/byte_size.h"
#include "base/echo.h"
#include "base/status_macros.h"
#include "server/buffers/guarded_touch.h"
#include "server/engine/op_target.h"
#include "server/engine/transfer_engine.h"

namespace ferry::server {
namespace {

// The buffer named by an op whose peer is this node, found as the Peer API finds one for a
// peer (server/api/peer_service.cc): exported to this node and not broken, else the same
// NOT_FOUND, so that a name is no easier to probe this way. `field` prefixes the error.
absl::StatusOr<std::shared_ptr<Buffer>> OwnBuffer(const BufferRegistry& buffers,
                                                  const std::string& self, const std::string& name,
                                                  const std::string& field) {
  auto buffer = buffers.FindByName(name);
  if (!buffer.ok() || !(*buffer)->ExportedTo(self) || (*buffer)->memory().broken()) {
    return absl::NotFoundError(
        absl::StrCat(field, "no buffer named ", Echo(name), " on ", self));
  }
  return *std::move(buffer);
}

absl::Status RangeError(const std::string& field, uint64_t offset, uint64_t length,
                        const std::string& what, uint64_t size) {
  return absl::OutOfRangeError(absl::StrCat(field, ": range [", offset, ", ", offset, "+", length,
                                            ") is outside ", what, " (", size, " bytes)"));
}

}  // namespace

absl::StatusOr<PlannedBatch> TransferEngine::Plan(const ferry::v1::SubmitRequest& request,
                                                 const EngineLimits& limits, absl::Time deadline) {
  if (request.ops_size() == 0) return absl::InvalidArgumentError("ops: the batch is empty");
  if (static_cast<uint64_t>(request.ops_size()) > limits.max_ops_per_submit) {
    return absl::InvalidArgumentError(absl::StrCat("ops: ", request.ops_size(),
                                                   " ops is more than limits.max_ops_per_submit (",
                                                   limits.max_ops_per_submit, ")"));
  }
  // One answer per distinct remote buffer in the batch, not per op: kept from an earlier
  // transfer where the peer allows (no call), else one ResolveBuffer. The batch holds it.
  std::map<std::pair<std::string, std::string>, const RemoteBuffer*> remotes;
  std::map<const RemoteBuffer*, Buffer*> heres;  // this node's buffers among them
  PlannedBatch batch;
  std::vector<PlannedOp>& planned = batch.ops;
  planned.resize(request.ops_size());
  for (int i = 0; i < request.ops_size(); ++i) {
    const ferry::v1::Op& op = request.ops(i);
    // The field prefix of error messages, built only for an error (not for 4096 good ops).
    auto f = [i] { return absl::StrCat("ops[", i, "]."); };
    PlannedOp& p = planned[i];
    if (op.type() != ferry::v1::WRITE && op.type() != ferry::v1::READ) {
      return absl::InvalidArgumentError(absl::StrCat(f(), "type: must be WRITE or READ"));
    }
    p.type = op.type();
    if (op.length() == 0)
      return absl::InvalidArgumentError(absl::StrCat(f(), "length: must be positive"));
    if (op.length() > limits.max_op_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(f(), "length: ", op.length(),
                                                     " bytes is more than limits.max_op_bytes (",
                                                     FormatByteSize(limits.max_op_bytes), ")"));
    }
    p.length = op.length();
    // Most ops of a batch name the previous op's local buffer and peer: looked up once for
    // the run of them, not once per op (a registry lookup takes its lock).
    const PlannedOp* previous = i > 0 ? &planned[i - 1] : nullptr;
    if (previous && request.ops(i - 1).local_buffer() == op.local_buffer()) {
      p.local = previous->local;
    } else {
      static const std::string kLocalBuffer = "local_buffer";
      auto local = buffers_->Get(op.local_buffer(), kLocalBuffer);
      if (!local.ok()) {
        return absl::Status(local.status().code(), absl::StrCat(f(), local.status().message()));
      }
      // A client file that shrank under an earlier touch shows zeros, not the client's bytes.
      if (absl::Status whole = NotBroken(**local, kLocalBuffer); !whole.ok()) {
        return absl::Status(whole.code(), absl::StrCat(f(), whole.message()));
      }
      p.local = batch.Keep(*std::move(local));
    }
    if (!RangeFits(op.local_offset(), op.length(), p.local->size())) {
      return RangeError(f() + "local_offset", op.local_offset(), op.length(),
                        absl::StrCat("local buffer ", p.local->id()), p.local->size());
    }
    p.local_offset = op.local_offset();
    ASSIGN_OR_RETURN(const OpTarget target, TargetOf(request, i));
    const std::string& peer = *target.peer;
    const std::string& name = *target.remote_buffer;
    // The prefix for the target's fields, likewise built only for an error.
    auto t = [&](absl::string_view field) { return absl::StrCat(target.Field(i, field), ": "); };
    if (peer.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(t("peer"), "must name a node"));
    }
    const bool same_peer = previous && previous->remote->node == peer;
    if (!same_peer && !peers_->Known(peer)) {
      return absl::NotFoundError(absl::StrCat(t("peer"), "unknown node ", Echo(peer)));
    }
    if (name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(t("remote_buffer"), "must name a buffer"));
    }
    if (name.size() > kMaxBufferName) {
      return absl::InvalidArgumentError(absl::StrCat(t("remote_buffer"), name.size(),
                                                     " characters is longer than any buffer "
                                                     "name (at most ",
                                                     kMaxBufferName, ")"));
    }
    // Likewise the previous op's remote buffer: no key to build for them.
    if (same_peer && previous->remote->name == name) {
      p.remote = previous->remote;
      p.here = previous->here;
    } else if (peer == peers_->self()) {
      // Both buffers are ours: found here, as the Peer API would find it for us (exported
      // to this node, not broken), and copied without a fabric. Whether the caller may
      // reach it was checked before Submit (server/local/own_node_access.h).
      auto key = std::make_pair(peer, name);
      auto it = remotes.find(key);
      if (it == remotes.end()) {
        ASSIGN_OR_RETURN(std::shared_ptr<Buffer> here,
                         OwnBuffer(*buffers_, peer, name, t("remote_buffer")));
        auto remote = std::make_shared<RemoteBuffer>();
        remote->node = peer;
        remote->name = name;
        remote->size = here->size();
        remote->device = here->device();
        remote->backend = here->backend();
        remote->mode = LegMode::kLocal;
        it = remotes.emplace(key, batch.Keep(std::move(remote))).first;
        heres[it->second] = batch.Keep(std::move(here));
      }
      p.remote = it->second;
      p.here = heres[it->second];
    } else {
      auto key = std::make_pair(peer, name);
      auto it = remotes.find(key);
      if (it == remotes.end()) {
        auto resolved = peers_->ResolveKept(peer, name, deadline);
        if (!resolved.ok()) {
          return absl::Status(resolved.status().code(),
                              absl::StrCat(t("remote_buffer"), resolved.status().message()));
        }
        it = remotes.emplace(key, batch.Keep(*std::move(resolved))).first;
      }
      p.remote = it->second;
    }
    if (!RangeFits(op.remote_offset(), op.length(), p.remote->size)) {
      return RangeError(f() + "remote_offset", op.remote_offset(), op.length(),
                        absl::StrCat(Echo(name), " on ", peer), p.remote->size);
    }
    p.remote_offset = op.remote_offset();
  }
  return batch;
}

}  // namespace ferry::server
