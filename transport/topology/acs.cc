#include "transport/topology/acs.h"

#include <set>
#include <vector>

#include "absl/strings/str_join.h"

namespace ferry::topology {
namespace {

constexpr uint16_t kAcsCapabilityId = 0x000d;
// ACS Control register bits (Source Validation is bit 0, Translation Blocking bit 1,
// Upstream Forwarding bit 4, Direct Translated P2P bit 6: none of them redirects).
constexpr uint16_t kRequestRedirect = 1 << 2;
constexpr uint16_t kCompletionRedirect = 1 << 3;
constexpr uint16_t kEgressControl = 1 << 5;
constexpr uint16_t kRedirecting = kRequestRedirect | kCompletionRedirect | kEgressControl;

uint32_t Read32(const std::string& data, size_t offset) {
  auto byte = [&](size_t i) { return static_cast<uint32_t>(static_cast<uint8_t>(data[i])); };
  return byte(offset) | byte(offset + 1) << 8 | byte(offset + 2) << 16 | byte(offset + 3) << 24;
}

}  // namespace

bool AcsReading::Redirects() const {
  return kind == Kind::kCapability &&
         (control & kRedirecting) != 0;
}

std::string AcsReading::EnabledNames() const {
  std::vector<std::string> names;
  if (control & kRequestRedirect) names.push_back("P2P Request Redirect");
  if (control & kCompletionRedirect) names.push_back("P2P Completion Redirect");
  if (control & kEgressControl) names.push_back("P2P Egress Control");
  return absl::StrJoin(names, ", ");
}

AcsReading ParseAcs(const std::string& config_space) {
  AcsReading reading;
  reading.bytes = config_space.size();
  // Unprivileged reads of sysfs `config` stop at 64 bytes (256 on some kernels); the
  // extended capabilities start at 0x100.
  if (config_space.size() < 0x104) return reading;
  reading.kind = AcsReading::Kind::kNoCapability;
  std::set<size_t> seen;  // a corrupt list must not loop forever
  for (size_t offset = 0x100; offset >= 0x100 && offset + 4 <= config_space.size() &&
                              seen.insert(offset).second;) {
    uint32_t header = Read32(config_space, offset);
    if (header == 0 || header == 0xffffffff) break;
    if ((header & 0xffff) == kAcsCapabilityId) {
      if (offset + 8 > config_space.size()) break;
      reading.kind = AcsReading::Kind::kCapability;
      reading.control = static_cast<uint16_t>(Read32(config_space, offset + 4) >> 16);
      return reading;
    }
    offset = (header >> 20) & 0xffc;
  }
  return reading;
}

}  // namespace ferry::topology
