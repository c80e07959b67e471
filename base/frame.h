#pragma once
// Length-prefixed frames, as the transfer socket carries them (server/api/transfer_socket.h):
// each message is its length, 4 bytes little-endian, then that many bytes.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace ferry {

// What a client of the transfer socket sends first, before its frames: either hello, of
// kTransferSocketHelloBytes. After the second the agent answers first, with
// kTransferSocketAccepted or (the connection refused: too many) one frame of a refusal, so
// that a client learns at connect time whether it may use the socket.
inline constexpr char kTransferSocketHello[] = "ferryxf1";
inline constexpr char kTransferSocketHelloAcked[] = "ferryxf2";
inline constexpr char kTransferSocketAccepted[] = "ferryok1";
inline constexpr size_t kTransferSocketHelloBytes = sizeof(kTransferSocketHello) - 1;
static_assert(sizeof(kTransferSocketHelloAcked) == sizeof(kTransferSocketHello) &&
              sizeof(kTransferSocketAccepted) == sizeof(kTransferSocketHello));

inline constexpr size_t kFrameHeaderBytes = 4;
// The largest frame either side takes: the local API's own limit on a message
// (server/main.cc, SetMaxReceiveMessageSize).
inline constexpr uint32_t kMaxFrameBytes = 64 << 20;

// Appends the header of a frame of `length` bytes to `out`.
inline void AppendFrameHeader(uint32_t length, std::string* out) {
  const char header[kFrameHeaderBytes] = {
      static_cast<char>(length & 0xff), static_cast<char>((length >> 8) & 0xff),
      static_cast<char>((length >> 16) & 0xff), static_cast<char>((length >> 24) & 0xff)};
  out->append(header, kFrameHeaderBytes);
}

// The length of the frame `data` starts with; nullopt while its header is not all there.
inline std::optional<uint32_t> FrameLength(absl::string_view data) {
  if (data.size() < kFrameHeaderBytes) return std::nullopt;
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

}  // namespace ferry
