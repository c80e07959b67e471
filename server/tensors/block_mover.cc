#include "server/tensors/block_mover.h"

#include <algorithm>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/batch_arena.h"
#include "base/echo.h"
#include "base/status_macros.h"
#include "ferry/v1/tensor.grpc.pb.h"
#include "server/tensors/block_checksum.h"
#include "server/tensors/notification_board.h"
#include "server/tensors/peer_call.h"

namespace ferry::server {
namespace {

// How long the peer may take to say where its blocks are.
constexpr absl::Duration kResolveTimeout = absl::Seconds(10);
// More blocks than a peer's answer may describe: no MoveBlocks names that many.
constexpr uint64_t kMaxRemoteBlocks = 1ull << 32;

// Not told apart from a list that does not exist, so that a peer learns nothing of what
// it may not reach.
absl::Status NoSuchList(const std::string& name) {
  return absl::NotFoundError(
      absl::StrCat("no block list named ", Echo(name), " (or one of its buffers is gone)"));
}

// The engine names op i; MoveBlocks' op i is pair i, which the caller knows as
// local_blocks[i] -> remote_blocks[i].
absl::Status AsPairs(const absl::Status& s) {
  std::string msg(s.message());
  if (absl::StartsWith(msg, "ops")) msg = "pairs" + msg.substr(3);
  return absl::Status(s.code(), msg);
}

// Two pairs that land in one block leave it holding one source, or a mix of both, while the
// move still succeeds: refused up front, naming both pairs. `landing`: the side written to
// (local_blocks for a READ, remote_blocks for a WRITE); the other side may repeat a block
// (one local block pushed to several remote ones is a broadcast).
absl::Status NoBlockLandedTwice(const google::protobuf::RepeatedField<uint64_t>& landing,
                                absl::string_view field, absl::string_view type) {
  absl::flat_hash_map<uint64_t, int> first;
  first.reserve(landing.size());
  for (int i = 0; i < landing.size(); ++i) {
    auto [at, fresh] = first.try_emplace(landing[i], i);
    if (!fresh) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, "[", i, "]: block ", landing[i], " is ", field, "[", at->second,
          "] too; a ", type, " would land two blocks in it (each block at most once)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ferry::v1::ResolveBlocksResponse> BlockMover::AskPeer(const std::string& node,
                                                                     const std::string& list,
                                                                     absl::Time deadline) {
  auto channel = peers_->Channel(node);
  if (absl::IsNotFound(channel.status())) {
    return absl::NotFoundError(absl::StrCat("peer: unknown node '", node, "'"));
  }
  if (!channel.ok()) return channel.status();
  auto stub = ferry::v1::TensorPeer::NewStub(*std::move(channel));
  ferry::v1::ResolveBlocksRequest req;
  req.set_list(list);
  req.set_from_node(peers_->self());
  ferry::v1::ResolveBlocksResponse resp;
  const absl::Duration budget = deadline - absl::Now();
  auto ctx = PeerContext(deadline);
  grpc::Status s = stub->ResolveBlocks(ctx.get(), req, &resp);
  if (!s.ok()) return PeerCallError(s, "remote_list", node, "ResolveBlocks", budget);
  // The peer's answer is checked like any network input: it sizes the lookups below.
  uint64_t blocks = 0;
  for (int r = 0; r < resp.extents_size(); ++r) {
    const ferry::v1::RemoteExtent& e = resp.extents(r);
    // Each block's offset must be computable: its last block ends within 64 bits; and one
    // extent's blocks do not overlap, as BlockLists::Prepare makes them.
    if (e.block_bytes() == 0 || e.count() == 0 || e.count() > kMaxRemoteBlocks - blocks ||
        (e.count() > 1 && StrideOf(e) < e.block_bytes()) || !ExtentFits(e, UINT64_MAX)) {
      return absl::DataLossError(absl::StrCat("remote_list: ", node, "'s answer for ", Echo(list),
                                              " has a malformed extent ", r));
    }
    blocks += e.count();
  }
  return resp;
}

absl::StatusOr<std::shared_ptr<const RemoteList>> BlockMover::RemoteListOf(
    const std::string& node, const std::string& list, absl::Time deadline) {
  ResolveCache& kept = peers_->kept_answers();
  for (int attempt = 0; attempt < PeerDirectory::kResolveAttempts; ++attempt) {
    if (auto answer = kept.FindList(node, list)) {
      // As for kept buffer answers: a broken connection says the peer may have restarted.
      if (!peers_->LinkBroken(node)) return answer;
      kept.Revoke(node, {}, true);
    }
    const uint64_t epoch = kept.Epoch(node);
    ASSIGN_OR_RETURN(ferry::v1::ResolveBlocksResponse resp, AskPeer(node, list, deadline));
    auto answer =
        std::make_shared<const RemoteList>(RemoteList{node, list, std::move(resp), absl::Now()});
    if (!answer->answer.revocable()) return answer;
    if (auto used = kept.KeepList(epoch, std::move(answer))) return used;
    // Revoked on its way (the list released, a buffer of it freed): ask again.
  }
  return absl::UnavailableError(absl::StrCat("remote_list: ", node, " revoked its answer for ",
                                             Echo(list), " ", PeerDirectory::kResolveAttempts,
                                             " times while it was on its way"));
}

bool BlockMover::MayAskPeer(const ferry::v1::MoveBlocksRequest& req) {
  const std::string& node = req.peer();
  if (!peers_->Known(node)) return false;
  std::shared_ptr<const RemoteList> answer =
      peers_->kept_answers().FindList(node, req.remote_list());
  // No kept answer (or one RemoteListOf would drop: a link broke), or rails to ask for.
  if (answer == nullptr || !peers_->RailsFresh(node)) return true;
  // The engine resolves the buffers the list names, once per buffer (kept answers too).
  const std::string* last = nullptr;
  for (const ferry::v1::RemoteExtent& e : answer->answer.extents()) {
    if (last != nullptr && *last == e.buffer()) continue;
    last = &e.buffer();
    if (!peers_->Kept(node, e.buffer())) return true;
  }
  return false;
}

absl::StatusOr<ferry::v1::MoveBlocksResponse> BlockMover::Move(
    const ferry::v1::MoveBlocksRequest& req, uint64_t session, int64_t owner_uid,
    uint32_t timeout_ms, absl::Time deadline, Finished then) {
  if (req.type() != ferry::v1::READ && req.type() != ferry::v1::WRITE) {
    return absl::InvalidArgumentError("type: must be READ or WRITE");
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const BlockList> list, lists_->Get(req.list(), session, "list"));
  RETURN_IF_ERROR(CheckName(req.peer(), "peer"));
  RETURN_IF_ERROR(CheckName(req.remote_list(), "remote_list"));
  if (req.notification().size() > kMaxNameLength) {
    return absl::InvalidArgumentError(absl::StrCat("notification: ", req.notification().size(),
                                                   " characters is more than ", kMaxNameLength));
  }
  RETURN_IF_ERROR(CheckNotificationPayload(req.notification_payload(), req.notification(),
                                           "notification_payload"));
  const int n = req.local_blocks_size();
  if (n == 0) return absl::InvalidArgumentError("local_blocks: no blocks to move");
  if (req.remote_blocks_size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("remote_blocks: ", req.remote_blocks_size(), " indices for ", n,
                     " local_blocks (they pair up one to one)"));
  }
  for (int i = 0; i < n; ++i) {
    if (req.local_blocks(i) >= list->size()) {
      return absl::InvalidArgumentError(absl::StrCat("local_blocks[", i, "]: ", req.local_blocks(i),
                                                     " is out of range (list ", list->id(),
                                                     " has ", list->size(), " blocks)"));
    }
  }
  if (req.type() == ferry::v1::READ) {
    RETURN_IF_ERROR(NoBlockLandedTwice(req.local_blocks(), "local_blocks", "READ"));
  } else {
    RETURN_IF_ERROR(NoBlockLandedTwice(req.remote_blocks(), "remote_blocks", "WRITE"));
  }
  // The peer is asked within the move's own time (as the caller counts it from now), at
  // most kResolveTimeout, and before the call's deadline: a hung peer costs the caller
  // what it said it would wait, not more.
  const absl::Time started = absl::Now();
  absl::Time resolve_by = std::min(deadline, started + kResolveTimeout);
  if (timeout_ms != 0) resolve_by = std::min(resolve_by, started + absl::Milliseconds(timeout_ms));
  ASSIGN_OR_RETURN(std::shared_ptr<const RemoteList> remote_list,
                   RemoteListOf(req.peer(), req.remote_list(), resolve_by));
  // The transfer has what is left of timeout_ms (at least 1 ms: 0 would mean the default).
  if (timeout_ms != 0) {
    const int64_t spent = absl::ToInt64Milliseconds(absl::Now() - started);
    timeout_ms = static_cast<uint32_t>(std::max<int64_t>(1, int64_t{timeout_ms} - spent));
  }
  auto moved = MoveOn(req, *list, remote_list, owner_uid, timeout_ms, std::move(then));
  // Refused on a kept answer (a block out of its range, a buffer it names gone when the
  // engine resolved it): the answer may be what is wrong, so the next move asks again.
  if (!moved.ok() && remote_list->answer.revocable()) {
    peers_->kept_answers().ForgetList(remote_list);
  }
  return moved;
}

absl::Status BlockMover::Notify(const ferry::v1::NotifyRequest& req, absl::Time deadline) {
  RETURN_IF_ERROR(CheckName(req.peer(), "peer"));
  RETURN_IF_ERROR(CheckName(req.remote_list(), "remote_list"));
  RETURN_IF_ERROR(CheckName(req.name(), "name"));
  RETURN_IF_ERROR(CheckNotificationPayload(req.payload(), req.name(), "payload"));
  // One budget for both calls, as Move's: a hung peer costs what the caller said it waits.
  const absl::Time started = absl::Now();
  absl::Time by = std::min(deadline, started + kResolveTimeout);
  if (req.timeout_ms() != 0) by = std::min(by, started + absl::Milliseconds(req.timeout_ms()));
  // The list resolved proves this node may reach it (the peer refuses a list not exported
  // to it as one it does not have), and a kept answer asks the peer nothing.
  RETURN_IF_ERROR(RemoteListOf(req.peer(), req.remote_list(), by).status());
  auto channel = peers_->Channel(req.peer());
  if (!channel.ok()) return channel.status();
  ferry::v1::Notification note;
  note.set_name(req.name());
  note.set_from_node(peers_->self());
  note.set_list(req.remote_list());  // its owner there is who the notification is for
  note.set_payload(req.payload());
  // Straight to the peer, not through the NotifySender's queue: the caller waits to learn
  // that it was delivered (the queue's sends are fire and forget).
  auto stub = ferry::v1::TensorPeer::NewStub(*std::move(channel));
  ferry::v1::NotifyResponse resp;
  auto ctx = PeerContext(by);
  grpc::Status s = stub->Notify(ctx.get(), note, &resp);
  if (!s.ok()) return PeerCallError(s, "peer", req.peer(), "Notify", by - started);
  return absl::OkStatus();
}

absl::StatusOr<ferry::v1::MoveBlocksResponse> BlockMover::MoveOn(
    const ferry::v1::MoveBlocksRequest& req, const BlockList& list,
    std::shared_ptr<const RemoteList> remote_list, int64_t owner_uid, uint32_t timeout_ms,
    Finished then) {
  const int n = req.local_blocks_size();
  const ferry::v1::ResolveBlocksResponse& remote = remote_list->answer;
  const ExtentIndex remote_index(remote.extents());

  // Built in an arena (the engine copies what it needs): the ops go in one free.
  google::protobuf::Arena arena(BatchArenaOptions());
  auto& submit = *google::protobuf::Arena::CreateMessage<ferry::v1::SubmitRequest>(&arena);
  submit.mutable_ops()->Reserve(n);
  uint64_t bytes = 0;
  std::shared_ptr<VerifyPlan> plan;
  absl::flat_hash_map<uint64_t, std::shared_ptr<const Buffer>> held;  // by id, for the plan
  std::vector<int> extent_targets(remote.extents_size(), -1);  // into submit.targets
  absl::flat_hash_map<absl::string_view, int> buffer_targets;   // the same, by buffer name
  if (req.verify()) {
    plan = std::make_shared<VerifyPlan>();
    plan->peer = req.peer();
    plan->remote_list = req.remote_list();
    plan->local_ids.assign(req.local_blocks().begin(), req.local_blocks().end());
    plan->remote_ids.assign(req.remote_blocks().begin(), req.remote_blocks().end());
    plan->local.reserve(n);
  }
  for (int i = 0; i < n; ++i) {
    const uint64_t r = req.remote_blocks(i);
    if (r >= remote_index.size()) {
      return absl::InvalidArgumentError(absl::StrCat("remote_blocks[", i, "]: ", r,
                                                     " is out of range (", req.peer(), "'s list ",
                                                     Echo(req.remote_list()), " has ",
                                                     remote_index.size(), " blocks)"));
    }
    const ListBlock local = list.At(req.local_blocks(i));
    const auto [extent, j] = remote_index.Find(r);
    const ferry::v1::RemoteExtent& e = remote.extents(static_cast<int>(extent));
    // A pair moves whole blocks: of unequal lengths, one side would be cut short or left
    // partly old, with the move succeeding.
    if (e.block_bytes() != local.length) {
      return absl::InvalidArgumentError(absl::StrCat(
          "local_blocks[", i, "], remote_blocks[", i, "]: local block ", req.local_blocks(i),
          " is ", local.length, " bytes, block ", r, " of ", req.peer(), "'s list ",
          Echo(req.remote_list()), " is ", e.block_bytes(), " (a pair moves equal lengths)"));
    }
    ferry::v1::Op* op = submit.add_ops();
    op->set_type(req.type());
    op->set_local_buffer(local.buffer);
    op->set_local_offset(local.offset);
    // Each buffer is named once, as a target: not one name per block to copy, nor one per
    // extent (a list of single entries has an extent per block, most in one buffer).
    int& target = extent_targets[extent];
    if (target < 0) {
      auto [at, fresh] = buffer_targets.try_emplace(e.buffer(), submit.targets_size());
      if (fresh) {
        ferry::v1::Target* t = submit.add_targets();
        t->set_peer(req.peer());
        t->set_remote_buffer(e.buffer());
      }
      target = at->second;
    }
    op->set_target(static_cast<uint32_t>(target));
    op->set_remote_offset(e.offset() + j * StrideOf(e));
    op->set_length(local.length);
    bytes += local.length;
    if (plan) {
      std::shared_ptr<const Buffer>& buffer = held[local.buffer];
      if (!buffer) {
        ASSIGN_OR_RETURN(buffer, buffers_->Get(local.buffer, "list"));
      }
      plan->local.push_back({buffer, local.offset, local.length});
    }
  }
  submit.set_timeout_ms(timeout_ms);

  TransferEngine::FinishedHook hook;
  // A move on a kept answer holds it until it finished (a revocation waits for that), and
  // one that failed may have failed on it: the next one asks again.
  std::shared_ptr<const RemoteList> kept = remote.revocable() ? remote_list : nullptr;
  if (!req.notification().empty() || kept != nullptr || then) {
    hook = [notifier = notifier_, node = req.peer(), name = req.notification(),
            payload = req.notification_payload(), list = req.remote_list(),
            blocks = static_cast<uint32_t>(n), kept = std::move(kept),
            cache = &peers_->kept_answers(), then = std::move(then)](const Transfer& transfer) {
      ferry::v1::TransferResult result = transfer.Result();
      if (kept != nullptr && result.state() != ferry::v1::SUCCEEDED) cache->ForgetList(kept);
      if (!name.empty()) {
        ferry::v1::Notification note;
        note.set_name(name);
        note.set_list(list);  // its owner there is who the notification is for
        note.set_bytes(result.bytes());
        note.set_blocks(blocks);
        note.set_code(result.state() == ferry::v1::SUCCEEDED ? 0 : result.code());
        note.set_message(result.message());
        note.set_payload(payload);
        notifier->Send(node, std::move(note));
      }
      if (then) then(result);  // the result computed once, for both
    };
  }
  auto id = engine_->Submit(submit, std::move(hook),
                            plan ? verifier_.Hook(std::move(plan)) : TransferEngine::CheckHook(),
                            owner_uid);
  if (!id.ok()) return AsPairs(id.status());
  ferry::v1::MoveBlocksResponse resp;
  resp.set_transfer_id(*id);
  resp.set_bytes(bytes);
  return resp;
}

absl::StatusOr<ferry::v1::ResolveBlocksResponse> BlockMover::Resolve(
    const std::string& name, const std::string& caller, ExportLeases* leases) const {
  auto list = lists_->Exported(name);
  if (!list.ok()) return list.status();
  // A caller that may not have the list is refused before anything is granted to it (so it
  // cannot make us call anyone).
  for (const ferry::v1::BlockExtent& e : (*list)->extents()) {
    auto buffer = buffers_->Get(e.buffer(), "list");
    if (!buffer.ok() || !(*buffer)->ExportedTo(caller)) return NoSuchList(name);
  }
  // Granted before what the answer says is read (again): a release, free or unexport that
  // ran before a grant is seen by the lookups after it, and the answer is refused. A grant
  // made for a refused answer is revoked (nobody keeps it; revoking it may cost another
  // holder of the same name one more question), so no holder is left for a name that went.
  const bool revocable = leases != nullptr && leases->CanGrant(caller);
  std::vector<std::string> granted;
  auto refuse = [&] {
    if (revocable) {
      leases->RevokeLists({name}, "gone while answering");
      leases->Revoke(granted, "gone while answering");
    }
    return NoSuchList(name);
  };
  if (revocable) leases->GrantList(name, caller);
  ferry::v1::ResolveBlocksResponse resp;
  for (const ferry::v1::BlockExtent& e : (*list)->extents()) {
    // A buffer freed, or unexported to the caller, since the check above.
    auto buffer = buffers_->Get(e.buffer(), "list");
    if (!buffer.ok() || !(*buffer)->ExportedTo(caller)) return refuse();
    if (revocable) {
      leases->Grant((*buffer)->name(), caller);
      granted.push_back((*buffer)->name());
      auto again = buffers_->Get(e.buffer(), "list");
      if (!again.ok() || *again != *buffer || !(*buffer)->ExportedTo(caller)) return refuse();
    }
    ferry::v1::RemoteExtent* out = resp.add_extents();
    out->set_buffer((*buffer)->name());
    out->set_offset(e.offset());
    out->set_block_bytes(e.block_bytes());
    out->set_count(e.count());
    out->set_stride(e.stride());
  }
  if (revocable) {
    auto again = lists_->Exported(name);
    if (!again.ok() || *again != *list) return refuse();  // released meanwhile
  }
  // A drain revokes everything once, when it starts: an answer given after cannot be kept
  // (the grants stay with an agent that is going away).
  resp.set_revocable(revocable && !engine_->draining());
  return resp;
}

absl::StatusOr<ferry::v1::ChecksumBlocksResponse> BlockMover::Checksum(
    const ferry::v1::ChecksumBlocksRequest& req, const std::string& caller,
    const std::function<bool()>& cancelled) const {
  auto list = lists_->Exported(req.list());
  if (!list.ok()) return list.status();
  if (req.blocks_size() > kMaxChecksumBlocks) {
    return absl::InvalidArgumentError(absl::StrCat("blocks: ", req.blocks_size(),
                                                   " is more than ", kMaxChecksumBlocks,
                                                   " in one call"));
  }
  ferry::v1::ChecksumBlocksResponse resp;
  resp.mutable_crc32c()->Reserve(req.blocks_size());
  absl::flat_hash_map<uint64_t, std::shared_ptr<Buffer>> buffers;  // each looked up once
  std::vector<char> scratch;
  for (int i = 0; i < req.blocks_size(); ++i) {
    const uint64_t index = req.blocks(i);
    if (index >= (*list)->size()) {
      return absl::InvalidArgumentError(absl::StrCat("blocks[", i, "]: ", index,
                                                     " is out of range (the list has ",
                                                     (*list)->size(), " blocks)"));
    }
    if (cancelled()) return absl::CancelledError("the caller went before every block was read");
    const ListBlock block = (*list)->At(index);
    std::shared_ptr<Buffer>& buffer = buffers[block.buffer];
    if (!buffer) {
      auto found = buffers_->Get(block.buffer, "list");
      if (!found.ok() || !(*found)->ExportedTo(caller)) return NoSuchList(req.list());
      buffer = *std::move(found);
    }
    ASSIGN_OR_RETURN(uint32_t crc, BlockCrc32c(*buffer, block.offset, block.length,
                                               buffers_->gpus(), scratch));
    resp.add_crc32c(crc);
  }
  return resp;
}

}  // namespace ferry::server
