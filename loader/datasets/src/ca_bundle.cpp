#include "gpufeed/datasets/ca_bundle.h"

#include <curl/curl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>

namespace gpufeed::datasets::remote {

const std::vector<std::string>& system_ca_files() {
  static const std::vector<std::string> files = {
      "/etc/ssl/certs/ca-certificates.crt",  // Debian, Ubuntu (and Gentoo, Arch's link)
      "/etc/pki/tls/certs/ca-bundle.crt",    // RHEL, Fedora, CentOS, Rocky, Amazon Linux
      "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",  // the same, as p11-kit extracts it
      "/etc/ssl/ca-bundle.pem",                             // openSUSE, SLES
      "/var/lib/ca-certificates/ca-bundle.pem",  // the same, as update-ca-certificates writes it
      "/etc/ssl/cert.pem",                       // Alpine (and macOS, the BSDs)
  };
  return files;
}

const std::vector<std::string>& ca_file_variables() {
  static const std::vector<std::string> names = {"AWS_CA_BUNDLE", "CURL_CA_BUNDLE",
                                                 "SSL_CERT_FILE"};
  return names;
}

std::string CaBundle::missing_message() const {
  std::string m = "no CA certificates for https: tried ";
  for (size_t i = 0; i < tried.size(); ++i) m += (i ? ", " : "") + tried[i];
  return m +
         "; set SSL_CERT_FILE to a PEM file of CA certificates (or SSL_CERT_DIR to a directory of "
         "them)";
}

namespace {

// The variable's value, or "" (recording it as unset in `tried`).
std::string variable(const char* name, const std::function<const char*(const char*)>& getenv,
                     CaBundle& b) {
  const char* v = getenv(name);
  if (v != nullptr && *v != '\0') return v;
  b.tried.push_back(std::string(name) + " (unset)");
  return {};
}

// Whether `path` is readable, recording it in `tried` when it is not.
bool usable(const std::string& what, const std::string& path,
            const std::function<bool(const std::string&)>& readable, CaBundle& b) {
  if (path.empty()) {
    b.tried.push_back(what + " (none)");
    return false;
  }
  if (readable(path)) return true;
  b.tried.push_back(what + (what.empty() ? "" : " ") + path + " (not readable)");
  return false;
}

}  // namespace

CaBundle find_ca_bundle(const std::function<bool(const std::string&)>& readable,
                        const std::function<const char*(const char*)>& getenv,
                        const LibcurlCaDefaults& libcurl) {
  CaBundle b;
  for (const std::string& name : ca_file_variables()) {
    if (std::string v = variable(name.c_str(), getenv, b); !v.empty()) {
      b.file = std::move(v);
      b.from = name;
      break;
    }
  }
  b.dir = variable("SSL_CERT_DIR", getenv, b);
  if (!b.file.empty()) return b;
  for (const std::string& f : system_ca_files()) {
    if (usable("", f, readable, b)) {
      b.file = f;
      b.from = "system";
      return b;
    }
  }
  if (!b.dir.empty()) return b;
  if (usable("libcurl's built-in CA file", libcurl.cainfo, readable, b)) {
    b.file = libcurl.cainfo;
    b.from = "libcurl";
  } else if (usable("libcurl's built-in CA directory", libcurl.capath, readable, b)) {
    b.dir = libcurl.capath;
  }
  return b;
}

CaBundle find_ca_bundle() {
  static const LibcurlCaDefaults libcurl = [] {
    LibcurlCaDefaults d;
    CURL* e = curl_easy_init();
    if (e == nullptr) return d;
    char* s = nullptr;
    if (curl_easy_getinfo(e, CURLINFO_CAINFO, &s) == CURLE_OK && s != nullptr) d.cainfo = s;
    s = nullptr;
    if (curl_easy_getinfo(e, CURLINFO_CAPATH, &s) == CURLE_OK && s != nullptr) d.capath = s;
    curl_easy_cleanup(e);
    return d;
  }();
  CaBundle b =
      find_ca_bundle([](const std::string& p) { return ::access(p.c_str(), R_OK) == 0; },
                     [](const char* name) -> const char* { return std::getenv(name); }, libcurl);
  if (b.file.empty() && !b.dir.empty()) {
    b.file = first_hashed_certificate(b.dir);
    if (!b.file.empty()) b.from = "directory";
  }
  return b;
}

std::string first_hashed_certificate(const std::string& dir) {
  const auto hashed = [](const std::string& name) {
    const auto dot = name.find('.');
    if (dot != 8 || dot + 1 == name.size()) return false;
    const auto hex = [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; };
    const auto digit = [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; };
    return std::all_of(name.begin(), name.begin() + 8, hex) &&
           std::all_of(name.begin() + 9, name.end(), digit);
  };
  std::error_code ec;
  std::string best;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (hashed(name) && e.is_regular_file(ec) && ::access(e.path().c_str(), R_OK) == 0 &&
        (best.empty() || e.path().string() < best)) {
      best = e.path().string();
    }
  }
  return best;
}

}  // namespace gpufeed::datasets::remote
