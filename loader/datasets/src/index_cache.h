#pragma once
// The index cache (internal): a dataset's listing written once and read back on the next start
// instead of walking the tree (DataOptions in gpufeed/datasets/dataset.h says where it lives
// and when it is used).
//
// File layout (native byte order; a cache is a local artefact, rebuilt on any mismatch):
//   "GPUFIDX" version(1 byte)
//   then sections, each a u64 byte count and the bytes:
//     kind, source (absolute path), options, dependency count, one 40-byte record per dependency
//     (its path section, then ino, size, mtime_ns, ctime_ns, mode), the dataset's own sections
//   then a u64 checksum: every section's hash, chained in order.
// The reader checks each dependency against the file system before reading the payload and the
// checksum after it; any difference, short read or inconsistency means "list again".
#include <sys/stat.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "gpufeed/datasets/dataset.h"

namespace gpufeed::datasets::detail {

/// What the listing depended on: a folder (or list file, or shard) and its identity then.
struct Dependency {
  std::string path;
  uint64_t ino = 0, size = 0;
  int64_t mtime_ns = 0, ctime_ns = 0;
  uint64_t mode = 0;
};
Dependency dependency_of(std::string path, const struct stat& st);

/// The key a cache must match besides its dependencies.
struct CacheKey {
  std::string kind;     // "ImageFolder", "FileList", "Shards"
  std::string source;   // the dataset's absolute path (or pattern)
  std::string options;  // the listing options that change the result
};

/// A cache file's corruption (short, inconsistent, checksum mismatch): rebuilt, never trusted.
struct CacheCorrupt : std::runtime_error {
  using std::runtime_error::runtime_error;
};

uint64_t hash_bytes(const void* data, size_t n, uint64_t seed);

class CacheWriter {
 public:
  explicit CacheWriter(int fd) : fd_(fd) {}
  void section(const void* data, size_t n);
  void section(std::string_view s) { section(s.data(), s.size()); }
  template <class T>
  void section(const std::vector<T>& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    section(v.data(), v.size() * sizeof(T));
  }
  void u64(uint64_t v) { section(&v, sizeof v); }
  void strings(const std::vector<std::string>& v);
  /// Writes the checksum trailer and flushes; throws std::runtime_error when a write fails.
  void finish();

 private:
  void raw(const void* data, size_t n);
  void flush();
  int fd_;
  std::string buffer_;
  uint64_t checksum_ = 0;
};

class CacheReader {
 public:
  CacheReader(int fd, uint64_t file_size) : fd_(fd), left_(file_size) {}
  /// The next section's bytes into `v` (resized); throws CacheCorrupt when its size is not a
  /// multiple of sizeof(T), runs past the file's end, or the read comes up short.
  template <class T>
  void section(std::vector<T>& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const uint64_t n = length();
    if (n % sizeof(T) != 0) throw CacheCorrupt("a section's size does not fit its type");
    v.resize(n / sizeof(T));
    read_hashed(v.data(), n);
  }
  std::string string();
  uint64_t u64();
  std::vector<std::string> strings();
  /// Reads the trailer and compares it with the sections' checksum; the file must end there.
  void finish();

 private:
  uint64_t length();
  void read_raw(void* data, uint64_t n);
  void read_hashed(void* data, uint64_t n);
  int fd_;
  uint64_t left_;
  uint64_t checksum_ = 0;
};

/// A SampleTable's three arrays as three sections, and back (checked by SampleTable::assign).
void write_table(CacheWriter& out, const SampleTable& table);
void read_table(CacheReader& in, SampleTable& table);

/// `path` as given without trailing separators ("data/" -> "data"; "/" stays).
std::string without_trailing_separator(const std::filesystem::path& path);
/// The dataset's identity in the cache: the canonical absolute path (symlinks, "." and ".."
/// resolved; a part that does not exist, such as a brace pattern's file name, kept lexically
/// normal), without trailing separators. "data", "./data/" and "/abs/data" are one dataset.
std::string canonical_source(const std::filesystem::path& path);

/// The user's cache folder for index caches: $XDG_CACHE_HOME/gpufeed when that is an absolute
/// path, else $HOME/.cache/gpufeed; nullopt when neither is set.
std::optional<std::filesystem::path> default_cache_dir();

/// The cache file of the dataset `kind` at `source` under `setting` (DataOptions: "" the
/// user's cache folder, "beside", "off", else a folder), or nullopt when off (or when "" finds
/// no cache folder). Outside "beside" the name is `<name>-<16 hex digits>.gpufeed-index`, the
/// digits a hash of the kind and canonical_source(source).
std::optional<std::filesystem::path> cache_file(const std::string& setting, const std::string& kind,
                                                const std::filesystem::path& source);

/// Whether this process may create files in `dir` by its mode bits alone: the owner's, group's
/// or others' write (and search) bit, whichever class applies to the effective uid/gid, as for
/// an ordinary user even when running as root (root's access(W_OK) is always true, but a folder
/// of mode 0555 says "do not write here"); also access(W_OK) (ACLs, read-only mounts).
bool may_write_in(const std::filesystem::path& dir);

/// Rewrites the paths of `table` read back from a cache that was written when the dataset was
/// spelled with paths starting `from`: those become `to` + the rest, others stay ("" `from`:
/// the relative paths get `to` prepended). The same files, as a listing through `to` names them.
void rebase_paths(SampleTable& table, std::string_view from, std::string_view to);

/// Reads `file` when its key and dependencies match: `payload` reads the dataset's sections.
/// Returns false (logging why, unless the file does not exist) when it is missing, stale or
/// corrupt; `payload`'s partial results must then be discarded by the caller.
bool read_cache(const std::filesystem::path& file, const CacheKey& key,
                const std::function<void(CacheReader&)>& payload);

/// Now on the clock file times are stamped with (CLOCK_REALTIME), nanoseconds.
int64_t wall_clock_ns();

/// Writes the cache atomically (temporary file + rename), creating its folder when missing. A
/// folder that may_write_in refuses is never written (the first refusal per folder is logged
/// at info level); any other failure (full disk) is logged and otherwise ignored: the cache is
/// an optimisation. Dependencies are recorded by absolute path. Not written when a
/// dependency changed less than kRacyWindowNs before `listing_started_ns`: a file system stamps
/// times in ticks (up to a second on some), so a change made in the same tick after the listing
/// read the folder would leave its identity unchanged and the cache stale but trusted (git's
/// "racy" index entries); such a dataset is listed again on the next start, and cached then.
constexpr int64_t kRacyWindowNs = 1000000000;
void write_cache(const std::filesystem::path& file, const CacheKey& key, const std::vector<Dependency>& deps,
                 int64_t listing_started_ns, const std::function<void(CacheWriter&)>& payload);

}  // namespace gpufeed::datasets::detail
