#include "client/dev_pki.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <random>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "client/child_process.h"

namespace ferry {
namespace {

bool Exists(const std::string& path) { return access(path.c_str(), R_OK) == 0; }

// Runs openssl with `args`; its output goes to `log` and is quoted on failure.
absl::Status OpenSsl(const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> argv = {"openssl"};
  argv.insert(argv.end(), args.begin(), args.end());
  auto pid = SpawnChild(argv, log);
  if (!pid.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot run openssl (apt-get install openssl): ", pid.status().message()));
  }
  int status = 0;
  while (waitpid(*pid, &status, 0) < 0) {
    if (errno != EINTR) return absl::InternalError(absl::StrCat("waitpid: ", strerror(errno)));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
  std::ifstream in(log);
  std::string output((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return absl::InternalError(absl::StrCat("openssl ", args.front(), " failed: ",
                                          output.substr(0, 512)));
}

// Made under a temporary name and renamed, so a reader never sees half a file.
absl::Status Publish(const std::string& tmp, const std::string& path) {
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("rename(", tmp, ", ", path, "): ", strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DevPki> DevPki::Open(const std::string& dir, const std::string& name, int days) {
  if (days < 1) return absl::InvalidArgumentError(absl::StrCat("days: ", days, " is not >= 1"));
  DevPki pki(dir, absl::StrCat(dir, "/ca.pem"), absl::StrCat(dir, "/ca.key"), days);
  if (Exists(pki.ca_) && Exists(pki.ca_key_)) return pki;
  const std::string tmp = absl::StrCat(dir, "/ca.tmp.", getpid());
  // P-256 keys: made in milliseconds (RSA takes a good part of a second per key).
  absl::Status made = OpenSsl(
      {"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
       "-keyout", tmp + ".key", "-out", tmp + ".pem", "-days", absl::StrCat(days), "-subj",
       absl::StrCat("/CN=", name, " CA"), "-addext", "basicConstraints=critical,CA:TRUE",
       "-addext", "keyUsage=critical,keyCertSign,cRLSign"},
      tmp + ".log");
  if (!made.ok()) return made;
  if (chmod((tmp + ".key").c_str(), 0600) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("chmod(", tmp, ".key, 0600)"));
  }
  if (absl::Status s = Publish(tmp + ".key", pki.ca_key_); !s.ok()) return s;
  if (absl::Status s = Publish(tmp + ".pem", pki.ca_); !s.ok()) return s;
  unlink((tmp + ".log").c_str());
  return pki;
}

absl::StatusOr<DevPki::Issued> DevPki::Issue(const std::string& node,
                                             const std::string& file_stem) const {
  const std::string stem = absl::StrCat(dir_, "/", file_stem.empty() ? node : file_stem);
  Issued out{stem + ".pem", stem + ".key"};
  if (Exists(out.cert) && Exists(out.key)) return out;
  if (absl::Status s = IssueTo(node, out.cert, out.key); !s.ok()) return s;
  return out;
}

absl::Status DevPki::CheckNodeName(const std::string& node) {
  // The name goes into openssl's -subj and the extension file as it is: anything but a DNS
  // name's characters could add fields or extensions there.
  auto dns_char = [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_';
  };
  if (!node.empty() && node.size() <= 253 && std::all_of(node.begin(), node.end(), dns_char)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("node name '", node, "': a certificate names a node by DNS name (letters, ",
                   "digits, '.', '-', '_'; at most 253)"));
}

absl::Status DevPki::IssueTo(const std::string& node, const std::string& cert,
                             const std::string& key) const {
  if (absl::Status s = CheckNodeName(node); !s.ok()) return s;
  const std::string tmp = absl::StrCat(cert, ".tmp.", getpid());
  {
    std::ofstream ext(tmp + ".ext");
    ext << "subjectAltName=DNS:" << node << "\n"
        << "extendedKeyUsage=serverAuth,clientAuth\n"
        << "basicConstraints=CA:FALSE\n";
    if (!ext) return absl::InternalError(absl::StrCat("cannot write ", tmp, ".ext"));
  }
  absl::Status made = OpenSsl({"req", "-new", "-newkey", "ec", "-pkeyopt",
                               "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", tmp + ".key",
                               "-out", tmp + ".csr", "-subj", absl::StrCat("/CN=", node)},
                              tmp + ".log");
  if (made.ok()) {
    // A random 63-bit serial: certificates of one CA must not share one (RFC 5280 4.1.2.2),
    // and they are issued by separate processes (tests, ferryctl runs) that share no counter.
    std::random_device random;
    const uint64_t serial = ((uint64_t{random()} << 32) | random()) >> 1;
    made = OpenSsl({"x509", "-req", "-in", tmp + ".csr", "-CA", ca_, "-CAkey", ca_key_,
                    "-set_serial", absl::StrCat(serial == 0 ? 1 : serial), "-days",
                    absl::StrCat(days_), "-extfile", tmp + ".ext", "-out", tmp + ".pem"},
                   tmp + ".log");
  }
  for (const char* suffix : {".ext", ".csr", ".log"}) unlink((tmp + suffix).c_str());
  if (made.ok() && chmod((tmp + ".key").c_str(), 0600) != 0) {
    made = absl::ErrnoToStatus(errno, absl::StrCat("chmod(", tmp, ".key, 0600)"));
  }
  if (!made.ok()) {
    unlink((tmp + ".key").c_str());
    unlink((tmp + ".pem").c_str());
    return made;
  }
  if (absl::Status s = Publish(tmp + ".key", key); !s.ok()) return s;
  return Publish(tmp + ".pem", cert);
}

absl::StatusOr<std::string> DevPki::SecurityYaml(const std::string& node) const {
  auto issued = Issue(node);
  if (!issued.ok()) return issued.status();
  return absl::StrCat("security:\n  mode: mtls\n  ca: ", ca_, "\n  cert: ", issued->cert,
                      "\n  key: ", issued->key, "\n");
}

}  // namespace ferry
