// libferry's public Client and Buffer (<ferry/ferry_client.h>): each holds the agent-side
// client's object (client/ferry_client.h) and answers in the public values (convert.h).
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/agent_channel.h"
#include "client/sdk/agent_client.h"
#include "client/sdk/convert.h"
#include "ferry/ferry_client.h"

namespace ferry::sdk {

using sdk_convert::FromProto;
using sdk_convert::ToOpSpecs;

struct Buffer::Mapping {
  std::unique_ptr<agent_client::Buffer> buffer;
};

// A session lives as long as the agent run that opened it. Once that run went away (killed,
// crashed, restarted), a new run on the same socket knows nothing of the session, and calls
// went on to it, each failing its own way or not failing at all (tests/sdk_restart_test.cc,
// before this check): Alloc, Free and the registrations FAILED_PRECONDITION "session N is
// not open"; Write, Read, Run, Submit and WriteBlocks NOT_FOUND "buffer 2 does not exist"
// (the new run's ids start again, so they may name someone else's buffer); Wait, Poll and
// Cancel NOT_FOUND; WaitNotification waited its whole timeout; GetInfo, ListBuffers,
// PollNotifications and Get/SetPolicy answered OK about the new run. So every call first
// asks the session whether it is still open and answers Gone() at once when not. libferry
// does not reconnect by itself: what the session held is lost, and only the program knows
// what to allocate and register again (Python's client reconnects, python/ferry/session.py,
// since it tracks what it registered).
struct Client::Session {
  std::string target;  // the agent's socket or address, as Connect resolved it
  std::unique_ptr<agent_client::Client> client;
  // On the client's session; goes first (declared after it).
  std::unique_ptr<agent_client::TensorClient> tensors;

  const AgentSession& agent() const { return client->session(); }

  // UNAVAILABLE saying the agent went away, and what that means here; OK while the session
  // is open.
  absl::Status Gone() const {
    const AgentSession& s = agent();
    if (s.alive()) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat(
        "ferryd at ", target, " went away: session ", s.id(), " of its run (incarnation ",
        absl::Hex(s.incarnation()), ", started ",
        absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", s.agent_started(), absl::UTCTimeZone()),
        ") ended (", s.ended().message(),
        "). It was killed, crashed or restarted: this Client's buffers, registrations and "
        "notifications waiting for it went with that run. Connect again (Client::Connect) and "
        "allocate and register again what you need"));
  }

  // `call()` (returning a Status or StatusOr) if the session is open; Gone() instead if it
  // is not, before the call or once it failed. A new run of the agent may refuse the session
  // ("session N is not open") a moment before gRPC tells this client that the old run's
  // connection closed: the session then waits that moment (1 s at most) for it.
  template <typename Call>
  auto Answer(Call&& call) -> decltype(call()) {
    if (absl::Status gone = Gone(); !gone.ok()) return gone;
    auto answer = call();
    if (answer.ok()) return answer;
    const absl::Status& failed = GetStatus(answer);
    const bool refused =
        failed.code() == absl::StatusCode::kFailedPrecondition &&
        absl::StrContains(failed.message(), absl::StrCat("session ", agent().id(), " is not open"));
    if (refused) agent().AwaitEnd(absl::Seconds(1));
    if (absl::Status gone = Gone(); !gone.ok()) return gone;
    return answer;
  }

 private:
  static const absl::Status& GetStatus(const absl::Status& s) { return s; }
  template <typename T>
  static const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
    return s.status();
  }
};

namespace {

template <typename T, typename U>
absl::StatusOr<T> Converted(absl::StatusOr<U> value) {
  if (!value.ok()) return value.status();
  return FromProto(*value);
}

}  // namespace

Buffer::Buffer(std::unique_ptr<Mapping> mapping, BufferInfo info, char* data)
    : mapping_(std::move(mapping)), info_(std::move(info)), data_(data) {}

Buffer::~Buffer() = default;

Client::Client(std::unique_ptr<Session> session) : session_(std::move(session)) {}

Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& target,
                                                        absl::Duration timeout) {
  auto client = agent_client::Client::Connect(target, timeout, "libferry");
  if (!client.ok()) return client.status();
  auto session = std::make_unique<Session>();
  session->target = target.empty() ? ::ferry::DefaultAgentSocket() : target;
  session->tensors = std::make_unique<agent_client::TensorClient>((*client)->shared_session());
  session->client = std::move(*client);
  return std::unique_ptr<Client>(new Client(std::move(session)));
}

bool Client::connected() const { return session_->agent().alive(); }

absl::StatusOr<AgentInfo> Client::GetInfo() {
  return session_->Answer([&] { return Converted<AgentInfo>(session_->client->GetInfo()); });
}

absl::StatusOr<std::unique_ptr<Buffer>> Client::Alloc(uint64_t size, const AllocOptions& options) {
  return session_->Answer([&]() -> absl::StatusOr<std::unique_ptr<Buffer>> {
    auto buffer = session_->client->Alloc(size, options.name, options.device, options.persist,
                                          options.allowed_peers);
    if (!buffer.ok()) return buffer.status();
    BufferInfo info = FromProto((*buffer)->info());
    char* data = (*buffer)->data();
    return std::unique_ptr<Buffer>(
        new Buffer(std::make_unique<Buffer::Mapping>(Buffer::Mapping{std::move(*buffer)}),
                   std::move(info), data));
  });
}

absl::Status Client::Free(uint64_t id) {
  return session_->Answer([&] { return session_->client->Free(id); });
}

absl::StatusOr<std::vector<BufferInfo>> Client::ListBuffers() {
  return session_->Answer([&]() -> absl::StatusOr<std::vector<BufferInfo>> {
    auto buffers = session_->client->ListBuffers();
    if (!buffers.ok()) return buffers.status();
    std::vector<BufferInfo> out;
    out.reserve(buffers->size());
    for (const v1::BufferInfo& info : *buffers) out.push_back(FromProto(info));
    return out;
  });
}

absl::StatusOr<uint64_t> Client::StatRemoteBuffer(const std::string& node,
                                                  const std::string& name) {
  return session_->Answer([&] { return session_->client->StatRemoteBuffer(node, name); });
}

absl::StatusOr<Registration> Client::RegisterMemory(const void* address, uint64_t length,
                                                    const std::string& name,
                                                    const std::vector<std::string>& allowed_peers) {
  return session_->Answer([&] {
    return Converted<Registration>(
        session_->client->RegisterMemory(address, length, name, allowed_peers));
  });
}

absl::StatusOr<Registration> Client::RegisterFd(int fd, uint64_t offset, uint64_t length,
                                                const std::string& name,
                                                const std::vector<std::string>& allowed_peers) {
  return session_->Answer([&] {
    return Converted<Registration>(
        session_->client->RegisterFd(fd, offset, length, "host", name, allowed_peers));
  });
}

absl::Status Client::DeregisterMemory(uint64_t id) {
  return session_->Answer([&] { return session_->client->DeregisterMemory(id); });
}

absl::Status Client::Write(const Buffer& local, uint64_t local_offset, const std::string& peer,
                           const std::string& remote_buffer, uint64_t remote_offset,
                           uint64_t length) {
  return session_->Answer([&] {
    return session_->client->Write(*local.mapping_->buffer, local_offset, peer, remote_buffer,
                                   remote_offset, length);
  });
}

absl::Status Client::Read(const Buffer& local, uint64_t local_offset, const std::string& peer,
                          const std::string& remote_buffer, uint64_t remote_offset,
                          uint64_t length) {
  return session_->Answer([&] {
    return session_->client->Read(*local.mapping_->buffer, local_offset, peer, remote_buffer,
                                  remote_offset, length);
  });
}

absl::StatusOr<TransferResult> Client::Run(const std::vector<Op>& ops, absl::Duration timeout,
                                           bool include_ops) {
  return session_->Answer([&] {
    return Converted<TransferResult>(session_->client->Run(ToOpSpecs(ops), timeout, include_ops));
  });
}

absl::StatusOr<uint64_t> Client::Submit(const std::vector<Op>& ops, absl::Duration timeout) {
  return session_->Answer([&] { return session_->client->Submit(ToOpSpecs(ops), timeout); });
}

absl::StatusOr<TransferResult> Client::Wait(uint64_t transfer_id, absl::Duration wait,
                                            bool include_ops) {
  return session_->Answer([&] {
    return Converted<TransferResult>(session_->client->Wait(transfer_id, wait, include_ops));
  });
}

absl::StatusOr<TransferResult> Client::Poll(uint64_t transfer_id) {
  return session_->Answer([&] {
    return Converted<TransferResult>(session_->client->Poll(transfer_id, /*failed_ops=*/true));
  });
}

absl::StatusOr<TransferResult> Client::Cancel(uint64_t transfer_id) {
  return session_->Answer(
      [&] { return Converted<TransferResult>(session_->client->Cancel(transfer_id)); });
}

absl::StatusOr<uint64_t> Client::WriteBlocks(uint64_t local_buffer, const std::string& peer,
                                             const std::string& remote_buffer,
                                             const std::vector<Block>& blocks,
                                             const std::string& notification,
                                             absl::Duration timeout,
                                             const std::string& notification_payload) {
  std::vector<agent_client::BlockSpec> specs;
  specs.reserve(blocks.size());
  for (const Block& b : blocks) specs.push_back({b.local_offset, b.remote_offset, b.length});
  agent_client::CallOptions options;
  options.timeout = timeout;
  return session_->Answer([&]() -> absl::StatusOr<uint64_t> {
    auto written = session_->tensors->WriteBlocks(local_buffer, peer, remote_buffer, specs,
                                                  notification, options, notification_payload);
    if (!written.ok()) return written.status();
    return written->bytes();
  });
}

absl::StatusOr<Notification> Client::WaitNotification(const std::string& name,
                                                      const std::string& from_node,
                                                      absl::Duration timeout) {
  agent_client::CallOptions options;
  options.timeout = timeout;
  return session_->Answer([&] {
    return Converted<Notification>(session_->tensors->WaitNotification(name, from_node, options));
  });
}

absl::StatusOr<std::vector<Notification>> Client::PollNotifications(const std::string& prefix,
                                                                    uint32_t max_count) {
  return session_->Answer([&]() -> absl::StatusOr<std::vector<Notification>> {
    std::vector<Notification> out;
    while (true) {
      const uint32_t want = max_count == 0 ? 0 : max_count - static_cast<uint32_t>(out.size());
      ferry::v1::PollNotificationsRequest req;
      req.set_prefix(prefix);
      req.set_max_count(want);
      auto on_socket = session_->client->PollOnSocket(req);
      auto polled = on_socket.has_value() ? *std::move(on_socket)
                                          : session_->tensors->PollNotifications(prefix, want);
      if (!polled.ok()) return polled.status();
      for (const ferry::v1::Notification& n : polled->notifications()) {
        out.push_back(FromProto(n));
      }
      if (!polled->more() || (max_count != 0 && out.size() >= max_count)) return out;
    }
  });
}

absl::StatusOr<PolicyState> Client::GetPolicy() {
  return session_->Answer([&] { return Converted<PolicyState>(session_->client->GetPolicy()); });
}

absl::StatusOr<PolicyState> Client::SetPolicy(
    const std::vector<std::pair<std::string, std::string>>& settings, bool clear_overrides) {
  return session_->Answer([&] {
    return Converted<PolicyState>(session_->client->SetPolicy(settings, clear_overrides));
  });
}

absl::Status TransferStatus(const TransferResult& result) {
  if (result.state == TransferState::kSucceeded) return absl::OkStatus();
  if (result.state == TransferState::kRunning) {
    return absl::DeadlineExceededError("transfer " + std::to_string(result.transfer_id) +
                                       " still running");
  }
  // A failed transfer always carries its first failing op's code; kUnknown if it did not.
  return absl::Status(
      result.code == absl::StatusCode::kOk ? absl::StatusCode::kUnknown : result.code,
      result.message);
}

const char* Version() { return FERRY_VERSION; }

}  // namespace ferry::sdk
