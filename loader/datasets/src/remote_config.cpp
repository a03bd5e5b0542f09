// URLs (recognised, checked, redacted) and the S3 configuration boto3 would find, credential_process
// included.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gpufeed/datasets/remote.h"
#include "remote_client.h"

namespace gpufeed::datasets {
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

// A command line split into words as a POSIX shell (and Python's shlex.split, which botocore
// uses) splits them: blanks separate words; '...' is literal; in "..." a backslash escapes only
// '"' and '\\'; elsewhere a backslash escapes any character. No expansion of any kind. Throws
// std::invalid_argument for an unterminated quote.
std::vector<std::string> split_command(std::string_view line) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      if (in_word) words.push_back(std::move(word));
      word.clear();
      in_word = false;
      continue;
    }
    in_word = true;
    if (c == '\\') {
      if (++i < line.size()) word += line[i];
    } else if (c == '\'') {
      const auto end = line.find('\'', i + 1);
      if (end == std::string_view::npos) throw std::invalid_argument("an unterminated ' quote");
      word.append(line.substr(i + 1, end - i - 1));
      i = end;
    } else if (c == '"') {
      for (++i;; ++i) {
        if (i >= line.size()) throw std::invalid_argument("an unterminated \" quote");
        if (line[i] == '"') break;
        if (line[i] == '\\' && i + 1 < line.size() && (line[i + 1] == '"' || line[i + 1] == '\\')) ++i;
        word += line[i];
      }
    } else {
      word += c;
    }
  }
  if (in_word) words.push_back(std::move(word));
  return words;
}

// The members of a JSON object whose values are strings, numbers, booleans or null (a
// credential_process's output), as text: strings unescaped, other scalars as written. A nested
// object or array is refused (std::invalid_argument), as is anything but one object.
std::map<std::string, std::string> parse_flat_json(std::string_view text) {
  size_t i = 0;
  const auto skip_ws = [&] {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  };
  const auto expect = [&](char c) {
    skip_ws();
    if (i >= text.size() || text[i] != c) throw std::invalid_argument(fmt::format("expected '{}' at byte {}", c, i));
    ++i;
  };
  const auto string = [&] {
    expect('"');
    std::string out;
    while (i < text.size() && text[i] != '"') {
      char c = text[i++];
      if (c == '\\') {
        if (i >= text.size()) break;
        c = text[i++];
        switch (c) {
          case 'b': out += '\b'; break;
          case 'f': out += '\f'; break;
          case 'n': out += '\n'; break;
          case 'r': out += '\r'; break;
          case 't': out += '\t'; break;
          case 'u': {
            if (i + 4 > text.size()) throw std::invalid_argument("a truncated \\u escape");
            const unsigned long cp = std::stoul(std::string(text.substr(i, 4)), nullptr, 16);
            i += 4;
            if (cp < 0x80) {
              out += static_cast<char>(cp);
            } else if (cp < 0x800) {
              out += static_cast<char>(0xC0 | (cp >> 6));
              out += static_cast<char>(0x80 | (cp & 0x3F));
            } else {  // surrogate pairs are kept as two 3-byte sequences: no key uses them
              out += static_cast<char>(0xE0 | (cp >> 12));
              out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
              out += static_cast<char>(0x80 | (cp & 0x3F));
            }
            break;
          }
          default: out += c;  // '"', '\\', '/'
        }
      } else {
        out += c;
      }
    }
    if (i >= text.size()) throw std::invalid_argument("an unterminated string");
    ++i;
    return out;
  };
  std::map<std::string, std::string> members;
  expect('{');
  skip_ws();
  if (i < text.size() && text[i] == '}') {
    ++i;
  } else {
    for (;;) {
      std::string key = string();
      expect(':');
      skip_ws();
      if (i < text.size() && text[i] == '"') {
        members[key] = string();
      } else {
        const size_t b = i;
        while (i < text.size() && text[i] != ',' && text[i] != '}' &&
               !std::isspace(static_cast<unsigned char>(text[i]))) {
          if (text[i] == '{' || text[i] == '[') throw std::invalid_argument("a nested value (" + key + ")");
          ++i;
        }
        if (i == b) throw std::invalid_argument(fmt::format("a missing value at byte {}", i));
        members[key] = std::string(text.substr(b, i - b));
      }
      skip_ws();
      if (i < text.size() && text[i] == ',') {
        ++i;
        continue;
      }
      expect('}');
      break;
    }
  }
  skip_ws();
  if (i != text.size()) throw std::invalid_argument(fmt::format("text after the object at byte {}", i));
  return members;
}

// An ISO 8601 UTC time as credential_process prints it: 2026-12-04T01:00:00Z, with optional
// fractional seconds and a Z or +HH:MM / -HH:MM offset.
std::optional<std::chrono::system_clock::time_point> parse_iso8601(const std::string& s) {
  std::tm tm{};
  int consumed = 0;
  if (std::sscanf(s.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
                  &tm.tm_min, &tm.tm_sec, &consumed) != 6) {
    return std::nullopt;
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  std::string_view rest = std::string_view(s).substr(static_cast<size_t>(consumed));
  if (!rest.empty() && rest[0] == '.') {
    rest.remove_prefix(1);
    while (!rest.empty() && std::isdigit(static_cast<unsigned char>(rest[0]))) rest.remove_prefix(1);
  }
  long offset_s = 0;
  if (rest == "Z" || rest == "z" || rest.empty()) {
    offset_s = 0;
  } else if ((rest[0] == '+' || rest[0] == '-') && rest.size() == 6 && rest[3] == ':') {
    const long h = std::strtol(std::string(rest.substr(1, 2)).c_str(), nullptr, 10);
    const long m = std::strtol(std::string(rest.substr(4, 2)).c_str(), nullptr, 10);
    offset_s = (rest[0] == '+' ? 1 : -1) * (h * 3600 + m * 60);
  } else {
    return std::nullopt;
  }
  const time_t t = ::timegm(&tm);
  if (t == static_cast<time_t>(-1)) return std::nullopt;
  return std::chrono::system_clock::from_time_t(t - offset_s);
}

// What a credential_process printed and how it ended.
struct ProcessResult {
  std::string out, err;
  int status = 0;       // the exit status, or 128 + the signal
  bool timed_out = false;
};

// Runs `argv` (no shell; PATH searched; stdin and environment inherited) for at most
// `timeout_s` seconds, collecting stdout and stderr (each up to 1 MiB). Killed (SIGKILL) when the
// time runs out. Throws std::runtime_error when it cannot be started.
ProcessResult run_process(const std::vector<std::string>& words, double timeout_s) {
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    const int e = errno;
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    throw std::runtime_error(std::string("pipe: ") + std::strerror(e));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], 2);
  std::vector<char*> argv;
  for (const std::string& w : words) argv.push_back(const_cast<char*>(w.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (rc != 0) {
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    throw std::runtime_error(std::string("cannot be run: ") + std::strerror(rc));
  }
  ProcessResult result;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open_fds = 2;
  while (open_fds > 0) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      result.timed_out = true;
      break;
    }
    const int n = ::poll(fds, 2, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (n < 0 && errno != EINTR) break;
    for (int k = 0; k < 2; ++k) {
      if (fds[k].fd < 0 || (fds[k].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      char buf[4096];
      const ssize_t got = ::read(fds[k].fd, buf, sizeof buf);
      if (got > 0) {
        if (sinks[k]->size() < (1u << 20)) sinks[k]->append(buf, static_cast<size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        ::close(fds[k].fd);
        fds[k].fd = -1;
        --open_fds;
      }
    }
  }
  for (const pollfd& f : fds) {
    if (f.fd >= 0) ::close(f.fd);
  }
  if (result.timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

// Credentials from a profile's credential_process (botocore's ProcessProvider). Throws RemoteError
// naming the profile and the program when it fails.
void credentials_from_process(const std::string& profile, const std::string& command, double timeout_s, S3Config& c) {
  std::vector<std::string> words;
  const std::string where = "the credential_process of AWS profile '" + profile + "'";
  try {
    words = split_command(command);
  } catch (const std::invalid_argument& e) {
    throw RemoteError(where + " cannot be split into words: " + e.what());
  }
  if (words.empty()) throw RemoteError(where + " is empty");
  const std::string program = "(" + words[0] + ")";
  ProcessResult r;
  try {
    r = run_process(words, timeout_s);
  } catch (const std::runtime_error& e) {
    throw RemoteError(where + " " + program + " " + e.what());
  }
  if (r.timed_out) throw RemoteError(fmt::format("{} {} timed out after {} s (killed)", where, program, timeout_s));
  if (r.status != 0) {
    std::string first = trim(r.err.substr(0, r.err.find('\n')));
    if (first.size() > 300) first = first.substr(0, 300) + "...";
    throw RemoteError(fmt::format("{} {} failed: exit status {}{}", where, program, r.status,
                                  first.empty() ? std::string(", nothing on stderr") : ": " + first));
  }
  std::map<std::string, std::string> json;
  try {
    json = parse_flat_json(r.out);
  } catch (const std::exception& e) {
    throw RemoteError(where + " " + program + " printed what is not a JSON object of strings (" + e.what() + ")");
  }
  const auto field = [&](const char* key) { return json.contains(key) ? json.at(key) : std::string(); };
  if (field("Version") != "1") {
    throw RemoteError(where + " " + program + " printed Version " +
                      (json.contains("Version") ? field("Version") : "(none)") +
                      "; version 1 is supported");
  }
  if (field("AccessKeyId").empty() || field("SecretAccessKey").empty()) {
    throw RemoteError(where + " " + program + " printed no " +
                      (field("AccessKeyId").empty() ? "AccessKeyId" : "SecretAccessKey"));
  }
  c.access_key = field("AccessKeyId");
  c.secret_key = field("SecretAccessKey");
  c.session_token = field("SessionToken");
  if (const std::string e = field("Expiration"); !e.empty()) {
    c.expiration = parse_iso8601(e);
    if (!c.expiration) {
      throw RemoteError(where + " " + program + " printed an Expiration that is not an ISO 8601 time: " + e);
    }
  }
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

S3Config s3_config(const std::string& endpoint_url, double process_timeout_s) {
  S3Config c;
  // botocore's order: AWS_DEFAULT_PROFILE, then AWS_PROFILE (its 'profile' setting's chain).
  std::string profile = env("AWS_DEFAULT_PROFILE");
  const char* profile_from = "AWS_DEFAULT_PROFILE";
  if (profile.empty()) {
    profile = env("AWS_PROFILE");
    profile_from = profile.empty() ? "the default" : "AWS_PROFILE";
  }
  if (profile.empty()) profile = "default";
  const std::string credentials_path = home_file("AWS_SHARED_CREDENTIALS_FILE", "credentials");
  const std::string config_path = home_file("AWS_CONFIG_FILE", "config");
  const Ini credentials = read_ini(credentials_path);
  const Ini config = read_ini(config_path);
  const auto config_section = [&]() -> const std::map<std::string, std::string>* {
    for (const std::string& name : {profile == "default" ? std::string("default") : "profile " + profile, profile}) {
      if (const auto it = config.find(name); it != config.end()) return &it->second;
    }
    return nullptr;
  }();
  const auto credentials_section = [&]() -> const std::map<std::string, std::string>* {
    const auto it = credentials.find(profile);
    return it == credentials.end() ? nullptr : &it->second;
  }();
  const auto from_config = [&](const char* key) {
    if (config_section == nullptr) return std::string();
    const auto it = config_section->find(key);
    return it == config_section->end() ? std::string() : it->second;
  };
  // The profile as botocore merges it: the credentials file's values over the config file's.
  const auto from_profile = [&](const char* key) {
    if (credentials_section != nullptr) {
      if (const auto it = credentials_section->find(key); it != credentials_section->end()) return it->second;
    }
    return from_config(key);
  };
  const auto file_state = [](const std::string& path, const Ini& ini, bool has_section) {
    if (path.empty()) return std::string("no path (HOME is unset)");
    if (::access(path.c_str(), R_OK) != 0) return path + " (not there)";
    if (ini.empty()) return path + " (empty)";
    return path + (has_section ? " (the profile has no keys)" : " (no such profile)");
  };
  const bool some_env = !env("AWS_ACCESS_KEY_ID").empty() || !env("AWS_SECRET_ACCESS_KEY").empty();
  c.searched = fmt::format(
      "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY ({}); profile '{}' ({}); the shared credentials file {}; "
      "the profile's credential_process (none); the config file {}",
      some_env ? "only one of them is set" : "unset", profile, profile_from,
      file_state(credentials_path, credentials, credentials_section != nullptr),
      file_state(config_path, config, config_section != nullptr));
  if (!env("AWS_ACCESS_KEY_ID").empty() && !env("AWS_SECRET_ACCESS_KEY").empty()) {
    c.access_key = env("AWS_ACCESS_KEY_ID");
    c.secret_key = env("AWS_SECRET_ACCESS_KEY");
    c.session_token = env("AWS_SESSION_TOKEN");
  } else if (credentials_section != nullptr && credentials_section->contains("aws_access_key_id")) {
    const auto& section = *credentials_section;
    c.access_key = section.at("aws_access_key_id");
    c.secret_key = section.contains("aws_secret_access_key") ? section.at("aws_secret_access_key") : "";
    c.session_token = section.contains("aws_session_token") ? section.at("aws_session_token") : "";
  } else if (const std::string command = from_profile("credential_process"); !command.empty()) {
    credentials_from_process(profile, command, process_timeout_s, c);
  } else if (!from_config("aws_access_key_id").empty()) {
    c.access_key = from_config("aws_access_key_id");
    c.secret_key = from_config("aws_secret_access_key");
    c.session_token = from_config("aws_session_token");
  }
  for (const std::string& r : {env("AWS_REGION"), env("AWS_DEFAULT_REGION"), from_profile("region")}) {
    if (!r.empty()) {
      c.region = r;
      break;
    }
  }
  for (const std::string& e :
       {endpoint_url, env("AWS_ENDPOINT_URL_S3"), env("AWS_ENDPOINT_URL"), from_profile("endpoint_url")}) {
    if (!e.empty()) {
      c.endpoint_url = e;
      break;
    }
  }
  c.ca_bundle = env("AWS_CA_BUNDLE").empty() ? from_profile("ca_bundle") : env("AWS_CA_BUNDLE");
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

}  // namespace gpufeed::datasets
