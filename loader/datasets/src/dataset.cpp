#include "gpufeed/datasets/dataset.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>
#include <optional>
#include <set>
#include <stdexcept>
#include <system_error>
#include <string_view>
#include <utility>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "gpufeed/datasets/tbb_tsan.h"

#include "gpufeed/cpu_budget.h"
#include "gpufeed/decode/decoder.h"
#include "gpufeed/decode/error.h"
#include "gpufeed/datasets/remote.h"
#include "gpufeed/datasets/shards.h"
#include "gpufeed/log.h"
#include "gpufeed/unique_fd.h"
#include "index_cache.h"

namespace gpufeed::datasets {
namespace fs = std::filesystem;
namespace {

std::runtime_error cannot_list(const std::string& dir, int err) {
  return std::runtime_error("cannot list " + dir + ": " + std::error_code(err, std::generic_category()).message());
}

// torchvision: filename.lower().endswith(extensions); `exts` are lower case.
bool has_extension(std::string_view name, const std::vector<std::string>& exts) {
  return std::any_of(exts.begin(), exts.end(), [&](const std::string& e) {
    if (name.size() < e.size()) return false;
    const char* tail = name.data() + name.size() - e.size();
    for (size_t i = 0; i < e.size(); ++i) {
      if (std::tolower(static_cast<unsigned char>(tail[i])) != static_cast<unsigned char>(e[i])) return false;
    }
    return true;
  });
}

std::string join(std::string_view dir, std::string_view name) {
  std::string s;
  s.reserve(dir.size() + 1 + name.size());
  s.append(dir);
  if (!dir.empty() && dir.back() != '/') s.push_back('/');
  s.append(name);
  return s;
}

// One folder's accepted file names, NUL-separated in one string (no string per file).
struct Group {
  std::string dir;
  std::string names;
  std::vector<uint32_t> starts;
  size_t count() const { return starts.size(); }
  std::string_view name(size_t i) const {
    return {names.data() + starts[i], (i + 1 < starts.size() ? starts[i + 1] : names.size()) - starts[i] - 1};
  }
  void sort() {
    std::vector<uint32_t> order(starts.size());
    for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return name(a) < name(b); });
    std::string sorted;
    sorted.reserve(names.size());
    std::vector<uint32_t> s2;
    s2.reserve(starts.size());
    for (uint32_t i : order) {
      s2.push_back(static_cast<uint32_t>(sorted.size()));
      sorted.append(name(i));
      sorted.push_back('\0');
    }
    names = std::move(sorted);
    starts = std::move(s2);
  }
};

// A folder entry's kind: readdir's d_type, or stat() when the file system does not say or the
// entry is a symlink (which is followed, as os.walk(followlinks=True) and is_directory() do).
enum class Kind { kFolder, kLinkedFolder, kOther };
Kind kind_of(const std::string& dir, const dirent* e) {
  if (e->d_type == DT_DIR) return Kind::kFolder;
  if (e->d_type != DT_LNK && e->d_type != DT_UNKNOWN) return Kind::kOther;
  const std::string full = join(dir, e->d_name);
  struct stat st {};
  if (::stat(full.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return Kind::kOther;
  if (e->d_type == DT_LNK) return Kind::kLinkedFolder;
  struct stat lst {};
  return ::lstat(full.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode) ? Kind::kLinkedFolder : Kind::kFolder;
}

// Calls `entry(name, kind)` for each entry of `dir` but "." and "..". Throws naming the folder
// when it cannot be opened or read.
template <class F>
void for_each_entry(const std::string& dir, F&& entry) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) throw cannot_list(dir, errno);
  struct Closer {
    DIR* d;
    ~Closer() { ::closedir(d); }
  } closer{d};
  for (;;) {
    errno = 0;
    const dirent* e = ::readdir(d);
    if (e == nullptr) {
      if (errno != 0) throw cannot_list(dir, errno);
      break;
    }
    if (e->d_name[0] == '.' && (e->d_name[1] == '\0' || (e->d_name[1] == '.' && e->d_name[2] == '\0'))) continue;
    entry(std::string_view(e->d_name), e);
  }
}

// The recursive walk of one folder (torchvision's os.walk(followlinks=True) of a class folder).
struct Walk {
  const std::vector<std::string>& extensions;
  bool follow_symlinks;
  std::vector<detail::Dependency>* deps;  // every folder read, for the index cache; may be null
  std::set<std::pair<dev_t, ino_t>> seen;  // the folders from the walk's root down to the current one
  std::vector<Group> groups;

  void folder(const std::string& dir) {
    Group g;
    g.dir = dir;
    std::vector<std::string> subdirs;
    for_each_entry(dir, [&](std::string_view name, const dirent* e) {
      const Kind k = kind_of(dir, e);
      if (k != Kind::kOther) {
        if (follow_symlinks || k == Kind::kFolder) subdirs.push_back(join(dir, name));
        return;
      }
      if (!extensions.empty() && !has_extension(name, extensions)) return;
      g.starts.push_back(static_cast<uint32_t>(g.names.size()));
      g.names.append(name);
      g.names.push_back('\0');
    });
    if (g.count() > 0) groups.push_back(std::move(g));
    for (const std::string& sub : subdirs) {
      struct stat st {};
      if (::stat(sub.c_str(), &st) != 0) throw cannot_list(sub, errno);
      const std::pair<dev_t, ino_t> id{st.st_dev, st.st_ino};
      if (seen.count(id)) {
        gpufeed::log()->warn("{}: links back to a folder above it (a symlink loop): not descended into", sub);
        continue;
      }
      if (deps) deps->push_back(detail::dependency_of(sub, st));
      seen.insert(id);
      folder(sub);
      seen.erase(id);
    }
  }

  // Starts at `dir` (stat'ed by the caller) and leaves the groups in torchvision's order: folders
  // sorted by path, file names sorted within each (byte order).
  void run(const std::string& dir, const struct stat& st) {
    seen.emplace(st.st_dev, st.st_ino);
    folder(dir);
    std::sort(groups.begin(), groups.end(), [](const Group& a, const Group& b) { return a.dir < b.dir; });
    for (Group& g : groups) g.sort();
  }
};

std::string options_key(const ImageFolderOptions& o) {
  std::string k = o.follow_symlinks ? "follow;" : "nofollow;";
  for (const auto& e : o.extensions) k += e + ";";
  return k;
}

// Reads the classes and the table from `cache` when it matches `key`; else leaves them empty.
// `prefix` is the text the table's paths start with as this spelling of the dataset builds them
// (the root and a '/'); a cache written through another spelling ("data" vs "/abs/data") has its
// paths rebased onto it, so that they read as a fresh listing's would.
bool read_cached_list(const std::optional<fs::path>& cache, const detail::CacheKey& key, const std::string& prefix,
                      std::vector<std::string>& classes, SampleTable& table) {
  std::string written_prefix;
  if (cache && detail::read_cache(*cache, key, [&](detail::CacheReader& in) {
        written_prefix = in.string();
        classes = in.strings();
        detail::read_table(in, table);
      })) {
    detail::rebase_paths(table, written_prefix, prefix);
    return true;
  }
  classes.clear();
  table = SampleTable();
  return false;
}

void write_cached_list(const std::optional<fs::path>& cache, const detail::CacheKey& key, const std::string& prefix,
                       const std::vector<detail::Dependency>& deps, int64_t started,
                       const std::vector<std::string>& classes, const SampleTable& table) {
  if (!cache) return;
  detail::write_cache(*cache, key, deps, started, [&](detail::CacheWriter& out) {
    out.section(prefix);
    out.strings(classes);
    detail::write_table(out, table);
  });
}

std::vector<std::string> lowered(std::vector<std::string> exts) {
  for (std::string& e : exts)
    std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return exts;
}

}  // namespace

// ---- SampleRef

void SampleRef::source(std::string& out) const {
  out.assign(path);
  if (!member.empty()) {
    out.push_back(':');
    out.append(member);
  }
}

std::string SampleRef::source() const {
  std::string s;
  source(s);
  return s;
}

namespace {

template <class Bytes>
void read_sample_into(const SampleRef& s, Bytes& out) {
  if (s.size < 0) {
    decode::read_file(s.path.data(), out);  // NUL-terminated in the dataset's table
    return;
  }
  const auto fail = [&](const std::string& reason) {
    throw decode::DecodeError(decode::ErrorKind::kIo, s.source(), reason);
  };
  const auto os_reason = [](int err) { return std::error_code(err, std::generic_category()).message(); };
  const UniqueFd fd(::open(s.path.data(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!fd) fail("cannot open " + std::string(s.path) + ": " + os_reason(errno));
  out.resize(static_cast<size_t>(s.size));
  const PreadResult got = pread_full(fd.get(), out.data(), out.size(), s.offset);
  if (got.error != 0) fail("read failed: " + os_reason(got.error));
  if (got.bytes < out.size())
    fail("the archive ends " + std::to_string(s.size - static_cast<int64_t>(got.bytes)) +
         " bytes before the member does (cut short since it was indexed)");
}

}  // namespace

void read_sample(const SampleRef& s, std::vector<uint8_t>& out) { read_sample_into(s, out); }
void read_sample(const SampleRef& s, decode::ByteBuffer& out) { read_sample_into(s, out); }

// ---- SampleTable

void SampleTable::add(std::string_view path, int64_t label) { add_joined({}, path, label); }

void SampleTable::add_joined(std::string_view dir, std::string_view name, int64_t label) {
  if (label < 0 || label > INT32_MAX)
    throw std::invalid_argument("sample label " + std::to_string(label) + " is outside 0.." + std::to_string(INT32_MAX));
  if (dir.find('\0') != std::string_view::npos || name.find('\0') != std::string_view::npos)
    throw std::invalid_argument("a sample path holds a NUL byte");
  offsets_.push_back(arena_.size());
  arena_.insert(arena_.end(), dir.begin(), dir.end());
  if (!dir.empty() && dir.back() != '/') arena_.push_back('/');
  arena_.insert(arena_.end(), name.begin(), name.end());
  arena_.push_back('\0');
  labels_.push_back(static_cast<int32_t>(label));
}

void SampleTable::reserve(int64_t samples, int64_t path_bytes) {
  arena_.reserve(static_cast<size_t>(path_bytes + samples));
  offsets_.reserve(static_cast<size_t>(samples));
  labels_.reserve(static_cast<size_t>(samples));
}

void SampleTable::shrink_to_fit() {
  arena_.shrink_to_fit();
  offsets_.shrink_to_fit();
  labels_.shrink_to_fit();
}

void SampleTable::assign(std::vector<char> arena, std::vector<uint64_t> offsets, std::vector<int32_t> labels) {
  if (offsets.size() != labels.size()) throw std::runtime_error("sample table: offsets and labels differ in count");
  uint64_t expect = 0;
  for (size_t i = 0; i < offsets.size(); ++i) {
    const uint64_t end = i + 1 < offsets.size() ? offsets[i + 1] : arena.size();
    if (offsets[i] != expect || end <= offsets[i] || end > arena.size() || arena[end - 1] != '\0' ||
        std::memchr(arena.data() + offsets[i], '\0', end - offsets[i] - 1) != nullptr || labels[i] < 0)
      throw std::runtime_error("sample table: entry " + std::to_string(i) + " is inconsistent");
    expect = end;
  }
  if (expect != arena.size()) throw std::runtime_error("sample table: path bytes after the last entry");
  arena_ = std::move(arena);
  offsets_ = std::move(offsets);
  labels_ = std::move(labels);
}

SampleRef SampleList::at(int64_t i) const {
  if (i < 0 || i >= size()) {
    throw std::out_of_range("dataset index " + std::to_string(i) + " out of range [0, " +
                            std::to_string(size()) + ")");
  }
  SampleRef r;
  r.path = table_.path(i);
  r.label = table_.label(i);
  return r;
}

// ---- listing

const std::vector<std::string>& torchvision_image_extensions() {
  static const std::vector<std::string> exts = {".jpg", ".jpeg", ".png", ".ppm", ".bmp",
                                                ".pgm", ".tif", ".tiff", ".webp"};
  return exts;
}

const std::vector<std::string>& default_image_extensions() {
  static const std::vector<std::string> exts = [] {
    std::vector<std::string> e = torchvision_image_extensions();
    e.push_back(".gif");
    return e;
  }();
  return exts;
}

std::vector<fs::path> list_files(const fs::path& dir, const std::vector<std::string>& extensions,
                                bool follow_symlinks) {
  const std::vector<std::string> exts = lowered(extensions);
  Walk w{exts, follow_symlinks, nullptr, {}, {}};
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) throw cannot_list(dir.string(), errno);
  w.run(dir.string(), st);
  std::vector<fs::path> out;
  for (const Group& g : w.groups)
    for (size_t i = 0; i < g.count(); ++i) out.push_back(fs::path(g.dir) / g.name(i));
  return out;
}

namespace {

// The class folders of an ImageFolder's root (every entry that is a folder, or a link to one),
// sorted. Throws std::runtime_error naming the root when it cannot be listed or holds none.
std::vector<std::string> list_classes(const std::string& root_text) {
  std::vector<std::string> classes;
  try {
    for_each_entry(root_text, [&](std::string_view name, const dirent* e) {
      if (kind_of(root_text, e) != Kind::kOther) classes.emplace_back(name);
    });
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string("ImageFolder: ") + e.what());
  }
  std::sort(classes.begin(), classes.end());
  if (classes.empty()) {
    throw std::runtime_error("ImageFolder: couldn't find any class folder in " + root_text);
  }
  return classes;
}

// Each class folder's walk, indexed by label: its groups of files, the folders it read (for the
// index cache), and what it threw, if anything.
struct ClassListings {
  std::vector<std::vector<Group>> groups;
  std::vector<std::vector<detail::Dependency>> deps;
  std::vector<std::exception_ptr> errors;
};

// Walks every class folder on up to 8 threads: folders are independent, and most of the time
// is the kernel's getdents. A class that fails (or holds no accepted file) has its error kept.
ClassListings walk_classes(const fs::path& root, const std::vector<std::string>& classes,
                           const std::vector<std::string>& exts, bool follow_symlinks) {
  const size_t n = classes.size();
  ClassListings out{std::vector<std::vector<Group>>(n), std::vector<std::vector<detail::Dependency>>(n),
                    std::vector<std::exception_ptr>(n)};
  std::atomic<size_t> next{0};
  const auto work = [&] {
    for (size_t label; (label = next.fetch_add(1)) < n;) {
      try {
        const std::string dir = (root / classes[label]).string();
        struct stat st {};
        if (::stat(dir.c_str(), &st) != 0) throw cannot_list(dir, errno);
        out.deps[label].push_back(detail::dependency_of(dir, st));
        Walk w{exts, follow_symlinks, &out.deps[label], {}, {}};
        w.run(dir, st);
        if (w.groups.empty()) {
          throw std::runtime_error("found no valid file for the class " + classes[label] + " in " + dir);
        }
        out.groups[label] = std::move(w.groups);
      } catch (...) {
        out.errors[label] = std::current_exception();
      }
    }
  };
  const size_t threads = std::min<size_t>({8, static_cast<size_t>(gpufeed::cpu_budget()), n});
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  return out;
}

// Fills `table` with every class's files, label by label, at its exact size (no growth
// copies), freeing each class's groups once copied.
void fill_table(std::vector<std::vector<Group>>& per_class, SampleTable& table) {
  int64_t samples = 0, path_bytes = 0;
  for (const std::vector<Group>& groups : per_class) {
    for (const Group& g : groups) {
      samples += static_cast<int64_t>(g.count());
      path_bytes += static_cast<int64_t>(g.names.size() - g.count()) + static_cast<int64_t>((g.dir.size() + 1) * g.count());
    }
  }
  table.reserve(samples, path_bytes);
  for (size_t label = 0; label < per_class.size(); ++label) {
    for (const Group& g : per_class[label])
      for (size_t i = 0; i < g.count(); ++i) table.add_joined(g.dir, g.name(i), static_cast<int64_t>(label));
    std::vector<Group>().swap(per_class[label]);
  }
}

}  // namespace

ImageFolder::ImageFolder(const fs::path& root, ImageFolderOptions options) : root_(root) {
  struct stat root_st {};
  if (::stat(root.c_str(), &root_st) != 0 || !S_ISDIR(root_st.st_mode)) {
    throw std::runtime_error("ImageFolder: " + root.string() + " is not a folder");
  }
  const int64_t started = detail::wall_clock_ns();
  const std::vector<std::string> exts = lowered(options.extensions);
  // Keyed by the folder's canonical path, whatever its spelling; the sample paths are built from
  // the spelling's text, `prefix` (root / class / ...).
  const detail::CacheKey key{"ImageFolder", detail::canonical_source(root), options_key(options)};
  const std::string prefix = (root / "").string();
  const auto cache = detail::cache_file(options.index_cache, key.kind, root);
  if ((from_cache_ = read_cached_list(cache, key, prefix, classes_, table_))) return;

  std::vector<detail::Dependency> deps{detail::dependency_of(root.string(), root_st)};
  classes_ = list_classes(root.string());
  // Every class is listed first, then the table is filled at its exact size.
  ClassListings listed = walk_classes(root, classes_, exts, options.follow_symlinks);
  for (size_t label = 0; label < classes_.size(); ++label) {
    if (listed.errors[label]) {  // the first failing class in label order, whatever the threads did
      try {
        std::rethrow_exception(listed.errors[label]);
      } catch (const std::runtime_error& e) {
        throw std::runtime_error(std::string("ImageFolder: ") + e.what());
      }
    }
    deps.insert(deps.end(), listed.deps[label].begin(), listed.deps[label].end());
  }
  fill_table(listed.groups, table_);
  write_cached_list(cache, key, prefix, deps, started, classes_, table_);
}

// ---- file lists

namespace {

// Calls `line(text, lineno)` for each line of the file (without its '\n'), reading it in blocks
// so that a large list is never held whole in memory.
template <class F>
void for_each_line(int fd, const fs::path& file, F&& line) {
  if (::lseek(fd, 0, SEEK_SET) != 0) throw std::runtime_error("FileList: cannot read " + file.string());
  std::string buf, carry;
  buf.resize(1 << 20);
  int64_t lineno = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw std::runtime_error("FileList: cannot read " + file.string() + ": " +
                               std::error_code(errno, std::generic_category()).message());
    if (n == 0) break;
    std::string_view block(buf.data(), static_cast<size_t>(n));
    for (;;) {
      const size_t nl = block.find('\n');
      if (nl == std::string_view::npos) {
        carry.append(block);
        break;
      }
      if (!carry.empty()) {
        carry.append(block.substr(0, nl));
        line(std::string_view(carry), ++lineno);
        carry.clear();
      } else {
        line(block.substr(0, nl), ++lineno);
      }
      block.remove_prefix(nl + 1);
    }
  }
  if (!carry.empty()) line(std::string_view(carry), ++lineno);
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

/// The encoding a byte-order mark at the start of `head` announces, or nullptr for none / UTF-8.
/// UTF-32 LE is tested before UTF-16 LE, whose mark is its prefix.
const char* foreign_encoding(std::string_view head, std::string_view& mark) {
  static constexpr std::pair<std::string_view, const char*> kMarks[] = {
      {std::string_view("\xFF\xFE\x00\x00", 4), "UTF-32 little-endian"},
      {std::string_view("\x00\x00\xFE\xFF", 4), "UTF-32 big-endian"},
      {"\xFF\xFE", "UTF-16 little-endian"},
      {"\xFE\xFF", "UTF-16 big-endian"},
  };
  for (const auto& [bytes, name] : kMarks) {
    if (head.substr(0, bytes.size()) == bytes) {
      mark = bytes;
      return name;
    }
  }
  return nullptr;
}

std::string hex_bytes(std::string_view bytes) {
  std::string out;
  for (const unsigned char c : bytes) {
    static constexpr char kHex[] = "0123456789ABCDEF";
    if (!out.empty()) out += ' ';
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

/// Why `p` cannot be read as a sample ("" when it can): what read_file would say at load time.
std::string unreadable_reason(const char* p) {
  struct stat st {};
  // std::error_code's message is strerror_r's: these run on several threads at once.
  if (::stat(p, &st) != 0) return std::generic_category().message(errno);
  if (!S_ISREG(st.st_mode)) return S_ISDIR(st.st_mode) ? "is a folder, not a file" : "not a regular file";
  if (::access(p, R_OK) != 0) return std::generic_category().message(errno);
  return {};
}

}  // namespace

namespace {

// One sample line of a file list: the path as written and its label.
struct ListedSample {
  std::string_view path;
  int64_t label = 0;
};

// Line `lineno` of `list_file` read as "<path> <label>": nullopt for a blank or '#' line. Throws
// std::runtime_error naming the file and line for anything else that is not such a line (and,
// on line 1, for a UTF-16 or UTF-32 byte-order mark).
std::optional<ListedSample> parse_list_line(std::string_view line, int64_t lineno, const fs::path& list_file) {
  if (lineno == 1) {
    // A Windows editor's UTF-8 byte-order mark would otherwise become part of the first path
    // (invisible in a terminal, "cannot open" only when that sample is loaded).
    if (line.substr(0, 3) == "\xEF\xBB\xBF") line.remove_prefix(3);
    std::string_view mark;
    if (const char* encoding = foreign_encoding(line, mark)) {
      throw std::runtime_error("FileList: " + list_file.string() + " is " + encoding +
                               " text (it starts with the byte-order mark " + hex_bytes(mark) +
                               "); file lists are read as UTF-8: save it as UTF-8, e.g. iconv -f " +
                               std::string(encoding).substr(0, 6) + " -t UTF-8");
    }
  }
  if (line.find('\0') != std::string_view::npos) {
    throw std::runtime_error("FileList: " + list_file.string() + ":" + std::to_string(lineno) +
                             ": the line contains NUL bytes: is the list UTF-16 or UTF-32 text "
                             "without a byte-order mark? File lists are read as UTF-8: save it "
                             "as UTF-8");
  }
  while (!line.empty() && is_space(line.back())) line.remove_suffix(1);
  while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
  if (line.empty() || line.front() == '#') return std::nullopt;
  const size_t split = line.find_last_of(" \t");
  const auto where = [&] { return list_file.string() + ":" + std::to_string(lineno); };
  if (split == std::string_view::npos) {
    throw std::runtime_error("FileList: " + where() + ": expected '<path> <label>', got '" + std::string(line) + "'");
  }
  std::string_view path_part = line.substr(0, split);
  while (!path_part.empty() && is_space(path_part.back())) path_part.remove_suffix(1);
  const std::string_view label_part = line.substr(split + 1);
  int64_t label = 0;
  const auto [end, ec] = std::from_chars(label_part.data(), label_part.data() + label_part.size(), label);
  if (ec != std::errc() || end != label_part.data() + label_part.size()) {
    throw std::runtime_error("FileList: " + where() + ": label '" + std::string(label_part) + "' is not an integer");
  }
  if (label < 0) throw std::runtime_error("FileList: " + where() + ": negative label " + std::string(label_part));
  if (label > kMaxLabel)
    throw std::runtime_error("FileList: " + where() + ": label " + std::string(label_part) +
                             " is above the largest class index, " + std::to_string(kMaxLabel) +
                             " (2^24-1): the class count is the largest label + 1");
  return ListedSample{path_part, label};
}

// Every listed file, checked in parallel (a list of a million files on a network file system is
// a million round trips); throws std::runtime_error naming the first bad line (`line_of`: each
// sample's line number) and counting the rest.
void check_listed_files(const SampleTable& table, const std::vector<int64_t>& line_of, const fs::path& list_file) {
  std::vector<std::string> reasons(static_cast<size_t>(table.size()));
  detail::parallel_for_ordered(tbb::blocked_range<size_t>(0, reasons.size(), 64), [&](const tbb::blocked_range<size_t>& r) {
    for (size_t i = r.begin(); i != r.end(); ++i)
      reasons[i] = unreadable_reason(table.path(static_cast<int64_t>(i)).data());
  });
  const auto bad = [](const std::string& r) { return !r.empty(); };
  const auto first = std::find_if(reasons.begin(), reasons.end(), bad);
  if (first == reasons.end()) return;
  const auto i = static_cast<size_t>(first - reasons.begin());
  const auto others = std::count_if(first + 1, reasons.end(), bad);
  std::string message = "FileList: " + list_file.string() + ":" + std::to_string(line_of[i]) + ": cannot read " +
                        std::string(table.path(static_cast<int64_t>(i))) + ": " + *first;
  if (others > 0)
    message += " (and " + std::to_string(others) + " more of the " + std::to_string(reasons.size()) +
               " listed files)";
  throw std::runtime_error(message);
}

}  // namespace

FileList::FileList(const fs::path& list_file, const fs::path& root, const DataOptions& data_options,
                   FileListOptions options) {
  const UniqueFd fd(::open(list_file.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) throw std::runtime_error("FileList: cannot open " + list_file.string());
  struct stat st {};
  const int64_t started = detail::wall_clock_ns();
  if (::fstat(fd.get(), &st) != 0) throw std::runtime_error("FileList: cannot stat " + list_file.string());
  // Keyed by the canonical paths of the list and of the root relative lines are joined to; the
  // paths are built from the root's text, `prefix` (relative lines only when it is empty).
  const detail::CacheKey key{"FileList", detail::canonical_source(list_file), detail::canonical_source(root)};
  const std::string root_text = root.string();
  const std::string prefix = root_text.empty() ? std::string() : root_text + "/";
  const auto cache = detail::cache_file(data_options.index_cache, key.kind, list_file);
  if ((from_cache_ = read_cached_list(cache, key, prefix, classes_, table_))) return;

  int64_t samples = 0, path_bytes = 0, max_label = -1;
  std::vector<int64_t> line_of;  // line number of each sample, for the file check's message
  // Two passes: count (and check every line), then fill the table at its exact size.
  for (int pass = 0; pass < 2; ++pass) {
    for_each_line(fd.get(), list_file, [&](std::string_view line, int64_t lineno) {
      const std::optional<ListedSample> sample = parse_list_line(line, lineno, list_file);
      if (!sample) return;
      const bool absolute = sample->path.front() == '/';
      if (pass == 0) {
        ++samples;
        path_bytes += static_cast<int64_t>(sample->path.size() + (absolute ? 0 : root_text.size() + 1));
        max_label = std::max(max_label, sample->label);
      } else {
        table_.add_joined(absolute ? std::string_view() : std::string_view(root_text), sample->path, sample->label);
        if (options.check_files) line_of.push_back(lineno);
      }
    });
    if (pass == 0) {
      if (samples == 0) throw std::runtime_error("FileList: " + list_file.string() + " lists no samples");
      table_.reserve(samples, path_bytes);
    }
  }
  for (int64_t c = 0; c <= max_label; ++c) classes_.push_back(std::to_string(c));
  // A list read back from the index cache is not checked again (the cache start stays one read).
  if (options.check_files) check_listed_files(table_, line_of, list_file);
  write_cached_list(cache, key, prefix, {detail::dependency_of(list_file.string(), st)}, started, classes_, table_);
}

FlatFolder::FlatFolder(const fs::path& root, ImageFolderOptions options) {
  const std::vector<std::string> exts = lowered(options.extensions);
  const std::string dir = root.string();
  std::vector<std::string> names;
  try {
    for_each_entry(dir, [&](std::string_view name, const dirent* e) {
      if (e->d_type == DT_DIR) return;
      struct stat st {};
      const bool regular = e->d_type == DT_REG || (::stat(join(dir, name).c_str(), &st) == 0 && S_ISREG(st.st_mode));
      if (regular && has_extension(name, exts)) names.emplace_back(name);
    });
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string("FlatFolder: ") + e.what());
  }
  if (names.empty()) throw std::runtime_error("FlatFolder: no image file in " + root.string());
  std::sort(names.begin(), names.end());
  auto class_of = [](const std::string& name) {
    const size_t us = name.find('_');
    return us != std::string::npos ? name.substr(0, us) : fs::path(name).stem().string();
  };
  for (const auto& n : names) classes_.push_back(class_of(n));
  std::sort(classes_.begin(), classes_.end());
  classes_.erase(std::unique(classes_.begin(), classes_.end()), classes_.end());
  for (const auto& n : names) {
    const auto it = std::lower_bound(classes_.begin(), classes_.end(), class_of(n));
    table_.add_joined(dir, n, static_cast<int64_t>(it - classes_.begin()));
  }
  table_.shrink_to_fit();
}

std::shared_ptr<Dataset> open_dataset(const fs::path& path, const DataOptions& data_options) {
  return open_dataset(path, data_options, default_image_extensions());
}

std::shared_ptr<Dataset> open_dataset(const fs::path& path, const DataOptions& data_options,
                                      const std::vector<std::string>& extensions) {
  if (is_url(path.native())) check_url(path.native());
  if (std::vector<std::string> urls = remote_shard_urls(path.native()); !urls.empty()) {
    return std::make_shared<RemoteShards>(std::move(urls), path.native(), data_options);
  }
  if (auto shards = shard_paths(path)) return std::make_shared<TarShards>(std::move(*shards), path, data_options);
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) {
    return std::make_shared<FileList>(path, path.parent_path(), data_options);
  }
  if (!fs::is_directory(path, ec)) {
    throw std::runtime_error("open_dataset: " + path.string() + " is neither a file list nor a folder");
  }
  for (const auto& entry : fs::directory_iterator(path)) {
    std::error_code sec;
    if (entry.is_directory(sec)) {
      ImageFolderOptions o;
      o.index_cache = data_options.index_cache;
      o.extensions = extensions;
      return std::make_shared<ImageFolder>(path, o);
    }
  }
  ImageFolderOptions flat;
  flat.extensions = extensions;
  return std::make_shared<FlatFolder>(path, flat);
}

}  // namespace gpufeed::datasets
