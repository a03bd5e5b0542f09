#pragma once
// WebDataset tar shards read with random access: a per-shard member index built from the tar
// headers alone (cached like the file index), so that every sample is one positioned read of its
// image member and the samplers, augmentation, skip policy and resume work as on folders.
//
// Layout (WebDataset's): samples are groups of adjacent members sharing a key, the member name up
// to the first '.' of its last path component ("train/n014_10026.JPEG" -> key "train/n014_10026",
// extension "jpeg", lower-cased as webdataset does). A sample needs exactly one image member,
// `key.jpg|jpeg|png|webp|ppm|pgm|bmp|tif|tiff|gif` (decoded by the bytes, not the name), and
// `key.cls`, the class index as ASCII digits (optionally surrounded by white space), as
// webdataset's "cls" decoder reads it. Other members of a sample (json, txt, ...) are accepted
// and ignored; so are members without a '.' in their last component (or starting with one),
// top-level "__name__" metadata members, folders, links and devices (their names are never used
// as paths): webdataset skips those too. Every other key group must be a sample: a group without
// an image member (only a `.cls`, only `.json`/`.txt`, ...) is an error, since webdataset would
// yield it as a sample without an image, and dropping it would lose it without a word. That
// includes dots in a key: "22.05.png" is key "22" with extension "05.png", not an image, and the
// error says so. Classes are named "0".."max label".
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpufeed/datasets/dataset.h"

namespace gpufeed::datasets {

/// A shard that cannot be used: what() names the shard, the member where there is one, and why
/// (truncated archive, a size past the end, a non-numeric field, a '..' or absolute member name,
/// a duplicate key, a sample without a label, a key without an image, ...).
class ShardError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Reads up to `n` bytes at `offset` into `buf`; returns the count read (fewer only at the end).
using ReadAt = std::function<size_t(int64_t offset, void* buf, size_t n)>;

/// A regular-file member of a tar archive: its name and where its data is.
struct TarMember {
  std::string name;
  int64_t offset = 0;
  int64_t size = 0;
};

/// The regular-file members of a tar archive of `file_size` bytes, in archive order, reading
/// only the 512-byte headers (and the data of pax 'x' and GNU 'L' long-name records, which
/// rename or resize the next member). POSIX ustar/pax and GNU formats, as Python's tarfile and
/// GNU tar write them. Every header's checksum is verified. Throws ShardError naming `shard`
/// (and the member) for: an archive that ends inside a header or without its end-of-archive
/// block, a member whose data runs past the end, a numeric field that is not octal (or
/// base-256), a checksum mismatch, an empty, absolute ('/...') or '..'-containing member name,
/// a sparse member, and pax/long-name records over 1 MiB.
std::vector<TarMember> index_tar(const ReadAt& read, int64_t file_size, const std::string& shard);

/// One sample of a shard: its image member's data and its label.
struct ShardSample {
  std::string member;  ///< the image member's name
  int64_t offset = 0, size = 0;
  int32_t label = 0;
};

/// The samples of one shard in archive order (index_tar, then WebDataset's grouping by key; the
/// labels are read from the `.cls` members). Throws ShardError naming the shard and member for
/// what index_tar rejects, a key that appears again after other keys (duplicate key), two
/// members with the same extension in a sample, two images in a sample, an image without a
/// `.cls` label, a key group without an image member (a label alone, metadata such as `.json`
/// alone, or a key with a '.' in it, whose image extension webdataset's first-dot rule hides:
/// the message explains the rule and suggests a name), and a `.cls` that is not a class index in
/// 0..kMaxLabel (2^24-1, dataset.h).
std::vector<ShardSample> index_shard(const ReadAt& read, int64_t file_size, const std::string& shard);

/// The name of a shard's index beside it: "train-000000.tar" -> "train-000000.tar.gpufeed-idx".
inline constexpr const char* kShardIndexSuffix = ".gpufeed-idx";

/// A shard's samples as its index file holds them, with what ties the index to one version of
/// its shard: the shard's size, the SHA-256 of its tar bytes (written by `gpufeed pack`, which
/// also writes it into the shard's trailer: format_shard_trailer), and, in the index cache of
/// remote shards, the ETag it was made against.
struct ShardIndex {
  int64_t shard_size = 0;
  std::string sha256{};  ///< 64 lower-case hex digits, or empty (an index that cannot prove its shard)
  std::string etag{};
  std::vector<ShardSample> samples{};
};

/// The index file's text (version 2, UTF-8, one sample per line; a few bytes per sample beyond
/// its name):
///   gpufeed-shard-index 2
///   shard_size <bytes>
///   sha256 <64 hex digits>           (only when non-empty: the shard's trailer's digest)
///   etag <ETag>                      (only when non-empty)
///   samples <count>
///   <offset> <size> <label> <member name>      (count lines, archive order)
/// Throws std::invalid_argument for a member name holding a line break.
std::string format_shard_index(const ShardIndex& index);

/// Reads format_shard_index's text, and version 1's (the same without the sha256 line). Throws
/// ShardError naming `source` and the line for another format or version, a malformed or
/// missing line, a sample past shard_size, or a label outside 0..kMaxLabel.
ShardIndex parse_shard_index(std::string_view text, const std::string& source);

/// The trailer `gpufeed pack` writes after a shard's end-of-archive blocks, so that an index can
/// prove it belongs to the exact shard it describes: kShardTrailerBytes bytes, the text
///   gpufeed-shard-trailer 1\nsha256 <64 hex digits>\ntar_bytes <N>\n
/// padded with NUL bytes, where N is the size of the tar before it (the file's size minus the
/// trailer) and the digest is the SHA-256 of those N bytes (`head -c N shard.tar | sha256sum`).
/// Tar readers stop at the end-of-archive blocks and never see it (GNU tar, Python's tarfile,
/// webdataset, index_tar).
inline constexpr int64_t kShardTrailerBytes = 512;

/// What a shard's trailer says.
struct ShardTrailer {
  std::string sha256;  ///< 64 lower-case hex digits
  int64_t tar_bytes = 0;
};

/// The trailer's kShardTrailerBytes bytes. Throws std::invalid_argument when `sha256` is not 64
/// lower-case hex digits.
std::string format_shard_trailer(const ShardTrailer& trailer);

/// The trailer in `tail`, a file's last bytes (up to kShardTrailerBytes of them), for a file of
/// `file_size` bytes; nullopt when they are not a trailer or its tar_bytes is not file_size -
/// kShardTrailerBytes (a shard written by another tool, cut short, or appended to).
std::optional<ShardTrailer> parse_shard_trailer(std::string_view tail, int64_t file_size);

/// Expands WebDataset's (braceexpand's) notation: "train-{000..002}.tar" -> train-000.tar,
/// train-001.tar, train-002.tar (numbers keep the first bound's width when it is zero-padded),
/// "{a,b}" lists; several braces multiply, left to right. Throws std::invalid_argument for an
/// unbalanced brace, a reversed range or more than 10 million names.
std::vector<std::string> expand_braces(const std::string& pattern);

/// The shards `data` names, or nullopt when it is not a shard set: a brace pattern, a `.tar`
/// file, a folder holding `.tar` files and no subfolder (sorted by name), or a list file whose
/// first entry (blank lines and '#' comments skipped) ends in ".tar" (one shard per line,
/// relative to the list's folder). Throws std::runtime_error naming a listed shard that does
/// not exist.
std::optional<std::vector<std::string>> shard_paths(const std::filesystem::path& data);

/// Dataset::shard_sizes() from a per-sample shard number: the count of each of `shards` shards.
/// Throws std::logic_error when the numbers decrease or are >= shards (a shard's samples would
/// not be one contiguous run of indices in shard order, which the shard-aware order relies on).
std::vector<int64_t> contiguous_shard_sizes(const std::vector<uint32_t>& shard_of_sample, size_t shards);

/// A dataset over WebDataset tar shards: samples in shard order, then archive order (the order
/// webdataset.WebDataset(urls, shardshuffle=False) yields them). The member index is read once
/// from the headers and cached as DataOptions says (keyed by each shard's identity);
/// every sample is then one pread of its image member (read_sample).
class TarShards : public Dataset {
 public:
  /// `source`: what the user gave (pattern, folder, list file), for the cache's name and key.
  /// Throws ShardError (see index_shard) or std::runtime_error when a shard cannot be opened or
  /// the set holds no sample.
  TarShards(std::vector<std::string> shards, const std::filesystem::path& source, const DataOptions& data_options = {});
  int64_t size() const override { return members_.size(); }
  /// Throws std::out_of_range naming the index and the size.
  SampleRef at(int64_t i) const override;
  const std::vector<std::string>& classes() const override { return classes_; }
  const std::vector<std::string>& shards() const { return shards_; }
  /// Samples per shard in shards() order (shard order, then archive order: contiguous runs).
  std::vector<int64_t> shard_sizes() const override { return contiguous_shard_sizes(shard_, shards_.size()); }
  bool from_cache() const { return from_cache_; }

 private:
  std::vector<std::string> shards_, classes_;
  std::vector<uint32_t> shard_;  // per sample
  std::vector<int64_t> offsets_, sizes_;
  SampleTable members_;  // the image members' names and the labels
  bool from_cache_ = false;
};

}  // namespace gpufeed::datasets
