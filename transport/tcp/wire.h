#pragma once
// The tcp provider's wire format: a fixed header per request and per response, payload
// bytes right after (WRITE request, READ response). Host byte order: both ends are ferryd
// builds on little-endian Linux, and the magic rejects anything else.

#include <cstdint>

namespace ferry::tcp {

inline constexpr uint32_t kRequestMagic = 0x46524551;   // "FREQ"
inline constexpr uint32_t kResponseMagic = 0x46525350;  // "FRSP"

// kHello is the first frame of every connection (no payload, no answer). It admits the
// socket to a session AcceptConnect issued (session_secrets.h):
//   id      = the session id from the Connect reply
//   address = bytes 0..7 of the session's 16-byte secret, length = bytes 8..15
//   key     = 0, imm = kWireVersion
// A connection that sends anything else first, a hello without a live session and its
// secret, or nothing within the listener's handshake timeout, is closed without an answer
// before anything more is read from it or any memory is touched.
enum class WireOp : uint32_t { kWrite = 1, kWriteImm = 2, kRead = 3, kHello = 4 };

// 3: the hello carries a session secret; one refusal code for key, bounds and access.
inline constexpr uint32_t kWireVersion = 3;

// What a target answers to a request it does not serve; its memory is untouched. One code
// for an unknown or revoked key, a range outside the region, access the region does not
// give and a peer the region is not exported to, so that answers do not tell which keys
// exist: the target keeps the reason in its own counters (ListenerStats) and log. After a
// kRefused or kBadOp answer the target closes the connection (as an RC QP goes to the error
// state after a remote access error), so one connection cannot scan keys.
enum class Refusal : uint32_t { kNone = 0, kRefused = 1, kBadOp = 4 };

struct RequestHeader {
  uint32_t magic;
  WireOp op;
  uint64_t id;
  uint64_t address;
  uint64_t length;
  uint32_t key;
  uint32_t imm;
};
static_assert(sizeof(RequestHeader) == 40);

struct ResponseHeader {
  uint32_t magic;
  Refusal refusal;
  uint64_t id;
  uint64_t length;  // payload bytes that follow (READ success)
};
static_assert(sizeof(ResponseHeader) == 24);

}  // namespace ferry::tcp
