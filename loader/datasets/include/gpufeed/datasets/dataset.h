#pragma once
// Datasets: an ordered list of (file, label) pairs. Pixels are never touched here; the loader
// reads and decodes on its worker pool.

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gpufeed/decode/decoder.h"  // decode::ByteBuffer
#include "gpufeed/option.h"

namespace gpufeed::datasets {

/// One sample, as a view into its dataset's table: valid while the dataset lives (datasets are
/// immutable, so any number of threads may hold views).
/// The largest class index a file list or a shard's `.cls` may give (2^24 - 1). Their class
/// count is the largest label + 1, one class name per index, so a stray huge label (a hash, a
/// byte offset) would otherwise allocate hundreds of millions of names before anything fails.
inline constexpr int64_t kMaxLabel = (int64_t{1} << 24) - 1;

struct SampleRef {
  /// The file's path. NUL-terminated in the table (path.data()[path.size()] == '\0'), so it can
  /// be passed to open() without a copy.
  std::string_view path;
  /// Class index, 0 <= label < classes().size() for folders (file lists may leave gaps).
  int64_t label = 0;
  /// Where the sample's bytes are in that file: [offset, offset + size); size -1 is the whole
  /// file. A tar shard's sample is its image member's data (read with one pread).
  int64_t offset = 0;
  int64_t size = -1;
  /// The member's name inside an archive, for messages; empty for a plain file.
  std::string_view member;

  /// What errors name: the path, or "<archive>:<member>" for an archive's member.
  std::string source() const;
  /// The same into `out`, reusing its capacity.
  void source(std::string& out) const;
};

/// Reads sample `s`'s bytes into `out` (reusing its capacity): the whole file, or the member's
/// byte range with one positioned read. Throws decode::DecodeError kIo naming s.source() when
/// the file cannot be opened or read, or ends before the range does (an archive cut short since
/// it was indexed).
void read_sample(const SampleRef& s, std::vector<uint8_t>& out);
/// The same into a decode::ByteBuffer, grown without zero-filling (the loader's workers use it).
void read_sample(const SampleRef& s, decode::ByteBuffer& out);

/// How a loader reads its dataset's samples when the dataset has a reader of its own
/// (Dataset::reader(): remote shards, which fetch ahead in the loader's order). The loader
/// announces each epoch's order as it plans it, reads each sample from its workers (any number
/// at once) and forgets an epoch it cancels. A read that was not announced, or comes in another
/// order, is still served (fetched on demand).
class SampleReader {
 public:
  virtual ~SampleReader() = default;
  /// The samples (dataset indices) epoch plan `tag` will read, in its order; queued after those
  /// announced before.
  virtual void announce(uint64_t tag, const std::vector<int64_t>& indices) = 0;
  /// Drops plan `tag`'s announced reads; its reads waiting now, and later, throw
  /// decode::DecodeError kIo ("cancelled").
  virtual void forget(uint64_t tag) = 0;
  /// Sample `index`'s bytes into `out`: what read_sample(dataset.at(index), out) would read.
  /// Throws decode::DecodeError kIo naming the sample's source when they cannot be read.
  virtual void read(uint64_t tag, int64_t index, decode::ByteBuffer& out) = 0;
};

/// What a loader tells Dataset::reader about the orders it will announce: any order (the reader
/// judges each plan), or sampler::ShardAwareSampler's, made of shards (or pieces of shards) whose
/// samples are mixed within a window of shards (gpufeed/sampler/shard_order.h).
enum class ReadOrder { kAny, kShardRuns };

/// A fixed, ordered list of samples. Implementations are immutable after construction, so any
/// thread may read them.
class Dataset {
 public:
  virtual ~Dataset() = default;
  /// Number of samples (torch's len(dataset)).
  virtual int64_t size() const = 0;
  /// Sample i, 0 <= i < size(). Throws std::out_of_range otherwise.
  virtual SampleRef at(int64_t i) const = 0;
  /// Class names, index = label.
  virtual const std::vector<std::string>& classes() const = 0;
  /// Sample i's bytes into `out`, `ref` being at(i): read_sample(ref, out) (the default), or, for
  /// remote data, one ranged GET. Throws decode::DecodeError kIo naming ref.source(), as
  /// read_sample does.
  virtual void read(int64_t i, const SampleRef& ref, decode::ByteBuffer& out) const { read_sample(ref, out); }
  /// A reader for one loader whose announced orders are `order`, or null (the default): the
  /// loader then calls read(i).
  virtual std::unique_ptr<SampleReader> reader(ReadOrder order = ReadOrder::kAny) const {
    return nullptr;
  }
  /// The samples of each shard, in shard order, for a dataset stored as shards (TarShards,
  /// RemoteShards): shard s holds the contiguous sample indices [offset_s, offset_s + sizes[s]),
  /// offset_s the sum of the sizes before it, and the sizes sum to size(). This is the layout
  /// sampler::shard_aware_epoch_list takes (gpufeed/sampler/shard_order.h). Empty (the default)
  /// for a dataset that is not made of shards (ImageFolder, FileList, ...).
  virtual std::vector<int64_t> shard_sizes() const { return {}; }
  /// The data is remote (read over HTTP(S) or S3: RemoteShards), where each read is a request.
  virtual bool remote() const { return false; }
};

/// The compact sample table behind the in-memory datasets: every path in one arena of bytes
/// (each NUL-terminated), a 64-bit start offset and an int32 label per sample: 13 bytes per
/// sample beyond the path bytes, where a std::filesystem::path per sample costs 32 bytes plus a
/// heap block for any path over 15 characters.
class SampleTable {
 public:
  int64_t size() const { return static_cast<int64_t>(labels_.size()); }
  /// Appends a sample. Throws std::invalid_argument for a label outside 0..INT32_MAX or a path
  /// holding a NUL byte.
  void add(std::string_view path, int64_t label);
  /// Appends `dir` + '/' + `name` (no separator when `dir` is empty), without a temporary.
  void add_joined(std::string_view dir, std::string_view name, int64_t label);
  std::string_view path(int64_t i) const {
    const auto b = offsets_[static_cast<size_t>(i)];
    const auto e = static_cast<size_t>(i) + 1 < offsets_.size() ? offsets_[static_cast<size_t>(i) + 1]
                                                                 : arena_.size();
    return {arena_.data() + b, e - b - 1};
  }
  int64_t label(int64_t i) const { return labels_[static_cast<size_t>(i)]; }
  void reserve(int64_t samples, int64_t path_bytes);
  /// Releases spare capacity (after the last add).
  void shrink_to_fit();
  /// Bytes of path text (without the NULs).
  int64_t path_bytes() const { return static_cast<int64_t>(arena_.size()) - size(); }
  /// Bytes the table holds in memory (capacities of its three arrays).
  int64_t memory_bytes() const {
    return static_cast<int64_t>(arena_.capacity() + offsets_.capacity() * sizeof(uint64_t) +
                                labels_.capacity() * sizeof(int32_t));
  }

  // The raw arrays, for the index cache.
  const std::vector<char>& arena() const { return arena_; }
  const std::vector<uint64_t>& offsets() const { return offsets_; }
  const std::vector<int32_t>& labels() const { return labels_; }
  /// Adopts arrays read back from a cache. Throws std::runtime_error when they are inconsistent
  /// (offsets not increasing, a path not NUL-terminated, a negative label).
  void assign(std::vector<char> arena, std::vector<uint64_t> offsets, std::vector<int32_t> labels);

 private:
  std::vector<char> arena_;
  std::vector<uint64_t> offsets_;
  std::vector<int32_t> labels_;
};

/// A Dataset held as a SampleTable, filled by its subclass's constructor or by add().
class SampleList : public Dataset {
 public:
  int64_t size() const override { return table_.size(); }
  /// Throws std::out_of_range naming the index and the size.
  SampleRef at(int64_t i) const override;
  const std::vector<std::string>& classes() const override { return classes_; }
  const SampleTable& table() const { return table_; }

 protected:
  std::vector<std::string> classes_;
  SampleTable table_;
};

/// Where the index cache lives (`--index-cache`, Python's `index_cache=`):
///   ""        (the default) the user's cache folder, `$XDG_CACHE_HOME/gpufeed` (an absolute
///             XDG_CACHE_HOME), else `$HOME/.cache/gpufeed`; nothing is written beside the data;
///   "beside"  beside the dataset, `<parent>/<name>.gpufeed-index`, only when asked;
///   "off"     never read or written;
///   else      a folder to keep it in (created when missing; "./beside" for a folder so named).
/// Outside "beside" a file is named `<name>-<16 hex digits>.gpufeed-index`, the digits a hash of
/// the dataset's kind and canonical path (symlinks, "." and ".." resolved), so "data", "./data/"
/// and "/abs/data" share one entry (a cache read through another spelling has its paths rebased
/// onto this one's). A folder is never written when its mode bits deny this process write
/// permission (the owner's, group's or others' bit, whichever applies), even as root, for whom
/// access(W_OK) is always true: a 0555 dataset folder stays untouched. When the cache folder
/// cannot be created or written, the dataset is listed without a cache and an info line says so
/// (once per folder per process); it is never an error. A cache is used only when its key still
/// matches: the dataset's canonical path, the listing options, and the identity (inode, mtime,
/// ctime, size) of every folder the listing read (every list file, for a file list); a stale,
/// corrupt or unreadable cache is rebuilt by listing again, never trusted. Written atomically (a
/// temporary file, then rename), and not written when something it depends on changed less than
/// a second before the listing (file times are stamped in ticks: a change in the same tick would
/// go unseen; such a dataset is cached on a later start).
///
/// The other fields are those of remote data (s3://, http(s):// URLs: remote.h, docs/SCALING.md,
/// "Remote data"); local datasets ignore them.
struct DataOptions {
  std::string index_cache;
  /// The S3 endpoint of s3:// URLs, for S3-compatible stores (MinIO, Ceph, R2, ...): "" takes
  /// AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL, else the profile's endpoint_url, else AWS's.
  std::string endpoint_url{};
  /// Ranged GETs in flight at once, per loader (per rank).
  int max_requests = 128;
  /// Sample bytes requested ahead of the loader, per loader, in MiB (requested and not yet
  /// decoded; the memory remote reading holds beyond the slots).
  int64_t read_ahead = 256;
  /// Seconds a request may go without receiving a byte (or without connecting) before it is
  /// retried.
  double request_timeout = 30;
  /// Retries of a request that timed out, was reset, cut short, throttled (503 SlowDown, 429) or
  /// got a 5xx, with exponential backoff, before its error is raised.
  int max_retries = 5;
  /// A local folder keeping the remote bytes fetched, shared by the processes of a node and kept
  /// across runs ("" = none): docs/SCALING.md, "Remote data" (src/remote_cache.h).
  std::string cache_dir{};
  /// The cache's size on disk at most, in GiB: the shards used least recently go first.
  double cache_limit = 100;
  /// How a loader reads remote samples (docs/DESIGN-NOTES.md, "remote: shard-granular reads"):
  /// "shards" fetches each shard whole (one GET, or GETs of remote_chunk MiB for a larger shard)
  /// and serves its samples from memory; "samples" issues a ranged GET per sample (runs of
  /// adjacent samples coalesced); "auto" takes shards for a reader of the shard-aware order
  /// (ReadOrder::kShardRuns: the loader's shuffle_order shards), and for any other order picks
  /// per epoch plan: shards for an announced order that keeps at most remote_shards_in_flight
  /// shards (or chunks) open at once and spans at most half as many of them as samples, samples
  /// otherwise.
  std::string remote_read = "auto";
  /// The bytes of one GET of shard-granular reads, in MiB: a shard up to this size is one GET, a
  /// larger one is cut into chunks of this size (its last chunk up to twice it).
  int64_t remote_chunk = 16;
  /// Shards (or chunks) of shard-granular reads fetched ahead or held in memory at once, per
  /// loader, beyond those the loader's reads are waiting on.
  int remote_shards_in_flight = 16;
  /// Not an option (no flag or keyword): set by the caller to abandon an open in progress, e.g.
  /// on Ctrl-C. A remote dataset's requests then fail at once ("cancelled (interrupted)") and
  /// opening throws RemoteError; null: never.
  std::shared_ptr<const std::atomic<bool>> interrupt{};
};

/// DataOptions' user-facing fields (gpufeed/option.h).
const options::Schema<DataOptions>& data_options_schema();

/// torchvision.datasets.folder.IMG_EXTENSIONS, in its order: the files torchvision's ImageFolder
/// lists (.jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp). Lower case, with the dot. The one
/// spelling of that list: gpufeed.DataLoader's default (_C.TORCHVISION_IMG_EXTENSIONS).
const std::vector<std::string>& torchvision_image_extensions();

/// torchvision_image_extensions() followed by ".gif": gpufeed decodes GIF through giflib, and
/// torchvision's list leaves it out, which would silently drop such files. The C++ folder
/// listings' default (ImageFolderOptions, open_dataset, the CLI) and gpufeed.IMAGE_EXTENSIONS.
const std::vector<std::string>& default_image_extensions();

/// Files under `dir`, recursively, in torchvision's ImageFolder order (folders sorted by path,
/// then file names sorted, byte order), keeping those whose name ends with one of `extensions`
/// (compared case-insensitively; empty keeps every file). Symlinked folders are followed when
/// `follow_symlinks` (torchvision's os.walk(followlinks=True)), except a link back to a folder
/// above it (same device and inode: a symlink loop), which is not descended into, with a warning
/// naming it, where os.walk would descend until the path grows too long. Throws
/// std::runtime_error naming the folder that cannot be listed and why (e.g. permission denied),
/// where os.walk would skip it silently.
std::vector<std::filesystem::path> list_files(const std::filesystem::path& dir,
                                              const std::vector<std::string>& extensions,
                                              bool follow_symlinks = true);

/// Options of ImageFolder.
struct ImageFolderOptions {
  /// File extensions accepted, compared case-insensitively, with the dot.
  std::vector<std::string> extensions = default_image_extensions();
  /// Follow symlinked folders, as torchvision's os.walk(followlinks=True) does.
  bool follow_symlinks = true;
  /// The index cache (see DataOptions).
  std::string index_cache;
};

/// torchvision.datasets.ImageFolder's layout: root/<class>/**/<file>. Classes are the sorted
/// names of root's subfolders (label = position); within a class, files are found recursively and
/// ordered as torchvision orders them (folders sorted, then file names sorted, byte order).
/// Files are found by list_files (symlink loops listed once; an unreadable folder is an error).
/// Throws std::runtime_error naming the folder when root is missing, has no class folders, a
/// folder cannot be listed, or a class folder has no file with an accepted extension
/// (torchvision raises FileNotFoundError).
class ImageFolder : public SampleList {
 public:
  explicit ImageFolder(const std::filesystem::path& root, ImageFolderOptions options = {});
  /// Whether this instance was read from the index cache rather than by walking the tree.
  bool from_cache() const { return from_cache_; }
  const std::filesystem::path& root() const { return root_; }

 private:
  std::filesystem::path root_;
  bool from_cache_ = false;
};

/// Options of FileList.
struct FileListOptions {
  /// Check, when the list is read, that every listed path is a readable regular file (stat +
  /// access, in parallel on oneTBB's pool), so a missing file is an error at start-up naming its
  /// line rather than a failure when that sample is first loaded. Off only for lists whose files
  /// appear later. A list read back from its index cache is not checked again.
  bool check_files = true;
};

/// A text file of "<path> <label>" lines; the path is relative to `root` (or absolute) and may
/// contain spaces (the label is the last field). Blank lines and lines starting with '#' are
/// ignored; CRLF line ends are accepted. The list is UTF-8 (or any byte encoding of the file
/// system's names): a UTF-8 byte-order mark (EF BB BF, written by Windows editors) is skipped, and
/// a UTF-16 or UTF-32 list (byte-order mark FF FE / FE FF / FF FE 00 00 / 00 00 FE FF, or NUL
/// bytes in a line) is an error naming the encoding. Classes are named by their label number,
/// "0".."max". Throws std::runtime_error naming the list file and line for a malformed line, a
/// negative label, or (with check_files) the first listed file that is missing or unreadable,
/// with the OS reason and how many others are; and when the list is missing or lists no sample.
class FileList : public SampleList {
 public:
  FileList(const std::filesystem::path& list_file, const std::filesystem::path& root,
           const DataOptions& data_options = {}, FileListOptions options = {});
  bool from_cache() const { return from_cache_; }

 private:
  bool from_cache_ = false;
};

/// A flat folder of images whose class is named by the file name's prefix up to the first '_'
/// (ImageNet's "n01440764_tench.JPEG" -> class "n01440764"; a name without '_' is its own class
/// by stem). Files are those directly in root with an accepted extension, sorted by name; classes
/// are the sorted distinct prefixes. Throws std::runtime_error naming root when it has no image.
class FlatFolder : public SampleList {
 public:
  explicit FlatFolder(const std::filesystem::path& root, ImageFolderOptions options = {});
};

/// Opens `path` as the dataset it looks like: remote shards (an http://, https:// or s3:// URL or
/// brace pattern of URLs, or a list file of URLs: RemoteShards in remote.h, read as `data_options`'
/// remote fields say; any other scheme is refused with std::invalid_argument); WebDataset tar
/// shards (a brace pattern such as
/// "shards/train-{000000..000146}.tar", a .tar file, a folder of .tar files only, or a list of
/// .tar paths: TarShards in shards.h); otherwise a regular file is a FileList (paths relative to
/// the file's folder); a folder with class subfolders is an ImageFolder; a folder of images
/// only is a FlatFolder. ImageFolders and file lists use the index cache as `data_options` says
/// (default: the user's cache folder, DataOptions). Throws std::runtime_error naming the path when
/// it is none of these.
std::shared_ptr<Dataset> open_dataset(const std::filesystem::path& path, const DataOptions& data_options = {});

/// open_dataset listing folders (ImageFolder, FlatFolder) with these `extensions` (with the dot,
/// compared case-insensitively) instead of default_image_extensions(); file lists and shards are
/// unaffected. gpufeed.DataLoader passes torchvision's IMG_EXTENSIONS this way.
std::shared_ptr<Dataset> open_dataset(const std::filesystem::path& path, const DataOptions& data_options,
                                      const std::vector<std::string>& extensions);

}  // namespace gpufeed::datasets
