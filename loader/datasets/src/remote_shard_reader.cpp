// Shard-granular reads of remote shards (DataOptions::remote_read, docs/DESIGN-NOTES.md, "remote:
// shard-granular reads"), and the choice between them and per-sample reads for each announced
// order.
//
// A shard is fetched in units: the whole shard in one GET when it is at most remote_chunk MiB,
// else chunks of remote_chunk MiB (the last one up to twice that), each with If-Match on the
// shard's ETag. A unit is held in memory until no sample of the announced orders still needs it,
// then dropped; a sample is copied out of the units it spans (a sample may straddle two chunks).
// The read-ahead walks the announced order and starts the units its samples need, at most
// remote_shards_in_flight units fetched or held at once; it never evicts. A read that needs a unit
// nobody fetched starts it on demand and, over that bound, first drops held units no passed
// sample needs (a random order thus fetches units again: counted in chunks_refetched). With a
// cache_dir a unit is written to the cache as one range (one CRC-32C) and later read back whole.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

#include "gpufeed/datasets/remote.h"
#include "remote_cache.h"
#include "remote_client.h"
#include "remote_store.h"

namespace gpufeed::datasets::remote {
namespace {

using UnitKey = std::pair<uint32_t, int64_t>;  // (shard, chunk number)

enum class St { kIdle, kFetching, kCached, kLoading, kHeld, kFailed };

struct Unit {
  int64_t begin = 0, end = 0;  // bytes of the shard
  St st = St::kIdle;
  decode::ByteBuffer bytes;
  std::string error;
  int64_t pending = 0;         // samples of the announced orders not yet read that need it
  int64_t holds = 0;           // samples the read-ahead passed, not yet read, and reads in progress
  bool evicted_early = false;  // dropped while pending > 0: its next fetch is a refetch
};

// A count per sample index, dense (4 bytes per sample of the dataset, allocated at the first
// add: a hash map of an epoch's 1.28M samples would take ~50 bytes each).
class Counts {
 public:
  void add(int64_t i, int64_t dataset_size) {
    if (n_.empty()) n_.resize(static_cast<size_t>(dataset_size));
    ++n_[static_cast<size_t>(i)];
    ++total_;
  }
  bool take(int64_t i) {
    if (n_.empty() || n_[static_cast<size_t>(i)] == 0) return false;
    --n_[static_cast<size_t>(i)];
    --total_;
    return true;
  }
  bool empty() const { return total_ == 0; }
  template <class F>
  void each(F f) const {
    for (size_t i = 0; i < n_.size() && total_ > 0; ++i) {
      if (n_[i] > 0) f(static_cast<int64_t>(i), static_cast<int64_t>(n_[i]));
    }
  }

 private:
  std::vector<int32_t> n_;
  int64_t total_ = 0;
};

struct Plan {
  std::vector<int64_t> order;
  size_t cursor = 0;             // the read-ahead's position
  Counts unread, passed, early;  // per sample index
};

void raise_peak(std::atomic<int64_t>& peak, int64_t v) {
  int64_t old = peak.load();
  while (old < v && !peak.compare_exchange_weak(old, v)) {
  }
}

// Shared with the client's callbacks, which may run after the reader is gone.
struct ShardState {
  const Store* store = nullptr;
  int64_t chunk = 16 << 20;
  size_t window = 16;
  int max_requests = 64;
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, Plan> plans;
  std::deque<uint64_t> queue;  // plans in announce order, for the read-ahead
  std::set<uint64_t> forgotten;
  std::map<UnitKey, Unit> units;  // never erased: the callbacks find theirs by key
  size_t live = 0;                // units not idle
  int in_flight = 0;
  int64_t held_bytes = 0;
  bool closed = false;

  int64_t chunks_of(uint32_t s) const {
    return std::max<int64_t>(1, store->shard_sizes[s] / chunk);
  }

  Unit& unit(const UnitKey& k) {
    auto [it, fresh] = units.try_emplace(k);
    if (fresh) {
      const int64_t n = chunks_of(k.first);
      it->second.begin = k.second * chunk;
      it->second.end = k.second + 1 == n ? store->shard_sizes[k.first] : (k.second + 1) * chunk;
    }
    return it->second;
  }

  // f(key, unit) for each unit sample i spans.
  template <class F>
  void for_units(int64_t i, F f) {
    const auto k = static_cast<size_t>(i);
    const uint32_t s = store->shard[k];
    const int64_t n = chunks_of(s);
    const int64_t first = std::min(n - 1, store->offsets[k] / chunk);
    const int64_t last =
        std::min(n - 1, (store->offsets[k] + std::max<int64_t>(store->sizes[k], 1) - 1) / chunk);
    for (int64_t c = first; c <= last; ++c) f(UnitKey{s, c}, unit({s, c}));
  }

  // Under mu: unit u (idle) from the cache when it holds it, else one GET.
  void start(const std::shared_ptr<ShardState>& self, const UnitKey& key, Unit& u) {
    ++live;
    if (store->cache != nullptr && store->cache->holds(key.first, u.begin, u.end - u.begin)) {
      u.st = St::kCached;
      return;
    }
    u.st = St::kFetching;
    ++in_flight;
    if (u.evicted_early) ++store->chunks_refetched;
    u.evicted_early = false;
    Request r{.url = store->urls[key.first],
              .offset = u.begin,
              .size = u.end - u.begin,
              .if_match = store->etags[key.first]};
    store->client->submit(std::move(r), [self, key, begin = u.begin](Response&& got) {
      if (got.error.empty() && self->store->cache != nullptr) {
        self->store->cache->write(key.first, begin, got.body.data(),
                                  static_cast<int64_t>(got.body.size()));
      }
      self->arrived(self, key, std::move(got));
    });
  }

  void hold_bytes(Unit& u) {
    u.st = St::kHeld;
    held_bytes += static_cast<int64_t>(u.bytes.size());
    raise_peak(store->peak_held_bytes, held_bytes);
  }

  // On the client's thread.
  void arrived(const std::shared_ptr<ShardState>& self, const UnitKey& key, Response&& got) {
    std::lock_guard<std::mutex> g(mu);
    --in_flight;
    Unit& u = units.at(key);
    if (!got.error.empty()) {
      u.st = St::kFailed;
      u.error = got.error;
    } else {
      ++store->chunks_fetched;
      u.bytes.swap(got.body);
      hold_bytes(u);
    }
    if (closed || (u.holds == 0 && u.pending == 0)) drop(u);
    cv.notify_all();
    pump(self);
  }

  // Under mu: a held, cached or failed unit back to idle, its memory freed.
  void drop(Unit& u) {
    if (u.st != St::kHeld && u.st != St::kCached && u.st != St::kFailed) return;
    held_bytes -= static_cast<int64_t>(u.bytes.size());
    decode::ByteBuffer().swap(u.bytes);
    u.error.clear();
    u.evicted_early = u.pending > 0;
    u.st = St::kIdle;
    --live;
  }

  // Under mu: drops held units no passed sample or read needs until `need` more fit the window.
  void make_room(size_t need) {
    for (auto it = units.begin(); it != units.end() && live + need > window; ++it) {
      if (it->second.holds == 0) drop(it->second);
    }
  }

  // Under mu: starts the units of the next announced samples while the window allows.
  void pump(const std::shared_ptr<ShardState>& self) {
    while (!closed && in_flight < max_requests && !queue.empty()) {
      auto it = plans.find(queue.front());
      if (it == plans.end() || it->second.cursor >= it->second.order.size()) {
        queue.pop_front();
        continue;
      }
      Plan& p = it->second;
      const int64_t i = p.order[p.cursor];
      if (p.early.take(i)) {  // read before the read-ahead got there
        ++p.cursor;
        continue;
      }
      size_t need = 0;
      for_units(i, [&](const UnitKey&, Unit& u) { need += u.st == St::kIdle ? 1 : 0; });
      if (need > 0 && live + need > window) return;  // the reads free units as they finish them
      for_units(i, [&](const UnitKey& k, Unit& u) {
        if (u.st == St::kIdle) start(self, k, u);
        ++u.holds;
      });
      p.passed.add(i, store->size());
      ++p.cursor;
    }
  }

  // Under lk: waits until unit `key` is held (loading it from the cache or fetching it on demand).
  // Returns "" or the error.
  std::string await(const std::shared_ptr<ShardState>& self, std::unique_lock<std::mutex>& lk,
                    uint64_t tag, const UnitKey& key) {
    for (;;) {
      Unit& u = units.at(key);
      if (closed || forgotten.contains(tag)) return "cancelled (the loader stopped this epoch)";
      if (u.st == St::kHeld) return "";
      if (u.st == St::kFailed) return u.error;
      if (u.st == St::kIdle) {
        make_room(1);
        start(self, key, u);
        continue;
      }
      if (u.st == St::kCached) {
        u.st = St::kLoading;
        decode::ByteBuffer b;
        lk.unlock();
        const bool ok = store->cache->read(key.first, u.begin, u.end - u.begin, b);
        lk.lock();
        if (ok) {
          u.bytes.swap(b);
          hold_bytes(u);
        } else {  // damaged or evicted on disk: fetched
          u.st = St::kIdle;
          --live;
        }
        cv.notify_all();
        continue;
      }
      cv.wait(lk);
    }
  }
};

decode::DecodeError cancelled(const SampleRef& ref) {
  return decode::DecodeError(decode::ErrorKind::kIo, ref.source(),
                             "cancelled (the loader stopped this epoch)");
}

class ShardReader final : public SampleReader {
 public:
  explicit ShardReader(const Store& store) : state_(std::make_shared<ShardState>()) {
    ShardState& s = *state_;
    s.store = &store;
    s.chunk = std::max<int64_t>(1, store.options.remote_chunk) << 20;
    s.window = static_cast<size_t>(std::max(1, store.options.remote_shards_in_flight));
    s.max_requests = std::max(1, store.options.max_requests);
  }

  ~ShardReader() override {
    std::lock_guard<std::mutex> g(state_->mu);
    ShardState& s = *state_;
    s.closed = true;
    s.plans.clear();
    s.queue.clear();
    for (auto& [key, u] : s.units) s.drop(u);
    s.cv.notify_all();
  }

  void announce(uint64_t tag, const std::vector<int64_t>& indices) override {
    std::lock_guard<std::mutex> g(state_->mu);
    ShardState& s = *state_;
    Plan& p = s.plans[tag];
    for (const int64_t i : indices) {
      (void)s.store->at(i);  // std::out_of_range for a bad index, before any count changes
    }
    for (const int64_t i : indices) {
      p.order.push_back(i);
      p.unread.add(i, s.store->size());
      s.for_units(i, [](const UnitKey&, Unit& u) { ++u.pending; });
    }
    if (std::find(s.queue.begin(), s.queue.end(), tag) == s.queue.end()) s.queue.push_back(tag);
    s.pump(state_);
  }

  void forget(uint64_t tag) override {
    std::lock_guard<std::mutex> g(state_->mu);
    ShardState& s = *state_;
    s.forgotten.insert(tag);
    std::erase(s.queue, tag);
    if (auto it = s.plans.find(tag); it != s.plans.end()) {
      it->second.unread.each([&s](int64_t i, int64_t n) {
        s.for_units(i, [n](const UnitKey&, Unit& u) { u.pending -= n; });
      });
      it->second.passed.each([&s](int64_t i, int64_t n) {
        s.for_units(i, [n](const UnitKey&, Unit& u) { u.holds -= n; });
      });
      s.plans.erase(it);
      for (auto& [key, u] : s.units) {
        if (u.holds == 0 && u.pending == 0) s.drop(u);
      }
    }
    s.cv.notify_all();
    s.pump(state_);
  }

  void read(uint64_t tag, int64_t index, decode::ByteBuffer& out) override {
    ShardState& s = *state_;
    const SampleRef ref = s.store->at(index);
    std::unique_lock<std::mutex> lk(s.mu);
    if (s.closed || s.forgotten.contains(tag)) throw cancelled(ref);
    bool unread = false, passed = false;
    if (auto pit = s.plans.find(tag); pit != s.plans.end()) {
      Plan& p = pit->second;
      unread = p.unread.take(index);
      passed = p.passed.take(index);
      if (unread && !passed) p.early.add(index, s.store->size());
      if (p.unread.empty() && p.cursor >= p.order.size()) s.plans.erase(pit);
    }
    std::vector<UnitKey> keys;
    s.for_units(index, [&](const UnitKey& k, Unit& u) {
      keys.push_back(k);
      if (!passed) ++u.holds;
    });
    std::string error;
    for (const UnitKey& k : keys) {
      error = s.await(state_, lk, tag, k);
      if (!error.empty()) break;
    }
    if (error.empty()) copy(ref, keys, out);
    for (const UnitKey& k : keys) {
      Unit& u = s.units.at(k);
      --u.holds;
      if (unread) --u.pending;
      if (u.holds == 0 && (u.pending == 0 || s.live > s.window || u.st == St::kFailed)) s.drop(u);
    }
    s.cv.notify_all();
    s.pump(state_);
    if (!error.empty()) throw decode::DecodeError(decode::ErrorKind::kIo, ref.source(), error);
  }

 private:
  // Under mu: the sample's bytes out of the held units it spans.
  void copy(const SampleRef& ref, const std::vector<UnitKey>& keys, decode::ByteBuffer& out) {
    out.resize(static_cast<size_t>(ref.size));
    for (const UnitKey& k : keys) {
      const Unit& u = state_->units.at(k);
      const int64_t from = std::max(ref.offset, u.begin),
                    to = std::min(ref.offset + ref.size, u.end);
      if (to > from) {
        std::memcpy(out.data() + (from - ref.offset), u.bytes.data() + (from - u.begin),
                    static_cast<size_t>(to - from));
      }
    }
  }

  std::shared_ptr<ShardState> state_;
};

// Whether an announced order is shard-local enough for whole-shard reads: its samples span at most
// half as many units (shards or chunks) as there are samples, so each fetched unit serves two
// samples or more of it, and at most `window` units are open at once (a unit is open from its
// first to its last sample in the order), so each is fetched once. DistributedSampler's shuffled
// order touches a new unit at nearly every sample; an unshuffled one, or a shard-aware one with
// a small window, keeps a few open.
bool shard_local(const Store& store, const std::vector<int64_t>& order, int64_t chunk,
                 size_t window) {
  std::unordered_map<uint64_t, std::pair<size_t, size_t>> span;  // unit -> first, last position
  for (size_t pos = 0; pos < order.size(); ++pos) {
    const auto k = static_cast<size_t>(order[pos]);
    if (k >= store.shard.size()) return false;
    const uint32_t s = store.shard[k];
    const int64_t n = std::max<int64_t>(1, store.shard_sizes[s] / chunk);
    const int64_t first = std::min(n - 1, store.offsets[k] / chunk);
    const int64_t last =
        std::min(n - 1, (store.offsets[k] + std::max<int64_t>(store.sizes[k], 1) - 1) / chunk);
    for (int64_t c = first; c <= last; ++c) {
      auto [it, fresh] =
          span.try_emplace((static_cast<uint64_t>(s) << 24) ^ static_cast<uint64_t>(c), pos, pos);
      it->second.second = pos;
    }
  }
  if (span.size() * 2 > order.size()) return false;
  std::vector<std::pair<size_t, int>> events;  // (position, +1 open / -1 closed after it)
  events.reserve(span.size() * 2);
  for (const auto& [key, fl] : span) {
    events.emplace_back(fl.first, 1);
    events.emplace_back(fl.second + 1, -1);
  }
  std::sort(events.begin(), events.end());  // at one position closings (-1) before openings
  int64_t open = 0, most = 0;
  for (const auto& [pos, d] : events) most = std::max(most, open += d);
  return static_cast<size_t>(most) <= window;
}

// remote_read = auto: each announced plan goes to the shard reader when its first announced part is
// shard-local (shard_local), else to the per-sample reader; its later parts and reads follow it.
class AutoReader final : public SampleReader {
 public:
  explicit AutoReader(const Store& store) : store_(store) {}

  void announce(uint64_t tag, const std::vector<int64_t>& indices) override {
    route(tag, &indices)->announce(tag, indices);
  }
  void forget(uint64_t tag) override { route(tag, nullptr)->forget(tag); }
  void read(uint64_t tag, int64_t index, decode::ByteBuffer& out) override {
    route(tag, nullptr)->read(tag, index, out);
  }

 private:
  SampleReader* route(uint64_t tag, const std::vector<int64_t>* first_part) {
    std::lock_guard<std::mutex> g(mu_);
    if (auto it = routes_.find(tag); it != routes_.end()) return it->second;
    const bool whole =
        first_part != nullptr &&
        shard_local(store_, *first_part, std::max<int64_t>(1, store_.options.remote_chunk) << 20,
                    static_cast<size_t>(std::max(1, store_.options.remote_shards_in_flight)));
    std::unique_ptr<SampleReader>& r = whole ? shards_ : samples_;
    if (!r) r = whole ? make_shard_reader(store_) : make_sample_reader(store_);
    if (first_part != nullptr)
      routes_[tag] = r.get();  // a read or forget of an unannounced tag: not kept
    return r.get();
  }

  const Store& store_;
  std::mutex mu_;
  std::unique_ptr<SampleReader> samples_, shards_;
  std::map<uint64_t, SampleReader*> routes_;
};

}  // namespace

std::unique_ptr<SampleReader> make_shard_reader(const Store& store) {
  return std::make_unique<ShardReader>(store);
}

}  // namespace gpufeed::datasets::remote

namespace gpufeed::datasets {

// auto for the shard-aware order: shards, without judging its plans. shard_local would judge an
// epoch planned ahead by its first batch (announced batch by batch), which spans more shards than
// half its samples, and it refuses when the order keeps more shards open than
// remote_shards_in_flight (window x partitions / world size): those units are then fetched again
// (chunks_refetched), as with remote_read shards.
std::unique_ptr<SampleReader> RemoteShards::reader(ReadOrder order) const {
  const std::string& mode = store_->options.remote_read;
  if (mode == "shards" || (mode == "auto" && order == ReadOrder::kShardRuns))
    return remote::make_shard_reader(*store_);
  if (mode == "samples") return remote::make_sample_reader(*store_);
  return std::make_unique<remote::AutoReader>(*store_);
}

}  // namespace gpufeed::datasets
