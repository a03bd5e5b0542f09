#pragma once
// The CA certificates remote datasets verify https servers with (internal to the datasets room;
// src/remote_client.cpp sets them as CURLOPT_CAINFO / CURLOPT_CAPATH on every https request).
//
// The search is explicit, not libcurl's compiled-in path first: the wheel carries a libcurl built
// on another distribution, whose built-in path may not exist where the wheel is installed.
// Precedence (docs/SCALING.md, "Remote data"):
//   1. a file named by AWS_CA_BUNDLE (botocore's variable), else CURL_CA_BUNDLE (the curl tool's),
//      else SSL_CERT_FILE (OpenSSL's); the first one set is used as it is, even when missing (the
//      request's error then names it: a variable set is a choice, not a hint);
//   2. a directory of hashed certificates named by SSL_CERT_DIR (OpenSSL's), as CURLOPT_CAPATH,
//      beside whichever file is chosen;
//   3. without a file variable, the first readable one of system_ca_files(): Debian/Ubuntu,
//      RHEL/Fedora (two), SUSE (two), Alpine;
//   4. with neither a file nor SSL_CERT_DIR, libcurl's built-in CA file, then its built-in CA
//      directory, when readable;
//   5. a directory without a file: one of its certificates as the file (find_ca_bundle()).
// Nothing found: an https request fails before connecting with missing_message(), which names
// every variable and path looked at.

#include <functional>
#include <string>
#include <vector>

namespace gpufeed::datasets::remote {

/// The distributions' usual CA bundle files, in the order they are searched: Debian/Ubuntu,
/// RHEL/Fedora (ca-certificates' compat link, then p11-kit's extracted bundle), SUSE (its link,
/// then the extracted bundle), Alpine.
const std::vector<std::string>& system_ca_files();

/// The variables naming a CA bundle file, in precedence order.
const std::vector<std::string>& ca_file_variables();

/// What libcurl would use on its own (CURLINFO_CAINFO, CURLINFO_CAPATH); "" when it has none.
struct LibcurlCaDefaults {
  std::string cainfo, capath;
};

/// Where https requests find their CA certificates.
struct CaBundle {
  std::string file;  ///< CURLOPT_CAINFO; "" leaves libcurl's own
  std::string dir;   ///< CURLOPT_CAPATH (SSL_CERT_DIR, or libcurl's built-in directory); "" none
  std::string
      from;  ///< what chose `file`: a variable's name, "system", "libcurl" or "directory"; "" none
  /// What was looked at, in search order: "SSL_CERT_FILE (unset)", "/etc/ssl/cert.pem (not
  /// readable)", "libcurl's built-in CA file /x (not readable)".
  std::vector<std::string> tried;

  bool found() const { return !file.empty() || !dir.empty(); }
  /// "no CA certificates for https: tried <every entry of tried>; set SSL_CERT_FILE to ...".
  std::string missing_message() const;
};

/// The search above. `readable(path)` says whether a file or directory can be read;
/// `getenv(name)` is a variable's value (nullptr or "" when unset). Throws nothing.
CaBundle find_ca_bundle(const std::function<bool(const std::string&)>& readable,
                        const std::function<const char*(const char*)>& getenv,
                        const LibcurlCaDefaults& libcurl = {});

/// The search in this process: access(R_OK), std::getenv, and the linked libcurl's defaults. A
/// directory found without a file (SSL_CERT_DIR alone, or libcurl's directory) also gets, as the
/// file, first_hashed_certificate(dir) when there is one: libcurl otherwise keeps its built-in CA
/// file, and its OpenSSL backend fails the handshake when that file is missing ("Problem with the
/// SSL CA cert"), even with a directory given; a certificate of the trusted directory adds no
/// trust.
CaBundle find_ca_bundle();

/// The first (by name) regular file of `dir` named as OpenSSL's c_rehash names certificates
/// ("<8 hex digits>.<n>"); "" when none or `dir` cannot be read.
std::string first_hashed_certificate(const std::string& dir);

}  // namespace gpufeed::datasets::remote
