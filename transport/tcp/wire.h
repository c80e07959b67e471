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
//
// kWriteList gathers pieces into one request (Endpoint::PostWriteList: the scattered blocks
// of a KV cache), answered by one ack:
//   address = the region's byte 0 (its remote address), key as for kWrite
//   imm     = the number of pieces, 1..kMaxWirePieces
//   length  = the payload bytes, the sum of the pieces' lengths
// then imm WirePieces (the frame table), then the pieces' bytes in table order. The target
// checks the table (each piece non-empty, no sum or address past 2^64, the lengths adding up
// to `length`: else kBadOp) and the range from the lowest piece to the end of the highest
// (inside the region: else kRefused) before any byte lands.
enum class WireOp : uint32_t { kWrite = 1, kWriteImm = 2, kRead = 3, kHello = 4, kWriteList = 5 };

// 3: the hello carries a session secret; one refusal code for key, bounds and access.
// 4: kWriteList.
inline constexpr uint32_t kWireVersion = 4;

// At most this many pieces in one kWriteList (IOV_MAX, so one recvmsg can take them all).
inline constexpr uint32_t kMaxWirePieces = 1024;

struct WirePiece {
  uint64_t offset;  // from the request's address
  uint64_t length;
};
static_assert(sizeof(WirePiece) == 16);

// What a target answers to a request it does not serve; its memory is untouched. One code
// for an unknown or revoked key, a range outside the region, access the region does not
// give and a peer the region is not exported to, so that answers do not tell which keys
// exist: the target keeps the reason in its own counters (ListenerStats) and log. After a
// kRefused or kBadOp answer the target closes the connection (as an RC QP goes to the error
// state after a remote access error), so one connection cannot scan keys.
//
// kFault is the one answer after which the connection goes on: the request was well formed
// and allowed, but the target's memory could not be read or written (a client's file shrank
// under it: EFAULT, or SIGBUS under a FaultGuard). A WRITE's payload was drained (none of it
// is known to have landed), a READ's answer carries no payload. One client's bad memory
// fails that client's op, never a connection other clients' ops share.
//
// kBusy (request id 0) is the answer to a hello the target admitted but has no room for:
// the peer node has tcp_max_connections_per_peer connections already. It names the cause to
// the initiator, which would otherwise see a connection closed for no reason, and the
// connection then ends.
enum class Refusal : uint32_t { kNone = 0, kRefused = 1, kBadOp = 4, kFault = 5, kBusy = 6 };

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
