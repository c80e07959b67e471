#pragma once
// The tcp provider's wire format: a fixed header per request and per response, payload
// bytes right after (WRITE request, READ response). Host byte order: both ends are ferryd
// builds on little-endian Linux, and the magic rejects anything else.

#include <cstdint>

namespace ferry::tcp {

inline constexpr uint32_t kRequestMagic = 0x46524551;   // "FREQ"
inline constexpr uint32_t kResponseMagic = 0x46525350;  // "FRSP"

// kHello is the first frame of every connection (no payload, no answer; `imm` carries
// kWireVersion): a connection that sends anything else first, or nothing within the
// listener's handshake timeout, is closed before any memory is touched.
enum class WireOp : uint32_t { kWrite = 1, kWriteImm = 2, kRead = 3, kHello = 4 };

inline constexpr uint32_t kWireVersion = 2;

// Why a target refused a request; the target's memory is untouched in every case.
enum class Refusal : uint32_t { kNone = 0, kBadKey = 1, kOutOfBounds = 2, kAccess = 3, kBadOp = 4 };

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
