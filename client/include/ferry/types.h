#pragma once
// libferry's values: what the agent answers, as plain structs. Installed as <ferry/types.h>;
// needs only the standard library and absl (no generated gRPC or protobuf types), so a
// program builds against the installed headers alone. The fields mirror the Agent service's
// messages (proto/ferry/v1/agent.proto), which say what each one means.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace ferry {
// The installed SDK's names live in an inline namespace: users write ferry::Client, and the
// library's symbols (ferry::sdk::...) never meet the agent-side code's own ferry:: types,
// which are linked into libferry but not exported from it.
inline namespace sdk {

// A buffer of the agent's: one it allocated (Client::Alloc) or memory a client registered
// (Client::RegisterMemory).
struct BufferInfo {
  uint64_t id = 0;
  std::string name;  // "": peers cannot name it
  uint64_t size = 0;
  std::string device;                      // "host" or "cuda:N"
  std::string backend;                     // "host", "cuda" or "sim"
  std::string owner;                       // the session or uid that owns it
  bool persist = false;                    // outlives its session
  bool registered = false;                 // client memory (RegisterMemory), not the pool's
  std::vector<std::string> allowed_peers;  // empty: every peer
};

struct AllocOptions {
  std::string name;                        // makes the buffer a target peers can name
  std::string device = "host";             // or "cuda:N", GPU N's pool
  bool persist = false;                    // outlives this client's session
  std::vector<std::string> allowed_peers;  // the peers that may reach a named buffer
};

// A registration of the client's own memory; `buffer.id` goes where a buffer id does
// (Op::local_buffer).
struct Registration {
  BufferInfo buffer;
  bool existing = false;  // this session had registered the same range already
};

enum class OpType { kWrite = 1, kRead = 2 };

// One op of a batch: kWrite moves [local_offset, +length) of a local buffer to the peer's
// named buffer at remote_offset; kRead the reverse. The peer may be this node's own name.
struct Op {
  OpType type = OpType::kWrite;
  uint64_t local_buffer = 0;
  uint64_t local_offset = 0;
  std::string peer;
  std::string remote_buffer;
  uint64_t remote_offset = 0;
  uint64_t length = 0;
};

// One side of an op: how the bytes left the source or reached the target.
struct Leg {
  std::string side;    // "local" or "remote"
  std::string mode;    // "host", "gdr" or "staged"
  std::string device;  // "host" or "cuda:N"
  std::string nic;     // "" for none
  std::string path;    // GPU-NIC path class ("" for host)
  std::string provider;
  uint64_t bytes = 0;
  absl::Duration duration;
  std::string reason;  // why this mode, and not a cheaper one
  std::vector<std::string> rails;
};

struct OpResult {
  uint64_t index = 0;  // the op's place in the batch
  absl::StatusCode code = absl::StatusCode::kOk;
  std::string message;
  uint64_t bytes = 0;
  std::string provider;
  absl::Duration duration;
  std::vector<Leg> legs;
  std::vector<std::string> retries;  // slices carried by another route, one line each
};

// One block of Client::WriteBlocks: [local_offset, +length) of the local buffer to
// [remote_offset, +length) of the peer's.
struct Block {
  uint64_t local_offset = 0;
  uint64_t remote_offset = 0;
  uint64_t length = 0;
};

// What a peer's WriteBlocks delivers once its last block landed (Client::WaitNotification,
// Client::PollNotifications).
struct Notification {
  std::string name;
  std::string from_node;
  uint64_t bytes = 0;
  uint32_t blocks = 0;
  uint64_t sequence = 0;  // per receiving agent, increasing
  // What the sender attached (WriteBlocks' notification_payload): up to 4096 bytes, any
  // bytes (NULs included); empty when none. New in libferry 0.2: it changed the struct's
  // layout, hence that version's new SONAME.
  std::string payload;
};

enum class TransferState { kUnspecified = 0, kRunning = 1, kSucceeded = 2, kFailed = 3 };

struct TransferResult {
  uint64_t transfer_id = 0;
  TransferState state = TransferState::kUnspecified;
  absl::StatusCode code = absl::StatusCode::kOk;  // the first failing op's, or kOk
  std::string message;
  uint64_t bytes = 0;        // moved so far
  uint64_t bytes_total = 0;  // what the transfer moves in all
  absl::Duration duration;
  uint64_t ops_total = 0;
  uint64_t ops_succeeded = 0;
  uint64_t ops_failed = 0;
  uint64_t policy_generation = 0;  // the policy it ran under
  std::vector<OpResult> ops;       // with include_ops (or failed ops, by Poll)
};

// The GDR / staging policy in force (docs/operator-guide.md, "Policy").
struct PolicyState {
  uint64_t generation = 0;   // +1 on every change
  std::string gdr;           // auto, always or never
  std::string gdr_max_path;  // PIX .. SYS
  std::string fallback;      // staged or fail
  uint64_t staging_chunk_bytes = 0;
  uint32_t staging_depth = 0;
  // Run-time settings (SetPolicy) in force over the config file's.
  std::vector<std::pair<std::string, std::string>> overrides;
};

// The agent, as GetInfo describes it (`ferryctl info` prints more).
struct AgentInfo {
  std::string node;
  std::string version;
  uint32_t pid = 0;
  std::vector<std::string> providers;  // e.g. {"tcp"}
  std::vector<std::string> peers;      // configured peer nodes
  uint64_t buffer_count = 0;
  uint64_t host_pool_bytes = 0;
  uint64_t host_pool_used_bytes = 0;
  uint64_t registered_bytes = 0;
  uint64_t transfers_active = 0;
  uint64_t transfers_done = 0;
  uint64_t sessions = 0;
  uint64_t policy_generation = 0;
};

}  // namespace sdk
}  // namespace ferry
