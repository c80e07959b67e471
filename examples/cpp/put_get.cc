// libferry's first steps: connect to this host's agent, put 4 MiB into a named buffer,
// get it back with a batch, verify every byte, then write KV-cache blocks with a
// notification (and a payload) and wait for it.
//
//   put_get [SOCKET]     SOCKET: the agent's (default: $FERRY_SOCKET, else
//                        /tmp/ferryd-<host name>.sock)
//
// The peer here is the agent's own node, so one agent is enough; with two agents, name the
// other node (and a buffer it allocated) instead.
#include <ferry/ferry_client.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

int Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "put_get: %s: %s\n", what, status.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string socket = argc > 1 ? argv[1] : "";
  auto client = ferry::Client::Connect(socket);
  if (!client.ok()) return Fail("connect", client.status());
  auto info = (*client)->GetInfo();
  if (!info.ok()) return Fail("info", info.status());
  std::printf("libferry %s (headers %s), agent %s on node %s\n", ferry::Version(), FERRY_VERSION,
              info->version.c_str(), info->node.c_str());

  constexpr uint64_t kSize = 4 << 20;
  // The target: a named buffer, as a peer would allocate one for others to write into.
  ferry::AllocOptions target_options;
  target_options.name = "put-get-example";
  auto target = (*client)->Alloc(kSize, target_options);
  if (!target.ok()) return Fail("alloc target", target.status());
  auto source = (*client)->Alloc(kSize);
  if (!source.ok()) return Fail("alloc source", source.status());
  for (uint64_t i = 0; i < kSize; ++i) (*source)->data()[i] = static_cast<char>(i * 7 + 3);

  // Put: one WRITE of the whole buffer to the node's named buffer.
  const std::string node = info->node;
  absl::Status put = (*client)->Write(**source, 0, node, "put-get-example", 0, kSize);
  if (!put.ok()) return Fail("put", put);

  // Get: a batch of two READs, the halves swapped, into a third buffer.
  auto back = (*client)->Alloc(kSize);
  if (!back.ok()) return Fail("alloc", back.status());
  const uint64_t half = kSize / 2;
  std::vector<ferry::Op> ops(2);
  for (int i = 0; i < 2; ++i) {
    ops[i].type = ferry::OpType::kRead;
    ops[i].local_buffer = (*back)->id();
    ops[i].local_offset = i * half;
    ops[i].peer = node;
    ops[i].remote_buffer = "put-get-example";
    ops[i].remote_offset = (1 - i) * half;
    ops[i].length = half;
  }
  auto result = (*client)->Run(ops, absl::Seconds(30), /*include_ops=*/true);
  if (!result.ok()) return Fail("get", result.status());
  if (absl::Status s = ferry::TransferStatus(*result); !s.ok()) return Fail("get", s);

  const char* in = (*source)->data();
  const char* out = (*back)->data();
  if (std::memcmp(out, in + half, half) != 0 || std::memcmp(out + half, in, half) != 0) {
    std::fprintf(stderr, "put_get: the bytes read back differ from those written\n");
    return 1;
  }
  std::printf("put %llu bytes, got them back in %zu ops (%s), verified\n",
              static_cast<unsigned long long>(kSize), result->ops.size(),
              result->ops.empty() ? "?" : result->ops[0].provider.c_str());

  // KV-cache style: blocks written into the named buffer, then a notification that the
  // receiving side (here the same node) waits for; it comes once every block landed, with
  // what the sender attached (up to 4096 bytes: here, which request the blocks are for).
  const std::vector<ferry::Block> blocks = {{0, kSize - 4096, 4096}, {4096, 0, 4096}};
  const std::string payload = "request 42, layer 0";
  auto written = (*client)->WriteBlocks((*back)->id(), node, "put-get-example", blocks,
                                        "put-get/done", absl::Seconds(10), payload);
  if (!written.ok()) return Fail("write blocks", written.status());
  auto note = (*client)->WaitNotification("put-get/done", node, absl::Seconds(10));
  if (!note.ok()) return Fail("notification", note.status());
  if (note->payload != payload) {
    std::fprintf(stderr, "put_get: the notification carried '%s', not '%s'\n",
                 note->payload.c_str(), payload.c_str());
    return 1;
  }
  const char* landed = (*target)->data();
  if (std::memcmp(landed + kSize - 4096, out, 4096) != 0 ||
      std::memcmp(landed, out + 4096, 4096) != 0) {
    std::fprintf(stderr, "put_get: the blocks did not land where they were written\n");
    return 1;
  }
  std::printf("wrote %llu bytes in %u blocks, notified '%s' from %s with '%s'\n",
              static_cast<unsigned long long>(*written), note->blocks, note->name.c_str(),
              note->from_node.c_str(), note->payload.c_str());
  // Or drained without waiting, as a serving engine does each step: every pending one at
  // once (WriteBlocks returns once its notification was delivered), then none.
  if (auto again = (*client)->WriteBlocks((*back)->id(), node, "put-get-example", blocks,
                                          "put-get/polled");
      !again.ok()) {
    return Fail("write blocks", again.status());
  }
  auto polled = (*client)->PollNotifications("put-get/");
  if (!polled.ok()) return Fail("poll", polled.status());
  auto empty = (*client)->PollNotifications("put-get/");
  if (!empty.ok()) return Fail("poll", empty.status());
  if (polled->size() != 1 || (*polled)[0].name != "put-get/polled" || !empty->empty()) {
    std::fprintf(stderr, "put_get: a poll took %zu notifications, the next %zu\n",
                 polled->size(), empty->size());
    return 1;
  }
  std::printf("polled '%s', then none\n", (*polled)[0].name.c_str());

  auto buffers = (*client)->ListBuffers();
  if (!buffers.ok()) return Fail("list", buffers.status());
  auto policy = (*client)->GetPolicy();
  if (!policy.ok()) return Fail("policy", policy.status());
  std::printf("%zu buffers listed; policy gdr=%s gdr_max_path=%s\n", buffers->size(),
              policy->gdr.c_str(), policy->gdr_max_path.c_str());
  return 0;
}
