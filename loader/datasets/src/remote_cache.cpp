#include "remote_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

#include "gpufeed/log.h"
#include "gpufeed/loader/remote.h"
#include "gpufeed/unique_fd.h"
#include "index_cache.h"

namespace gpufeed::loader::remote {
namespace fs = std::filesystem;
namespace {

// Holds an flock for its scope.
class Flock {
 public:
  Flock(int fd, int op) : fd_(fd) { ok_ = fd >= 0 && ::flock(fd, op) == 0; }
  ~Flock() {
    if (ok_) ::flock(fd_, LOCK_UN);
  }
  bool ok() const { return ok_; }

 private:
  int fd_;
  bool ok_ = false;
};

std::string read_all(int fd, int64_t from) {
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::pread(fd, buf, sizeof buf, from + static_cast<int64_t>(out.size()));
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

bool write_all(int fd, const void* data, size_t n, int64_t offset) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = offset >= 0 ? ::pwrite(fd, p, n, offset) : ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
    if (offset >= 0) offset += w;
  }
  return true;
}

}  // namespace

Cache::Cache(std::string dir, int64_t limit) : dir_(std::move(dir)), limit_(limit) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw std::runtime_error("cache_dir " + dir_ + " cannot be created: " + ec.message());
}

void Cache::open_shard(size_t s, const std::string& url, int64_t size, const std::string& etag) {
  std::lock_guard<std::mutex> g(mu_);
  if (shards_.size() <= s) shards_.resize(s + 1);
  Shard& shard = shards_[s];
  const std::string key = redact_url(url);
  const std::string base = fmt::format("{}/{:016x}", dir_, detail::hash_bytes(key.data(), key.size(), 0xcac4e));
  shard.data = base + ".data";
  shard.ranges = base + ".ranges";
  const UniqueFd fd(::open(shard.ranges.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  const Flock lock(fd.get(), LOCK_EX);
  if (!lock.ok()) {
    gpufeed::log()->warn("remote cache: cannot use {}: {}", shard.ranges, std::strerror(errno));
    return;
  }
  const std::string header = fmt::format("gpufeed-cache 1 {} {}\n", size, etag);
  const std::string text = read_all(fd.get(), 0);
  if (etag.empty() || !text.starts_with(header)) {  // new, or another object's: start empty
    if (::ftruncate(fd.get(), 0) != 0 || !write_all(fd.get(), header.data(), header.size(), 0)) return;
    const UniqueFd data(::open(shard.data.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!data) return;
    shard.usable = !etag.empty();  // without an ETag a change could not be told: not cached
    shard.ranges_read = static_cast<int64_t>(header.size());
    return;
  }
  ::futimens(fd.get(), nullptr);  // used now (the eviction's recency)
  shard.usable = true;
  shard.ranges_read = static_cast<int64_t>(header.size());
  refresh(shard);
}

void Cache::refresh(Shard& shard) {
  const UniqueFd fd(::open(shard.ranges.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    shard.present.clear();
    return;
  }
  const std::string text = read_all(fd.get(), shard.ranges_read);
  size_t at = 0;
  for (size_t nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1) {
    long long offset = 0, size = 0;
    if (std::sscanf(text.c_str() + at, "%lld %lld", &offset, &size) == 2 && offset >= 0 && size > 0) {
      add(shard, offset, offset + size);
    }
  }
  shard.ranges_read += static_cast<int64_t>(at);  // a torn last line is read again next time
}

void Cache::add(Shard& shard, int64_t offset, int64_t end) {
  auto it = shard.present.upper_bound(offset);
  if (it != shard.present.begin() && std::prev(it)->second >= offset) {
    --it;
    offset = it->first;
    end = std::max(end, it->second);
    it = shard.present.erase(it);
  }
  while (it != shard.present.end() && it->first <= end) {
    end = std::max(end, it->second);
    it = shard.present.erase(it);
  }
  shard.present[offset] = end;
}

bool Cache::covered(const Shard& shard, int64_t offset, int64_t end) const {
  auto it = shard.present.upper_bound(offset);
  return it != shard.present.begin() && std::prev(it)->second >= end;
}

bool Cache::holds(size_t s, int64_t offset, int64_t size) {
  std::lock_guard<std::mutex> g(mu_);
  if (s >= shards_.size() || !shards_[s].usable) return false;
  Shard& shard = shards_[s];
  if (covered(shard, offset, offset + size)) return true;
  refresh(shard);  // another process may have fetched it
  return covered(shard, offset, offset + size);
}

bool Cache::read(size_t s, int64_t offset, int64_t size, decode::ByteBuffer& out) {
  if (!holds(s, offset, size)) return false;
  std::string path;
  {
    std::lock_guard<std::mutex> g(mu_);
    path = shards_[s].data;
  }
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  out.resize(static_cast<size_t>(size));
  size_t got = 0;
  while (fd && got < out.size()) {
    const ssize_t n = ::pread(fd.get(), out.data() + got, out.size() - got, offset + static_cast<int64_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  if (got == out.size()) return true;
  std::lock_guard<std::mutex> g(mu_);  // evicted under us: forget the shard's ranges, fetch again
  shards_[s].present.clear();
  shards_[s].ranges_read = INT64_MAX;
  shards_[s].usable = false;
  return false;
}

void Cache::write(size_t s, int64_t offset, const uint8_t* data, int64_t size) {
  std::string data_path, ranges_path;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (s >= shards_.size() || !shards_[s].usable || covered(shards_[s], offset, offset + size)) return;
    data_path = shards_[s].data;
    ranges_path = shards_[s].ranges;
  }
  {
    const UniqueFd fd(::open(data_path.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd || !write_all(fd.get(), data, static_cast<size_t>(size), offset)) return;
  }
  {
    const UniqueFd fd(::open(ranges_path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC));
    const Flock lock(fd.get(), LOCK_EX);
    const std::string line = fmt::format("{} {}\n", offset, size);
    if (!lock.ok() || !write_all(fd.get(), line.data(), line.size(), -1)) return;
  }
  bool check = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    add(shards_[s], offset, offset + size);
    written_since_check_ += size;
    check = limit_ > 0 && written_since_check_ >= std::min<int64_t>(limit_ / 16 + 1, int64_t{64} << 20);
    if (check) written_since_check_ = 0;
  }
  if (check) evict();
}

void Cache::evict() {
  const UniqueFd lock_fd(::open((dir_ + "/.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  const Flock lock(lock_fd.get(), LOCK_EX);
  if (!lock.ok()) return;
  struct Entry {
    int64_t mtime_ns, bytes;
    std::string base;
  };
  std::vector<Entry> entries;
  int64_t total = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string p = e.path().string();
    if (!p.ends_with(".ranges")) continue;
    const std::string base = p.substr(0, p.size() - 7);
    struct stat r{}, d{};
    if (::stat(p.c_str(), &r) != 0) continue;
    const int64_t bytes = ::stat((base + ".data").c_str(), &d) == 0 ? static_cast<int64_t>(d.st_blocks) * 512 : 0;
    entries.push_back({static_cast<int64_t>(r.st_mtim.tv_sec) * 1000000000 + r.st_mtim.tv_nsec, bytes, base});
    total += bytes;
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.mtime_ns < b.mtime_ns; });
  for (const Entry& e : entries) {
    if (total <= limit_) break;
    fs::remove(e.base + ".ranges", ec);
    fs::remove(e.base + ".data", ec);
    total -= e.bytes;
    gpufeed::log()->info("remote cache: evicted {}.data ({} bytes; the cache is over its limit of {} bytes)", e.base,
                         e.bytes, limit_);
  }
}

}  // namespace gpufeed::loader::remote
