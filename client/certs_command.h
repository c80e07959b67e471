#pragma once
// `ferryctl certs`: a certificate authority and node certificates for the agents' mutual TLS
// (security.mode mtls), made by DevPki, the code that gives `make demo`'s agents theirs.
// Each returns what it made, in words for the operator; nothing is overwritten.

#include <string>

#include "absl/status/statusor.h"

namespace ferry::client {

// A CA in `dir` (made if absent, mode 0700): dir/ca.pem, its certificate, and dir/ca.key,
// which signs node certificates and stays off the nodes. FAILED_PRECONDITION if either exists.
absl::StatusOr<std::string> MakeCertificateAuthority(const std::string& dir, int days);

// A certificate for `node` (DNS subjectAltName = the node name, for server and client use)
// signed by the CA in `ca_dir`, in `out_dir` (made if absent, mode 0700) as the config's
// `security` section and deploy/'s mounts name them: tls.crt, tls.key (mode 0600) and ca.crt
// (the CA's certificate). FAILED_PRECONDITION if any of the three exists, NOT_FOUND without
// a CA in `ca_dir`.
absl::StatusOr<std::string> MakeNodeCertificate(const std::string& node, const std::string& ca_dir,
                                                const std::string& out_dir, int days);

}  // namespace ferry::client
