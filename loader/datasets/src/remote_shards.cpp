// RemoteShards: WebDataset tar shards over HTTP(S) and S3, opened from their indexes into a
// remote::Store, read with ranged GETs ahead of the loader in its order (RemoteReader, over the
// store).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "gpufeed/log.h"
#include "gpufeed/datasets/remote.h"
#include "gpufeed/datasets/shards.h"
#include "index_cache.h"
#include "remote_cache.h"
#include "remote_client.h"
#include "remote_store.h"

namespace gpufeed::datasets {
namespace fs = std::filesystem;
namespace {

bool ends_with_tar(std::string_view s) { return s.size() > 4 && s.substr(s.size() - 4) == ".tar"; }

// The shard's index beside it: the suffix goes on the path, before an http(s) URL's query string
// (a presigned URL's signature; a '?' in such a path is written %3F). An s3:// URL has no query:
// a '?' there is part of the key (percent-encoded when requested: s3_http_url).
std::string index_url(const std::string& shard) {
  const auto q = shard.starts_with("s3://") ? std::string::npos : shard.find('?');
  if (q == std::string::npos) return shard + kShardIndexSuffix;
  return shard.substr(0, q) + kShardIndexSuffix + shard.substr(q);
}

// The index cache's file for a remote shard: the user's cache folder (or the folder the setting
// names) / remote / <hash of the URL without its query>.gpufeed-idx; nullopt when "off".
std::optional<fs::path> remote_index_file(const std::string& setting, const std::string& url) {
  if (setting == "off") return std::nullopt;
  std::optional<fs::path> dir;
  if (setting.empty() || setting == "beside") dir = detail::default_cache_dir();
  else dir = fs::path(setting);
  if (!dir) return std::nullopt;
  const std::string key = redact_url(url);
  return *dir / "remote" / fmt::format("{:016x}{}", detail::hash_bytes(key.data(), key.size(), 0x5eed), kShardIndexSuffix);
}

std::optional<ShardIndex> read_cached_index(const fs::path& file, const std::string& url, int64_t size,
                                            const std::string& etag) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  try {
    ShardIndex index = parse_shard_index(text.str(), file.string());
    if (index.shard_size == size && index.etag == etag && !etag.empty()) return index;
  } catch (const ShardError& e) {
    gpufeed::log()->info("remote shards: ignoring the cached index of {}: {}", redact_url(url), e.what());
  }
  return std::nullopt;
}

void write_cached_index(const fs::path& file, const ShardIndex& index) {
  std::error_code ec;
  fs::create_directories(file.parent_path(), ec);
  const fs::path tmp = file.string() + fmt::format(".tmp{}", ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << format_shard_index(index);
    if (!out) {
      fs::remove(tmp, ec);
      return;  // the cache is an optimisation: a full disk only costs a rebuild next time
    }
  }
  fs::rename(tmp, file, ec);
  if (ec) fs::remove(tmp, ec);
}

// A tar's headers read through ranged GETs of 1 MiB blocks (one block kept): index_shard's reads
// of 512-byte headers and small .cls members then cost a request per block, not per member.
class BlockReader {
 public:
  BlockReader(remote::Client& client, std::string url, std::string etag, int64_t size)
      : client_(client), url_(std::move(url)), etag_(std::move(etag)), size_(size) {}
  size_t operator()(int64_t offset, void* buf, size_t n) {
    size_t done = 0;
    while (done < n && offset + static_cast<int64_t>(done) < size_) {
      const int64_t at = offset + static_cast<int64_t>(done);
      const int64_t block = at / kBlock * kBlock;
      if (block != block_at_ || bytes_.empty()) load(block);
      const auto from = static_cast<size_t>(at - block);
      if (from >= bytes_.size()) break;
      const size_t take = std::min(n - done, bytes_.size() - from);
      std::memcpy(static_cast<char*>(buf) + done, bytes_.data() + from, take);
      done += take;
    }
    return done;
  }

 private:
  static constexpr int64_t kBlock = int64_t{1} << 20;
  void load(int64_t block) {
    remote::Request r{.url = url_, .offset = block, .size = std::min(kBlock, size_ - block), .if_match = etag_};
    bytes_ = client_.fetch(std::move(r)).body;
    block_at_ = block;
  }
  remote::Client& client_;
  std::string url_, etag_;
  int64_t size_;
  int64_t block_at_ = -1;
  decode::ByteBuffer bytes_;
};

}  // namespace

std::vector<std::string> remote_shard_urls(const std::string& data) {
  if (is_url(data)) {
    check_url(data);
    return expand_braces(data);
  }
  std::error_code ec;
  if (!fs::is_regular_file(data, ec) || ends_with_tar(data)) return {};
  std::ifstream in(data);
  std::vector<std::string> urls;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const auto b = line.find_first_not_of(" \t");
    if (b == std::string::npos || line[b] == '#') continue;
    line = line.substr(b, line.find_last_not_of(" \t") - b + 1);
    if (urls.empty() && !is_url(line)) return {};  // a local list: not remote data
    if (!is_url(line)) throw std::invalid_argument("list " + data + ": '" + line + "' is not a URL, as its first entry is");
    check_url(line);
    urls.push_back(line);
  }
  return urls;
}

namespace {

// Every shard's HEAD and index GET: (HEAD, index) per shard. At most `window` requests are
// submitted and not yet answered (the client runs max_requests of them at once); once one
// fails (a 404 or 403 of a shard, retries run out, cancelled) no more are submitted and the
// function returns at once with that failure in `failed` (and nothing else): the requests
// still in flight are cancelled when the client is destroyed. `failed_index`: whether it was an
// index GET.
struct Opening : std::enable_shared_from_this<Opening> {
  // Used only while submitting, which heads_and_indexes waits out before it returns.
  remote::Client& client;
  const std::vector<std::string>& urls;
  size_t window;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<remote::Response> got;  // 2 per shard: HEAD, index
  size_t next = 0, answered = 0;
  int submitting = 0;  // threads in submit_more's loop
  std::optional<std::pair<size_t, remote::Response>> failure;

  Opening(remote::Client& c, const std::vector<std::string>& u, size_t w)
      : client(c), urls(u), window(w), got(2 * u.size()) {}

  // Submits what the window has room for, outside the lock (a stopped client answers at once,
  // on this thread).
  void submit_more() {
    std::vector<size_t> ks;
    {
      std::lock_guard<std::mutex> g(mu);
      while (!failure && next < got.size() && next - answered < window) ks.push_back(next++);
      if (ks.empty()) return;
      ++submitting;
    }
    for (const size_t k : ks) {
      const std::string& u = urls[k / 2];
      remote::Request r = k % 2 == 0 ? remote::Request{.url = u, .head = true}
                                     : remote::Request{.url = index_url(u), .missing_ok = true};
      client.submit(std::move(r), [self = shared_from_this(), k](remote::Response&& response) {
        {
          std::lock_guard<std::mutex> g(self->mu);
          ++self->answered;
          if (!response.error.empty() && !self->failure) self->failure.emplace(k, response);
          self->got[k] = std::move(response);
          self->cv.notify_all();
        }
        self->submit_more();
      });
    }
    std::lock_guard<std::mutex> g(mu);
    --submitting;
    cv.notify_all();
  }
};

std::vector<std::pair<remote::Response, remote::Response>> heads_and_indexes(
    remote::Client& client, const std::vector<std::string>& urls, size_t window,
    std::optional<std::pair<size_t, remote::Response>>& failed) {
  auto opening = std::make_shared<Opening>(client, urls, window);
  opening->submit_more();
  std::unique_lock<std::mutex> lk(opening->mu);
  opening->cv.wait(lk, [&] {
    return opening->submitting == 0 && (opening->failure || opening->answered == opening->got.size());
  });
  failed = opening->failure;
  std::vector<std::pair<remote::Response, remote::Response>> out;
  if (failed) return out;
  for (size_t s = 0; s < urls.size(); ++s) {
    out.emplace_back(std::move(opening->got[2 * s]), std::move(opening->got[2 * s + 1]));
  }
  return out;
}

// The shards `found` lacks an index of: from the index cache, else from their tar headers (eight
// shards at a time), each then written to the cache. Returns (from the cache, from headers).
std::pair<int64_t, int64_t> index_the_rest(remote::Client& client, const std::vector<std::string>& urls,
                                           const std::vector<int64_t>& sizes, const std::vector<std::string>& etags,
                                           const std::string& index_cache, std::vector<std::optional<ShardIndex>>& found) {
  const size_t n = urls.size();
  std::atomic<size_t> next{0};
  std::mutex failure_mu;
  std::exception_ptr failure;
  std::atomic<int64_t> cached{0}, built{0};
  const auto work = [&] {
    for (size_t s = next++; s < n; s = next++) {
      if (found[s]) continue;
      try {
        const auto file = remote_index_file(index_cache, urls[s]);
        if (file) found[s] = read_cached_index(*file, urls[s], sizes[s], etags[s]);
        if (found[s]) {
          ++cached;
          continue;
        }
        BlockReader read(client, urls[s], etags[s], sizes[s]);
        ShardIndex index{.shard_size = sizes[s], .etag = etags[s],
                         .samples = index_shard(std::ref(read), sizes[s], redact_url(urls[s]))};
        if (file && !etags[s].empty()) write_cached_index(*file, index);
        found[s] = std::move(index);
        ++built;
      } catch (...) {
        std::lock_guard<std::mutex> g(failure_mu);
        if (!failure) failure = std::current_exception();
        next = n;
      }
    }
  };
  {
    std::vector<std::jthread> pool;
    const auto missing = static_cast<size_t>(std::count_if(found.begin(), found.end(), [](const auto& f) { return !f; }));
    for (size_t t = 0; t < std::min<size_t>(missing, 8); ++t) pool.emplace_back(work);
  }
  if (failure) std::rethrow_exception(failure);
  return {cached.load(), built.load()};
}

// Keeps in `found` only the indexes that prove they belong to their shard's exact version: the
// SHA-256 an index records is the one in the shard's trailer (its last kShardTrailerBytes bytes,
// which gpufeed pack writes: one ranged GET per shard, all in flight at once). The others are
// dropped with a warning naming the shard and why; their headers are read instead.
void prove_indexes(remote::Client& client, const std::vector<std::string>& urls, const std::vector<int64_t>& sizes,
                   const std::vector<std::string>& etags, std::vector<std::optional<ShardIndex>>& found) {
  const auto distrust = [&](size_t s, const std::string& why) {
    gpufeed::log()->warn("remote shards: the index beside {} cannot be trusted: {}; reading its headers instead",
                         redact_url(urls[s]), why);
    found[s].reset();
  };
  std::vector<std::pair<size_t, std::future<remote::Response>>> pending;
  for (size_t s = 0; s < urls.size(); ++s) {
    if (!found[s]) continue;
    if (found[s]->sha256.empty()) {
      distrust(s, "it records no digest of its shard (an index of version 1, written before gpufeed pack wrote "
                  "digests), so it cannot prove it describes this version of the shard");
    } else if (sizes[s] < kShardTrailerBytes) {
      distrust(s, "the shard is too short to hold a gpufeed trailer");
    } else {
      auto promise = std::make_shared<std::promise<remote::Response>>();
      pending.emplace_back(s, promise->get_future());
      client.submit({.url = urls[s], .offset = sizes[s] - kShardTrailerBytes, .size = kShardTrailerBytes,
                     .if_match = etags[s]},
                    [promise](remote::Response&& got) { promise->set_value(std::move(got)); });
    }
  }
  for (auto& [s, future] : pending) {
    const remote::Response r = future.get();
    // Every later read is a ranged GET too: said once, at open, rather than a warning per shard
    // and a failure at the first sample read.
    if (r.range_ignored)
      throw RemoteError("remote shards: cannot read the trailer: " + r.error +
                        " (gpufeed reads a shard's samples with Range requests: serve the shards with a server "
                        "that honours them, e.g. nginx or an object store)");
    const std::optional<ShardTrailer> trailer =
        r.error.empty() ? parse_shard_trailer(std::string_view(reinterpret_cast<const char*>(r.body.data()), r.body.size()),
                                              sizes[s])
                        : std::nullopt;
    if (!r.error.empty()) {
      distrust(s, "its trailer could not be read: " + r.error);
    } else if (!trailer) {
      distrust(s, "the shard ends without a gpufeed trailer (rewritten by another tool, or its upload is unfinished)");
    } else if (trailer->sha256 != found[s]->sha256) {
      distrust(s, fmt::format("it describes another version of the shard (the index records SHA-256 {}, the shard's "
                              "trailer {})",
                              found[s]->sha256, trailer->sha256));
    }
  }
}

}  // namespace

RemoteShards::RemoteShards(std::vector<std::string> urls, const std::string& source, const DataOptions& options)
    : store_(std::make_unique<remote::Store>()) {
  remote::Store& st = *store_;
  st.options = options;
  st.urls = std::move(urls);
  if (st.urls.empty()) throw std::runtime_error("remote shards: " + redact_url(source) + " names no shard");
  if (st.urls.size() > UINT32_MAX) throw std::runtime_error("remote shards: more than 2^32 shards");
  for (const std::string& u : st.urls) check_url(u);
  st.client = std::make_shared<remote::Client>(st.options);
  const size_t n = st.urls.size();
  std::vector<int64_t> shard_sizes(n);
  std::vector<std::optional<ShardIndex>> found(n);
  st.etags.resize(n);
  std::optional<std::pair<size_t, remote::Response>> failed;
  std::vector<std::pair<remote::Response, remote::Response>> opened =
      heads_and_indexes(*st.client, st.urls, static_cast<size_t>(std::max(1, st.options.max_requests)), failed);
  if (failed && failed->first % 2 == 0) throw RemoteError("remote shards: cannot open " + failed->second.error);
  if (failed) throw RemoteError("remote shards: cannot read the index: " + failed->second.error);
  for (size_t s = 0; s < n; ++s) {
    auto& [head, index] = opened[s];
    if (head.object_size < 0) {
      throw RemoteError("remote shards: HEAD " + redact_url(st.urls[s]) + " gave no Content-Length");
    }
    shard_sizes[s] = head.object_size;
    st.etags[s] = head.etag;
    if (!index.error.empty()) throw RemoteError("remote shards: cannot read the index: " + index.error);
    if (index.status != 200) continue;
    const std::string text(reinterpret_cast<const char*>(index.body.data()), index.body.size());
    ShardIndex parsed = parse_shard_index(text, redact_url(index_url(st.urls[s])));
    if (parsed.shard_size == head.object_size) {
      found[s] = std::move(parsed);
    } else {
      gpufeed::log()->warn("remote shards: the index of {} is for a {}-byte shard, the shard has {}: reading its "
                           "headers instead",
                           redact_url(st.urls[s]), parsed.shard_size, head.object_size);
    }
  }
  prove_indexes(*st.client, st.urls, shard_sizes, st.etags, found);
  st.shard_sizes = shard_sizes;
  beside_ = std::count_if(found.begin(), found.end(), [](const auto& f) { return f.has_value(); });
  if (!st.options.cache_dir.empty()) {
    st.cache = std::make_shared<remote::Cache>(st.options.cache_dir,
                                               static_cast<int64_t>(st.options.cache_limit * 1073741824.0));
    for (size_t s = 0; s < n; ++s) st.cache->open_shard(s, st.urls[s], shard_sizes[s], st.etags[s]);
  }
  std::tie(cached_, built_) = index_the_rest(*st.client, st.urls, shard_sizes, st.etags, st.options.index_cache, found);
  int64_t max_label = -1;
  for (size_t s = 0; s < n; ++s) {
    st.redacted.push_back(redact_url(st.urls[s]));
    for (const ShardSample& x : found[s]->samples) {
      st.shard.push_back(static_cast<uint32_t>(s));
      st.offsets.push_back(x.offset);
      st.sizes.push_back(x.size);
      st.labels.push_back(x.label);
      st.members.add(x.member, x.label);
      max_label = std::max<int64_t>(max_label, x.label);
    }
  }
  if (st.labels.empty()) throw std::runtime_error("remote shards: " + redact_url(source) + " holds no sample");
  for (int64_t c = 0; c <= max_label; ++c) classes_.push_back(std::to_string(c));
  gpufeed::log()->info("remote shards: {} samples in {} shards ({} indexes beside the shards, {} from the index "
                       "cache, {} read from tar headers)",
                       st.labels.size(), n, beside_, cached_, built_);
}

RemoteShards::~RemoteShards() = default;

int64_t RemoteShards::size() const { return store_->size(); }
const std::vector<std::string>& RemoteShards::shards() const { return store_->urls; }
std::vector<int64_t> RemoteShards::shard_sizes() const {
  return contiguous_shard_sizes(store_->shard, store_->urls.size());
}
SampleRef RemoteShards::at(int64_t i) const { return store_->at(i); }
const DataOptions& RemoteShards::options() const { return store_->options; }
double RemoteShards::mean_units_per_shard() const {
  const int64_t chunk = std::max<int64_t>(1, store_->options.remote_chunk) << 20;
  double units = 0;
  for (const int64_t bytes : store_->shard_sizes) units += static_cast<double>(std::max<int64_t>(1, bytes / chunk));
  return store_->shard_sizes.empty() ? 0.0 : units / static_cast<double>(store_->shard_sizes.size());
}
void RemoteShards::read(int64_t i, const SampleRef& ref, decode::ByteBuffer& out) const { store_->read(i, ref, out); }

namespace remote {

SampleRef Store::at(int64_t i) const {
  if (i < 0 || i >= size()) {
    throw std::out_of_range("dataset index " + std::to_string(i) + " out of range [0, " + std::to_string(size()) + ")");
  }
  const auto k = static_cast<size_t>(i);
  const std::string& name = redacted[shard[k]];
  return SampleRef{.path = name, .label = labels[k], .offset = offsets[k], .size = sizes[k],
                   .member = members.path(i)};
}

void Store::read(int64_t i, const SampleRef& ref, decode::ByteBuffer& out) const {
  const auto k = static_cast<size_t>(i);
  std::string cache_failure;  // the cached copy's damage, named in an error if fetching fails too
  if (cache && cache->read(shard[k], offsets[k], sizes[k], out, &cache_failure)) return;
  try {
    Response r = client->fetch(
        {.url = urls[shard[k]], .offset = offsets[k], .size = sizes[k], .if_match = etags[shard[k]]});
    out.swap(r.body);
    if (cache) cache->write(shard[k], offsets[k], out.data(), sizes[k]);
  } catch (const RemoteError& e) {
    throw decode::DecodeError(decode::ErrorKind::kIo, ref.source(),
                              cache_failure.empty() ? std::string(e.what()) : e.what() + ("; " + cache_failure));
  }
}

}  // namespace remote

RemoteStats RemoteShards::stats() const {
  RemoteStats s;
  const remote::ClientStats c = store_->client->stats();
  s.requests = c.requests;
  s.bytes_fetched = c.bytes;
  if (store_->cache) {
    const remote::CacheStats k = store_->cache->stats();
    s.cache_hits = k.hits;
    s.cache_hit_bytes = k.hit_bytes;
    s.cache_checksum_failures = k.checksum_failures;
    s.cache_read_errors = k.read_errors;
  }
  for (const int64_t b : store_->shard_sizes) s.dataset_bytes += b;
  s.chunks_fetched = store_->chunks_fetched.load();
  s.chunks_refetched = store_->chunks_refetched.load();
  s.peak_held_bytes = store_->peak_held_bytes.load();
  return s;
}

}  // namespace gpufeed::datasets
