// A local client running as another uid (it drops to the uid it is given, so the test that
// starts it must be root): tries what it must not do to the test's buffers and session,
// and prints one line per attempt, "<what>: <gRPC code name> <message>", for the test to
// check (a block move over the transfer socket too, as "socket move"). It does its own
// allocation and free too, which must work.
//
//   other_uid_client UID SOCKET VICTIM_BUFFER VICTIM_SESSION TARGET_NODE TARGET_NAME [TICKET]
//
// TICKET: an fd socket ticket the test's uid was given (RegisterMemory), tried as this uid.

#include <grp.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/socket_line.h"
#include "ferry/v1/agent.grpc.pb.h"
#include "grpcpp/create_channel.h"

namespace {

void Report(const std::string& what, const grpc::Status& s) {
  std::printf("%s: %d %s\n", what.c_str(), static_cast<int>(s.error_code()),
              s.error_message().c_str());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7 && argc != 8) {
    std::fprintf(stderr, "usage: %s UID SOCKET VICTIM_BUFFER VICTIM_SESSION NODE NAME [TICKET]\n",
                 argv[0]);
    return 2;
  }
  uint32_t uid = 0;
  uint64_t victim = 0, session = 0;
  if (!absl::SimpleAtoi(argv[1], &uid) || !absl::SimpleAtoi(argv[3], &victim) ||
      !absl::SimpleAtoi(argv[4], &session)) {
    return 2;
  }
  // Groups first, while still root.
  if (setgroups(0, nullptr) != 0 || setgid(uid) != 0 || setuid(uid) != 0) {
    std::perror("dropping to the other uid");
    return 3;
  }
  auto stub = ferry::v1::Agent::NewStub(
      grpc::CreateChannel(absl::StrCat("unix:", argv[2]), grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext ctx;
    ferry::v1::FreeBufferRequest req;
    req.set_id(victim);
    ferry::v1::FreeBufferResponse resp;
    Report("free", stub->FreeBuffer(&ctx, req, &resp));
  }
  {
    // Naming the victim's session: allocating into it, as if this client were its owner.
    grpc::ClientContext ctx;
    ctx.AddMetadata("ferry-session", absl::StrCat(session));
    ferry::v1::AllocBufferRequest req;
    req.set_size(4096);
    ferry::v1::AllocBufferResponse resp;
    Report("session", stub->AllocBuffer(&ctx, req, &resp));
  }
  {
    grpc::ClientContext ctx;
    ferry::v1::SubmitRequest req;
    auto* op = req.add_ops();
    op->set_type(ferry::v1::WRITE);
    op->set_local_buffer(victim);
    op->set_peer(argv[5]);
    op->set_remote_buffer(argv[6]);
    op->set_length(4096);
    ferry::v1::SubmitResponse resp;
    Report("submit", stub->Submit(&ctx, req, &resp));
  }
  {
    grpc::ClientContext ctx;
    ferry::v1::ListBuffersRequest req;
    ferry::v1::ListBuffersResponse resp;
    grpc::Status s = stub->ListBuffers(&ctx, req, &resp);
    std::string mapping = "absent";
    for (const auto& b : resp.buffers()) {
      if (b.id() == victim && !b.shm().fd_socket().empty()) mapping = b.shm().fd_socket();
    }
    Report(absl::StrCat("list mapping=", mapping), s);
  }
  {
    // The same session named in a block move on the transfer socket, where no metadata
    // carries it: the request names it, and the agent checks it against the kernel's uid.
    absl::Status moved = absl::UnavailableError("the transfer socket was not reached");
    auto line = ferry::SocketLine::Connect(absl::StrCat(argv[2], ".transfers"));
    if (line.ok()) {
      ferry::v1::MoveBlocksRequest move;
      move.set_type(ferry::v1::WRITE);
      move.set_list(1);
      move.add_local_blocks(0);
      move.set_peer(argv[5]);
      move.set_remote_list(argv[6]);
      move.add_remote_blocks(0);
      moved = (*line)->Move(session, move, absl::Seconds(10)).result.status();
    }
    std::printf("socket move: %d %s\n", static_cast<int>(moved.code()),
                std::string(moved.message()).c_str());
  }
  if (argc == 8) {
    uint64_t ticket = 0;
    if (!absl::SimpleAtoi(argv[7], &ticket)) return 2;
    grpc::ClientContext ctx;
    ferry::v1::RegisterMemoryRequest req;
    req.set_fd_ticket(ticket);
    req.set_length(4096);
    ferry::v1::RegisterMemoryResponse resp;
    Report("ticket", stub->RegisterMemory(&ctx, req, &resp));
  }
  // Its own buffer (persist: no session needed): allocated, then freed by its owner
  // (tests/other_uid_alloc.cc maps one too).
  uint64_t own = 0;
  {
    grpc::ClientContext ctx;
    ferry::v1::AllocBufferRequest req;
    req.set_size(4096);
    req.set_persist(true);
    ferry::v1::AllocBufferResponse resp;
    Report("own alloc", stub->AllocBuffer(&ctx, req, &resp));
    own = resp.buffer().id();
    std::printf("own owner: %s\n", resp.buffer().owner().c_str());
  }
  {
    grpc::ClientContext ctx;
    ferry::v1::FreeBufferRequest req;
    req.set_id(own);
    ferry::v1::FreeBufferResponse resp;
    Report("own free", stub->FreeBuffer(&ctx, req, &resp));
  }
  return 0;
}
