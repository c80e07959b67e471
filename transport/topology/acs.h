#pragma once
// PCIe Access Control Services, read from a bridge's config space (sysfs `config`).
// ACS P2P Request/Completion Redirect makes a switch port send peer-to-peer traffic up to
// the root complex instead of across the switch, and Source Validation checks it there;
// either turns a PIX/PXB GPU-NIC path into a root-complex round trip (slow, and on some
// platforms a hang). PCIe Base Spec, "ACS Extended Capability" (ID 0x000D).

#include <cstdint>
#include <string>

namespace ferry::topology {

struct AcsReading {
  enum class Kind {
    kUnreadable,     // config space shorter than 0x104: extended space needs root
    kNoCapability,   // the bridge has no ACS capability: nothing redirects
    kCapability,     // `control` holds the ACS Control register
  };
  Kind kind = Kind::kUnreadable;
  uint16_t control = 0;
  size_t bytes = 0;  // how much config space was readable

  // Source Validation, P2P Request Redirect or P2P Completion Redirect enabled.
  bool Redirects() const;
  // "Source Validation, P2P Request Redirect" for the enabled bits that matter.
  std::string EnabledNames() const;
};

// Walks the extended capability list starting at 0x100.
AcsReading ParseAcs(const std::string& config_space);

}  // namespace ferry::topology
