#pragma once
// How agents reach one another's Peer API: mutual TLS (security.mode mtls) or plaintext
// (insecure). One object per agent gives the Peer listener its server credentials and makes
// every channel to a peer (PeerDirectory, PeerHealth), so no caller picks credentials itself.
//
// Over mTLS both sides verify: the listener requires a client certificate that chains to the
// CA (server/peers/caller_identity.h then takes the caller's node from it), and a channel to
// node N accepts only a server certificate that chains to the CA and names N, so a peer
// cannot stand in for another even at the right address.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "config/config.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace ferry::server {

class PeerCredentials {
 public:
  // Reads security.ca, cert and key (errors name the key and the file); plaintext for mode
  // insecure, then loopback only unless allow_insecure_remote.
  static absl::StatusOr<std::shared_ptr<const PeerCredentials>> FromConfig(
      const config::SecuritySettings& security);
  // Mutual TLS from PEM text.
  static std::shared_ptr<const PeerCredentials> Mtls(std::string ca_pem, std::string cert_pem,
                                                     std::string key_pem);
  // Plaintext; `loopback_only` refuses to dial anything else.
  static std::shared_ptr<const PeerCredentials> Insecure(bool loopback_only);

  bool tls() const { return !ca_pem_.empty(); }
  std::shared_ptr<grpc::ServerCredentials> ServerCredentials() const;
  // A channel to the Peer API of `node` at `address`, with `args`. mtls: the server must
  // present a certificate for `node`. insecure, loopback only: FAILED_PRECONDITION for any
  // other address (a peer added at run time or found in etcd), naming the remedy.
  absl::StatusOr<std::shared_ptr<grpc::Channel>> Dial(const std::string& node,
                                                      const std::string& address,
                                                      grpc::ChannelArguments args) const;
  // "mtls" or "insecure" (+ " (loopback only)"), for logs and GetInfo.
  std::string Describe() const;

 private:
  PeerCredentials() = default;

  std::string ca_pem_, cert_pem_, key_pem_;  // all empty: plaintext
  bool loopback_only_ = false;
};

}  // namespace ferry::server
