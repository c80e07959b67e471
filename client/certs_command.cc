#include "client/certs_command.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "client/dev_pki.h"

namespace ferry::client {
namespace {

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

// `dir` and its missing parents; made ones are 0700 (a node's key goes in).
absl::Status MakeDirectory(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("--out: empty folder name");
  for (size_t at = dir.find('/', 1);; at = dir.find('/', at + 1)) {
    const std::string part = dir.substr(0, at);
    if (mkdir(part.c_str(), 0700) != 0 && errno != EEXIST) {
      return absl::ErrnoToStatus(errno, absl::StrCat("mkdir(", part, ")"));
    }
    if (at == std::string::npos) break;
  }
  struct stat st;
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(dir, " is not a folder"));
  }
  return absl::OkStatus();
}

// The config names certificate files by absolute path (ferryd may start elsewhere).
std::string Absolute(const std::string& path) {
  char resolved[PATH_MAX];
  return realpath(path.c_str(), resolved) != nullptr ? std::string(resolved) : path;
}

absl::Status RefuseExisting(const std::string& path, absl::string_view what) {
  if (!Exists(path)) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(path, " exists: ", what, " (nothing was overwritten; remove it first, or ",
                   "choose another --out)"));
}

// Written to a temporary name and renamed, as DevPki writes its files.
absl::Status CopyFile(const std::string& from, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", from));
  const std::string tmp = absl::StrCat(to, ".tmp.", getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text.str();
    if (!out.flush()) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  if (rename(tmp.c_str(), to.c_str()) != 0) {
    unlink(tmp.c_str());
    return absl::ErrnoToStatus(errno, absl::StrCat("rename(", tmp, ", ", to, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> MakeCertificateAuthority(const std::string& dir, int days) {
  const std::string cert = absl::StrCat(dir, "/ca.pem"), key = absl::StrCat(dir, "/ca.key");
  // A second CA in the same place would orphan every certificate the first one signed.
  if (absl::Status s = RefuseExisting(cert, "a CA is there already"); !s.ok()) return s;
  if (absl::Status s = RefuseExisting(key, "a CA is there already"); !s.ok()) return s;
  if (absl::Status s = MakeDirectory(dir); !s.ok()) return s;
  auto pki = DevPki::Open(dir, "ferry", days);
  if (!pki.ok()) return pki.status();
  return absl::StrCat("made a CA, valid ", days, " days:\n  ", cert,
                      "  its certificate (each node gets a copy as ca.crt)\n  ", key,
                      "  its key: signs node certificates; keep it off the nodes\n",
                      "next: ferryctl certs node NAME --ca ", dir, " --out DIR, once per node\n");
}

absl::StatusOr<std::string> MakeNodeCertificate(const std::string& node, const std::string& ca_dir,
                                                const std::string& out_dir, int days) {
  if (absl::Status s = DevPki::CheckNodeName(node); !s.ok()) return s;
  if (!Exists(absl::StrCat(ca_dir, "/ca.pem")) || !Exists(absl::StrCat(ca_dir, "/ca.key"))) {
    return absl::NotFoundError(absl::StrCat("--ca ", ca_dir,
                                            ": no CA there (ca.pem and ca.key); make one with "
                                            "ferryctl certs ca --out ",
                                            ca_dir));
  }
  const std::string cert = absl::StrCat(out_dir, "/tls.crt");
  const std::string key = absl::StrCat(out_dir, "/tls.key");
  const std::string ca = absl::StrCat(out_dir, "/ca.crt");
  for (const std::string& path : {cert, key, ca}) {
    if (absl::Status s = RefuseExisting(path, "a node's certificate is there already"); !s.ok())
      return s;
  }
  // Opening an existing CA makes nothing; `days` applies to the certificate issued here.
  auto pki = DevPki::Open(ca_dir, "ferry", days);
  if (!pki.ok()) return pki.status();
  if (absl::Status s = MakeDirectory(out_dir); !s.ok()) return s;
  if (absl::Status s = pki->IssueTo(node, cert, key); !s.ok()) return s;
  if (absl::Status s = CopyFile(pki->ca(), ca); !s.ok()) return s;
  return absl::StrCat("made ", node, "'s certificate, valid ", days, " days:\n  ", cert,
                      "  DNS:", node, ", signed by ", pki->ca(), "\n  ", key,
                      "  its key (mode 0600)\n  ", ca,
                      "  the CA's certificate\n"
                      "copy ",
                      out_dir, " to ", node, "; its config's security section, paths as here:\n",
                      "security: {mode: mtls, ca: ", Absolute(ca), ", cert: ", Absolute(cert),
                      ", key: ", Absolute(key), "}\n");
}

}  // namespace ferry::client
