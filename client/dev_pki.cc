#include "client/dev_pki.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <vector>

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

absl::StatusOr<DevPki> DevPki::Open(const std::string& dir, const std::string& name) {
  DevPki pki(dir, absl::StrCat(dir, "/ca.pem"), absl::StrCat(dir, "/ca.key"));
  if (Exists(pki.ca_) && Exists(pki.ca_key_)) return pki;
  const std::string tmp = absl::StrCat(dir, "/ca.tmp.", getpid());
  // P-256 keys: made in milliseconds (RSA takes a good part of a second per key).
  absl::Status made = OpenSsl(
      {"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
       "-keyout", tmp + ".key", "-out", tmp + ".pem", "-days", "7", "-subj",
       absl::StrCat("/CN=", name, " CA"), "-addext", "basicConstraints=critical,CA:TRUE",
       "-addext", "keyUsage=critical,keyCertSign,cRLSign"},
      tmp + ".log");
  if (!made.ok()) return made;
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
  const std::string tmp = absl::StrCat(stem, ".tmp.", getpid());
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
    made = OpenSsl({"x509", "-req", "-in", tmp + ".csr", "-CA", ca_, "-CAkey", ca_key_,
                    "-set_serial", absl::StrCat(getpid(), std::hash<std::string>()(stem) % 100000),
                    "-days", "7", "-extfile", tmp + ".ext", "-out", tmp + ".pem"},
                   tmp + ".log");
  }
  for (const char* suffix : {".ext", ".csr", ".log"}) unlink((tmp + suffix).c_str());
  if (!made.ok()) return made;
  if (absl::Status s = Publish(tmp + ".key", out.key); !s.ok()) return s;
  if (absl::Status s = Publish(tmp + ".pem", out.cert); !s.ok()) return s;
  return out;
}

absl::StatusOr<std::string> DevPki::SecurityYaml(const std::string& node) const {
  auto issued = Issue(node);
  if (!issued.ok()) return issued.status();
  return absl::StrCat("security:\n  mode: mtls\n  ca: ", ca_, "\n  cert: ", issued->cert,
                      "\n  key: ", issued->key, "\n");
}

}  // namespace ferry
