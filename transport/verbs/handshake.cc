#include "transport/verbs/handshake.h"

#include <arpa/inet.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace ferry::verbs {
namespace {

constexpr char kMagic[4] = {'F', 'V', 'Q', 'P'};
constexpr uint8_t kVersion = 1;
constexpr size_t kFixedSize = 4 + 4 + 4 + 4 + 2 + 16 + 8 + 2;
constexpr size_t kMaxRetired = 4096;
constexpr uint8_t kTakesImmediates = 1u << 0;  // the flags byte

void PutLe(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t GetLe(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

}  // namespace

std::string SerializeQpAddress(const QpAddress& a) {
  std::string out(kMagic, 4);
  out.push_back(static_cast<char>(kVersion));
  out.push_back(static_cast<char>(a.link_layer));
  out.push_back(static_cast<char>(a.mtu));
  out.push_back(static_cast<char>(a.takes_immediates ? kTakesImmediates : 0));
  PutLe(out, a.qpn, 4);
  PutLe(out, a.psn, 4);
  PutLe(out, a.lid, 2);
  out.append(reinterpret_cast<const char*>(a.gid.raw), 16);
  PutLe(out, a.fabric_id, 8);
  PutLe(out, a.retired_qpns.size(), 2);
  for (uint32_t q : a.retired_qpns) PutLe(out, q, 4);
  return out;
}

absl::StatusOr<QpAddress> ParseQpAddress(const std::string& bytes) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("verbs handshake (", bytes.size(), " bytes): ", why));
  };
  if (bytes.size() < kFixedSize) return bad(absl::StrCat("shorter than ", kFixedSize, " bytes"));
  const char* p = bytes.data();
  if (std::memcmp(p, kMagic, 4) != 0) return bad("not a verbs QP address (bad magic)");
  if (static_cast<uint8_t>(p[4]) != kVersion) {
    return bad(absl::StrCat("version ", static_cast<int>(static_cast<uint8_t>(p[4])),
                            ", this agent speaks ", static_cast<int>(kVersion)));
  }
  QpAddress a;
  a.link_layer = static_cast<uint8_t>(p[5]);
  if (a.link_layer != IBV_LINK_LAYER_INFINIBAND && a.link_layer != IBV_LINK_LAYER_ETHERNET) {
    return bad(absl::StrCat("unknown link layer ", static_cast<int>(a.link_layer)));
  }
  uint8_t mtu = static_cast<uint8_t>(p[6]);
  if (mtu < IBV_MTU_256 || mtu > IBV_MTU_4096) return bad(absl::StrCat("bad MTU code ", mtu));
  a.mtu = static_cast<ibv_mtu>(mtu);
  const uint8_t flags = static_cast<uint8_t>(p[7]);
  if ((flags & ~kTakesImmediates) != 0)
    return bad(absl::StrCat("unknown flags 0x", absl::Hex(flags)));
  a.takes_immediates = (flags & kTakesImmediates) != 0;
  a.qpn = static_cast<uint32_t>(GetLe(p + 8, 4));
  a.psn = static_cast<uint32_t>(GetLe(p + 12, 4));
  if (a.qpn == 0 || a.qpn > 0xffffff)
    return bad(absl::StrCat("QP number ", a.qpn, " is not 24-bit"));
  if (a.psn > 0xffffff) return bad(absl::StrCat("PSN ", a.psn, " is not 24-bit"));
  a.lid = static_cast<uint16_t>(GetLe(p + 16, 2));
  std::memcpy(a.gid.raw, p + 18, 16);
  a.fabric_id = GetLe(p + 34, 8);
  size_t count = GetLe(p + 42, 2);
  if (count > kMaxRetired || bytes.size() != kFixedSize + 4 * count) {
    return bad(absl::StrCat("retired QP list of ", count, " does not match the length"));
  }
  for (size_t i = 0; i < count; ++i) {
    a.retired_qpns.push_back(static_cast<uint32_t>(GetLe(p + kFixedSize + 4 * i, 4)));
  }
  return a;
}

std::string GidToString(const ibv_gid& gid) {
  char text[INET6_ADDRSTRLEN] = {};
  if (inet_ntop(AF_INET6, gid.raw, text, sizeof(text)) == nullptr) return "?";
  return text;
}

}  // namespace ferry::verbs
