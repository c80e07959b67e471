#include "client/ferry_client.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <string_view>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/batch_arena.h"
#include "base/status_macros.h"
#include "base/unique_fd.h"
#include "client/agent_channel.h"
#include "client/gpu_mapping.h"
#include "client/shared_memory.h"
#include "client/socket_line.h"
#include "client/stream_wire.h"
#include "client/transfer_line.h"
#include "client/transfer_stream.h"
#include "grpcpp/grpcpp.h"
#include "base/grpc_status.h"

namespace ferry {

Buffer::~Buffer() {
  if (mapping_ != nullptr) munmap(mapping_, mapping_length_);
  if (!ipc_handle_.empty()) CloseCudaIpc(ipc_handle_).IgnoreError();
}

absl::StatusOr<std::unique_ptr<Buffer>> Buffer::Map(const ferry::v1::BufferInfo& info) {
  ferry::v1::ShmMapping shm = info.shm();
  if (info.has_gpu() && info.gpu().kind() == "cuda_ipc") {
    // The agent's "cuda:N" is its own numbering; find the same GPU in ours by PCI address.
    int device = -1;
    if (!info.gpu().pci().empty()) {
      auto ordinal = CudaDeviceByPci(info.gpu().pci());
      if (!ordinal.ok()) return ordinal.status();
      device = *ordinal;
    } else if (!absl::SimpleAtoi(info.device().substr(info.device().find(':') + 1), &device)) {
      return absl::InvalidArgumentError(
          absl::StrCat("buffer ", info.id(), ": device '", info.device(), "'"));
    }
    auto ptr = OpenCudaIpc(info.gpu().handle(), info.gpu().offset(), device);
    if (!ptr.ok()) return ptr.status();
    return std::unique_ptr<Buffer>(
        new Buffer(info, nullptr, 0, static_cast<char*>(*ptr), info.gpu().handle()));
  }
  if (info.has_gpu()) {
    if (info.gpu().kind() != "shm") {
      return absl::UnimplementedError(absl::StrCat(
          "buffer ", info.id(), " on ", info.device(), " is mapped by '", info.gpu().kind(),
          "', which this libferry cannot open"));
    }
    // A simulated GPU: its memory is shared host memory, mapped like a host buffer.
    shm.set_path(info.gpu().path());
    shm.set_offset(info.gpu().offset());
    shm.set_length(info.gpu().length());
  }
  // The agent lends a host buffer's own file over its fd socket (any uid of its owner); a
  // simulated GPU's memory is a path.
  UniqueFd fd;
  if (!shm.fd_socket().empty()) {
    ASSIGN_OR_RETURN(fd, BorrowBufferFile(shm.fd_socket(), info.id()));
  } else {
    fd.Reset(open(shm.path().c_str(), O_RDWR | O_CLOEXEC));
  }
  if (!fd.valid()) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat("open(", shm.path(), ") to map buffer ", info.id()));
  }
  // mmap needs a page-aligned offset; the agent aligns buffers, but do not depend on it.
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  uint64_t start = shm.offset() / page * page;
  uint64_t skew = shm.offset() - start;
  uint64_t length = shm.length() + skew;
  void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(),
                 static_cast<off_t>(start));
  if (p == MAP_FAILED) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat("mmap(buffer ", info.id(), ", ", length, " bytes)"));
  }
  return std::unique_ptr<Buffer>(new Buffer(info, p, length, static_cast<char*>(p) + skew));
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& target,
                                                        absl::Duration timeout,
                                                        const std::string& what) {
  auto session = AgentSession::Open(target, timeout, what);
  if (!session.ok()) return session.status();
  return std::make_unique<Client>(*std::move(session));
}

Client::Client(std::shared_ptr<AgentSession> session)
    : session_(std::move(session)), stub_(ferry::v1::Agent::NewStub(session_->channel())) {
  const char* use = std::getenv("FERRY_TRANSFER_SOCKET");
  absl::MutexLock lock(&mu_);
  use_transfer_socket_ = use == nullptr || std::string_view(use) != "0";
}

std::unique_ptr<grpc::ClientContext> Client::Context(absl::Duration timeout) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  session_->Attach(ctx.get());
  return ctx;
}

absl::StatusOr<ferry::v1::GetInfoResponse> Client::GetInfo() {
  ferry::v1::GetInfoResponse resp;
  auto ctx = Context();
  grpc::Status s = stub_->GetInfo(ctx.get(), {}, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

absl::StatusOr<std::unique_ptr<Buffer>> Client::Alloc(
    uint64_t size, const std::string& name, const std::string& device, bool persist,
    const std::vector<std::string>& allowed_peers) {
  ferry::v1::AllocBufferRequest req;
  req.set_size(size);
  req.set_name(name);
  req.set_device(device);
  req.set_persist(persist);
  for (const std::string& peer : allowed_peers) req.add_allowed_peers(peer);
  ferry::v1::AllocBufferResponse resp;
  auto ctx = Context();
  grpc::Status s = stub_->AllocBuffer(ctx.get(), req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  auto mapped = Buffer::Map(resp.buffer());
  if (!mapped.ok()) Free(resp.buffer().id()).IgnoreError();  // do not leak it in the agent
  return mapped;
}

absl::Status Client::Free(uint64_t id) {
  ferry::v1::FreeBufferRequest req;
  req.set_id(id);
  ferry::v1::FreeBufferResponse resp;
  auto ctx = Context();
  return FromGrpcStatus(stub_->FreeBuffer(ctx.get(), req, &resp));
}

absl::StatusOr<std::vector<ferry::v1::BufferInfo>> Client::ListBuffers() {
  ferry::v1::ListBuffersResponse resp;
  auto ctx = Context();
  grpc::Status s = stub_->ListBuffers(ctx.get(), {}, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return std::vector<ferry::v1::BufferInfo>(resp.buffers().begin(), resp.buffers().end());
}

absl::StatusOr<uint64_t> Client::StatRemoteBuffer(const std::string& node,
                                                  const std::string& name) {
  ferry::v1::StatRemoteBufferRequest req;
  req.set_node(node);
  req.set_name(name);
  ferry::v1::StatRemoteBufferResponse resp;
  auto ctx = Context();
  grpc::Status s = stub_->StatRemoteBuffer(ctx.get(), req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp.size();
}

void FillSubmitRequest(const std::vector<OpSpec>& ops, absl::Duration timeout,
                       ferry::v1::SubmitRequest* req) {
  req->mutable_ops()->Reserve(static_cast<int>(ops.size()));
  // Each remote buffer is named once, in `targets`, and its ops name it by index: a batch
  // names a few buffers thousands of times, and each name is an allocation for the agent to
  // parse before the transfer starts. Runs of ops to one buffer skip the lookup.
  absl::flat_hash_map<std::pair<std::string_view, std::string_view>, uint32_t> targets;
  const OpSpec* previous = nullptr;
  uint32_t target = 0;
  for (const OpSpec& o : ops) {
    if (!previous || o.peer != previous->peer || o.remote_buffer != previous->remote_buffer) {
      auto [it, added] = targets.try_emplace(std::make_pair(std::string_view(o.peer),
                                                            std::string_view(o.remote_buffer)),
                                             static_cast<uint32_t>(targets.size()));
      if (added) {
        ferry::v1::Target* t = req->add_targets();
        t->set_peer(o.peer);
        t->set_remote_buffer(o.remote_buffer);
      }
      target = it->second;
    }
    previous = &o;
    ferry::v1::Op* op = req->add_ops();
    op->set_type(o.type);
    op->set_local_buffer(o.local_buffer);
    op->set_local_offset(o.local_offset);
    op->set_target(target);
    op->set_remote_offset(o.remote_offset);
    op->set_length(o.length);
  }
  req->set_timeout_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(timeout)));
}

absl::StatusOr<uint64_t> Client::Submit(const std::vector<OpSpec>& ops, absl::Duration timeout) {
  // In an arena: freeing a batch is on the caller's way to its next one.
  google::protobuf::Arena arena(BatchArenaOptions());
  auto* req = google::protobuf::Arena::CreateMessage<ferry::v1::SubmitRequest>(&arena);
  FillSubmitRequest(ops, timeout, req);
  ferry::v1::SubmitResponse resp;
  auto ctx = Context();
  grpc::Status s = stub_->Submit(ctx.get(), *req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp.transfer_id();
}

absl::StatusOr<ferry::v1::TransferResult> Client::Wait(uint64_t transfer_id, absl::Duration wait,
                                                       bool include_ops) {
  ferry::v1::WaitRequest req;
  req.set_transfer_id(transfer_id);
  req.set_include_ops(include_ops);
  ferry::v1::TransferResult resp;
  auto ctx = Context(wait);
  grpc::Status s = stub_->Wait(ctx.get(), req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  if (include_ops) RETURN_IF_ERROR(FetchRemainingOps(resp));
  return resp;
}

absl::Status Client::FetchRemainingOps(ferry::v1::TransferResult& result) {
  // A page at a time, from where the last one ended (the transfer has ended: they are final).
  ferry::v1::WaitRequest req;
  req.set_transfer_id(result.transfer_id());
  req.set_include_ops(true);
  while (result.ops_next() != 0) {
    req.set_ops_from(result.ops_next());
    ferry::v1::TransferResult page;
    auto ctx = Context();
    grpc::Status s = stub_->Wait(ctx.get(), req, &page);
    if (!s.ok()) return FromGrpcStatus(s);
    for (auto& op : *page.mutable_ops()) *result.add_ops() = std::move(op);
    result.set_ops_next(page.ops_next());
  }
  return absl::OkStatus();
}

absl::StatusOr<ferry::v1::TransferResult> Client::Cancel(uint64_t transfer_id) {
  ferry::v1::CancelTransferRequest req;
  req.set_transfer_id(transfer_id);
  ferry::v1::TransferResult resp;
  auto ctx = Context();
  grpc::Status s = stub_->Cancel(ctx.get(), req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

absl::Status Client::Watch(
    uint64_t transfer_id,
    const std::function<void(const ferry::v1::TransferProgress&)>& on_progress) {
  ferry::v1::WatchRequest req;
  req.set_transfer_id(transfer_id);
  grpc::ClientContext ctx;
  session_->Attach(&ctx);
  auto reader = stub_->Watch(&ctx, req);
  ferry::v1::TransferProgress p;
  while (reader->Read(&p)) on_progress(p);
  return FromGrpcStatus(reader->Finish());
}

absl::StatusOr<ferry::v1::TransferResult> Client::Run(const std::vector<OpSpec>& ops,
                                                      absl::Duration timeout, bool include_ops) {
  const bool large = ops.size() > kLineOps;
  // The agent ends the transfer at its deadline; wait a little past it for the verdict.
  const absl::Duration wait = timeout + absl::Seconds(5);
  // A line that ended unseen (the agent restarted while it was idle) takes no request: the
  // second try has a new one.
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::shared_ptr<SocketLine> socket = Socket(large ? SocketUse::kBulk : SocketUse::kSmall);
    if (socket == nullptr && large) break;  // not over the shared gRPC line: a call of its own
    TransferLine::Outcome outcome = socket != nullptr
                                        ? socket->Run(ops, timeout, include_ops, wait)
                                        : Line()->Run(ops, timeout, include_ops, wait);
    if (!outcome.sent) continue;
    if (outcome.result.ok() && include_ops) {
      RETURN_IF_ERROR(FetchRemainingOps(*outcome.result));  // later pages come by Wait
    }
    return outcome.result;
  }
  // No line takes it (the agent is gone, or refuses the stream), or a large batch with no
  // socket: a call of its own, which also says why.
  return RunCall(ops, timeout, include_ops);
}

std::optional<absl::StatusOr<ferry::v1::MoveBlocksResponse>> Client::MoveOnSocket(
    const ferry::v1::MoveBlocksRequest& request, absl::Duration wait) {
  if (TransferSocketPath().empty()) return std::nullopt;
  {
    absl::MutexLock lock(&mu_);
    if (!socket_moves_) return std::nullopt;  // an agent whose socket takes no moves
  }
  const bool large = static_cast<size_t>(request.local_blocks_size()) > kLineOps;
  for (int attempt = 0; attempt < 2; ++attempt) {  // as Run: a line may have ended unseen
    std::shared_ptr<SocketLine> socket = Socket(large ? SocketUse::kBulk : SocketUse::kSmall);
    if (socket == nullptr) return std::nullopt;
    TransferLine::Outcome outcome = socket->Move(session_->id(), request, wait);
    if (!outcome.sent) continue;
    if (!outcome.result.ok()) return outcome.result.status();
    ferry::v1::MoveBlocksResponse response;
    response.set_transfer_id(outcome.result->transfer_id());
    response.set_bytes(outcome.result->bytes_total());
    *response.mutable_result() = *std::move(outcome.result);
    return response;
  }
  return std::nullopt;
}

std::optional<absl::StatusOr<ferry::v1::PollNotificationsResponse>> Client::PollOnSocket(
    const ferry::v1::PollNotificationsRequest& request) {
  if (TransferSocketPath().empty()) return std::nullopt;
  {
    absl::MutexLock lock(&mu_);
    if (!socket_polls_) return std::nullopt;  // an agent whose socket answers no polls
  }
  // The agent answers at once: this is only how long a busy agent may take to read it.
  constexpr absl::Duration kPollWait = absl::Seconds(10);
  for (int attempt = 0; attempt < 2; ++attempt) {  // as Run: a line may have ended unseen
    std::shared_ptr<SocketLine> socket = Socket(SocketUse::kPolls);
    if (socket == nullptr) return std::nullopt;
    SocketLine::Polled polled = socket->Poll(request, kPollWait);
    if (!polled.sent) continue;  // nothing was taken: ask again
    return std::move(polled.notifications);
  }
  return std::nullopt;
}

absl::StatusOr<ferry::v1::TransferResult> Client::RunCall(const std::vector<OpSpec>& ops,
                                                          absl::Duration timeout,
                                                          bool include_ops) {
  // In an arena: freeing a batch is on the caller's way to its next one.
  google::protobuf::Arena arena(BatchArenaOptions());
  auto* req = google::protobuf::Arena::CreateMessage<ferry::v1::TransferRequest>(&arena);
  FillSubmitRequest(ops, timeout, req->mutable_submit());
  req->set_include_ops(include_ops);
  ferry::v1::TransferResult resp;
  auto ctx = Context(timeout + absl::Seconds(5));
  grpc::Status s = stub_->Transfer(ctx.get(), *req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  if (include_ops) RETURN_IF_ERROR(FetchRemainingOps(resp));  // later pages come by Wait
  return resp;
}

std::shared_ptr<TransferLine> Client::Line() {
  absl::MutexLock lock(&mu_);
  if (line_ == nullptr || line_->ended()) {
    // No deadline: the line lives as long as the client; each transfer has its own.
    auto ctx = std::make_unique<grpc::ClientContext>();
    session_->Attach(ctx.get());
    line_ = std::make_shared<TransferLine>(*stub_, std::move(ctx));
  }
  return line_;
}

void Client::set_use_transfer_socket(bool use) {
  absl::MutexLock lock(&mu_);
  use_transfer_socket_ = use;
  socket_retry_after_ = absl::InfinitePast();
  if (use) return;
  socket_line_.reset();
  bulk_socket_line_.reset();
  poll_socket_line_.reset();
}

std::string Client::TransferSocketPath() {
  {
    absl::MutexLock lock(&mu_);
    if (!use_transfer_socket_ || absl::Now() < socket_retry_after_) return "";
    if (transfer_socket_.has_value()) return *transfer_socket_;
  }
  // Briefly: an agent that does not answer (stopped, overloaded) would otherwise hold the
  // caller's transfer for GetInfo's 30 s before its own deadline even began.
  ferry::v1::GetInfoResponse info;
  auto ctx = Context(kSocketRetry);
  if (!stub_->GetInfo(ctx.get(), {}, &info).ok()) {
    SocketUnreached();  // the gRPC call made instead says why; asked again after a while
    return "";
  }
  absl::MutexLock lock(&mu_);
  transfer_socket_ = info.transfer_socket();
  socket_moves_ = info.transfer_socket_moves();
  socket_polls_ = info.transfer_socket_polls();
  return *transfer_socket_;
}

void Client::SocketUnreached() {
  // Not reached (a client in another mount namespace, or over local_tcp from another node):
  // gRPC carries it, and no one tries again for a second (a connect per Run would be a
  // syscall on every op of a client that never reaches it).
  absl::MutexLock lock(&mu_);
  socket_retry_after_ = absl::Now() + kSocketRetry;
}

std::shared_ptr<SocketLine>& Client::SocketLocked(SocketUse use) {
  switch (use) {
    case SocketUse::kBulk:
      return bulk_socket_line_;
    case SocketUse::kPolls:
      return poll_socket_line_;
    case SocketUse::kSmall:
      break;
  }
  return socket_line_;
}

std::shared_ptr<SocketLine> Client::Socket(SocketUse use) {
  {
    absl::MutexLock lock(&mu_);
    if (!use_transfer_socket_) return nullptr;
    const std::shared_ptr<SocketLine>& line = SocketLocked(use);
    if (line != nullptr && !line->ended()) return line;
  }
  const std::string path = TransferSocketPath();
  if (path.empty()) return nullptr;
  absl::StatusOr<std::unique_ptr<SocketLine>> line = SocketLine::Connect(path);
  if (!line.ok()) {
    SocketUnreached();
    return nullptr;
  }
  absl::MutexLock lock(&mu_);
  std::shared_ptr<SocketLine>& kept = SocketLocked(use);
  if (kept == nullptr || kept->ended()) kept = *std::move(line);
  return kept;
}

absl::StatusOr<std::unique_ptr<TransferStream>> Client::OpenTransferStream() {
  if (const std::string path = TransferSocketPath(); !path.empty()) {
    absl::StatusOr<std::unique_ptr<StreamWire>> wire = SocketStreamWire(path);
    if (wire.ok()) return std::make_unique<TransferStream>(*std::move(wire));
    SocketUnreached();
  }
  // No deadline: the stream lives as long as its user wants; each transfer has its own.
  auto ctx = std::make_unique<grpc::ClientContext>();
  session_->Attach(ctx.get());
  ASSIGN_OR_RETURN(std::unique_ptr<StreamWire> wire, GrpcStreamWire(*stub_, std::move(ctx)));
  return std::make_unique<TransferStream>(std::move(wire));
}

absl::Status Client::Write(const Buffer& local, uint64_t local_offset, const std::string& peer,
                           const std::string& remote_buffer, uint64_t remote_offset,
                           uint64_t length) {
  auto result = Run(
      {{ferry::v1::WRITE, local.id(), local_offset, peer, remote_buffer, remote_offset, length}});
  return result.ok() ? TransferStatus(*result) : result.status();
}

absl::StatusOr<ferry::v1::PolicyState> Client::GetPolicy() {
  ferry::v1::PolicyState resp;
  auto ctx = Context();
  grpc::Status s = stub_->GetPolicy(ctx.get(), {}, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

absl::StatusOr<ferry::v1::PolicyState> Client::SetPolicy(
    const std::vector<std::pair<std::string, std::string>>& settings, bool clear_overrides) {
  ferry::v1::SetPolicyRequest req;
  req.set_clear_overrides(clear_overrides);
  for (const auto& [key, value] : settings) {
    auto* s = req.add_settings();
    s->set_key(key);
    s->set_value(value);
  }
  ferry::v1::PolicyState resp;
  auto ctx = Context();
  grpc::Status s = stub_->SetPolicy(ctx.get(), req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

absl::Status Client::Read(const Buffer& local, uint64_t local_offset, const std::string& peer,
                          const std::string& remote_buffer, uint64_t remote_offset,
                          uint64_t length) {
  auto result = Run(
      {{ferry::v1::READ, local.id(), local_offset, peer, remote_buffer, remote_offset, length}});
  return result.ok() ? TransferStatus(*result) : result.status();
}

absl::Status TransferStatus(const ferry::v1::TransferResult& result) {
  if (result.state() == ferry::v1::SUCCEEDED) return absl::OkStatus();
  if (result.state() == ferry::v1::RUNNING) {
    return absl::DeadlineExceededError(
        absl::StrCat("transfer ", result.transfer_id(), " still running"));
  }
  return absl::Status(static_cast<absl::StatusCode>(result.code()), result.message());
}

}  // namespace ferry
