#pragma once
// Channels to an agent's Peer API as another process would open them: as a node with a
// certificate from a DevPki (client/dev_pki.h), with a CA but no certificate of its own, or
// in plaintext. For the tests that speak the Peer protocol themselves.

#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "client/dev_pki.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"

namespace ferry {

inline std::string ReadPemFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_FALSE(text.str().empty()) << path;
  return text.str();
}

struct PeerIdentity {
  std::string ca_pem;    // the CA this caller trusts ("" = plaintext)
  std::string cert_pem;  // its own certificate and key ("" = none)
  std::string key_pem;
};

// The identity `node` gets from the DevPki in `dir` (Issue makes it once).
inline PeerIdentity IdentityFor(const std::string& dir, const std::string& node) {
  auto pki = DevPki::Open(dir);
  EXPECT_TRUE(pki.ok()) << pki.status();
  auto issued = pki->Issue(node);
  EXPECT_TRUE(issued.ok()) << issued.status();
  return {ReadPemFile(pki->ca()), ReadPemFile(issued->cert), ReadPemFile(issued->key)};
}

// A channel to `address`, expecting the server's certificate to name `server_node`.
inline std::shared_ptr<grpc::Channel> PeerChannel(const std::string& address,
                                                  const std::string& server_node,
                                                  const PeerIdentity& as) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  if (as.ca_pem.empty()) {
    return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  }
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = as.ca_pem;
  options.pem_cert_chain = as.cert_pem;
  options.pem_private_key = as.key_pem;
  args.SetSslTargetNameOverride(server_node);
  return grpc::CreateCustomChannel(address, grpc::SslCredentials(options), args);
}

// A channel to the agent `server_node` at `address` of a pair in `dir`, as node `as_node`.
inline std::shared_ptr<grpc::Channel> PeerChannelAs(const std::string& dir,
                                                    const std::string& address,
                                                    const std::string& server_node,
                                                    const std::string& as_node) {
  return PeerChannel(address, server_node, IdentityFor(dir, as_node));
}

}  // namespace ferry
