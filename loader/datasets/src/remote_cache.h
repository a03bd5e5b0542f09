#pragma once
// The local cache of remote shards (internal; DataOptions::cache_dir, docs/SCALING.md): the bytes
// fetched of each shard kept on local disk, shared by the processes of a node, within a limit.
//
// Per shard, two files named by a hash of its URL (without its query):
//   <hash>.data    the shard's bytes at their own offsets (a sparse file)
//   <hash>.ranges  "gpufeed-cache 1 <shard size> <ETag>", then one "<offset> <size>" line per
//                  range of .data that holds the shard's bytes, appended (under flock) only after
//                  those bytes are written: a range is never listed before it is there.
// A shard whose size or ETag differs from the header's is emptied when opened, so an object that
// changed is never served. Over `limit` bytes (the .data files' disk blocks), the shards used
// least recently (.ranges' mtime, touched when a process opens the shard) are removed, under an
// exclusive flock of <dir>/.lock. A process whose shard was evicted under it reads short, drops
// what it knew of that shard and fetches again.

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gpufeed/decode/decoder.h"

namespace gpufeed::loader::remote {

class Cache {
 public:
  /// `dir`: the cache folder (created); `limit`: bytes on disk at most (0: no limit).
  Cache(std::string dir, int64_t limit);
  /// Registers shard `s` (its URL, size and ETag), emptying its files when they are another
  /// object's. Errors (an unwritable folder) turn the cache off for the shard, with a warning.
  void open_shard(size_t s, const std::string& url, int64_t size, const std::string& etag);
  /// Bytes [offset, offset + size) of shard s into `out` when the cache holds them.
  bool read(size_t s, int64_t offset, int64_t size, decode::ByteBuffer& out);
  /// Whether the cache says it holds them (no disk access).
  bool holds(size_t s, int64_t offset, int64_t size);
  /// Stores them.
  void write(size_t s, int64_t offset, const uint8_t* data, int64_t size);

 private:
  struct Shard {
    std::string data, ranges;  // paths
    bool usable = false;
    std::map<int64_t, int64_t> present;  // start -> end, merged
    int64_t ranges_read = 0;             // bytes of .ranges parsed
  };
  void refresh(Shard& shard);  // parses what other processes appended; under mu_
  void add(Shard& shard, int64_t offset, int64_t end);
  bool covered(const Shard& shard, int64_t offset, int64_t end) const;
  void evict();

  std::string dir_;
  int64_t limit_;
  std::mutex mu_;
  std::vector<Shard> shards_;
  int64_t written_since_check_ = 0;
};

}  // namespace gpufeed::loader::remote
