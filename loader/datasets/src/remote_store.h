#pragma once
// The opened remote shards as their readers need them (private to the datasets room): every
// sample's place (shard, byte offset and size, member name, label), the shards' URLs and the
// ETags their indexes were made against, the HTTP client and the local cache. RemoteShards fills
// one when it opens the shards and owns it; its Dataset methods and every RemoteReader (the
// loader's read-ahead) read samples through it, so a reader depends on the store, not on the
// dataset. Immutable once filled (the client and the cache lock themselves): any thread may read.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpufeed/datasets/dataset.h"
#include "remote_cache.h"
#include "remote_client.h"

namespace gpufeed::datasets::remote {

struct Store {
  DataOptions options;
  std::shared_ptr<Client> client;
  std::shared_ptr<Cache> cache;  // null without cache_dir
  std::vector<std::string> urls;      // per shard, as given
  std::vector<std::string> redacted;  // per shard, as messages print it (redact_url)
  std::vector<std::string> etags;     // per shard
  std::vector<int64_t> shard_sizes;   // per shard, bytes (the HEAD's Content-Length)
  std::vector<uint32_t> shard;        // per sample
  std::vector<int64_t> offsets, sizes;
  std::vector<int32_t> labels;
  SampleTable members;  // the image members' names (labels unused)
  // Shard-granular reads' counts over every reader (RemoteStats documents them); the only
  // mutable part.
  mutable std::atomic<int64_t> chunks_fetched{0}, chunks_refetched{0}, peak_held_bytes{0};

  // The client first: its thread may still be completing a loader's read-ahead, whose callback
  // writes to the cache, so it must be joined before the cache (a later member) is destroyed.
  ~Store() { client.reset(); }

  int64_t size() const { return static_cast<int64_t>(labels.size()); }
  uint32_t shard_of(int64_t i) const { return shard[static_cast<size_t>(i)]; }
  /// Sample i. Throws std::out_of_range outside [0, size()).
  SampleRef at(int64_t i) const;
  /// Sample i's bytes (`ref` = at(i)): from the cache when it holds them intact, else one ranged
  /// GET with If-Match on the shard's ETag (then written to the cache). Throws decode::DecodeError
  /// kIo naming ref.source() and the fetch's reason (and the cached copy's damage, if any).
  void read(int64_t i, const SampleRef& ref, decode::ByteBuffer& out) const;
};

/// The loader's readers over `store` (which must outlive them): ranged GETs per sample
/// (remote_reader.cpp), or whole shards and chunks (remote_shard_reader.cpp).
std::unique_ptr<SampleReader> make_sample_reader(const Store& store);
std::unique_ptr<SampleReader> make_shard_reader(const Store& store);

}  // namespace gpufeed::datasets::remote
