#pragma once
// PCIe Access Control Services, read from a bridge's config space (sysfs `config`).
// ACS P2P Request/Completion Redirect (and Egress Control, which can redirect per egress
// port) make a switch port send peer-to-peer traffic up to the root complex instead of
// across the switch, turning a PIX/PXB GPU-NIC path into a root-complex round trip (slow,
// and on some platforms a hang). Source Validation only checks a request's bus number
// against the port's bus range and forwards it as before, so it is harmless here; Linux
// clears exactly RR | CR | EC when it disables redirect (pci_disable_acs_redir).
// PCIe Base Spec, "ACS Extended Capability" (ID 0x000D).

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

  // P2P Request Redirect, P2P Completion Redirect or P2P Egress Control enabled.
  bool Redirects() const;
  // "P2P Request Redirect, P2P Completion Redirect" for the enabled redirecting bits.
  std::string EnabledNames() const;
};

// Walks the extended capability list starting at 0x100.
AcsReading ParseAcs(const std::string& config_space);

}  // namespace ferry::topology
