#pragma once
// A small certificate authority made with the `openssl` command: for the demo, the tests and
// the benchmarks a throwaway one in one folder, so that the agents AgentProcess starts talk
// mutual TLS as a deployment does (security.mode mtls); for `ferryctl certs` a CA and node
// certificates an operator copies to the nodes. P-256 keys. Not a production CA: its key is a
// plain file (docs/operator-guide.md, "Trust", says how to issue real certificates).

#include <string>

#include "absl/status/statusor.h"

namespace ferry {

class DevPki {
 public:
  struct Issued {
    std::string cert;  // PEM file paths
    std::string key;
  };

  // The CA in `dir` (dir/ca.pem, dir/ca.key), made when absent. `name` goes in its subject,
  // so two DevPkis are two CAs that do not trust each other. `days`: how long what it makes
  // (the CA, if made now, and the certificates it issues) stays valid.
  static absl::StatusOr<DevPki> Open(const std::string& dir, const std::string& name = "ferry-dev",
                                     int days = 7);

  const std::string& ca() const { return ca_; }
  // A certificate for `node` (DNS subjectAltName `node`, for server and client use) signed by
  // this CA: dir/<file_stem>.pem and .key, made when absent. `file_stem` defaults to `node`.
  absl::StatusOr<Issued> Issue(const std::string& node, const std::string& file_stem = "") const;
  // OK when `node` can be a certificate's DNS name as given (letters, digits, '.', '-', '_').
  static absl::Status CheckNodeName(const std::string& node);
  // The same certificate written to `cert` and `key` (PEM; the key mode 0600), made whether
  // or not they exist. `node` as CheckNodeName accepts.
  absl::Status IssueTo(const std::string& node, const std::string& cert,
                       const std::string& key) const;
  // The `security` section of an agent config for `node` (issues its certificate).
  absl::StatusOr<std::string> SecurityYaml(const std::string& node) const;

 private:
  DevPki(std::string dir, std::string ca, std::string ca_key, int days)
      : dir_(std::move(dir)), ca_(std::move(ca)), ca_key_(std::move(ca_key)), days_(days) {}

  std::string dir_, ca_, ca_key_;
  int days_;
};

}  // namespace ferry
