#pragma once
// A throwaway certificate authority for the demo, the tests and the benchmarks: a CA and
// node certificates made with the `openssl` command in one folder, so that the agents
// AgentProcess starts talk mutual TLS as a deployment does (security.mode mtls). Not for
// production: the CA's key sits beside the certificates; deploy/ says how to issue real ones.

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
  // so two DevPkis are two CAs that do not trust each other.
  static absl::StatusOr<DevPki> Open(const std::string& dir, const std::string& name = "ferry-dev");

  const std::string& ca() const { return ca_; }
  // A certificate for `node` (DNS subjectAltName `node`, for server and client use) signed by
  // this CA: dir/<file_stem>.pem and .key, made when absent. `file_stem` defaults to `node`.
  absl::StatusOr<Issued> Issue(const std::string& node, const std::string& file_stem = "") const;
  // The `security` section of an agent config for `node` (issues its certificate).
  absl::StatusOr<std::string> SecurityYaml(const std::string& node) const;

 private:
  DevPki(std::string dir, std::string ca, std::string ca_key)
      : dir_(std::move(dir)), ca_(std::move(ca)), ca_key_(std::move(ca_key)) {}

  std::string dir_, ca_, ca_key_;
};

}  // namespace ferry
