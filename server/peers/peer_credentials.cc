#include "server/peers/peer_credentials.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/text_file.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace ferry::server {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& key, const std::string& path) {
  absl::StatusOr<std::string> text = ReadTextFile(path);
  if (!text.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("security.", key, ": ", text.status().message()));
  }
  // gRPC would only say "handshake failed" much later, on the first peer call.
  if (!absl::StrContains(*text, "-----BEGIN ")) {
    return absl::FailedPreconditionError(
        absl::StrCat("security.", key, ": ", path, " is not a PEM file (no -----BEGIN line)"));
  }
  return text;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const PeerCredentials>> PeerCredentials::FromConfig(
    const config::SecuritySettings& security) {
  if (!security.tls()) return Insecure(!security.allow_insecure_remote);
  ASSIGN_OR_RETURN(std::string ca, ReadPem("ca", security.ca));
  ASSIGN_OR_RETURN(std::string cert, ReadPem("cert", security.cert));
  ASSIGN_OR_RETURN(std::string key, ReadPem("key", security.key));
  return Mtls(std::move(ca), std::move(cert), std::move(key));
}

std::shared_ptr<const PeerCredentials> PeerCredentials::Mtls(std::string ca_pem,
                                                             std::string cert_pem,
                                                             std::string key_pem) {
  auto creds = std::shared_ptr<PeerCredentials>(new PeerCredentials());
  creds->ca_pem_ = std::move(ca_pem);
  creds->cert_pem_ = std::move(cert_pem);
  creds->key_pem_ = std::move(key_pem);
  return creds;
}

std::shared_ptr<const PeerCredentials> PeerCredentials::Insecure(bool loopback_only) {
  auto creds = std::shared_ptr<PeerCredentials>(new PeerCredentials());
  creds->loopback_only_ = loopback_only;
  return creds;
}

std::shared_ptr<grpc::ServerCredentials> PeerCredentials::ServerCredentials() const {
  if (!tls()) return grpc::InsecureServerCredentials();
  // REQUIRE_..._AND_VERIFY: a caller without a certificate, or with one the CA did not
  // sign, fails the handshake before any method runs.
  grpc::SslServerCredentialsOptions options(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = ca_pem_;
  options.pem_key_cert_pairs.push_back({key_pem_, cert_pem_});
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> PeerCredentials::Dial(
    const std::string& node, const std::string& address, grpc::ChannelArguments args) const {
  if (!tls()) {
    if (loopback_only_ && !config::IsLoopbackAddress(address)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "peer ", node, " at ", address, ": not loopback, and this agent's Peer API is "
          "plaintext (security.mode insecure); configure mutual TLS (security.ca, cert, key) or "
          "security.allow_insecure_remote: true"));
    }
    return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  }
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = ca_pem_;
  options.pem_private_key = key_pem_;
  options.pem_cert_chain = cert_pem_;
  // The name checked against the server's certificate is the node we mean to reach, not
  // the host in `address`: agents are addressed by IP, known by node name.
  args.SetSslTargetNameOverride(node);
  return grpc::CreateCustomChannel(address, grpc::SslCredentials(options), args);
}

std::string PeerCredentials::Describe() const {
  if (tls()) return "mtls";
  return loopback_only_ ? "insecure (loopback only)" : "insecure";
}

}  // namespace ferry::server
