// A hostile local client of another uid (issue 44, rows 3, 4 and 9): it drops to the uid it
// is given (the test that starts it must be root) and tries, against the victim's data and
// the node's settings, everything a tenant must not do, printing one line per attempt,
// "<what>: <gRPC code> <message>", and what it could see, "<what> seen: N", for the test to
// check. Its own buffer (allocated here) is the other side of its transfers.
//
//   tenant_attacker UID SOCKET NODE VICTIM_NAME VICTIM_TRANSFER VICTIM_TAG

#include <grp.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "ferry/v1/agent.grpc.pb.h"
#include "ferry/v1/tensor.grpc.pb.h"
#include "grpcpp/create_channel.h"

namespace {

void Report(const std::string& what, const grpc::Status& s) {
  std::printf("%s: %d %s\n", what.c_str(), static_cast<int>(s.error_code()),
              s.error_message().c_str());
}

// A context that gives up after a few seconds: a call the agent should refuse must not hang
// the test if it does not.
std::unique_ptr<grpc::ClientContext> Context() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return ctx;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr,
                 "usage: %s UID SOCKET NODE VICTIM_NAME VICTIM_TRANSFER VICTIM_TAG VICTIM_BUFFER\n",
                 argv[0]);
    return 2;
  }
  uint32_t uid = 0;
  uint64_t victim_transfer = 0, victim_buffer = 0;
  if (!absl::SimpleAtoi(argv[1], &uid) || !absl::SimpleAtoi(argv[5], &victim_transfer) ||
      !absl::SimpleAtoi(argv[7], &victim_buffer)) {
    return 2;
  }
  const std::string node = argv[3], victim_name = argv[4], victim_tag = argv[6];
  if (setgroups(0, nullptr) != 0 || setgid(uid) != 0 || setuid(uid) != 0) {
    std::perror("dropping to the other uid");
    return 3;
  }
  auto channel =
      grpc::CreateChannel(absl::StrCat("unix:", argv[2]), grpc::InsecureChannelCredentials());
  auto agent = ferry::v1::Agent::NewStub(channel);
  auto tensors = ferry::v1::Tensors::NewStub(channel);

  // Its own buffer: the source or target of the transfers below.
  uint64_t own = 0;
  {
    ferry::v1::AllocBufferRequest req;
    req.set_size(4096);
    req.set_persist(true);
    req.set_name("attacker-own");
    ferry::v1::AllocBufferResponse resp;
    Report("own alloc", agent->AllocBuffer(Context().get(), req, &resp));
    own = resp.buffer().id();
  }
  // Row 3: the victim's buffer through this node's own name, both ways.
  for (auto type : {ferry::v1::WRITE, ferry::v1::READ}) {
    ferry::v1::SubmitRequest req;
    auto* op = req.add_ops();
    op->set_type(type);
    op->set_local_buffer(own);
    op->set_peer(node);
    op->set_remote_buffer(victim_name);
    op->set_length(64);
    ferry::v1::SubmitResponse resp;
    Report(type == ferry::v1::WRITE ? "self write" : "self read",
           agent->Submit(Context().get(), req, &resp));
  }
  {
    ferry::v1::StatRemoteBufferRequest req;
    req.set_node(node);
    req.set_name(victim_name);
    ferry::v1::StatRemoteBufferResponse resp;
    Report("self stat", agent->StatRemoteBuffer(Context().get(), req, &resp));
  }
  {
    ferry::v1::WriteBlocksRequest req;
    req.set_local_buffer(own);
    req.set_peer(node);
    req.set_remote_buffer(victim_name);
    auto* b = req.add_blocks();
    b->set_length(64);
    ferry::v1::WriteBlocksResponse resp;
    Report("self blocks", tensors->WriteBlocks(Context().get(), req, &resp));
  }
  // Row 4: the victim's transfer, and the node's settings.
  {
    ferry::v1::WaitRequest req;
    req.set_transfer_id(victim_transfer);
    req.set_poll(true);
    ferry::v1::TransferResult resp;
    Report("wait", agent->Wait(Context().get(), req, &resp));
  }
  {
    ferry::v1::CancelTransferRequest req;
    req.set_transfer_id(victim_transfer);
    ferry::v1::TransferResult resp;
    Report("cancel", agent->Cancel(Context().get(), req, &resp));
  }
  {
    ferry::v1::WatchRequest req;
    req.set_transfer_id(victim_transfer);
    auto ctx = Context();
    auto reader = agent->Watch(ctx.get(), req);
    ferry::v1::TransferProgress p;
    while (reader->Read(&p)) {
    }
    Report("watch", reader->Finish());
  }
  {
    ferry::v1::ListTransfersRequest req;
    req.set_recent(100);
    ferry::v1::ListTransfersResponse resp;
    grpc::Status s = agent->ListTransfers(Context().get(), req, &resp);
    Report("list transfers", s);
    std::printf("transfers seen: %d\n", resp.running_size() + resp.recent_size());
  }
  {
    ferry::v1::SetPolicyRequest req;
    auto* setting = req.add_settings();
    setting->set_key("fallback");
    setting->set_value("fail");
    ferry::v1::PolicyState resp;
    Report("set policy", agent->SetPolicy(Context().get(), req, &resp));
  }
  {
    ferry::v1::SetNicStateRequest req;
    req.set_nic("tcp");
    req.set_up(false);
    req.set_reason("attacker");
    ferry::v1::SetNicStateResponse resp;
    Report("nic down", agent->SetNicState(Context().get(), req, &resp));
  }
  {
    ferry::v1::AddPeerRequest req;
    req.set_node(node);
    req.set_address("127.0.0.1:1");
    ferry::v1::PeerChange resp;
    Report("add peer", agent->AddPeer(Context().get(), req, &resp));
  }
  {
    ferry::v1::RemovePeerRequest req;
    req.set_node(node);
    ferry::v1::PeerChange resp;
    Report("remove peer", agent->RemovePeer(Context().get(), req, &resp));
  }
  {
    ferry::v1::ListBuffersRequest req;
    ferry::v1::ListBuffersResponse resp;
    grpc::Status s = agent->ListBuffers(Context().get(), req, &resp);
    Report("list buffers", s);
    std::printf("buffers seen: %d\n", resp.buffers_size());
  }
  // Row 4, tensors: the victim's pending receive, its landing buffer, its notification.
  {
    ferry::v1::ListPendingRequest req;
    ferry::v1::ListPendingResponse resp;
    Report("list pending", tensors->ListPending(Context().get(), req, &resp));
    std::printf("pending seen: %d\n", resp.recvs_size() + resp.sends_size() + resp.arrived_size());
    std::printf("notifications seen: %llu\n",
                static_cast<unsigned long long>(resp.notifications()));
  }
  {
    ferry::v1::CancelRequest req;
    req.set_peer(node);
    req.set_tag(victim_tag);
    ferry::v1::CancelResponse resp;
    Report("tensor cancel", tensors->Cancel(Context().get(), req, &resp));
  }
  {
    ferry::v1::StreamNotificationsRequest req;
    req.set_timeout_ms(1000);
    auto ctx = Context();
    auto reader = tensors->StreamNotifications(ctx.get(), req);
    ferry::v1::Notification n;
    int taken = 0;
    while (reader->Read(&n)) ++taken;
    Report("stream notifications", reader->Finish());
    std::printf("notifications taken: %d\n", taken);
  }
  {
    // Landing a tensor in the victim's buffer: refused before anything waits.
    ferry::v1::RecvRequest req;
    req.set_peer(node);
    req.set_tag("attacker-tag");
    req.set_buffer(victim_buffer);  // its id, as a neighbour could guess it
    req.set_timeout_ms(500);
    ferry::v1::RecvResponse resp;
    Report("recv into victim", tensors->Recv(Context().get(), req, &resp));
  }
  {
    ferry::v1::FreeBufferRequest req;
    req.set_id(own);
    ferry::v1::FreeBufferResponse resp;
    Report("own free", agent->FreeBuffer(Context().get(), req, &resp));
  }
  return 0;
}
