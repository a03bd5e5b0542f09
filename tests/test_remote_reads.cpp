// Shard-granular reads of remote shards (DataOptions::remote_read, src/remote_shard_reader.cpp)
// against a loopback HTTP server started here, which counts the GETs: whole shards or chunks
// fetched once per epoch in a shard-local order, the same bytes as the local tars and as per-sample
// reads in any order, memory bounded by remote_shards_in_flight (a counted peak), a cache_dir that
// serves a second open, and 503s retried. No timing is asserted.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <thread>

#include "gpufeed/datasets/dataset.h"
#include "gpufeed/datasets/remote.h"
#include "gpufeed/datasets/shards.h"
#include "gpufeed/loader/loader.h"
#include "gpufeed/pack/pack.h"
#include "gpufeed/sampler/sampler.h"
#include "gpufeed/sampler/shard_order.h"
#include "golden.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace gpufeed::datasets;
using gpufeed::decode::ByteBuffer;

namespace {

// A static file server on 127.0.0.1 with single byte ranges, a fixed ETag per file and If-Match;
// one thread per connection (keep-alive). fail_gets: that many next GETs answer 503. small_gets:
// GETs of less than 512 KiB (a sample's ranged GET; the tests' shards and chunks are larger).
class Server {
 public:
  explicit Server(fs::path root) : root_(std::move(root)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 64) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      throw std::runtime_error("test server: cannot listen");
    }
    url = "http://127.0.0.1:" + std::to_string(ntohs(a.sin_port));
    accept_ = std::thread([this] { accept_loop(); });
  }
  ~Server() {
    stopping_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    accept_.join();
    std::lock_guard<std::mutex> g(mu_);
    for (const int c : clients_) ::shutdown(c, SHUT_RDWR);
    for (std::thread& t : threads_) t.join();
    for (const int c : clients_) ::close(c);
  }
  int64_t gets() const { return gets_; }
  int64_t small_gets() const { return small_gets_; }

  std::string url;
  std::atomic<int> fail_gets{0};

 private:
  void accept_loop() {
    for (;;) {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      timeval tv{.tv_sec = 20, .tv_usec = 0};
      ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      std::lock_guard<std::mutex> g(mu_);
      if (stopping_) {
        ::close(c);
        return;
      }
      clients_.push_back(c);
      threads_.emplace_back([this, c] { serve(c); });
    }
  }

  void serve(int c) {
    std::string buf;
    char chunk[65536];
    for (;;) {
      size_t end;
      while ((end = buf.find("\r\n\r\n")) == std::string::npos) {
        const ssize_t n = ::recv(c, chunk, sizeof chunk, 0);
        if (n <= 0) return;
        buf.append(chunk, static_cast<size_t>(n));
      }
      const std::string head = buf.substr(0, end);
      buf.erase(0, end + 4);
      if (!respond(c, head)) return;
    }
  }

  static std::string header(const std::string& head, const std::string& name) {
    std::string lower = head;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char ch) { return std::tolower(ch); });
    const size_t at = lower.find("\r\n" + name + ":");
    if (at == std::string::npos) return "";
    size_t from = at + 3 + name.size();
    while (from < head.size() && head[from] == ' ') ++from;
    return head.substr(from, head.find("\r\n", from) - from);
  }

  bool send_all(int c, const std::string& s) {
    for (size_t done = 0; done < s.size();) {
      const ssize_t n = ::send(c, s.data() + done, s.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }

  bool respond(int c, const std::string& head) {
    const std::string method = head.substr(0, head.find(' '));
    const size_t p = method.size() + 1;
    const std::string path = head.substr(p, head.find(' ', p) - p);
    const fs::path file = root_ / path.substr(1);
    if (method == "GET") {
      ++gets_;
      if (fail_gets > 0) {
        --fail_gets;
        return send_all(c, "HTTP/1.1 503 Slow Down\r\nContent-Length: 0\r\n\r\n");
      }
    }
    std::error_code ec;
    if (!fs::is_regular_file(file, ec))
      return send_all(c, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
    const auto size = static_cast<int64_t>(fs::file_size(file));
    const std::string etag = "\"" + std::to_string(size) + "\"";
    const std::string if_match = header(head, "if-match");
    if (!if_match.empty() && if_match != etag) {
      return send_all(c, "HTTP/1.1 412 Precondition Failed\r\nContent-Length: 0\r\n\r\n");
    }
    std::string common = "ETag: " + etag + "\r\nAccept-Ranges: bytes\r\n";
    if (method == "HEAD") {
      return send_all(c, "HTTP/1.1 200 OK\r\n" + common +
                             "Content-Length: " + std::to_string(size) + "\r\n\r\n");
    }
    int64_t from = 0, to = size - 1;
    const std::string range = header(head, "range");  // bytes=a-b, a-, -n
    if (range.starts_with("bytes=")) {
      const std::string r = range.substr(6);
      const size_t dash = r.find('-');
      if (dash == 0) {
        from = std::max<int64_t>(0, size - std::stoll(r.substr(1)));
      } else {
        from = std::stoll(r.substr(0, dash));
        if (dash + 1 < r.size()) to = std::min<int64_t>(size - 1, std::stoll(r.substr(dash + 1)));
      }
      if (from >= size)
        return send_all(c, "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Length: 0\r\n\r\n");
      common += "Content-Range: bytes " + std::to_string(from) + "-" + std::to_string(to) + "/" +
                std::to_string(size) + "\r\n";
    }
    if (method == "GET" && to - from + 1 < (512 << 10)) ++small_gets_;
    std::string body(static_cast<size_t>(to - from + 1), '\0');
    std::ifstream in(file, std::ios::binary);
    in.seekg(from);
    in.read(body.data(), static_cast<std::streamsize>(body.size()));
    return send_all(
        c, std::string(range.empty() ? "HTTP/1.1 200 OK\r\n" : "HTTP/1.1 206 Partial Content\r\n") +
               common + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  }

  fs::path root_;
  int fd_ = -1;
  std::thread accept_;
  std::mutex mu_;
  std::vector<int> clients_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> gets_{0};
  std::atomic<int64_t> small_gets_{0};
};

// Shards of random "JPEG" members (bytes the reader never decodes) and .cls labels: shard 0 about
// 0.4 MiB (one GET with 1 MiB chunks), shards 1..3 about 2.4 MiB (two chunks each): 7 units.
struct Shards {
  explicit Shards(const fs::path& dir) {
    std::mt19937 rng(7);
    const int per_shard[] = {10, 60, 60, 60};
    for (int s = 0; s < 4; ++s) {
      const fs::path p = dir / ("train-" + std::to_string(s) + ".tar");
      gpufeed::pack::TarWriter w(p);
      for (int k = 0; k < per_shard[s]; ++k) {
        std::vector<uint8_t> img(20000 + rng() % 40000);
        for (uint8_t& b : img) b = static_cast<uint8_t>(rng());
        std::string key = "s";
        key += std::to_string(s);
        key += '_';
        key += std::to_string(k);
        w.add(key + ".jpg", img);
        const std::string label = std::to_string(k % 5);
        w.add(key + ".cls", std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(label.data()),
                                                     label.size()));
      }
      w.close();
      names.push_back(p.filename().string());
      bytes += static_cast<int64_t>(fs::file_size(p));
    }
  }
  std::vector<std::string> urls(const std::string& base) const {
    std::vector<std::string> u;
    for (const std::string& n : names) u.push_back(base + "/" + n);
    return u;
  }
  std::vector<std::string> names;
  int64_t bytes = 0;
};

DataOptions options(const std::string& mode, int window) {
  DataOptions o;
  o.index_cache = "off";
  o.remote_read = mode;
  o.remote_chunk = 1;  // MiB: below the option's floor of 8, so these small shards have chunks
  o.remote_shards_in_flight = window;
  o.max_retries = 3;
  return o;
}

// Every sample's bytes as the local tar holds them.
std::vector<ByteBuffer> local_bytes(const RemoteShards& d, const fs::path& dir) {
  std::vector<ByteBuffer> out;
  for (int64_t i = 0; i < d.size(); ++i) {
    const SampleRef r = d.at(i);
    std::ifstream in(dir / fs::path(std::string(r.path)).filename(), std::ios::binary);
    ByteBuffer b(static_cast<size_t>(r.size));
    in.seekg(r.offset);
    in.read(reinterpret_cast<char*>(b.data()), r.size);
    out.push_back(std::move(b));
  }
  return out;
}

// Reads `order` as plan `tag` through `reader` on `threads` threads (each takes the next
// position), checking every sample against `expected`.
void read_epoch(SampleReader& reader, uint64_t tag, const std::vector<int64_t>& order,
                const std::vector<ByteBuffer>& expected, int threads = 1) {
  reader.announce(tag, order);
  std::atomic<size_t> next{0};
  std::atomic<int64_t> wrong{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      ByteBuffer out;
      for (size_t k; (k = next++) < order.size();) {
        reader.read(tag, order[k], out);
        if (out != expected[static_cast<size_t>(order[k])]) ++wrong;
      }
    });
  }
  for (std::thread& t : pool) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

std::vector<int64_t> shuffled(int64_t n, uint32_t seed) {
  std::vector<int64_t> v = iota(n);
  std::shuffle(v.begin(), v.end(), std::mt19937(seed));
  return v;
}

class RemoteReads : public ::testing::Test {
 protected:
  gpufeed::test::TempDir dir{"remote_reads"};
  Shards shards{dir.path};
  Server server{dir.path};
  const std::string source = "remote_reads";
};

constexpr int64_t kUnits = 7;  // 1 + 3 x 2

}  // namespace

TEST_F(RemoteReads, ShardOrderFetchesEachShardOrChunkOncePerEpoch) {
  RemoteShards d(shards.urls(server.url), source, options("shards", 2));
  ASSERT_EQ(d.size(), 190);
  const std::vector<ByteBuffer> expected = local_bytes(d, dir.path);
  const RemoteStats open = d.stats();
  EXPECT_EQ(open.dataset_bytes, shards.bytes);
  const int64_t gets_open = server.gets();
  auto reader = d.reader();
  read_epoch(*reader, 1, iota(d.size()), expected);
  RemoteStats s = d.stats();
  EXPECT_EQ(server.gets() - gets_open, kUnits);
  EXPECT_EQ(s.requests - open.requests, kUnits);
  EXPECT_EQ(s.chunks_fetched, kUnits);
  EXPECT_EQ(s.chunks_refetched, 0);
  EXPECT_EQ(s.bytes_fetched - open.bytes_fetched, shards.bytes);  // egress: one copy of the dataset
  // At most remote_shards_in_flight = 2 units held at once: each unit is under 2 MiB.
  EXPECT_GT(s.peak_held_bytes, 0);
  EXPECT_LE(s.peak_held_bytes, 2 * (int64_t{2} << 20));
  EXPECT_LT(s.peak_held_bytes, shards.bytes / 2);
  RecordProperty("peak_held_bytes", static_cast<int>(s.peak_held_bytes));
  RecordProperty("dataset_bytes", static_cast<int>(s.dataset_bytes));
  // A second epoch (another plan) fetches them again: the first epoch's were evicted once read.
  // Its 4 reading threads get ahead of the read-ahead's window of 2: a unit started on demand
  // there may be dropped and fetched again (counted: chunks_refetched), and memory is bounded by
  // the window plus two units per reading thread (docs/DESIGN-NOTES.md), not by the window.
  read_epoch(*reader, 2, iota(d.size()), expected, 4);
  s = d.stats();
  EXPECT_EQ(s.chunks_fetched - s.chunks_refetched, 2 * kUnits);
  EXPECT_EQ(server.gets() - gets_open, s.chunks_fetched);
  EXPECT_LE(s.peak_held_bytes, (2 + 2 * 4) * (int64_t{2} << 20));
}

TEST_F(RemoteReads, RandomOrderIsExactAndBoundedInShardsAndSamplesModes) {
  RemoteShards whole(shards.urls(server.url), source, options("shards", 2));
  const std::vector<ByteBuffer> expected = local_bytes(whole, dir.path);
  const std::vector<int64_t> order = shuffled(whole.size(), 3);
  int64_t gets = server.gets();
  const int64_t fetched = whole.stats().bytes_fetched;
  read_epoch(*whole.reader(), 1, order, expected, 3);
  const RemoteStats s = whole.stats();
  // Every GET is a unit; a unit is fetched again when evicted while samples of it were still to
  // come: at most one fetch per unit a sample spans (<= 2 per sample), far fewer with the window.
  EXPECT_EQ(server.gets() - gets, s.chunks_fetched);
  EXPECT_GT(s.chunks_refetched, 0);
  EXPECT_EQ(s.chunks_fetched - s.chunks_refetched, kUnits);
  EXPECT_LE(s.chunks_fetched, 2 * whole.size());
  // The window (2) plus the units of the reads in progress (3 threads, up to 2 units each).
  EXPECT_LE(s.peak_held_bytes, (2 + 3 * 2) * (int64_t{2} << 20));
  RecordProperty("shards_gets", static_cast<int>(s.chunks_fetched));
  RecordProperty("shards_refetched", static_cast<int>(s.chunks_refetched));
  RecordProperty("shards_peak_held_bytes", static_cast<int>(s.peak_held_bytes));
  RecordProperty("shards_bytes_fetched", static_cast<int>(s.bytes_fetched - fetched));

  RemoteShards samples(shards.urls(server.url), source, options("samples", 2));
  gets = server.gets();
  const int64_t fetched_samples = samples.stats().bytes_fetched;
  read_epoch(*samples.reader(), 1, order, expected, 3);
  EXPECT_EQ(samples.stats().chunks_fetched, 0);
  EXPECT_LE(server.gets() - gets, samples.size());  // one ranged GET per sample at most
  EXPECT_GE(server.gets() - gets, samples.size() / 2);
  RecordProperty("samples_gets", static_cast<int>(server.gets() - gets));
  RecordProperty("samples_bytes_fetched", static_cast<int>(samples.stats().bytes_fetched - fetched_samples));
  RecordProperty("dataset_bytes", static_cast<int>(whole.stats().dataset_bytes));
}

TEST_F(RemoteReads, AutoPicksShardsForAShardLocalOrderAndSamplesForARandomOne) {
  RemoteShards d(shards.urls(server.url), source, options("auto", 4));
  const std::vector<ByteBuffer> expected = local_bytes(d, dir.path);
  auto reader = d.reader();
  read_epoch(*reader, 1, iota(d.size()), expected, 2);
  EXPECT_EQ(d.stats().chunks_fetched, kUnits);
  const int64_t gets = server.gets();
  read_epoch(*reader, 2, shuffled(d.size(), 5), expected, 2);  // 7 units open at once > 4
  EXPECT_EQ(d.stats().chunks_fetched, kUnits);                 // per-sample GETs instead
  EXPECT_GE(server.gets() - gets, d.size() / 2);
  // A single-sample plan (Python's dataset[i]) is one ranged GET, not a chunk.
  ByteBuffer out;
  reader->announce(3, {42});
  reader->read(3, 42, out);
  EXPECT_EQ(out, expected[42]);
  EXPECT_EQ(d.stats().chunks_fetched, kUnits);
  // With a window smaller than the units open at once, even the shard order reads per sample.
  RemoteShards narrow(shards.urls(server.url), source, options("auto", 1));
  auto s1 = std::vector<int64_t>(iota(narrow.size()));
  std::rotate(s1.begin(), s1.begin() + 5,
              s1.end());  // shard 0's first five samples last: it stays open
  read_epoch(*narrow.reader(), 1, s1, expected);
  EXPECT_EQ(narrow.stats().chunks_fetched, 0);
}

// remote_read auto for the shard-aware order (ReadOrder::kShardRuns, what the loader asks for under
// shuffle_order shards) reads whole shards even when the plan's first announced part is one batch
// from several shards (an epoch planned ahead is announced batch by batch), which the per-plan
// judgement refuses: the reader of ReadOrder::kAny reads the same announcements sample by sample.
TEST_F(RemoteReads, AutoReadsWholeShardsForTheShardAwareOrder) {
  RemoteShards d(shards.urls(server.url), source, options("auto", 16));
  const std::vector<ByteBuffer> expected = local_bytes(d, dir.path);
  gpufeed::sampler::ShardOrderOptions one_window;
  one_window.partitions = 1;  // every shard in one window: the first batch spans several units
  gpufeed::sampler::ShardAwareSampler sampler(d.shard_sizes(), one_window);
  sampler.set_epoch(1);
  const std::vector<int64_t> order = sampler.indices();
  ASSERT_EQ(order.size(), 190u);
  const auto read_batch_then_rest = [&](SampleReader& reader, uint64_t tag) {
    reader.announce(tag, {order.begin(), order.begin() + 4});
    reader.announce(tag, {order.begin() + 4, order.end()});
    int64_t wrong = 0;
    ByteBuffer out;
    for (const int64_t i : order) {
      reader.read(tag, i, out);
      wrong += out != expected[static_cast<size_t>(i)] ? 1 : 0;
    }
    EXPECT_EQ(wrong, 0);
  };
  int64_t gets = server.gets();
  read_batch_then_rest(*d.reader(ReadOrder::kShardRuns), 1);
  EXPECT_EQ(server.gets() - gets, kUnits);  // one GET per shard or chunk
  EXPECT_EQ(d.stats().chunks_fetched, kUnits);
  EXPECT_EQ(d.stats().chunks_refetched, 0);
  gets = server.gets();
  read_batch_then_rest(*d.reader(ReadOrder::kAny), 2);
  EXPECT_EQ(d.stats().chunks_fetched, kUnits);  // no unit: ranged GETs
  EXPECT_GE(server.gets() - gets, d.size() / 2);
  RecordProperty("any_order_gets", static_cast<int>(server.gets() - gets));
}

TEST_F(RemoteReads, ForgetCancelsAPlanAndDropsItsUnits) {
  RemoteShards d(shards.urls(server.url), source, options("shards", 2));
  const std::vector<ByteBuffer> expected = local_bytes(d, dir.path);
  auto reader = d.reader();
  const std::vector<int64_t> order = iota(d.size());
  reader->announce(1, order);
  ByteBuffer out;
  for (int64_t i = 0; i < 30; ++i) {
    reader->read(1, i, out);
    ASSERT_EQ(out, expected[static_cast<size_t>(i)]);
  }
  reader->forget(1);
  EXPECT_THROW(reader->read(1, 30, out), gpufeed::decode::DecodeError);
  // The next plan starts from the beginning of its own order, exact.
  read_epoch(*reader, 2, order, expected);
}

TEST_F(RemoteReads, ACacheDirServesTheUnitsToTheNextOpen) {
  DataOptions o = options("shards", 4);
  o.cache_dir = (dir.path / "cache").string();
  {
    RemoteShards d(shards.urls(server.url), source, o);
    read_epoch(*d.reader(), 1, iota(d.size()), local_bytes(d, dir.path));
    EXPECT_EQ(d.stats().chunks_fetched, kUnits);
  }
  RemoteShards again(shards.urls(server.url), source, o);
  const int64_t gets = server.gets();
  read_epoch(*again.reader(), 1, iota(again.size()), local_bytes(again, dir.path), 2);
  const RemoteStats s = again.stats();
  EXPECT_EQ(server.gets(), gets);  // no GET: every unit from the cache
  EXPECT_EQ(s.chunks_fetched, 0);
  EXPECT_EQ(s.cache_hits, kUnits);
  EXPECT_EQ(s.cache_hit_bytes, shards.bytes);
}

TEST_F(RemoteReads, ThrottledGetsAreRetried) {
  RemoteShards d(shards.urls(server.url), source, options("shards", 2));
  const std::vector<ByteBuffer> expected = local_bytes(d, dir.path);
  const int64_t gets = server.gets();
  server.fail_gets = 3;
  read_epoch(*d.reader(), 1, iota(d.size()), expected, 2);
  EXPECT_EQ(server.fail_gets.load(), 0);
  EXPECT_EQ(d.stats().chunks_fetched, kUnits);
  EXPECT_EQ(server.gets() - gets, kUnits + 3);
}

namespace {

// Every batch of one epoch: indices, labels and pixels.
struct Epoch {
  std::vector<int64_t> indices, labels;
  std::vector<uint8_t> pixels;
  bool operator==(const Epoch&) const = default;
};

// Epochs 1..epochs of one loader; prefetch_next_epoch plans each next epoch while the current one
// ends (announced to the reader one batch at a time).
std::vector<Epoch> run_epochs(std::shared_ptr<Dataset> d, std::shared_ptr<gpufeed::sampler::Sampler> sampler,
                              int epochs, int64_t batch_size, bool prefetch_next_epoch) {
  gpufeed::loader::LoaderOptions o;
  o.batch_size = batch_size;
  o.num_workers = 2;
  o.transform.rrc.size = 48;
  o.prefetch_next_epoch = prefetch_next_epoch;
  gpufeed::loader::Loader loader(std::move(d), std::move(sampler), o);
  std::vector<Epoch> out(static_cast<size_t>(epochs));
  for (int epoch = 1; epoch <= epochs; ++epoch) {
    loader.start_epoch(epoch);
    Epoch& e = out[static_cast<size_t>(epoch - 1)];
    while (auto b = loader.next()) {
      e.indices.insert(e.indices.end(), b->indices.begin(), b->indices.end());
      e.labels.insert(e.labels.end(), b->labels, b->labels + b->size);
      e.pixels.insert(e.pixels.end(), b->images, b->images + b->image_bytes());
    }
  }
  return out;
}

Epoch run_epoch(std::shared_ptr<Dataset> d, std::shared_ptr<gpufeed::sampler::Sampler> sampler) {
  return run_epochs(std::move(d), std::move(sampler), 1, 16, false)[0];
}

// `shards` tar shards of `per_shard` of the shared folder's JPEGs each in `dir` (labels: the JPEG's
// number % 7) and their units of 1 MiB chunks; no shards when the shared folder is absent.
struct JpegShards {
  std::vector<std::string> local;
  int64_t units = 0;
};

JpegShards jpeg_shards(const fs::path& dir, int shards = 3, int per_shard = 40) {
  const fs::path shared = gpufeed::test::shared_dir();
  JpegShards out;
  if (shared.empty() || !fs::exists(shared / "data/imagenet-sample")) return out;
  std::vector<fs::path> jpegs;
  for (const auto& f : fs::directory_iterator(shared / "data/imagenet-sample")) jpegs.push_back(f.path());
  std::sort(jpegs.begin(), jpegs.end());
  if (jpegs.size() < static_cast<size_t>(shards * per_shard))
    throw std::runtime_error("imagenet-sample holds fewer JPEGs than the shards need");
  for (int s = 0; s < shards; ++s) {
    const fs::path p = dir / ("train-" + std::to_string(s) + ".tar");
    gpufeed::pack::TarWriter w(p);
    for (int k = 0; k < per_shard; ++k) {
      const int j = s * per_shard + k;
      std::ifstream in(jpegs[static_cast<size_t>(j)], std::ios::binary);
      const std::vector<uint8_t> img((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      std::string key = "k";
      key += std::to_string(j);
      w.add(key + ".jpg", img);
      const std::string label = std::to_string(j % 7);
      w.add(key + ".cls", std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(label.data()), label.size()));
    }
    w.close();
    out.local.push_back(p.string());
    out.units += std::max<int64_t>(1, static_cast<int64_t>(fs::file_size(p)) >> 20);  // 1 MiB chunks
  }
  return out;
}

std::vector<std::string> urls_of(const Server& server, const JpegShards& shards) {
  std::vector<std::string> urls;
  for (const std::string& l : shards.local) urls.push_back(server.url + "/" + fs::path(l).filename().string());
  return urls;
}

}  // namespace

// The loader over real JPEGs in 3 shards: the local tars, per-sample reads and shard reads give the
// same batches (pixels and labels), in the sequential order and in DistributedSampler's shuffled one.
TEST(RemoteReadsLoader, BatchesEqualTheLocalShardsInEveryMode) {
  gpufeed::test::TempDir dir("remote_reads_loader");
  const JpegShards js = jpeg_shards(dir.path);
  if (js.local.empty()) GTEST_SKIP() << "../shared/data/imagenet-sample is absent in this checkout";
  const int64_t units = js.units;
  Server server(dir.path);
  const std::vector<std::string> urls = urls_of(server, js);
  auto tars = std::make_shared<TarShards>(js.local, dir.path);
  // A window holding every unit: the loader's workers read up to prefetch_depth batches ahead of
  // the reader's read-ahead, and with a smaller window a unit started on demand there may be
  // dropped and fetched again (chunks_refetched), which would make the count below timing-bound.
  auto whole = std::make_shared<RemoteShards>(urls, "loader", options("shards", 16));
  auto narrow = std::make_shared<RemoteShards>(urls, "loader", options("shards", 4));
  auto samples = std::make_shared<RemoteShards>(urls, "loader", options("samples", 4));
  const int64_t n = tars->size();
  ASSERT_EQ(n, 120);
  const auto sequential = [n] { return std::make_shared<gpufeed::sampler::SequentialSampler>(n); };
  const Epoch want = run_epoch(tars, sequential());
  ASSERT_EQ(want.indices.size(), 120u);
  const int64_t gets = server.gets(), fetched = whole->stats().bytes_fetched;
  EXPECT_EQ(run_epoch(whole, sequential()), want);
  EXPECT_EQ(whole->stats().bytes_fetched - fetched, whole->stats().dataset_bytes);  // one copy
  EXPECT_EQ(whole->stats().chunks_fetched, units);
  EXPECT_EQ(server.gets() - gets, units);  // one GET per shard or 1 MiB chunk: 3 shards of ~4 MiB
  RecordProperty("units", static_cast<int>(units));
  RecordProperty("bytes_fetched_epoch", static_cast<int>(whole->stats().bytes_fetched - fetched));
  RecordProperty("dataset_bytes", static_cast<int>(whole->stats().dataset_bytes));
  EXPECT_EQ(run_epoch(samples, sequential()), want);
  const auto shuffled_order = [n] {
    return std::make_shared<gpufeed::sampler::DistributedSampler>(n, gpufeed::sampler::DistributedSamplerOptions{});
  };
  const Epoch random = run_epoch(tars, shuffled_order());
  EXPECT_NE(random.indices, want.indices);
  EXPECT_EQ(run_epoch(whole, shuffled_order()), random);
  EXPECT_EQ(run_epoch(narrow, shuffled_order()), random);  // units evicted and fetched again
  EXPECT_EQ(run_epoch(samples, shuffled_order()), random);
  EXPECT_EQ(samples->stats().chunks_fetched, 0);
  RecordProperty("shards_mode_random_gets", static_cast<int>(whole->stats().chunks_fetched - units));
  RecordProperty("shards_mode_random_gets_window_4", static_cast<int>(narrow->stats().chunks_fetched));
}

// The loader under the shard-aware order (the sampler shuffle_order shards builds) asks its dataset
// for ReadOrder::kShardRuns, so remote_read auto reads whole shards in every epoch: the second one
// too, planned while the first ends and announced one batch (4 samples) at a time, which the
// per-plan judgement may send to ranged GETs (4 samples spanning more than 2 units). Batches equal
// the local tars'.
TEST(RemoteReadsLoader, AutoReadsWholeShardsUnderTheShardAwareOrder) {
  gpufeed::test::TempDir dir("remote_reads_shard_order");
  const JpegShards js = jpeg_shards(dir.path);
  if (js.local.empty()) GTEST_SKIP() << "../shared/data/imagenet-sample is absent in this checkout";
  Server server(dir.path);
  auto tars = std::make_shared<TarShards>(js.local, dir.path);
  auto remote = std::make_shared<RemoteShards>(urls_of(server, js), "loader", options("auto", 16));
  ASSERT_LE(js.units, 16);  // every unit fits the window: none is fetched again within an epoch
  const auto shard_order = [&] {
    return std::make_shared<gpufeed::sampler::ShardAwareSampler>(tars->shard_sizes(),
                                                                 gpufeed::sampler::ShardOrderOptions{});
  };
  const std::vector<Epoch> want = run_epochs(tars, shard_order(), 2, 4, true);
  ASSERT_NE(want[0].indices, want[1].indices);
  const int64_t gets = server.gets(), small = server.small_gets();
  EXPECT_EQ(run_epochs(remote, shard_order(), 2, 4, true), want);
  const RemoteStats s = remote->stats();
  // Every GET a whole shard or chunk (the loader's plan of epoch 3, cancelled when it is destroyed,
  // may have started some more than chunks_fetched counts); ranged GETs would be ~120 per epoch.
  EXPECT_EQ(server.small_gets() - small, 0);
  EXPECT_GE(s.chunks_fetched, js.units);  // each unit at least once
  EXPECT_EQ(s.chunks_refetched, 0);
  RecordProperty("units", static_cast<int>(js.units));
  RecordProperty("gets_two_epochs", static_cast<int>(server.gets() - gets));
}

namespace {

// ShardAwareSampler for epochs 1 and 2, nothing after: the loader plans epoch 3 while epoch 2 ends
// (prefetch_next_epoch), and an empty plan keeps its reads out of the two epochs' counts.
class TwoEpochs : public gpufeed::sampler::ShardAwareSampler {
 public:
  using ShardAwareSampler::ShardAwareSampler;
  std::vector<int64_t> indices() const override {
    return epoch() > 2 ? std::vector<int64_t>{} : ShardAwareSampler::indices();
  }
  int64_t size() const override { return epoch() > 2 ? 0 : ShardAwareSampler::size(); }
};

}  // namespace

// What one epoch costs under the defaults (shuffle_order shards' window 8 and partitions 24,
// remote_read auto, remote_shards_in_flight 16, chunks of 16 MiB), per rank of a world of 1 and of
// 4, each rank a loader over its own RemoteShards (its own process in a real run): 96 shards of 5
// JPEGs (~0.5 MiB each, one GET per shard). Two epochs with prefetch_next_epoch (the second
// announced batch by batch while the first ends). Over the ranks, every sample once per epoch,
// at most 2 GETs per shard per epoch and at most 1.1 dataset copies fetched per epoch (and each
// rank within 2 GETs per shard of the shards its own runs touch, 24 per epoch at W = 4): each rank
// reads its own run of the order one window of shards at a time (sampler/shard_order.h). An order
// interleaving 64 partitions (about window x 64 / world shards open per rank) would fetch its
// shards again and again with 16 in flight, and ranged GETs per sample would be 480 per epoch.
TEST(RemoteReadsLoader, EachEpochFetchesAboutOneCopyInAboutOneGetPerShardForWorldSizes1And4) {
  gpufeed::test::TempDir dir("remote_reads_egress");
  constexpr int kShards = 96, kPerShard = 5, kEpochs = 2;
  const JpegShards js = jpeg_shards(dir.path, kShards, kPerShard);
  if (js.local.empty()) GTEST_SKIP() << "../shared/data/imagenet-sample is absent in this checkout";
  Server server(dir.path);
  DataOptions defaults;
  defaults.index_cache = "off";
  for (const int64_t world : {1, 4}) {
    int64_t gets = 0, bytes = 0, dataset_bytes = 0, refetched = 0;
    std::vector<std::vector<int64_t>> seen(kEpochs);
    for (int64_t rank = 0; rank < world; ++rank) {
      auto remote = std::make_shared<RemoteShards>(urls_of(server, js), "egress", defaults);
      gpufeed::sampler::ShardOrderOptions so;
      so.num_replicas = world;
      so.rank = rank;
      auto sampler = std::make_shared<TwoEpochs>(remote->shard_sizes(), so);
      const int64_t gets_open = server.gets(), bytes_open = remote->stats().bytes_fetched;
      const std::vector<Epoch> epochs = run_epochs(remote, sampler, kEpochs + 1, 4, true);
      const RemoteStats st = remote->stats();

      // This rank's own bound: the shards its runs of the two epochs touch, and their bytes.
      int64_t own_shards = 0, own_bytes = 0;
      for (int e = 0; e < kEpochs; ++e) {
        std::set<int64_t> touched;
        for (const int64_t i : epochs[static_cast<size_t>(e)].indices) touched.insert(i / kPerShard);
        own_shards += static_cast<int64_t>(touched.size());
        for (const int64_t s : touched) own_bytes += static_cast<int64_t>(fs::file_size(js.local[static_cast<size_t>(s)]));
      }
      EXPECT_LE(server.gets() - gets_open, 2 * own_shards) << "world " << world << " rank " << rank;
      // A shard that epoch 2's first batches (decoded ahead, announced one batch at a time) read
      // is dropped once read, before start_epoch announces the rest, and fetched again if the
      // rest needs it: a few shards per rank, timing-bound, hence 1.25 here and 1.1 summed.
      EXPECT_LE(static_cast<double>(st.bytes_fetched - bytes_open), 1.25 * static_cast<double>(own_bytes))
          << "world " << world << " rank " << rank;
      if (world > 1) {
        EXPECT_LE(own_shards, kEpochs * (kShards / world)) << "rank " << rank;  // 4 divides 24
      }
      gets += server.gets() - gets_open;
      bytes += st.bytes_fetched - bytes_open;
      refetched += st.chunks_refetched;
      dataset_bytes = st.dataset_bytes;
      ASSERT_TRUE(epochs[kEpochs].indices.empty());
      for (int e = 0; e < kEpochs; ++e) {
        seen[e].insert(seen[e].end(), epochs[e].indices.begin(), epochs[e].indices.end());
      }
    }
    for (auto& e : seen) {
      std::sort(e.begin(), e.end());
      EXPECT_EQ(e, iota(kShards * kPerShard)) << "world " << world;  // 480 = 4 x 120: no padding
    }
    const double per_epoch_copies = static_cast<double>(bytes) / kEpochs / static_cast<double>(dataset_bytes);
    EXPECT_LE(gets, 2 * kShards * kEpochs) << "world " << world;
    // Each shard at least once (one a rank holds at the end of epoch 1 and needs again early in
    // epoch 2 serves both).
    EXPECT_GE(gets, kShards) << "world " << world;
    EXPECT_LE(per_epoch_copies, 1.1) << "world " << world;
    EXPECT_GE(per_epoch_copies, 0.5) << "world " << world;
    const std::string w = std::to_string(world);
    RecordProperty("world_" + w + "_gets_per_epoch", static_cast<int>(gets / kEpochs));
    RecordProperty("world_" + w + "_copies_per_epoch_x1000", static_cast<int>(per_epoch_copies * 1000));
    RecordProperty("world_" + w + "_chunks_refetched", static_cast<int>(refetched));
    std::printf("world %lld: %lld GETs per epoch over %d shards, %.3f dataset copies fetched per epoch, "
                "%lld units refetched\n",
                static_cast<long long>(world), static_cast<long long>(gets / kEpochs), kShards, per_epoch_copies,
                static_cast<long long>(refetched));
  }
}
