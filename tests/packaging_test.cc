// Packaging (deploy/): the tree `cmake --install` lays out, the systemd unit (checked by
// systemd-analyze where it is installed), the Kubernetes manifest (parsed, every mount the
// agent needs named), the container file, and the .debs CPack makes (ferryd, libferry,
// libferry-dev, python3-ferry).

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "config/config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/text_file.h"
#include "yaml-cpp/yaml.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Runs `command` with sh; its stdout and stderr together in *out. Returns the exit code.
int Shell(const std::string& command, std::string* out) {
  out->clear();
  FILE* p = popen(absl::StrCat(command, " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char chunk[4096];
  size_t n;
  while ((n = fread(chunk, 1, sizeof(chunk), p)) > 0) out->append(chunk, n);
  int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

bool OnPath(const std::string& tool) {
  std::string out;
  return Shell(absl::StrCat("command -v ", tool), &out) == 0;
}

bool IsExecutable(const std::string& path) { return access(path.c_str(), X_OK) == 0; }

std::string MakeTempDir() {
  char tmpl[] = "/tmp/ferry-pkg-test-XXXXXX";
  EXPECT_NE(mkdtemp(tmpl), nullptr);
  return tmpl;
}

// One install into a fresh prefix, shared by the tests that look at it.
class InstallTree : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    prefix_ = new std::string(MakeTempDir());
    std::string out;
    install_rc_ = Shell(absl::StrCat(FERRY_CMAKE, " --install ", FERRY_BUILD_DIR, " --prefix ",
                                     *prefix_),
                        &out);
    install_log_ = new std::string(out);
  }
  static void TearDownTestSuite() {
    std::system(absl::StrCat("rm -rf ", *prefix_).c_str());
    delete prefix_;
    delete install_log_;
  }
  void SetUp() override { ASSERT_EQ(install_rc_, 0) << *install_log_; }
  static std::string Path(const std::string& rel) { return absl::StrCat(*prefix_, "/", rel); }

  static std::string* prefix_;
  static std::string* install_log_;
  static int install_rc_;
};
std::string* InstallTree::prefix_ = nullptr;
std::string* InstallTree::install_log_ = nullptr;
int InstallTree::install_rc_ = -1;

TEST_F(InstallTree, HasTheStandardLayout) {
  EXPECT_TRUE(IsExecutable(Path("bin/ferryd")));
  EXPECT_TRUE(IsExecutable(Path("bin/ferryctl")));
  for (const char* file : {"etc/ferry/ferry.yaml", "lib/systemd/system/ferryd.service",
                           "share/doc/ferry/README.md", "share/doc/ferry/ferry.example.yaml",
                           "share/doc/ferry/ferryd-daemonset.yaml"}) {
    EXPECT_EQ(access(Path(file).c_str(), R_OK), 0) << file << " is not installed";
  }
  std::string out;
  EXPECT_EQ(Shell(Path("bin/ferryd --version"), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("ferryd "));
  // libferry for programs (tests/sdk_install_test.sh builds and runs one against it).
  for (const char* file : {"lib/libferry.so", "include/ferry/ferry_client.h",
                           "include/ferry/types.h", "include/ferry/version.h",
                           "lib/cmake/ferry/ferryConfig.cmake", "lib/pkgconfig/ferry.pc"}) {
    EXPECT_EQ(access(Path(file).c_str(), R_OK), 0) << file << " is not installed";
  }
#ifdef FERRY_PACKAGING_PYTHON
  EXPECT_EQ(access(Path("lib/python3/dist-packages/ferry/__init__.py").c_str(), R_OK), 0);
#endif
}

TEST_F(InstallTree, TheInstalledConfigIsValidAndPackaged) {
  auto c = config::LoadConfigFile(Path("etc/ferry/ferry.yaml"));
  ASSERT_TRUE(c.ok()) << c.status();
  // A packaged agent: the host's name, no example peers, the socket in the unit's
  // RuntimeDirectory; otherwise the documented defaults.
  EXPECT_EQ(c->node, "");
  EXPECT_TRUE(c->peers.empty());
  EXPECT_EQ(c->local_socket, "/run/ferry/ferryd.sock");
  EXPECT_EQ(c->shutdown_grace_ms, 30000u);
  EXPECT_EQ(c->host_pool_bytes, config::Config{}.host_pool_bytes);
}

TEST_F(InstallTree, TheUnitRunsThisInstallWithTheLimitsItNeeds) {
  const std::string unit = ReadFile(Path("lib/systemd/system/ferryd.service"));
  EXPECT_THAT(unit, HasSubstr(absl::StrCat("ExecStart=", Path("bin/ferryd"), " --config ",
                                           Path("etc/ferry/ferry.yaml"),
                                           " --socket /run/ferry/ferryd.sock")));
  for (const char* line : {"LimitMEMLOCK=infinity\n", "Restart=on-failure\n",
                           "RuntimeDirectory=ferry\n", "ExecReload=/bin/kill -HUP $MAINPID\n",
                           "KillSignal=SIGTERM\n", "TimeoutStopSec=45s\n"}) {
    EXPECT_THAT(unit, HasSubstr(line));
  }
  // Hardening must leave /dev/infiniband and /dev/nvidia* open.
  for (const char* line : {"PrivateDevices=yes", "DevicePolicy=closed", "DevicePolicy=strict",
                           "ProtectProc=invisible"}) {
    EXPECT_THAT(unit, Not(HasSubstr(line)));
  }
}

// systemd-analyze verify checks keys, values and that ExecStart's binary exists: the
// installed unit names the installed ferryd, so that check is real here.
TEST_F(InstallTree, TheUnitPassesSystemdAnalyzeVerify) {
  if (!OnPath("systemd-analyze")) {
    GTEST_SKIP() << "systemd-analyze is not installed (Debian package systemd); unit not verified";
  }
  std::string out;
  int rc = Shell(absl::StrCat("systemd-analyze verify ", Path("lib/systemd/system/ferryd.service")),
                 &out);
  EXPECT_EQ(rc, 0) << out;
  // Unknown keys and bad values are warnings with exit code 0: none may appear.
  EXPECT_THAT(out, Not(HasSubstr("ferryd.service"))) << out;
  std::printf("systemd-analyze verify: exit %d, %zu bytes of output\n", rc, out.size());
}

YAML::Node FindKind(const std::vector<YAML::Node>& docs, const std::string& kind) {
  for (const auto& d : docs) {
    if (d["kind"] && d["kind"].as<std::string>() == kind) return d;
  }
  ADD_FAILURE() << "no " << kind << " in the manifest";
  return YAML::Node();
}

TEST(DaemonSetTest, ParsesAndNamesEveryMountTheAgentNeeds) {
  std::vector<YAML::Node> docs;
  ASSERT_NO_THROW(docs = YAML::LoadAllFromFile(
                      FERRY_SOURCE_DIR "/deploy/kubernetes/ferryd-daemonset.yaml"));
  YAML::Node ds = FindKind(docs, "DaemonSet");
  ASSERT_TRUE(ds.IsMap());
  YAML::Node pod = ds["spec"]["template"]["spec"];
  EXPECT_TRUE(pod["hostNetwork"].as<bool>());
  EXPECT_TRUE(pod["hostPID"].as<bool>());
  EXPECT_EQ(pod["runtimeClassName"].as<std::string>(), "nvidia");
  ASSERT_EQ(pod["containers"].size(), 1u);
  YAML::Node c = pod["containers"][0];

  std::set<std::string> caps;
  for (const auto& cap : c["securityContext"]["capabilities"]["add"]) {
    caps.insert(cap.as<std::string>());
  }
  EXPECT_TRUE(caps.count("IPC_LOCK"));
  bool all_gpus = false;
  for (const auto& e : c["env"]) {
    all_gpus |= e["name"].as<std::string>() == "NVIDIA_VISIBLE_DEVICES" &&
                e["value"].as<std::string>() == "all";
  }
  EXPECT_TRUE(all_gpus);

  // Volume name -> what it is ("hostPath:/dev/infiniband", "configMap:ferryd-config").
  std::map<std::string, std::string> volumes;
  for (const auto& v : pod["volumes"]) {
    std::string what = v["hostPath"] ? "hostPath:" + v["hostPath"]["path"].as<std::string>()
                       : v["configMap"] ? "configMap:" + v["configMap"]["name"].as<std::string>()
                                        : "other";
    volumes[v["name"].as<std::string>()] = what;
  }
  // Mount path -> volume.
  std::map<std::string, std::string> mounts;
  for (const auto& m : c["volumeMounts"]) {
    mounts[m["mountPath"].as<std::string>()] = volumes[m["name"].as<std::string>()];
  }
  EXPECT_EQ(mounts["/dev/infiniband"], "hostPath:/dev/infiniband");
  EXPECT_EQ(mounts["/run/ferry"], "hostPath:/run/ferry");
  EXPECT_EQ(mounts["/etc/ferry"], "configMap:ferryd-config");
  EXPECT_EQ(mounts["/etc/ferry-tls"], "hostPath:/etc/ferry/tls");

  // The arguments use those mounts, and the probes ask through the socket the agent serves
  // (the Peer API wants a client certificate the kubelet does not have).
  std::vector<std::string> args;
  for (const auto& a : c["args"]) args.push_back(a.as<std::string>());
  EXPECT_THAT(args, ::testing::Contains("--config=/etc/ferry/ferry.yaml"));
  EXPECT_THAT(args, ::testing::Contains("--socket=/run/ferry/ferryd.sock"));
  EXPECT_THAT(args, ::testing::Contains("--peer-listen=$(NODE_IP):7100"));
  for (const char* probe : {"readinessProbe", "livenessProbe"}) {
    std::vector<std::string> command;
    for (const auto& w : c[probe]["exec"]["command"]) command.push_back(w.as<std::string>());
    EXPECT_THAT(command, ::testing::ElementsAre("ferryctl", "--socket", "/run/ferry/ferryd.sock",
                                                "info"))
        << probe;
  }

  // The ConfigMap's ferry.yaml is a valid config whose drain ends before the kubelet kills.
  YAML::Node cm = FindKind(docs, "ConfigMap");
  ASSERT_TRUE(cm["data"]["ferry.yaml"]);
  auto config = config::ParseConfig(cm["data"]["ferry.yaml"].as<std::string>(), "ConfigMap");
  ASSERT_TRUE(config.ok()) << config.status();
  // Its peers are on other hosts: mutual TLS, with the mounted certificate.
  EXPECT_EQ(config->security.mode, "mtls");
  EXPECT_EQ(config->security.cert, "/etc/ferry-tls/tls.crt");
  EXPECT_LT(config->shutdown_grace_ms, pod["terminationGracePeriodSeconds"].as<uint32_t>() * 1000);
}

TEST(ContainerfileTest, BuildsFromDebianPackagesOnly) {
  const std::string file = ReadFile(FERRY_SOURCE_DIR "/deploy/container/Containerfile");
  ASSERT_FALSE(file.empty());
  int stages = 0;
  for (absl::string_view line : absl::StrSplit(file, '\n')) {
    if (!absl::StartsWith(line, "FROM ")) continue;
    ++stages;
    EXPECT_TRUE(absl::StartsWith(line, "FROM debian:bookworm")) << line;
  }
  EXPECT_EQ(stages, 2) << "a build stage and a runtime stage";
  for (const char* fetch : {"curl ", "wget ", "pip ", "git clone", "ADD http"}) {
    EXPECT_THAT(file, Not(HasSubstr(fetch)));
  }
  EXPECT_THAT(file, HasSubstr("cpack -G DEB"));
}

// The .deb, packed into a temporary folder from this build (its CPackConfig.cmake).
TEST(DebPackageTest, ListsFerrydTheUnitAndTheConfig) {
  if (!OnPath("dpkg-deb") || !OnPath("dpkg-shlibdeps")) {
    GTEST_SKIP() << "dpkg-deb / dpkg-shlibdeps missing (Debian package dpkg-dev); no .deb made";
  }
  const std::string dir = MakeTempDir();
  std::string out;
  ASSERT_EQ(Shell(absl::StrCat(FERRY_CPACK, " -G DEB --config ", FERRY_BUILD_DIR,
                               "/CPackConfig.cmake -B ", dir),
                  &out),
            0)
      << out;
  std::string deb;
  ASSERT_EQ(Shell(absl::StrCat("ls ", dir, "/ferryd_*.deb"), &deb), 0) << deb;
  deb = std::string(absl::StripTrailingAsciiWhitespace(deb));
  ASSERT_EQ(Shell(absl::StrCat("dpkg-deb -c ", deb), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("./usr/bin/ferryd"));
  EXPECT_THAT(out, HasSubstr("./usr/bin/ferryctl"));
  EXPECT_THAT(out, HasSubstr("./usr/lib/systemd/system/ferryd.service"));
  EXPECT_THAT(out, HasSubstr("./etc/ferry/ferry.yaml"));
  EXPECT_THAT(out, HasSubstr("./usr/share/doc/ferry/ferry.example.yaml"));
  ASSERT_EQ(Shell(absl::StrCat("dpkg-deb -f ", deb, " Package Version Depends Recommends"), &out),
            0);
  EXPECT_THAT(out, HasSubstr("Package: ferryd\n"));
  EXPECT_THAT(out, HasSubstr("libgrpc++1.51"));
  EXPECT_THAT(out, HasSubstr("libibverbs1"));
  EXPECT_THAT(out, HasSubstr("ibverbs-providers"));
  std::string fields = out;
  ASSERT_EQ(Shell(absl::StrCat("dpkg-deb -I ", deb, " conffiles"), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("/etc/ferry/ferry.yaml"));
  // The packed unit runs the packaged binary.
  ASSERT_EQ(Shell(absl::StrCat("dpkg-deb --fsys-tarfile ", deb,
                               " | tar -xO ./usr/lib/systemd/system/ferryd.service"),
                  &out),
            0);
  EXPECT_THAT(out, HasSubstr("ExecStart=/usr/bin/ferryd --config /etc/ferry/ferry.yaml"));
  struct stat st {};
  ASSERT_EQ(stat(deb.c_str(), &st), 0);
  std::printf("%s: %lld bytes\n%s", deb.c_str(), static_cast<long long>(st.st_size),
              fields.c_str());

  // The client packages: the run-time library (named after its SONAME), the development
  // files that depend on exactly it, and the Python package.
  const std::map<std::string, std::vector<std::string>> contents = {
      {"libferry" FERRY_SOVERSION, {"./usr/lib/libferry.so." FERRY_SOVERSION}},
      {"libferry-dev",
       {"./usr/include/ferry/ferry_client.h", "./usr/lib/libferry.so",
        "./usr/lib/cmake/ferry/ferryConfig.cmake", "./usr/lib/pkgconfig/ferry.pc"}},
#ifdef FERRY_PACKAGING_PYTHON
      {"python3-ferry", {"./usr/lib/python3/dist-packages/ferry/__init__.py",
                         "./usr/lib/python3/dist-packages/ferry/_ferry"}},
#endif
  };
  for (const auto& [package, files] : contents) {
    std::string path;
    ASSERT_EQ(Shell(absl::StrCat("ls ", dir, "/", package, "_*.deb"), &path), 0) << path;
    path = std::string(absl::StripTrailingAsciiWhitespace(path));
    ASSERT_EQ(Shell(absl::StrCat("dpkg-deb -c ", path), &out), 0) << out;
    for (const std::string& file : files) EXPECT_THAT(out, HasSubstr(file)) << package;
    EXPECT_THAT(out, Not(HasSubstr("./usr/bin/ferryd"))) << package;
    ASSERT_EQ(Shell(absl::StrCat("dpkg-deb -f ", path, " Package Depends"), &out), 0);
    EXPECT_THAT(out, HasSubstr(absl::StrCat("Package: ", package, "\n")));
    if (package == "libferry-dev") {
      EXPECT_THAT(out, HasSubstr("libferry" FERRY_SOVERSION " (= " FERRY_PROJECT_VERSION ")"));
      EXPECT_THAT(out, HasSubstr("libabsl-dev"));
    }
    if (package == "python3-ferry") EXPECT_THAT(out, HasSubstr("python3-numpy"));
  }
  std::system(absl::StrCat("rm -rf ", dir).c_str());
}

}  // namespace
}  // namespace ferry
