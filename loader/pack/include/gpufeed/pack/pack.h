#pragma once
// `gpufeed pack`: a dataset (ImageFolder, flat folder, file list, or shards) written as
// WebDataset tar shards, OUT_DIR/<prefix>-000000.tar, <prefix>-000001.tar, ..., plus
// OUT_DIR/manifest.json. The shards are what gpufeed's TarShards (shards.h) and the `webdataset`
// Python package read: per sample two adjacent members, `KEY.<ext>` (the image) and `KEY.cls`
// (the class index as ASCII digits, webdataset's "cls"), in the dataset's order, or with `shuffle`
// in the order torch.randperm(N, generator=torch.Generator().manual_seed(seed)) gives (N the
// dataset's size; sampler/randperm.h): written shuffled, as webdataset's and MosaicML
// streaming's docs advise, so that a reader mixing a few shards at a time (webdataset's shuffle
// buffer, the loader's `shuffle_order shards`) still sees every class in a batch; a dataset
// folder lists its samples class by class.
//
// Keys: "<n>_<path>", n the sample's position in the pack (its dataset index unless `shuffle`)
// zero-padded to max(6, digits of size-1)
// (unique, and sorting the keys sorts the samples), <path> the file's path relative to the
// dataset's folder without its extension ("n01440764/sub/x.JPEG" -> "n01440764_sub_x"; a file
// outside it: its file name; a tar member: the member name), every byte but [A-Za-z0-9-] made
// '_' (so no '.', '/' or ".." survives), cut so the key is at most 95 bytes. Example:
// "000012_n01440764_n01440764_10026".
//
// Member extension: "jpg" for every JPEG and every re-encoded image; a copied non-JPEG keeps its
// file's extension, lower-cased, when it is one TarShards accepts and names the format the bytes
// have (png, webp, gif, bmp, tif/tiff, ppm/pgm), else the format's own (png, webp, gif, bmp, tif,
// ppm).
//
// Pixels: an image whose longer side (as stored) exceeds max_side is decoded whole (8/8), resized
// with transforms::Resizer (PIL's antialiased bilinear, the loader's resize: torchvision's
// Resize(antialias=True)) over the whole image to a longer side of exactly max_side and a shorter
// side of round(shorter * max_side / longer) (half up, at least 1), and encoded by libjpeg-turbo
// (decode::encode_jpeg, 4:2:0, `quality`); never upscaled. Every other image is copied byte for
// byte (with `reencode`, every image is decoded whole and re-encoded, resized or not). EXIF
// orientation is not applied, as the loader (DecodeOptions::apply_exif_orientation off)
// and torchvision's ImageFolder read images: pixels as stored, "longer side" as stored. A copied
// file keeps its EXIF segment; a re-encoded one has none (so a reader that applies EXIF
// orientation sees it as stored, as gpufeed does).
//
// Validation: every file is decoded with `decode` (the loader's defaults unless changed), so a
// shard never holds a sample the loader would fail on: a copied JPEG at DCT scale 1/8 (all of its
// entropy data is decoded, so truncation and corruption show as at 8/8; only the inverse DCT
// shrinks), other copied formats and every resized image whole. A file that cannot be read or
// decoded is an error (ErrorPolicy::kRaise: decode::DecodeError naming the file, kind and reason)
// or, under kSkip, left out, counted per kind and listed in the result and the manifest; more
// than max_skips skipped files is an error.
//
// Shards: a shard is closed before the next sample would make it exceed shard_size bytes (the
// tar file's size: 512-byte headers, data padded to 512, the two end-of-archive blocks), or when
// it holds max_samples_per_shard samples; a sample is never split and a shard holds at least one
// sample (so one larger than shard_size gets a shard of its own). Each shard is written to
// "<name>.tmp" and renamed when complete; the manifest too.
//
// Raw pixels where they pay (raw_budget / raw_budget_fraction, `--raw-budget`): some samples are
// stored as binary PPM (`KEY.ppm`: "P6\n<w> <h>\n255\n" + RGB rows; TarShards and the decoder read
// it, a copy instead of a JPEG decode) within a budget of extra bytes. A first pass (in
// parallel) reads and probes every file and finds, per sample: its packed JPEG bytes J (the
// file's size when copied; when re-encoded, the size of the new JPEG, which that pass
// therefore computes; up to plan_keep_bytes (512 MiB) of those JPEGs, and as much of their
// pixels as PPM, are kept for the main pass, which writes the form chosen; beyond that they are
// decoded, resized and, for a JPEG, encoded again), its PPM bytes P (header + 3 x pixels
// after the resize), the extra bytes E = tar size of P - tar size of J (exact), and the decode
// work it saves, modelled as its pixel count N (JPEG decode time grows with the pixels). Samples
// are taken in order of N / E, highest first (ties: lower index), each one whose E still fits
// the budget, so the shards' members exceed those of the pack without a budget by at most the
// budget; a budget fraction f means f x the sum of every sample's tar size of J. The choice
// depends only on the files and the options. A raw sample is decoded whole, resized when it
// exceeds max_side, and stored losslessly (its pixels are exactly the loader's decode, or that
// decode resized).
//
// Determinism: the shards and the manifest depend only on the dataset's files and the options,
// never on num_workers: samples are processed in chunks of `chunk_samples` (in parallel on a
// oneTBB arena of num_workers threads) and written by one writer in pack order, so memory holds
// at most one chunk of encoded samples. Tar headers are fixed: mode 0644, uid/gid 0, mtime 0,
// empty uname/gname, ustar format.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpufeed/decode/decoder.h"
#include "gpufeed/datasets/dataset.h"
#include "gpufeed/loader/loader.h"
#include "gpufeed/option.h"

namespace gpufeed::pack {

/// A POSIX ustar archive written member by member (what pack's shards are made of): deterministic
/// headers (mode 0644, uid/gid 0, mtime 0, empty uname/gname, typeflag '0'), data padded to 512
/// bytes, and close() appends the two zero blocks that end the archive (no padding to a 10 KiB
/// record: readers need none), then the shard trailer (shards.h, format_shard_trailer): the
/// SHA-256 of every byte before it, computed as they are written, which the shard's index records
/// too, so that an index proves it belongs to this very shard.
struct TarDigest;
class TarWriter {
 public:
  /// Creates (truncates) `path`. Throws std::runtime_error naming it and the OS reason.
  explicit TarWriter(const std::filesystem::path& path);
  /// Closes without the end blocks when close() was not called (an unfinished archive).
  ~TarWriter();
  TarWriter(const TarWriter&) = delete;
  TarWriter& operator=(const TarWriter&) = delete;

  /// Appends a regular-file member. `name`: at most 100 bytes, or a longer one whose part up to a
  /// '/' fits ustar's 155-byte prefix field and the rest the 100-byte name; no NUL. Throws
  /// std::invalid_argument for a name that fits neither or a member of 8 GiB or more (the 11
  /// octal digits of the size field), std::runtime_error naming the file on a write failure.
  void add(std::string_view name, std::span<const uint8_t> data);
  /// Writes the end-of-archive blocks and the trailer and closes the file (checking the close).
  /// Throws std::runtime_error naming the file on failure.
  void close();
  /// Bytes written so far (after close(): the file's size, the trailer included).
  int64_t bytes() const { return bytes_; }
  /// After close(): the SHA-256 of the tar (the file without its trailer), 64 lower-case hex digits.
  const std::string& sha256() const { return sha256_; }

  /// Bytes a member of `size` data bytes takes: its header plus the data padded to 512.
  static int64_t member_bytes(int64_t size) { return 512 + (size + 511) / 512 * 512; }
  /// What close() appends: the end-of-archive blocks (1024 bytes) and the trailer (512).
  static constexpr int64_t kEndBytes = 1024 + 512;

 private:
  void write(const void* data, size_t n);
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
  int64_t bytes_ = 0;
  std::unique_ptr<TarDigest> digest_;
  std::string sha256_;
};

/// Options of pack_dataset (the CLI's flags, from pack_options_schema(): `gpufeed pack --help`).
struct PackOptions {
  std::string prefix = "train";              ///< shard names: <prefix>-000000.tar, ...
  int64_t shard_size = 1'000'000'000;        ///< bytes per shard at most (unless one sample is larger); > 0
  int64_t max_samples_per_shard = 0;         ///< samples per shard at most (WebDataset's maxcount); 0: no limit
  int max_side = 0;                          ///< resize images whose longer side exceeds this; 0: never
  int quality = 90;                          ///< JPEG quality of re-encoded images, 1..100
  /// Re-encode every image (not stored raw) as a JPEG at `quality`, resized or not: FFCV's
  /// write_mode="jpg" (smaller files than high-quality originals, at a generation of loss).
  bool reencode = false;
  /// Write the samples in a seeded random order (see the top), not the dataset's.
  bool shuffle = false;
  int64_t seed = 0;                          ///< shuffle's seed (torch.manual_seed's), >= 0
  int num_workers = 0;                       ///< decode/resize/encode threads; 0 = the CPU budget (gpufeed/cpu_budget.h); <= kMaxNumWorkers
  loader::ErrorPolicy error_policy = loader::ErrorPolicy::kRaise;  ///< a file that cannot be read or decoded
  int64_t max_skips = 100;                   ///< kSkip: more skipped files than this is an error
  bool overwrite = false;                    ///< replace shards with this prefix and the manifest
  int64_t chunk_samples = 256;               ///< samples processed in parallel before being written; >= 1
  decode::DecodeOptions decode{};            ///< validation decode: pixel limit, strict (scale/crop ignored)
  /// Raw pixels (see the top): extra bytes allowed for PPM samples; 0 = none. Either this or
  /// raw_budget_fraction (> 0: that fraction of the JPEG members' bytes of the whole pack).
  int64_t raw_budget = 0;
  double raw_budget_fraction = 0;
  /// With a raw budget, the memory the first pass may keep its re-encoded JPEGs in, and as much
  /// again for their pixels as PPM (bytes, each; 0 keeps nothing). The main pass writes what was
  /// kept and makes the rest again; the output bytes never depend on it.
  int64_t plan_keep_bytes = int64_t{512} << 20;
  /// Where keys' relative paths start: "" = the source's folder (the source itself when it is a
  /// folder, a list file's folder).
  std::filesystem::path base;
};

/// PackOptions' user-facing fields (gpufeed/option.h), the flags of `gpufeed pack`: prefix,
/// shard_size (a number of bytes, "1e9"), max_samples_per_shard, max_side, quality, reencode,
/// shuffle, seed, num_workers, on_error (error_policy), max_skips, raw_budget (bytes "2e9", a fraction "0.25" or
/// a percentage "25%": raw_budget or raw_budget_fraction), strict_decode (decode.strict),
/// overwrite. num_workers, on_error, max_skips and strict_decode take the loader's specs
/// (loader_options_schema()). chunk_samples, plan_keep_bytes, base and decode's other limits are
/// the library's alone. Defaults are PackOptions{}'s.
const options::Schema<PackOptions>& pack_options_schema();

/// A file left out under ErrorPolicy::kSkip.
struct PackSkip {
  int64_t index = -1;   ///< dataset index (not the pack position, under `shuffle`)
  std::string path;     ///< SampleRef::source(): the file, or "shard.tar:member"
  std::string kind;     ///< decode::to_string(kind), or "error" for any other failure
  std::string reason;   ///< DecodeError::reason(), else what()
};

/// One written shard.
struct PackedShard {
  std::string file;     ///< file name inside OUT_DIR
  int64_t samples = 0;
  int64_t bytes = 0;    ///< the file's size
  std::string sha256{}; ///< the SHA-256 of its tar bytes (its trailer's and its index's)
};

/// Progress, reported after each chunk is written.
struct PackProgress {
  int64_t done = 0;     ///< samples processed (packed or skipped)
  int64_t total = 0;    ///< samples in the dataset
  int64_t shards = 0;   ///< shards started
  int64_t bytes_out = 0;
  double seconds = 0;
};

/// What a pack did.
struct PackResult {
  std::vector<std::string> classes;   ///< names, index = label (the dataset's)
  std::vector<PackedShard> shards;    ///< in order
  int64_t samples = 0;                ///< packed (= sum of shards' samples)
  int64_t bytes_in = 0;               ///< source bytes of the packed samples
  int64_t bytes_out = 0;              ///< shard bytes (= sum of shards' bytes)
  int64_t reencoded = 0;              ///< resized and re-encoded
  int64_t copied = 0;                 ///< copied byte for byte
  int64_t raw = 0;                    ///< stored as PPM (raw budget)
  int64_t raw_bytes = 0;              ///< their PPM bytes
  int64_t raw_budget = 0;             ///< the budget in bytes (a fraction resolved); 0 = none
  int64_t raw_extra = 0;              ///< the extra bytes of the samples chosen (<= raw_budget)
  std::vector<PackSkip> skipped;      ///< in dataset order
  std::map<std::string, int64_t> skipped_by_kind;
  double seconds = 0;                 ///< wall time of pack_dataset
  std::string pattern;                ///< the shards as a brace pattern: "train-{000000..000002}.tar"

  /// "packed N samples into S shards: X MB in -> Y MB out, R re-encoded, C copied[, P raw],
  /// K skipped (kinds), T s, I images/s".
  std::string summary() const;
};

/// The member key of sample `index` of a dataset of `size` samples whose file is `path`,
/// relative to `base` (see the key rule at the top). Never empty; no '.', '/' or NUL; <= 95 bytes.
std::string pack_key(int64_t index, int64_t size, std::string_view path, std::string_view member,
                     const std::filesystem::path& base);

/// Writes `dataset` as WebDataset shards into `out_dir` (created when missing) and writes
/// `out_dir`/manifest.json (see docs/DATASETS.md, "Packing into shards"). `source` is what the user
/// named (recorded in the manifest; the key base when options.base is empty). `progress`, when
/// set, is called from the calling thread after each chunk.
/// Throws std::runtime_error before writing anything when out_dir already holds
/// `<prefix>-NNNNNN.tar` shards or a manifest.json and !options.overwrite (naming them), or when
/// options are invalid (std::invalid_argument: options::OptionError naming the option, in
/// backticks, for a value its pack_options_schema() row refuses); decode::DecodeError naming the
/// file under kRaise; std::runtime_error when more than max_skips files are skipped or none could
/// be packed. After a failure the shards this call wrote are removed (no partial set is left
/// behind; with overwrite, shards it had already replaced are gone). With overwrite, a successful
/// pack removes the shards of that prefix it did not write (an older, longer set).
PackResult pack_dataset(const datasets::Dataset& dataset, const std::filesystem::path& source,
                        const std::filesystem::path& out_dir, const PackOptions& options,
                        const std::function<void(const PackProgress&)>& progress = {});

}  // namespace gpufeed::pack
