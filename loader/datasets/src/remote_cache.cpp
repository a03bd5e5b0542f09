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
#include "gpufeed/datasets/remote.h"
#include "gpufeed/unique_fd.h"
#include "crc32c.h"
#include "index_cache.h"

namespace gpufeed::datasets::remote {
namespace fs = std::filesystem;
namespace {

constexpr int kVersion = 2;  // 1: ranges without checksums (emptied when opened: unverifiable)

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
  if (fs::is_directory(dir_, ec)) return;  // an existing folder, perhaps read-only: read what it holds
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
  const std::string header = fmt::format("gpufeed-cache {} {} {}\n", kVersion, size, etag);
  UniqueFd fd(::open(shard.ranges.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!fd && (errno == EROFS || errno == EACCES || errno == EPERM)) {
    // A read-only cache (a read-only mount, another user's folder): served as it is, never written.
    const int why = errno;
    fd = UniqueFd(::open(shard.ranges.c_str(), O_RDONLY | O_CLOEXEC));
    const Flock lock(fd.get(), LOCK_SH);
    if (!lock.ok()) {
      if (errno != ENOENT) gpufeed::log()->warn("remote cache: cannot use {}: {}", shard.ranges, std::strerror(why));
      return;
    }
    if (etag.empty() || !read_all(fd.get(), 0).starts_with(header)) return;  // another object's: not served
    shard.usable = true;
    shard.ranges_read = static_cast<int64_t>(header.size());
    refresh(shard);
    return;
  }
  const Flock lock(fd.get(), LOCK_EX);
  if (!lock.ok()) {
    gpufeed::log()->warn("remote cache: cannot use {}: {}", shard.ranges, std::strerror(errno));
    return;
  }
  shard.writable = true;
  const std::string text = read_all(fd.get(), 0);
  if (etag.empty() || !text.starts_with(header)) {  // new, another object's, or unverifiable: start empty
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
    unsigned crc = 0;
    if (std::sscanf(text.c_str() + at, "%lld %lld %8x", &offset, &size, &crc) == 3 && offset >= 0 && size > 0) {
      shard.present[offset] = Range{.end = offset + size, .crc = crc};  // a later line replaces an earlier one
    }
  }
  shard.ranges_read += static_cast<int64_t>(at);  // a torn last line is read again next time
}

const std::pair<const int64_t, Cache::Range>* Cache::find(const Shard& shard, int64_t offset, int64_t end) const {
  auto it = shard.present.upper_bound(offset);
  if (it == shard.present.begin() || std::prev(it)->second.end < end) return nullptr;
  return &*std::prev(it);
}

bool Cache::holds(size_t s, int64_t offset, int64_t size) {
  std::lock_guard<std::mutex> g(mu_);
  if (s >= shards_.size() || !shards_[s].usable) return false;
  Shard& shard = shards_[s];
  if (find(shard, offset, offset + size)) return true;
  refresh(shard);  // another process may have fetched it
  return find(shard, offset, offset + size) != nullptr;
}

bool Cache::read(size_t s, int64_t offset, int64_t size, decode::ByteBuffer& out, std::string* why) {
  if (!holds(s, offset, size)) return false;
  std::string path;
  int64_t start = 0, end = 0;
  uint32_t crc = 0;
  {
    std::lock_guard<std::mutex> g(mu_);
    const auto* r = find(shards_[s], offset, offset + size);
    if (!r) return false;
    path = shards_[s].data;
    start = r->first;
    end = r->second.end;
    crc = r->second.crc;
  }
  // The whole range, to check its checksum (a sample is its own range: no more than it).
  decode::ByteBuffer whole;
  decode::ByteBuffer& buf = start == offset && end == offset + size ? out : whole;
  buf.resize(static_cast<size_t>(end - start));
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  size_t got = 0;
  int err = fd ? 0 : errno;
  while (fd && got < buf.size()) {
    const ssize_t n = ::pread(fd.get(), buf.data() + got, buf.size() - got, start + static_cast<int64_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) err = errno;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  std::string failure;
  if (got == buf.size()) {
    const uint32_t actual = detail::crc32c(0, buf.data(), buf.size());
    if (actual == crc) {
      if (&buf != &out) out.assign(buf.begin() + (offset - start), buf.begin() + (offset + size - start));
      std::lock_guard<std::mutex> g(mu_);
      ++stats_.hits;
      stats_.hit_bytes += size;
      return true;
    }
    failure = fmt::format("bytes {}-{} of {} failed their checksum (CRC-32C {:08x}, recorded {:08x})", start,
                          end - 1, path, actual, crc);
  } else if (err != 0 && err != ENOENT) {
    failure = fmt::format("bytes {}-{} of {} could not be read: {}", start, end - 1, path, std::strerror(err));
  }
  std::lock_guard<std::mutex> g(mu_);
  Shard& shard = shards_[s];
  if (failure.empty()) {  // evicted under us (removed, or cut short): forget the shard's ranges, fetch again
    shard.present.clear();
    shard.ranges_read = INT64_MAX;
    shard.usable = false;
    return false;
  }
  // Damaged bytes (a power loss, a bad disk): the range is dropped here and fetched again; the
  // new line the write appends replaces it for every process.
  if (auto it = shard.present.find(start); it != shard.present.end() && it->second.end == end) shard.present.erase(it);
  ++(err != 0 && got != buf.size() ? stats_.read_errors : stats_.checksum_failures);
  gpufeed::log()->warn("remote cache: {}: dropped, fetching them again", failure);
  if (why) *why = "the local cache's copy was unusable: " + failure;
  return false;
}

void Cache::write(size_t s, int64_t offset, const uint8_t* data, int64_t size) {
  std::string data_path, ranges_path;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (s >= shards_.size() || !shards_[s].usable || !shards_[s].writable ||
        find(shards_[s], offset, offset + size))
      return;
    data_path = shards_[s].data;
    ranges_path = shards_[s].ranges;
  }
  const uint32_t crc = detail::crc32c(0, data, static_cast<size_t>(size));
  {
    const UniqueFd fd(::open(data_path.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd || !write_all(fd.get(), data, static_cast<size_t>(size), offset)) return;
  }
  {
    const UniqueFd fd(::open(ranges_path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC));
    const Flock lock(fd.get(), LOCK_EX);
    const std::string line = fmt::format("{} {} {:08x}\n", offset, size, crc);
    if (!lock.ok() || !write_all(fd.get(), line.data(), line.size(), -1)) return;
  }
  bool check = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    shards_[s].present[offset] = Range{.end = offset + size, .crc = crc};
    written_since_check_ += size;
    check = limit_ > 0 && written_since_check_ >= std::min<int64_t>(limit_ / 16 + 1, int64_t{64} << 20);
    if (check) written_since_check_ = 0;
  }
  if (check) evict();
}

CacheStats Cache::stats() const {
  std::lock_guard<std::mutex> g(mu_);
  return stats_;
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

}  // namespace gpufeed::datasets::remote
