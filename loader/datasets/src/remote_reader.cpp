// The per-sample read-ahead of remote shards (remote_read = samples; shard-granular reads:
// remote_shard_reader.cpp): ranged GETs issued in the loader's announced order, at most
// max_requests in flight and read_ahead MiB requested and not yet read, runs of samples adjacent
// in one shard coalesced into one request. It reads through the shards' remote::Store (the
// samples' places, the client, the cache), which the RemoteShards that made the reader owns.
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include <fmt/format.h>

#include "gpufeed/datasets/remote.h"
#include "remote_cache.h"
#include "remote_client.h"
#include "remote_store.h"

namespace gpufeed::datasets {
namespace {

// Samples coalesced into one request: consecutive in the order and adjacent in one shard (sample
// i + 1 after sample i: the bytes between are the tar headers and .cls members), up to kMaxRun
// samples and kMaxRunBytes. A shuffled order rarely has such runs; an unshuffled one (validation)
// reads a shard in a few requests.
constexpr size_t kMaxRun = 64;
constexpr int64_t kMaxRunBytes = 16 << 20;

struct Entry {
  uint64_t tag = 0;
  int64_t index = 0;
  int64_t offset = 0, size = 0;
  bool claimed = false;  // a read() took it
  bool done = false;     // bytes or error arrived
  bool cancelled = false;
  bool cached = false;   // in the local cache: the reader reads it from there
  bool counted = true;   // its size is in State::outstanding
  decode::ByteBuffer bytes;
  std::string error;
};
using EntryPtr = std::shared_ptr<Entry>;

struct Plan {
  uint64_t tag = 0;
  std::vector<int64_t> order;
  size_t cursor = 0;
};

// Shared with the client's callbacks, which may run after the reader is gone.
struct State {
  const remote::Store* store = nullptr;  // the dataset's (the loader keeps the dataset alive)
  remote::Client* client = nullptr;      // the store's
  int max_requests = 64;
  int64_t budget = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Plan> plans;
  std::map<std::pair<uint64_t, int64_t>, std::deque<EntryPtr>> entries;  // issued, not yet read
  std::map<std::pair<uint64_t, int64_t>, int> early;  // read before the order reached them
  std::set<uint64_t> forgotten;
  int in_flight = 0;
  int64_t outstanding = 0;  // bytes of issued entries not yet read
  bool closed = false;

  void release(Entry& e) {
    if (e.counted) outstanding -= e.size;
    e.counted = false;
  }

  // Issues requests while the budget allows: the next run of the front plan. Under mu.
  void pump(std::shared_ptr<State> self) {
    while (!closed && in_flight < max_requests && outstanding < budget && !plans.empty()) {
      Plan& p = plans.front();
      if (p.cursor >= p.order.size()) {
        plans.pop_front();
        continue;
      }
      std::vector<EntryPtr> run;
      uint32_t shard = 0;
      int64_t begin = 0, end = 0;
      while (p.cursor < p.order.size() && run.size() < kMaxRun) {
        const int64_t i = p.order[p.cursor];
        const auto key = std::make_pair(p.tag, i);
        if (auto it = early.find(key); it != early.end()) {  // already read on demand
          if (run.empty()) {
            if (--it->second == 0) early.erase(it);
            ++p.cursor;
            continue;
          }
          break;
        }
        const SampleRef ref = store->at(i);
        if (store->cache != nullptr && store->cache->holds(store->shard_of(i), ref.offset, ref.size)) {
          if (!run.empty()) break;
          auto e = std::make_shared<Entry>();
          e->tag = p.tag;
          e->index = i;
          e->cached = e->done = true;
          e->counted = false;
          entries[key].push_back(std::move(e));
          ++p.cursor;
          continue;
        }
        if (!run.empty() && (i != run.back()->index + 1 || store->shard_of(i) != shard || ref.offset < end ||
                             ref.offset + ref.size - begin > kMaxRunBytes)) {
          break;
        }
        if (run.empty()) {
          shard = store->shard_of(i);
          begin = ref.offset;
        }
        end = ref.offset + ref.size;
        auto e = std::make_shared<Entry>();
        e->tag = p.tag;
        e->index = i;
        e->offset = ref.offset;
        e->size = ref.size;
        outstanding += ref.size;
        entries[key].push_back(e);
        run.push_back(std::move(e));
        ++p.cursor;
      }
      if (!run.empty()) issue(self, std::move(run), shard, begin, end);
    }
  }

  void issue(const std::shared_ptr<State>& self, std::vector<EntryPtr> run, uint32_t shard, int64_t begin, int64_t end) {
    ++in_flight;
    remote::Request r{.url = store->urls[shard], .offset = begin, .size = end - begin,
                      .if_match = store->etags[shard]};
    client->submit(std::move(r), [self, run = std::move(run), shard, begin](remote::Response&& got) {
      if (got.error.empty() && self->store->cache != nullptr) {
        for (const EntryPtr& e : run) {  // a range (and a checksum) per sample, as reads check them
          self->store->cache->write(shard, e->offset, got.body.data() + (e->offset - begin), e->size);
        }
      }
      self->arrived(self, run, begin, std::move(got));
    });
  }

  // On the client's thread: the run's bytes (or its error) to its entries, then the next requests.
  void arrived(const std::shared_ptr<State>& self, const std::vector<EntryPtr>& run, int64_t begin,
               remote::Response&& got) {
    std::lock_guard<std::mutex> g(mu);
    --in_flight;
    for (const EntryPtr& e : run) {
      if (e->cancelled) continue;
      if (!got.error.empty()) {
        e->error = got.error;
      } else if (run.size() == 1) {
        e->bytes.swap(got.body);
      } else {
        const auto from = static_cast<size_t>(e->offset - begin);
        e->bytes.assign(got.body.begin() + static_cast<std::ptrdiff_t>(from),
                        got.body.begin() + static_cast<std::ptrdiff_t>(from + static_cast<size_t>(e->size)));
      }
      e->done = true;
    }
    cv.notify_all();
    pump(self);
  }
};

class RemoteReader final : public SampleReader {
 public:
  explicit RemoteReader(const remote::Store& store) : state_(std::make_shared<State>()) {
    state_->store = &store;
    state_->client = store.client.get();
    state_->max_requests = store.options.max_requests;
    state_->budget = store.options.read_ahead << 20;
  }

  ~RemoteReader() override {
    std::lock_guard<std::mutex> g(state_->mu);
    State& s = *state_;
    s.closed = true;
    s.plans.clear();
    for (auto& [key, list] : s.entries) {
      for (const EntryPtr& e : list) e->cancelled = true;
    }
    s.entries.clear();
    s.cv.notify_all();
  }

  void announce(uint64_t tag, const std::vector<int64_t>& indices) override {
    std::lock_guard<std::mutex> g(state_->mu);
    state_->plans.push_back(Plan{.tag = tag, .order = indices});
    state_->pump(state_);
  }

  void forget(uint64_t tag) override {
    std::lock_guard<std::mutex> g(state_->mu);
    State& s = *state_;
    s.forgotten.insert(tag);
    std::erase_if(s.plans, [&](const Plan& p) { return p.tag == tag; });
    for (auto it = s.entries.begin(); it != s.entries.end();) {
      if (it->first.first != tag) {
        ++it;
        continue;
      }
      for (const EntryPtr& e : it->second) {
        e->cancelled = true;
        s.release(*e);
      }
      it = s.entries.erase(it);
    }
    std::erase_if(s.early, [&](const auto& kv) { return kv.first.first == tag; });
    s.cv.notify_all();
    s.pump(state_);
  }

  void read(uint64_t tag, int64_t index, decode::ByteBuffer& out) override {
    State& s = *state_;
    const SampleRef ref = s.store->at(index);
    std::unique_lock<std::mutex> lk(s.mu);
    const auto cancelled = [&] {
      return decode::DecodeError(decode::ErrorKind::kIo, ref.source(), "cancelled (the loader stopped this epoch)");
    };
    if (s.closed || s.forgotten.contains(tag)) throw cancelled();
    const auto key = std::make_pair(tag, index);
    EntryPtr e;
    if (auto it = s.entries.find(key); it != s.entries.end()) {
      for (const EntryPtr& c : it->second) {
        if (!c->claimed) {
          e = c;
          break;
        }
      }
    }
    if (!e) {  // not requested yet (or every request of it is taken): on demand, ahead of the queue
      ++s.early[key];
      e = std::make_shared<Entry>();
      e->tag = tag;
      e->index = index;
      e->offset = ref.offset;
      e->size = ref.size;
      s.outstanding += ref.size;
      s.entries[key].push_back(e);
      s.issue(state_, {e}, s.store->shard_of(index), ref.offset, ref.offset + ref.size);
    }
    e->claimed = true;
    s.cv.wait(lk, [&] { return e->done || e->cancelled; });
    if (auto it = s.entries.find(key); it != s.entries.end()) {
      std::erase(it->second, e);
      if (it->second.empty()) s.entries.erase(it);
    }
    s.release(*e);
    s.pump(state_);
    if (e->cached && !e->cancelled) {  // from the local disk, outside the lock (or fetched, if evicted)
      lk.unlock();
      s.store->read(index, ref, out);
      return;
    }
    if (e->cancelled) throw cancelled();
    if (!e->error.empty()) throw decode::DecodeError(decode::ErrorKind::kIo, ref.source(), e->error);
    out.swap(e->bytes);
  }

 private:
  std::shared_ptr<State> state_;
};

}  // namespace

std::unique_ptr<SampleReader> remote::make_sample_reader(const remote::Store& store) {
  return std::make_unique<RemoteReader>(store);
}

}  // namespace gpufeed::datasets
