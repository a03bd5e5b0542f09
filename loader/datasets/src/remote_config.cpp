// URLs (recognised, checked, redacted) and the S3 configuration boto3 would find.
#include <cstdlib>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>

#include "gpufeed/loader/remote.h"
#include "remote_client.h"

namespace gpufeed::loader {
namespace {

std::string trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// The sections of an INI file (the AWS shared files' format): section -> key -> value. Keys are
// lower-cased; nested "key =\n  sub = value" blocks (s3 = ...) are skipped.
using Ini = std::map<std::string, std::map<std::string, std::string>>;

Ini read_ini(const std::string& path) {
  Ini ini;
  std::ifstream in(path);
  std::string line, section;
  while (std::getline(in, line)) {
    const std::string t = trim(line);
    if (t.empty() || t[0] == '#' || t[0] == ';') continue;
    if (t.front() == '[' && t.back() == ']') {
      section = trim(std::string_view(t).substr(1, t.size() - 2));
      continue;
    }
    if (std::isspace(static_cast<unsigned char>(line[0]))) continue;  // a nested block's line
    const auto eq = t.find('=');
    if (eq == std::string::npos || section.empty()) continue;
    std::string key = trim(std::string_view(t).substr(0, eq));
    for (char& c : key) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    ini[section][key] = trim(std::string_view(t).substr(eq + 1));
  }
  return ini;
}

std::string home_file(const char* override_env, const char* name) {
  if (std::string p = env(override_env); !p.empty()) return p;
  const std::string home = env("HOME");
  return home.empty() ? std::string() : home + "/.aws/" + name;
}

// Percent-encodes an S3 key for its URL path: RFC 3986's unreserved characters and '/' stay.
std::string encode_key(std::string_view key) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (const char ch : key) {
    const auto c = static_cast<unsigned char>(ch);
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == '/') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

}  // namespace

bool is_url(std::string_view s) {
  const auto colon = s.find("://");
  if (colon == std::string_view::npos || colon == 0) return false;
  if (!std::isalpha(static_cast<unsigned char>(s[0]))) return false;
  for (const char c : s.substr(0, colon)) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '+' && c != '-' && c != '.') return false;
  }
  return true;
}

void check_url(std::string_view url) {
  const std::string_view scheme = url.substr(0, url.find("://"));
  if (scheme != "http" && scheme != "https" && scheme != "s3") {
    throw std::invalid_argument("unsupported URL scheme '" + std::string(scheme) + "' in " + redact_url(url) +
                                " (http, https and s3 are accepted)");
  }
}

std::string redact_url(std::string_view url) {
  std::string out(url);
  const auto q = out.starts_with("s3://") ? std::string::npos : out.find_first_of("?#");  // s3: part of the key
  if (q != std::string::npos) {
    out = out.substr(0, q) + (out[q] == '?' ? "?<redacted>" : "");
  }
  if (const auto scheme = out.find("://"); scheme != std::string::npos) {
    const auto host = scheme + 3;
    const auto slash = out.find('/', host);
    const auto at = out.rfind('@', slash == std::string::npos ? out.size() : slash);
    if (at != std::string::npos && at >= host) out = out.substr(0, host) + "<redacted>" + out.substr(at);
  }
  return out;
}

S3Config s3_config(const std::string& endpoint_url) {
  S3Config c;
  const std::string profile = env("AWS_PROFILE").empty() ? "default" : env("AWS_PROFILE");
  const Ini credentials = read_ini(home_file("AWS_SHARED_CREDENTIALS_FILE", "credentials"));
  const Ini config = read_ini(home_file("AWS_CONFIG_FILE", "config"));
  const auto config_section = [&]() -> const std::map<std::string, std::string>* {
    for (const std::string& name : {profile == "default" ? std::string("default") : "profile " + profile, profile}) {
      if (const auto it = config.find(name); it != config.end()) return &it->second;
    }
    return nullptr;
  }();
  const auto from_config = [&](const char* key) {
    if (config_section == nullptr) return std::string();
    const auto it = config_section->find(key);
    return it == config_section->end() ? std::string() : it->second;
  };
  if (!env("AWS_ACCESS_KEY_ID").empty() && !env("AWS_SECRET_ACCESS_KEY").empty()) {
    c.access_key = env("AWS_ACCESS_KEY_ID");
    c.secret_key = env("AWS_SECRET_ACCESS_KEY");
    c.session_token = env("AWS_SESSION_TOKEN");
  } else if (const auto it = credentials.find(profile);
             it != credentials.end() && it->second.contains("aws_access_key_id")) {
    c.access_key = it->second.at("aws_access_key_id");
    c.secret_key = it->second.contains("aws_secret_access_key") ? it->second.at("aws_secret_access_key") : "";
    c.session_token = it->second.contains("aws_session_token") ? it->second.at("aws_session_token") : "";
  } else if (!from_config("aws_access_key_id").empty()) {
    c.access_key = from_config("aws_access_key_id");
    c.secret_key = from_config("aws_secret_access_key");
    c.session_token = from_config("aws_session_token");
  }
  for (const std::string& r : {env("AWS_REGION"), env("AWS_DEFAULT_REGION"), from_config("region")}) {
    if (!r.empty()) {
      c.region = r;
      break;
    }
  }
  for (const std::string& e : {endpoint_url, env("AWS_ENDPOINT_URL_S3"), env("AWS_ENDPOINT_URL"), from_config("endpoint_url")}) {
    if (!e.empty()) {
      c.endpoint_url = e;
      break;
    }
  }
  while (!c.endpoint_url.empty() && c.endpoint_url.back() == '/') c.endpoint_url.pop_back();
  if (!c.endpoint_url.empty() && !is_url(c.endpoint_url)) {
    throw std::invalid_argument("the S3 endpoint '" + redact_url(c.endpoint_url) +
                                "' is not a URL (http://host:port or https://host)");
  }
  if (!c.endpoint_url.empty()) {
    const std::string_view scheme = std::string_view(c.endpoint_url).substr(0, c.endpoint_url.find("://"));
    if (scheme != "http" && scheme != "https")
      throw std::invalid_argument("the S3 endpoint " + redact_url(c.endpoint_url) + " must be http or https");
  }
  return c;
}

std::string s3_http_url(const std::string& s3_url, const S3Config& config) {
  const std::string_view rest = std::string_view(s3_url).substr(5);  // after "s3://"
  const auto slash = rest.find('/');
  if (slash == 0 || slash == std::string_view::npos || slash + 1 == rest.size()) {
    throw std::invalid_argument(redact_url(s3_url) + " is not s3://bucket/key");
  }
  const std::string bucket(rest.substr(0, slash));
  const std::string key = encode_key(rest.substr(slash + 1));
  if (!config.endpoint_url.empty()) return config.endpoint_url + "/" + bucket + "/" + key;
  return "https://" + bucket + ".s3." + config.region + ".amazonaws.com/" + key;
}

}  // namespace gpufeed::loader
