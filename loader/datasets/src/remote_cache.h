#pragma once
// The local cache of remote shards (internal; DataOptions::cache_dir, docs/SCALING.md): the bytes
// fetched of each shard kept on local disk, shared by the processes of a node, within a limit.
//
// Per shard, two files named by a hash of its URL (without an http(s) URL's query):
//   <hash>.data    the shard's bytes at their own offsets (a sparse file)
//   <hash>.ranges  "gpufeed-cache 2 <shard size> <ETag>", then one "<offset> <size> <crc32c>"
//                  line per range of .data that holds the shard's bytes (one sample's image
//                  member each; the CRC-32C of those bytes in 8 hex digits), appended (under
//                  flock) only after the bytes are written: a range is never listed before it is
//                  there. A later line for the same offset replaces an earlier one.
// Every read checks its range's CRC-32C: bytes a power loss or a bad disk zeroed or flipped while
// .ranges still lists them are dropped (counted, with a warning naming the .data file) and
// fetched again, never decoded. A shard whose size or ETag differs from the header's, or whose
// .ranges has another version (version 1 had no checksums: its bytes cannot be verified), is
// emptied when opened, so an object that changed is never served. A cache folder this process
// cannot write (a read-only mount) is still read: its shards whose header matches are served,
// nothing is written or evicted. Over `limit` bytes (the .data files' disk blocks), the shards
// used least recently (.ranges' mtime, touched when a process opens the shard) are removed, under
// an exclusive flock of <dir>/.lock. A process whose shard was evicted under it reads short, drops
// what it knew of that shard and fetches again.

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gpufeed/decode/decoder.h"

namespace gpufeed::datasets::remote {

/// What the cache served and refused, summed over its life (RemoteShards::cache_stats).
struct CacheStats {
  int64_t hits = 0;               ///< reads served from the cache
  int64_t hit_bytes = 0;          ///< their bytes
  int64_t checksum_failures = 0;  ///< ranges whose bytes failed their CRC-32C: dropped, fetched again
  int64_t read_errors = 0;        ///< ranges the .data file could not give back (an I/O error)
};

class Cache {
 public:
  /// `dir`: the cache folder (created when missing); `limit`: bytes on disk at most (0: no
  /// limit). Throws std::runtime_error naming `dir` when it neither exists nor can be created.
  Cache(std::string dir, int64_t limit);
  /// Registers shard `s` (its URL, size and ETag), emptying its files when they are another
  /// object's (or an older cache version's). When the folder cannot be written, a matching shard
  /// is still read; other errors turn the cache off for the shard, with a warning.
  void open_shard(size_t s, const std::string& url, int64_t size, const std::string& etag);
  /// Bytes [offset, offset + size) of shard s into `out` when the cache holds them and they pass
  /// their checksum. When it held them but they failed it (or could not be read), the range is
  /// dropped, a warning names the .data file, and `why` (when given) says what happened to them
  /// there, for an error raised if fetching them again fails too; else `why` is left as it is.
  bool read(size_t s, int64_t offset, int64_t size, decode::ByteBuffer& out, std::string* why = nullptr);
  /// Whether the cache says it holds them (no disk access).
  bool holds(size_t s, int64_t offset, int64_t size);
  /// Stores them (one range, its checksum computed here), unless the folder is read-only.
  void write(size_t s, int64_t offset, const uint8_t* data, int64_t size);
  CacheStats stats() const;

 private:
  struct Range {
    int64_t end = 0;
    uint32_t crc = 0;
  };
  struct Shard {
    std::string data, ranges;  // paths
    bool usable = false;
    bool writable = false;
    std::map<int64_t, Range> present;  // start -> range, as .ranges lists them (not merged)
    int64_t ranges_read = 0;           // bytes of .ranges parsed
  };
  void refresh(Shard& shard);  // parses what other processes appended; under mu_
  // The range holding [offset, end) (the one starting last at or before offset), or null.
  const std::pair<const int64_t, Range>* find(const Shard& shard, int64_t offset, int64_t end) const;
  void evict();

  std::string dir_;
  int64_t limit_;
  mutable std::mutex mu_;
  std::vector<Shard> shards_;
  int64_t written_since_check_ = 0;
  CacheStats stats_;  // under mu_
};

}  // namespace gpufeed::datasets::remote
