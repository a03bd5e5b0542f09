#include "index_cache.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <set>
#include <system_error>

#include <fmt/format.h>

#include "gpufeed/log.h"
#include "gpufeed/unique_fd.h"

namespace gpufeed::datasets::detail {
namespace fs = std::filesystem;
namespace {

// The last byte is the format's version, raised whenever what a cache holds or how a dataset is
// grouped changes (2: shards' key groups without an image are refused, no longer dropped; 3:
// keyed by the canonical path, dependencies by absolute path, lists with the spelling of their
// root), so that no listing made by an earlier rule is trusted.
constexpr char kMagic[8] = {'G', 'P', 'U', 'F', 'I', 'D', 'X', 3};

std::string os_reason() { return std::error_code(errno, std::generic_category()).message(); }

// A file name from any text: keeps [A-Za-z0-9._-], replaces the rest by '_'.
std::string sanitize(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) c = '_';
  }
  return out;
}

// The dataset's name and the folder that holds it, trailing separators ignored.
std::pair<fs::path, std::string> parent_and_name(const fs::path& source) {
  fs::path p = source;
  while (p.has_relative_path() && p.filename().empty()) p = p.parent_path();
  return {p.parent_path(), p.filename().string()};
}

// Says once per folder (per process) why no index cache is written there: the loader runs without
// it, listing the dataset on every start; not worth more than an info line each start.
void note_once(const std::string& dir, const std::string& why) {
  static std::mutex mu;
  static std::set<std::string> told;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!told.insert(dir).second) return;
  }
  gpufeed::log()->info("index cache: {}; running without one (the dataset is listed on every start; "
                       "the `index_cache` option picks a folder, 'off' silences this)", why);
}

}  // namespace

Dependency dependency_of(std::string path, const struct stat& st) {
  Dependency d;
  d.path = std::move(path);
  d.ino = static_cast<uint64_t>(st.st_ino);
  d.size = static_cast<uint64_t>(st.st_size);
  d.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  d.ctime_ns = static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
  d.mode = static_cast<uint64_t>(st.st_mode);
  return d;
}

uint64_t hash_bytes(const void* data, size_t n, uint64_t h) {
  constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
  const auto* b = static_cast<const unsigned char*>(data);
  const auto mix = [&](uint64_t w) {
    h = (h ^ w) * kMul;
    h ^= h >> 29;
  };
  for (; n >= 8; b += 8, n -= 8) {
    uint64_t w;
    std::memcpy(&w, b, 8);
    mix(w);
  }
  uint64_t tail = 0;
  if (n != 0) std::memcpy(&tail, b, n);  // b may be null when the whole input is empty
  mix(tail ^ (static_cast<uint64_t>(n) << 56));
  return h;
}

// ---- writer

void CacheWriter::raw(const void* data, size_t n) {
  if (buffer_.size() + n > (1u << 20)) flush();
  if (n > (1u << 20)) {
    const auto* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        throw std::runtime_error(os_reason());
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
    return;
  }
  buffer_.append(static_cast<const char*>(data), n);
}

void CacheWriter::flush() {
  size_t done = 0;
  while (done < buffer_.size()) {
    const ssize_t w = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(os_reason());
    }
    done += static_cast<size_t>(w);
  }
  buffer_.clear();
}

void CacheWriter::section(const void* data, size_t n) {
  const uint64_t len = n;
  raw(&len, sizeof len);
  raw(data, n);
  checksum_ = hash_bytes(data, n, checksum_ ^ len);
}

void CacheWriter::strings(const std::vector<std::string>& v) {
  u64(v.size());
  for (const std::string& s : v) section(s);
}

void CacheWriter::finish() {
  raw(&checksum_, sizeof checksum_);
  flush();
}

// ---- reader

void CacheReader::read_raw(void* data, uint64_t n) {
  if (n > left_) throw CacheCorrupt("shorter than its sections say");
  auto* p = static_cast<char*>(data);
  uint64_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd_, p + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw CacheCorrupt("read failed: " + os_reason());
    if (r == 0) throw CacheCorrupt("shorter than its size");
    got += static_cast<uint64_t>(r);
  }
  left_ -= n;
}

uint64_t CacheReader::length() {
  uint64_t n = 0;
  read_raw(&n, sizeof n);
  if (n > left_) throw CacheCorrupt("a section runs past the end of the file");
  checksum_ ^= n;
  return n;
}

void CacheReader::read_hashed(void* data, uint64_t n) {
  read_raw(data, n);
  checksum_ = hash_bytes(data, n, checksum_);
}

std::string CacheReader::string() {
  std::vector<char> v;
  section(v);
  return {v.begin(), v.end()};
}

uint64_t CacheReader::u64() {
  std::vector<uint64_t> v;
  section(v);
  if (v.size() != 1) throw CacheCorrupt("a number section of the wrong size");
  return v[0];
}

std::vector<std::string> CacheReader::strings() {
  const uint64_t n = u64();
  if (n > left_ / 8) throw CacheCorrupt("more strings than bytes left");
  std::vector<std::string> out;
  out.reserve(n);
  for (uint64_t i = 0; i < n; ++i) out.push_back(string());
  return out;
}

void CacheReader::finish() {
  uint64_t stored = 0;
  read_raw(&stored, sizeof stored);
  if (stored != checksum_) throw CacheCorrupt("checksum mismatch");
  if (left_ != 0) throw CacheCorrupt("bytes after the checksum");
}

void write_table(CacheWriter& out, const SampleTable& table) {
  out.section(table.arena());
  out.section(table.offsets());
  out.section(table.labels());
}

void read_table(CacheReader& in, SampleTable& table) {
  std::vector<char> arena;
  std::vector<uint64_t> offsets;
  std::vector<int32_t> labels;
  in.section(arena);
  in.section(offsets);
  in.section(labels);
  table.assign(std::move(arena), std::move(offsets), std::move(labels));
}

// ---- files

std::string without_trailing_separator(const fs::path& path) {
  std::string s = path.string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

std::string canonical_source(const fs::path& path) {
  std::error_code ec;
  const fs::path abs = fs::absolute(path.empty() ? fs::path(".") : path, ec);
  if (ec) return without_trailing_separator(path.lexically_normal());
  fs::path canonical = fs::weakly_canonical(abs, ec);
  if (ec) canonical = abs.lexically_normal();
  return without_trailing_separator(canonical);
}

std::optional<fs::path> default_cache_dir() {
  // XDG Base Directory: a relative $XDG_CACHE_HOME is invalid and ignored.
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && xdg[0] == '/') return fs::path(xdg) / "gpufeed";
  if (const char* home = std::getenv("HOME"); home && home[0] != '\0') return fs::path(home) / ".cache" / "gpufeed";
  return std::nullopt;
}

std::optional<fs::path> cache_file(const std::string& setting, const std::string& kind, const fs::path& source) {
  if (setting == "off") return std::nullopt;
  const std::string identity = canonical_source(source);
  auto [parent, name] = parent_and_name(identity);
  if (setting == "beside") return parent / (sanitize(name) + ".gpufeed-index");
  std::optional<fs::path> dir = setting.empty() ? default_cache_dir() : std::optional<fs::path>(setting);
  if (!dir) {
    note_once("", "neither XDG_CACHE_HOME nor HOME is set, so the index cache has no folder");
    return std::nullopt;
  }
  const std::string keyed = kind + '\n' + identity;
  return *dir / fmt::format("{}-{:016x}.gpufeed-index", sanitize(name), hash_bytes(keyed.data(), keyed.size(), 0));
}

bool may_write_in(const fs::path& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return false;
  const uid_t uid = ::geteuid();
  mode_t need = S_IWOTH | S_IXOTH;
  if (uid == st.st_uid) {
    need = S_IWUSR | S_IXUSR;
  } else {
    bool member = ::getegid() == st.st_gid;
    if (!member) {
      const int n = ::getgroups(0, nullptr);
      std::vector<gid_t> groups(static_cast<size_t>(std::max(0, n)));
      if (n > 0 && ::getgroups(n, groups.data()) == n)
        member = std::find(groups.begin(), groups.end(), st.st_gid) != groups.end();
    }
    if (member) need = S_IWGRP | S_IXGRP;
  }
  return (st.st_mode & need) == need && ::access(dir.c_str(), W_OK | X_OK) == 0;
}

void rebase_paths(SampleTable& table, std::string_view from, std::string_view to) {
  if (from == to) return;
  SampleTable out;
  const int64_t n = table.size();
  out.reserve(n, table.path_bytes() + n * static_cast<int64_t>(to.size()));
  std::string path;
  for (int64_t i = 0; i < n; ++i) {
    const std::string_view p = table.path(i);
    const bool moves = from.empty() ? (p.empty() || p.front() != '/') : p.substr(0, from.size()) == from;
    if (moves) {
      path.assign(to).append(p.substr(from.size()));
      out.add(path, table.label(i));
    } else {
      out.add(p, table.label(i));
    }
  }
  out.shrink_to_fit();
  table = std::move(out);
}

bool read_cache(const fs::path& file, const CacheKey& key, const std::function<void(CacheReader&)>& payload) {
  const UniqueFd f(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  if (!f) {
    if (errno != ENOENT) gpufeed::log()->info("index cache {}: cannot open ({}): listing again", file.string(), os_reason());
    return false;
  }
  struct stat st {};
  if (::fstat(f.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    gpufeed::log()->warn("index cache {}: not a regular file: listing again", file.string());
    return false;
  }
  try {
    CacheReader in(f.get(), static_cast<uint64_t>(st.st_size));
    std::vector<char> m;
    in.section(m);
    if (m.size() == sizeof kMagic && std::memcmp(m.data(), kMagic, sizeof kMagic - 1) == 0 &&
        m.back() != kMagic[sizeof kMagic - 1]) {
      gpufeed::log()->info("index cache {}: written in format {} (this gpufeed writes {}): listing again",
                           file.string(), static_cast<int>(m.back()), static_cast<int>(kMagic[sizeof kMagic - 1]));
      return false;
    }
    if (m.size() != sizeof kMagic || std::memcmp(m.data(), kMagic, sizeof kMagic) != 0)
      throw CacheCorrupt("not a gpufeed index cache");
    if (in.string() != key.kind || in.string() != key.source || in.string() != key.options) {
      gpufeed::log()->info("index cache {}: made for another dataset or options: listing again", file.string());
      return false;
    }
    const uint64_t deps = in.u64();
    for (uint64_t i = 0; i < deps; ++i) {
      const std::string path = in.string();
      std::vector<uint64_t> id;
      in.section(id);
      if (id.size() != 5) throw CacheCorrupt("a dependency record of the wrong size");
      struct stat now {};
      if (::stat(path.c_str(), &now) != 0) {
        gpufeed::log()->info("index cache {}: {} is gone: listing again", file.string(), path);
        return false;
      }
      const Dependency d = dependency_of(path, now);
      if (d.ino != id[0] || d.size != id[1] || static_cast<uint64_t>(d.mtime_ns) != id[2] ||
          static_cast<uint64_t>(d.ctime_ns) != id[3] || d.mode != id[4]) {
        gpufeed::log()->info("index cache {}: {} changed since it was written: listing again", file.string(), path);
        return false;
      }
    }
    payload(in);
    in.finish();
    return true;
  } catch (const std::exception& e) {  // CacheCorrupt, or the payload's own consistency checks
    gpufeed::log()->warn("index cache {} is corrupt ({}): listing again and rewriting it", file.string(), e.what());
    return false;
  }
}

int64_t wall_clock_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void write_cache(const fs::path& file, const CacheKey& key, const std::vector<Dependency>& deps,
                 int64_t listing_started_ns, const std::function<void(CacheWriter&)>& payload) {
  for (const Dependency& d : deps) {
    if (listing_started_ns - std::max(d.mtime_ns, d.ctime_ns) < kRacyWindowNs) {
      gpufeed::log()->debug("index cache {} not written: {} changed less than a second before it was listed",
                           file.string(), d.path);
      return;
    }
  }
  static std::atomic<uint64_t> counter{0};
  std::error_code ec;
  const fs::path dir = fs::absolute(file.parent_path().empty() ? fs::path(".") : file.parent_path(), ec);
  // The folder, or the nearest existing folder above it that creating it would write in.
  fs::path existing = dir;
  while (!fs::exists(existing, ec) && existing.has_relative_path()) existing = existing.parent_path();
  if (!may_write_in(existing)) {
    note_once(dir.string(), fmt::format("{} is not writable by its mode bits (or access()), so {} is not written",
                                        existing.string(), file.string()));
    return;
  }
  if (existing != dir && !fs::create_directories(dir, ec) && ec) {
    note_once(dir.string(), fmt::format("cannot create {} ({})", dir.string(), ec.message()));
    return;
  }
  const fs::path tmp = file.string() + fmt::format(".tmp.{}.{}", ::getpid(), counter.fetch_add(1));
  try {
    UniqueFd f(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!f) throw std::runtime_error(os_reason());
    CacheWriter out(f.get());
    out.section(kMagic, sizeof kMagic);
    out.section(key.kind);
    out.section(key.source);
    out.section(key.options);
    out.u64(deps.size());
    for (const Dependency& d : deps) {
      // By absolute path: a cache shared by another spelling of the dataset, or read from another
      // working folder, checks the same folders.
      std::error_code aec;
      const fs::path abs = fs::absolute(d.path, aec);
      out.section(aec ? d.path : abs.string());
      const std::vector<uint64_t> id = {d.ino, d.size, static_cast<uint64_t>(d.mtime_ns),
                                        static_cast<uint64_t>(d.ctime_ns), d.mode};
      out.section(id);
    }
    payload(out);
    out.finish();
    if (::close(f.release()) != 0) throw std::runtime_error(os_reason());  // close can report a delayed write error
    if (::rename(tmp.c_str(), file.c_str()) != 0) throw std::runtime_error(os_reason());
    gpufeed::log()->debug("index cache {} written", file.string());
  } catch (const std::exception& e) {
    ::unlink(tmp.c_str());
    gpufeed::log()->info("index cache {} not written ({}); the next start lists again", file.string(), e.what());
  }
}

}  // namespace gpufeed::datasets::detail
