// The CA certificates of https requests (gpufeed/datasets/ca_bundle.h): the search order over
// made-up variables and files, then the real search in a child process whose /etc is a private
// tmpfs (an unprivileged user and mount namespace) holding the system's bundle at RHEL's path only,
// and holding nothing, where an https request fails naming every place looked at.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "gpufeed/datasets/ca_bundle.h"
#include "remote_client.h"

using namespace gpufeed::datasets;
using namespace gpufeed::datasets::remote;

namespace {

const char* const kDebian = "/etc/ssl/certs/ca-certificates.crt";
const char* const kRhel = "/etc/pki/tls/certs/ca-bundle.crt";
const char* const kRhelExtracted = "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem";
const char* const kSuse = "/etc/ssl/ca-bundle.pem";
const char* const kSuseExtracted = "/var/lib/ca-certificates/ca-bundle.pem";
const char* const kAlpine = "/etc/ssl/cert.pem";

// A made-up machine: its variables and its readable paths.
struct Machine {
  std::map<std::string, std::string> env;
  std::set<std::string> files;
  LibcurlCaDefaults libcurl;

  CaBundle search() const {
    return find_ca_bundle([this](const std::string& p) { return files.count(p) > 0; },
                          [this](const char* name) -> const char* {
                            const auto it = env.find(name);
                            return it == env.end() ? nullptr : it->second.c_str();
                          },
                          libcurl);
  }
};

}  // namespace

TEST(CaBundleSearch, SystemFilesInDistributionOrder) {
  EXPECT_EQ(system_ca_files(), (std::vector<std::string>{kDebian, kRhel, kRhelExtracted, kSuse,
                                                         kSuseExtracted, kAlpine}));
  const std::vector<std::string> all = system_ca_files();
  // Each file found when it is the only one, and the earliest one when it has the later ones too.
  for (size_t i = 0; i < all.size(); ++i) {
    Machine only{{}, {all[i]}, {}};
    EXPECT_EQ(only.search().file, all[i]);
    EXPECT_EQ(only.search().from, "system");
    Machine from_here{{}, {all.begin() + static_cast<std::ptrdiff_t>(i), all.end()}, {}};
    const CaBundle b = from_here.search();
    EXPECT_EQ(b.file, all[i]);
    EXPECT_EQ(b.dir, "");
    // tried: the four variables, then the files before it
    ASSERT_EQ(b.tried.size(), 4 + i);
    for (size_t j = 0; j < i; ++j) EXPECT_EQ(b.tried[4 + j], all[j] + " (not readable)");
  }
}

TEST(CaBundleSearch, VariablesBeforeFilesInTheirOrder) {
  const std::set<std::string> files = {kDebian, kRhel};
  Machine m{{{"SSL_CERT_FILE", "/a/ssl.pem"},
             {"CURL_CA_BUNDLE", "/a/curl.pem"},
             {"AWS_CA_BUNDLE", "/a/aws.pem"}},
            files,
            {}};
  EXPECT_EQ(m.search().file, "/a/aws.pem");
  EXPECT_EQ(m.search().from, "AWS_CA_BUNDLE");
  m.env["AWS_CA_BUNDLE"] = "";  // set but empty: unset
  EXPECT_EQ(m.search().file, "/a/curl.pem");
  EXPECT_EQ(m.search().from, "CURL_CA_BUNDLE");
  m.env.erase("CURL_CA_BUNDLE");
  EXPECT_EQ(m.search().file, "/a/ssl.pem");
  EXPECT_EQ(m.search().from, "SSL_CERT_FILE");
  EXPECT_EQ(m.search().tried,
            (std::vector<std::string>{"AWS_CA_BUNDLE (unset)", "CURL_CA_BUNDLE (unset)",
                                      "SSL_CERT_DIR (unset)"}));
  // A variable is taken as it is, readable or not: libcurl's error then names the file.
  EXPECT_EQ(m.files.count("/a/ssl.pem"), 0u);
  m.env.erase("SSL_CERT_FILE");
  EXPECT_EQ(m.search().file, kDebian);
}

TEST(CaBundleSearch, SslCertDirIsTheCaPathBesideTheFile) {
  Machine m{{{"SSL_CERT_DIR", "/a/certs"}}, {kRhel}, {"/usr/share/curl.pem", "/etc/ssl/certs"}};
  CaBundle b = m.search();
  EXPECT_EQ(b.dir, "/a/certs");
  EXPECT_EQ(b.file,
            kRhel);  // the system file too, as OpenSSL keeps its default file beside SSL_CERT_DIR
  m.env["SSL_CERT_FILE"] = "/a/ssl.pem";
  b = m.search();
  EXPECT_EQ(b.dir, "/a/certs");
  EXPECT_EQ(b.file, "/a/ssl.pem");
  m.env.erase("SSL_CERT_FILE");
  m.files.clear();
  b = m.search();  // the directory alone: found, libcurl's defaults not consulted
  EXPECT_TRUE(b.found());
  EXPECT_EQ(b.dir, "/a/certs");
  EXPECT_EQ(b.file, "");
  EXPECT_EQ(b.tried.size(), 3 + system_ca_files().size());
}

TEST(CaBundleSearch, LibcurlsBuiltInPathsLast) {
  // libcurl's own file exists, but a system file comes first
  Machine m{{},
            {kAlpine, "/opt/curl/ca.pem", "/opt/curl/certs"},
            {"/opt/curl/ca.pem", "/opt/curl/certs"}};
  EXPECT_EQ(m.search().file, kAlpine);
  m.files.erase(kAlpine);
  EXPECT_EQ(m.search().file, "/opt/curl/ca.pem");
  EXPECT_EQ(m.search().from, "libcurl");
  EXPECT_EQ(m.search().dir, "");
  m.files.erase("/opt/curl/ca.pem");
  EXPECT_EQ(m.search().file, "");
  EXPECT_EQ(m.search().dir, "/opt/curl/certs");
  EXPECT_TRUE(m.search().found());
}

TEST(CaBundleSearch, NothingFoundNamesEveryVariableAndPath) {
  const Machine m{{}, {}, {"/usr/local/ssl/cert.pem", ""}};
  const CaBundle b = m.search();
  EXPECT_FALSE(b.found());
  const std::vector<std::string> want = {
      "AWS_CA_BUNDLE (unset)",
      "CURL_CA_BUNDLE (unset)",
      "SSL_CERT_FILE (unset)",
      "SSL_CERT_DIR (unset)",
      std::string(kDebian) + " (not readable)",
      std::string(kRhel) + " (not readable)",
      std::string(kRhelExtracted) + " (not readable)",
      std::string(kSuse) + " (not readable)",
      std::string(kSuseExtracted) + " (not readable)",
      std::string(kAlpine) + " (not readable)",
      "libcurl's built-in CA file /usr/local/ssl/cert.pem (not readable)",
      "libcurl's built-in CA directory (none)"};
  EXPECT_EQ(b.tried, want);
  std::string joined;
  for (const auto& t : want) joined += (joined.empty() ? "" : ", ") + t;
  EXPECT_EQ(b.missing_message(),
            "no CA certificates for https: tried " + joined +
                "; set SSL_CERT_FILE to a PEM file of CA certificates (or SSL_CERT_DIR to a "
                "directory of them)");
}

TEST(CaBundleSearch, FirstHashedCertificateOfADirectory) {
  namespace fs = std::filesystem;
  const fs::path d = fs::temp_directory_path() / ("gpufeed-ca-dir-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d / "c0ffee00.0");  // a directory, not a certificate
  for (const char* f :
       {"README", "zzzzzzzz.0", "abcdef01.x", "abcdef0.1", "cert.pem", "b0000000.0"})
    std::ofstream(d / f) << "x";
  EXPECT_EQ(first_hashed_certificate(d.string()), (d / "b0000000.0").string());
  fs::create_symlink(d / "cert.pem", d / "a1b2c3d4.1");  // c_rehash's links
  EXPECT_EQ(first_hashed_certificate(d.string()), (d / "a1b2c3d4.1").string());
  fs::remove_all(d);
  EXPECT_EQ(first_hashed_certificate(d.string()), "");
}

namespace {

bool write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  return out.good();
}

// Makes this process root of a new user namespace with a private mount namespace, /etc (and SUSE's
// /var/lib/ca-certificates) replaced by empty tmpfs mounts; "" when done, else why not. Nothing
// is changed outside the process: the mounts vanish with it.
std::string private_empty_etc() {
  const uid_t uid = ::getuid();
  const gid_t gid = ::getgid();
  if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0)
    return std::string("unshare: ") + std::strerror(errno);
  if (!write_file("/proc/self/setgroups", "deny") ||
      !write_file("/proc/self/uid_map", "0 " + std::to_string(uid) + " 1") ||
      !write_file("/proc/self/gid_map", "0 " + std::to_string(gid) + " 1"))
    return "cannot write the new user namespace's uid_map/gid_map";
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
    return std::string("mount --make-rprivate /: ") + std::strerror(errno);
  if (::mount("tmpfs", "/etc", "tmpfs", 0, "mode=755") != 0)
    return std::string("tmpfs on /etc: ") + std::strerror(errno);
  struct stat st {};
  if (::stat("/var/lib/ca-certificates", &st) == 0 &&
      ::mount("tmpfs", "/var/lib/ca-certificates", "tmpfs", 0, "mode=755") != 0)
    return std::string("tmpfs on /var/lib/ca-certificates: ") + std::strerror(errno);
  return {};
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs `body` in a child process made by fork (the namespace is the child's alone) and returns what
// it wrote to its pipe; a child that could not enter the namespace writes "SKIP <why>".
std::string in_child(const std::function<std::string()>& body) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    const std::string out = body();
    (void)!::write(fds[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;)
    out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    out += " [child died: status " + std::to_string(status) + "]";
  return out;
}

// The error of a HEAD of an https URL nothing listens at (port 1 of this machine), no retries.
std::string https_error() {
  DataOptions o;
  o.max_retries = 0;
  o.request_timeout = 5;
  Client c(o);
  Request r;
  r.url = "https://127.0.0.1:1/shard-000.tar";
  r.head = true;
  try {
    c.fetch(r);
    return "no error";
  } catch (const std::exception& e) {
    return e.what();
  }
}

void unset_ca_variables() {
  for (const char* v : {"AWS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR"})
    ::unsetenv(v);
}

}  // namespace

TEST(CaBundleNamespace, ABundleOnlyAtRhelsPathIsFound) {
  const CaBundle here = find_ca_bundle();
  if (here.file.empty() || ::access(here.file.c_str(), R_OK) != 0)
    GTEST_SKIP() << "no readable CA bundle here to copy";
  const std::string pem = slurp(here.file);
  ASSERT_NE(pem.find("-----BEGIN CERTIFICATE-----"), std::string::npos) << here.file;
  const std::string out = in_child([&]() -> std::string {
    if (std::string why = private_empty_etc(); !why.empty()) return "SKIP " + why;
    unset_ca_variables();
    if (::access(kDebian, F_OK) == 0) return "the Debian bundle is still visible";
    for (const char* d : {"/etc/pki", "/etc/pki/tls", "/etc/pki/tls/certs"}) ::mkdir(d, 0755);
    if (!write_file(kRhel, pem))
      return std::string("cannot write ") + kRhel + " on the private /etc";
    const CaBundle b = find_ca_bundle();
    // past the CA search: the request fails connecting, not for certificates
    return b.file + "|" + b.from + "|" + std::to_string(slurp(kRhel).size()) + "|" + https_error();
  });
  if (out.starts_with("SKIP "))
    GTEST_SKIP() << "no unprivileged user+mount namespace: " << out.substr(5);
  const std::string want = std::string(kRhel) + "|system|" + std::to_string(pem.size()) + "|";
  ASSERT_TRUE(out.starts_with(want)) << out;
  const std::string error = out.substr(want.size());
  EXPECT_NE(error.find("HEAD https://127.0.0.1:1/shard-000.tar"), std::string::npos) << error;
  EXPECT_EQ(error.find("no CA certificates"), std::string::npos) << error;
}

TEST(CaBundleNamespace, SslCertDirAloneGivesTheFileOneOfItsCertificates) {
  const std::string out = in_child([]() -> std::string {
    if (std::string why = private_empty_etc(); !why.empty()) return "SKIP " + why;
    unset_ca_variables();
    ::mkdir("/etc/certs", 0755);
    if (!write_file("/etc/certs/README", "") || !write_file("/etc/certs/9d66eef0.0", "pem"))
      return "cannot write /etc/certs on the private /etc";
    ::setenv("SSL_CERT_DIR", "/etc/certs", 1);
    const CaBundle b = find_ca_bundle();
    return b.file + "|" + b.dir + "|" + b.from;
  });
  if (out.starts_with("SKIP "))
    GTEST_SKIP() << "no unprivileged user+mount namespace: " << out.substr(5);
  EXPECT_EQ(out, "/etc/certs/9d66eef0.0|/etc/certs|directory");
}

TEST(CaBundleNamespace, NothingPresentTheErrorNamesEveryPlaceTried) {
  const std::string out = in_child([]() -> std::string {
    if (std::string why = private_empty_etc(); !why.empty()) return "SKIP " + why;
    unset_ca_variables();
    return https_error();
  });
  if (out.starts_with("SKIP "))
    GTEST_SKIP() << "no unprivileged user+mount namespace: " << out.substr(5);
  EXPECT_TRUE(out.starts_with(
      "HEAD https://127.0.0.1:1/shard-000.tar: no CA certificates for https: tried "
      "AWS_CA_BUNDLE (unset), CURL_CA_BUNDLE (unset), SSL_CERT_FILE (unset), SSL_CERT_DIR "
      "(unset), "))
      << out;
  for (const std::string& f : system_ca_files())
    EXPECT_NE(out.find(f + " (not readable)"), std::string::npos) << f;
  EXPECT_NE(out.find("libcurl's built-in CA file"), std::string::npos) << out;
}
