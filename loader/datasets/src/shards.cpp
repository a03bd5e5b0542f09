#include "gpufeed/datasets/shards.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>
#include <fstream>
#include <system_error>
#include <unordered_set>

#include <fmt/format.h>

#include "gpufeed/unique_fd.h"
#include "index_cache.h"

namespace gpufeed::datasets {
namespace fs = std::filesystem;
namespace {

constexpr int64_t kBlock = 512;
constexpr int64_t kMaxRecord = 1 << 20;  // pax and GNU long-name records
constexpr int64_t kMaxLabelBytes = 64;

// Names from hostile headers are printed escaped: no control bytes reach a terminal or log.
std::string printable(std::string_view s) {
  std::string out;
  for (const char c : s.substr(0, 300)) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      out += fmt::format("\\x{:02x}", u);
    } else {
      out.push_back(c);
    }
  }
  if (s.size() > 300) out += "...";
  return out;
}

[[noreturn]] void fail(const std::string& shard, std::string_view member, const std::string& why) {
  if (member.empty()) throw ShardError(fmt::format("shard {}: {}", shard, why));
  throw ShardError(fmt::format("shard {}: member '{}': {}", shard, printable(member), why));
}

std::string field_text(const uint8_t* f, size_t n) {
  size_t len = 0;
  while (len < n && f[len] != 0) ++len;
  return {reinterpret_cast<const char*>(f), len};
}

// A numeric header field: octal digits padded with spaces/NULs (empty is 0, as tarfile reads
// it), or GNU base-256 when the first byte's high bit is set. nullopt when it is neither.
std::optional<int64_t> parse_number(const uint8_t* f, size_t n) {
  if (f[0] & 0x80) {
    if (f[0] != 0x80) return std::nullopt;  // negative (0xff) or malformed
    uint64_t v = 0;
    for (size_t i = 1; i < n; ++i) {
      if (v >> 55) return std::nullopt;  // over 2^63
      v = (v << 8) | f[i];
    }
    return static_cast<int64_t>(v);
  }
  size_t i = 0;
  while (i < n && (f[i] == ' ' || f[i] == 0)) ++i;
  int64_t v = 0;
  for (; i < n && f[i] >= '0' && f[i] <= '7'; ++i) v = v * 8 + (f[i] - '0');
  for (; i < n; ++i)
    if (f[i] != ' ' && f[i] != 0) return std::nullopt;
  return v;
}

std::string quoted_field(const uint8_t* f, size_t n) {
  std::string out(1, '\'');
  out += printable(std::string_view(reinterpret_cast<const char*>(f), n));
  out += '\'';
  return out;
}

// A header's member name: its name field, after ustar's prefix field and a '/' when it has one.
std::string header_name(const uint8_t* h) {
  std::string name = field_text(h, 100);
  if (std::memcmp(h + 257, "ustar", 5) == 0) {
    const std::string prefix = field_text(h + 345, 155);
    if (!prefix.empty()) {
      std::string full;
      full.reserve(prefix.size() + 1 + name.size());
      full.append(prefix).append(1, '/').append(name);
      name = std::move(full);
    }
  }
  return name;
}

// The header block at `pos` against its checksum field, which tar writers sum with bytes
// unsigned (POSIX) or signed (some historic ones): either is accepted, as Python's tarfile does.
void check_checksum(const uint8_t* h, const std::string& shard, const std::string& name, int64_t pos) {
  const std::optional<int64_t> sum = parse_number(h + 148, 8);
  if (!sum) fail(shard, name, "checksum field " + quoted_field(h + 148, 8) + " is not an octal number");
  int64_t unsigned_sum = 0, signed_sum = 0;
  for (int64_t i = 0; i < kBlock; ++i) {
    const bool in_field = i >= 148 && i < 156;
    unsigned_sum += in_field ? ' ' : h[i];
    signed_sum += in_field ? ' ' : static_cast<int8_t>(h[i]);
  }
  if (*sum != unsigned_sum && *sum != signed_sum)
    fail(shard, name, fmt::format("header checksum mismatch at offset {} (not a tar archive, or corrupt)", pos));
}

void check_name(const std::string& shard, const std::string& name) {
  if (name.empty()) fail(shard, "", "a member has an empty name");
  if (name.front() == '/') fail(shard, name, "absolute member name (refused: names are never used as paths)");
  size_t start = 0;
  while (start <= name.size()) {
    const size_t end = std::min(name.find('/', start), name.size());
    if (name.compare(start, end - start, "..") == 0 && end - start == 2)
      fail(shard, name, "'..' in the member name (refused: names are never used as paths)");
    start = end + 1;
  }
}

void read_exact(const ReadAt& read, int64_t offset, void* buf, size_t n, const std::string& shard,
                std::string_view member) {
  if (read(offset, buf, n) != n)
    fail(shard, member, fmt::format("truncated archive: {} bytes at offset {} could not be read", n, offset));
}

// pax extended header records: "<len> <key>=<value>\n".
void parse_pax(const std::string& shard, const std::string& data, std::optional<std::string>& path,
               int64_t& size) {
  size_t pos = 0;
  while (pos < data.size()) {
    if (data[pos] == '\0') break;  // padding
    size_t len = 0;
    const auto [p, ec] = std::from_chars(data.data() + pos, data.data() + data.size(), len);
    if (ec != std::errc() || p == data.data() + data.size() || *p != ' ' || len < 5 || len > data.size() - pos ||
        data[pos + len - 1] != '\n')
      fail(shard, "", fmt::format("malformed pax record at byte {} of an extended header", pos));
    const std::string_view rec(p + 1, data.data() + pos + len - 1 - (p + 1));
    const size_t eq = rec.find('=');
    if (eq == std::string_view::npos) fail(shard, "", "a pax record without '='");
    const std::string_view key = rec.substr(0, eq), value = rec.substr(eq + 1);
    if (key == "path") {
      if (value.find('\0') != std::string_view::npos) fail(shard, "", "a pax path holding a NUL byte");
      path = std::string(value);
    } else if (key == "size") {
      int64_t v = 0;
      const auto [q, ec2] = std::from_chars(value.data(), value.data() + value.size(), v);
      if (ec2 != std::errc() || q != value.data() + value.size() || v < 0)
        fail(shard, path.value_or(""), fmt::format("pax size '{}' is not a number", printable(value)));
      size = v;
    }
    pos += len;
  }
}

bool is_image_extension(std::string_view ext) {
  static const char* const kImages[] = {"jpg", "jpeg", "png", "webp", "ppm", "pgm", "bmp", "tif", "tiff", "gif"};
  return std::any_of(std::begin(kImages), std::end(kImages), [&](const char* e) { return ext == e; });
}

constexpr const char* kImageNames = "key.jpg|jpeg|png|webp|ppm|pgm|bmp|tif|tiff|gif";

// A key group without an image member. webdataset yields such a group as a sample without an
// image, so it is an error naming a member and why, never a sample dropped without a word; when
// an extension holds a '.' and ends like an image (a dot in the key: "22.05.png" is key "22" with
// extension "05.png"), the message explains webdataset's key rule.
[[noreturn]] void no_image(const std::string& shard, const std::string& key,
                           const std::vector<std::pair<std::string, const TarMember*>>& parts) {
  std::string exts;
  for (const auto& part : parts) exts += fmt::format("{}'{}'", exts.empty() ? "" : ", ", printable(part.first));
  for (const auto& [ext, m] : parts) {
    const size_t last = ext.rfind('.');
    if (last == std::string::npos || !is_image_extension(std::string_view(ext).substr(last + 1))) continue;
    // The name with the dots of its last component made '_', but the image extension's:
    // "x/22.05.png" -> "x/22_05.png".
    const std::string tail = m->name.substr(m->name.size() - (ext.size() - last));  // ".png"
    std::string renamed = m->name.substr(0, m->name.size() - tail.size());
    const size_t slash = renamed.rfind('/');
    std::replace(renamed.begin() + static_cast<std::ptrdiff_t>(slash == std::string::npos ? 0 : slash + 1),
                 renamed.end(), '.', '_');
    renamed += tail;
    fail(shard, m->name,
         fmt::format("key '{}' has members with the extensions {} but no image extension: webdataset splits a name "
                     "at the first '.' of its last path component, so '{}' is key '{}' with extension '{}'; rename "
                     "the members without dots in the key (e.g. '{}')",
                     printable(key), exts, printable(m->name), printable(key), printable(ext), printable(renamed)));
  }
  for (const auto& [ext, m] : parts)
    if (ext == "cls")
      fail(shard, m->name, fmt::format("a label without an image member beside it (key '{}' has the extensions {} "
                                       "and no {})", printable(key), exts, kImageNames));
  fail(shard, parts.front().second->name,
       fmt::format("key '{}' has members with the extensions {} but no image ({}): webdataset would yield it as a "
                   "sample without an image; every key must be a sample with one image and its .cls label (remove "
                   "these members, or add the image)",
                   printable(key), exts, kImageNames));
}

}  // namespace

std::vector<TarMember> index_tar(const ReadAt& read, int64_t file_size, const std::string& shard) {
  std::vector<TarMember> members;
  std::optional<std::string> long_name, pax_path;
  int64_t pax_size = -1;  // -1: none
  uint8_t h[kBlock];
  int64_t pos = 0;
  for (;;) {
    if (pos == file_size) {
      fail(shard, "", pos == 0 ? std::string("empty file (not a tar archive)")
                               : fmt::format("truncated archive: it ends at offset {} without the "
                                             "end-of-archive block", pos));
    }
    if (file_size - pos < kBlock)
      fail(shard, "", fmt::format("truncated archive: the header at offset {} is cut short ({} of 512 bytes)",
                                  pos, file_size - pos));
    read_exact(read, pos, h, kBlock, shard, "");
    if (std::all_of(h, h + kBlock, [](uint8_t b) { return b == 0; })) break;  // end of archive

    const std::string name = header_name(h);
    check_checksum(h, shard, name, pos);
    const std::optional<int64_t> header_size = parse_number(h + 124, 12);
    if (!header_size) fail(shard, name, "size field " + quoted_field(h + 124, 12) + " is not an octal number");
    const char type = static_cast<char>(h[156]);
    const bool regular = type == '0' || type == '\0' || type == '7';
    const int64_t size = regular && pax_size >= 0 ? pax_size : *header_size;
    const int64_t data = pos + kBlock;
    if (size > file_size - data) {
      fail(shard, regular ? pax_path.value_or(long_name.value_or(name)) : name,
           fmt::format("size {} runs past the end of the archive (data at offset {}, archive {} bytes)", size, data,
                       file_size));
    }
    const auto record = [&]() {
      if (size > kMaxRecord) fail(shard, name, fmt::format("a {}-byte extended header record (over 1 MiB)", size));
      std::string text(static_cast<size_t>(size), '\0');
      read_exact(read, data, text.data(), text.size(), shard, name);
      return text;
    };
    if (type == 'x') {
      parse_pax(shard, record(), pax_path, pax_size);
    } else if (type == 'L') {
      std::string text = record();
      text.resize(std::strlen(text.c_str()));
      long_name = std::move(text);
    } else if (type == 'S') {
      fail(shard, name, "GNU sparse member (not supported)");
    } else if (type != 'g' && type != 'K') {
      if (regular) {
        TarMember m;
        m.name = pax_path ? *pax_path : long_name ? *long_name : name;
        check_name(shard, m.name);
        m.offset = data;
        m.size = size;
        members.push_back(std::move(m));
      }
      // Folders, links, devices and vendor types: skipped, never followed.
      long_name.reset();
      pax_path.reset();
      pax_size = -1;
    }
    pos = data + (size + kBlock - 1) / kBlock * kBlock;
    if (pos > file_size) pos = file_size;  // the last member's padding may be cut: caught above next turn
  }
  return members;
}

std::vector<ShardSample> index_shard(const ReadAt& read, int64_t file_size, const std::string& shard) {
  const std::vector<TarMember> members = index_tar(read, file_size, shard);
  std::vector<ShardSample> out;
  std::unordered_set<std::string> done;  // keys of finished samples
  struct Group {
    std::string key;
    std::vector<std::pair<std::string, const TarMember*>> parts;  // (extension, member)
  } g;
  const auto finish = [&] {
    if (g.parts.empty()) return;
    const TarMember *image = nullptr, *cls = nullptr;
    for (const auto& [ext, m] : g.parts) {
      if (ext == "cls") cls = m;
      if (!is_image_extension(ext)) continue;
      if (image) fail(shard, m->name, fmt::format("a second image for the key '{}' (beside '{}')", printable(g.key), printable(image->name)));
      image = m;
    }
    if (!image) no_image(shard, g.key, g.parts);
    if (image && !cls) fail(shard, image->name, fmt::format("no label: the sample has no '{}.cls' member", printable(g.key)));
    if (image) {
      if (cls->size > kMaxLabelBytes) fail(shard, cls->name, fmt::format("a {}-byte label (a class index is expected)", cls->size));
      char text[kMaxLabelBytes];
      read_exact(read, cls->offset, text, static_cast<size_t>(cls->size), shard, cls->name);
      std::string_view t(text, static_cast<size_t>(cls->size));
      while (!t.empty() && std::isspace(static_cast<unsigned char>(t.front()))) t.remove_prefix(1);
      while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.remove_suffix(1);
      int64_t label = -1;
      const auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), label);
      if (t.empty() || ec != std::errc() || p != t.data() + t.size() || label < 0)
        fail(shard, cls->name, fmt::format("'{}' is not a class index (0..{})", printable(t), kMaxLabel));
      if (label > kMaxLabel)
        fail(shard, cls->name, fmt::format("label {} is above the largest class index, {} (2^24-1): the class "
                                           "count is the largest label + 1", label, kMaxLabel));
      out.push_back({image->name, image->offset, image->size, static_cast<int32_t>(label)});
    }
    done.insert(std::move(g.key));
    g.key.clear();
    g.parts.clear();
  };
  for (const TarMember& m : members) {
    const size_t slash = m.name.rfind('/');
    const std::string_view base = std::string_view(m.name).substr(slash == std::string::npos ? 0 : slash + 1);
    if (slash == std::string::npos && base.size() >= 4 && base.substr(0, 2) == "__" && base.substr(base.size() - 2) == "__")
      continue;  // webdataset's "__key__"-style metadata
    const size_t dot = base.find('.');
    if (dot == std::string_view::npos || dot == 0) continue;  // no key.extension: webdataset skips it
    std::string key = m.name.substr(0, m.name.size() - base.size() + dot);
    std::string ext(base.substr(dot + 1));
    std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (key != g.key || g.parts.empty()) {
      finish();
      if (done.count(key)) fail(shard, m.name, fmt::format("duplicate key '{}': it appeared earlier in the shard", printable(key)));
      g.key = std::move(key);
    }
    for (const auto& part : g.parts)
      if (part.first == ext) fail(shard, m.name, fmt::format("duplicate member: the key already has a '.{}'", printable(ext)));
    g.parts.emplace_back(std::move(ext), &m);
  }
  finish();
  return out;
}

// ---- shard sets

std::vector<int64_t> contiguous_shard_sizes(const std::vector<uint32_t>& shard_of_sample, size_t shards) {
  std::vector<int64_t> sizes(shards, 0);
  uint32_t last = 0;
  for (size_t i = 0; i < shard_of_sample.size(); ++i) {
    const uint32_t s = shard_of_sample[i];
    if (s >= shards || s < last)
      throw std::logic_error(fmt::format("sample {} is in shard {} after shard {} of {}: a shard's samples are not "
                                         "one contiguous run in shard order",
                                         i, s, last, shards));
    last = s;
    ++sizes[s];
  }
  return sizes;
}

std::vector<std::string> expand_braces(const std::string& pattern) {
  const size_t open = pattern.find('{');
  if (open == std::string::npos) {
    if (pattern.find('}') != std::string::npos) throw std::invalid_argument("unbalanced '}' in " + pattern);
    return {pattern};
  }
  const size_t close = pattern.find('}', open);
  if (close == std::string::npos || pattern.find('{', open + 1) < close)
    throw std::invalid_argument("unbalanced '{' in " + pattern);
  const std::string inner = pattern.substr(open + 1, close - open - 1);
  const std::string head = pattern.substr(0, open);
  std::vector<std::string> choices;
  const size_t dots = inner.find("..");
  const auto number = [&](std::string_view s, int64_t& v) {
    const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    return !s.empty() && ec == std::errc() && p == s.data() + s.size();
  };
  int64_t lo = 0, hi = 0;
  if (dots != std::string::npos && number(std::string_view(inner).substr(0, dots), lo) &&
      number(std::string_view(inner).substr(dots + 2), hi)) {
    if (hi < lo) throw std::invalid_argument("reversed range {" + inner + "} in " + pattern);
    if (hi - lo >= 10000000) throw std::invalid_argument("range {" + inner + "} names over 10 million shards");
    const size_t width = inner[0] == '0' ? dots : 0;
    for (int64_t v = lo; v <= hi; ++v) choices.push_back(fmt::format("{:0{}}", v, width));
  } else {
    size_t start = 0;
    for (;;) {
      const size_t comma = inner.find(',', start);
      choices.push_back(inner.substr(start, comma - start));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  const std::vector<std::string> tails = expand_braces(pattern.substr(close + 1));
  if (choices.size() * tails.size() > 10000000) throw std::invalid_argument(pattern + " names over 10 million shards");
  std::vector<std::string> out;
  out.reserve(choices.size() * tails.size());
  for (const std::string& c : choices)
    for (const std::string& t : tails) out.push_back(head + c + t);
  return out;
}

std::optional<std::vector<std::string>> shard_paths(const fs::path& data) {
  const std::string text = data.string();
  const auto ends_with_tar = [](std::string_view s) { return s.size() > 4 && s.substr(s.size() - 4) == ".tar"; };
  const auto must_exist = [](std::vector<std::string> shards) {
    for (const std::string& s : shards) {
      std::error_code ec;
      if (!fs::is_regular_file(s, ec)) throw std::runtime_error("shards: " + s + " does not exist (or is not a file)");
    }
    return shards;
  };
  std::error_code ec;
  if (text.find('{') != std::string::npos && !fs::exists(data, ec)) return must_exist(expand_braces(text));
  if (fs::is_directory(data, ec)) {
    std::vector<std::string> tars;
    for (const auto& e : fs::directory_iterator(data)) {
      std::error_code sec;
      if (e.is_directory(sec)) return std::nullopt;  // class folders: an ImageFolder
      if (ends_with_tar(e.path().filename().string()) && e.is_regular_file(sec)) tars.push_back(e.path().string());
    }
    if (tars.empty()) return std::nullopt;
    std::sort(tars.begin(), tars.end());
    return tars;
  }
  if (!fs::is_regular_file(data, ec)) return std::nullopt;
  if (ends_with_tar(text)) return std::vector<std::string>{text};
  // A list file: shard lists name .tar files; FileLists end their lines with a label.
  std::ifstream in(data);
  std::string line;
  std::vector<std::string> shards;
  const fs::path base = data.parent_path();
  while (std::getline(in, line)) {
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
    const size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos || line[start] == '#') continue;
    line.erase(0, start);
    if (!ends_with_tar(line)) {
      if (shards.empty()) return std::nullopt;
      throw std::runtime_error("shards: " + text + ": '" + line + "' is not a .tar shard");
    }
    shards.push_back(line.front() == '/' || base.empty() ? line : (base / line).string());
  }
  if (shards.empty()) return std::nullopt;
  return must_exist(std::move(shards));
}

// ---- the dataset

namespace {

std::string os_reason(int err) { return std::error_code(err, std::generic_category()).message(); }

// Each shard's identity, for the index cache; throws std::runtime_error naming a shard that
// cannot be stat'ed.
std::vector<detail::Dependency> shard_dependencies(const std::vector<std::string>& shards) {
  std::vector<detail::Dependency> deps;
  for (const std::string& s : shards) {
    struct stat st {};
    if (::stat(s.c_str(), &st) != 0) throw std::runtime_error("shards: cannot open " + s + ": " + os_reason(errno));
    deps.push_back(detail::dependency_of(s, st));
  }
  return deps;
}

// index_shard over the file at `path`, read with pread (a short read is the archive's end, which
// index_shard reports); throws std::runtime_error when it cannot be opened or is not a regular
// file.
std::vector<ShardSample> index_shard_file(const std::string& path) {
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!fd) throw std::runtime_error("shards: cannot open " + path + ": " + os_reason(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) throw std::runtime_error("shards: " + path + " is not a regular file");
  const ReadAt read_at = [&fd](int64_t offset, void* buf, size_t n) -> size_t {
    return pread_full(fd.get(), buf, n, offset).bytes;
  };
  return index_shard(read_at, static_cast<int64_t>(st.st_size), path);
}

}  // namespace

TarShards::TarShards(std::vector<std::string> shards, const fs::path& source, const DataOptions& data_options)
    : shards_(std::move(shards)) {
  if (shards_.empty()) throw std::runtime_error("shards: " + source.string() + " names no shard");
  const int64_t started = detail::wall_clock_ns();
  const std::vector<detail::Dependency> deps = shard_dependencies(shards_);
  // Keyed by canonical paths: the same shards however they are spelled (the cache holds no path).
  std::string shard_list;
  for (const std::string& s : shards_) shard_list += detail::canonical_source(s) + '\n';
  const detail::CacheKey key{"TarShards", detail::canonical_source(source), shard_list};
  const auto cache = detail::cache_file(data_options.index_cache, key.kind, source);
  const auto read = [&](detail::CacheReader& in) {
    classes_ = in.strings();
    in.section(shard_);
    in.section(offsets_);
    in.section(sizes_);
    detail::read_table(in, members_);
    const size_t n = static_cast<size_t>(members_.size());
    if (shard_.size() != n || offsets_.size() != n || sizes_.size() != n) throw detail::CacheCorrupt("array sizes differ");
    for (size_t i = 0; i < n; ++i)
      if (shard_[i] >= shards_.size() || offsets_[i] < 0 || sizes_[i] < 0) throw detail::CacheCorrupt("a bad sample record");
  };
  if (cache && detail::read_cache(*cache, key, read)) {
    from_cache_ = true;
    return;
  }
  classes_.clear();
  shard_.clear();
  offsets_.clear();
  sizes_.clear();
  members_ = SampleTable();

  int64_t max_label = -1;
  for (size_t s = 0; s < shards_.size(); ++s) {
    for (ShardSample& x : index_shard_file(shards_[s])) {
      shard_.push_back(static_cast<uint32_t>(s));
      offsets_.push_back(x.offset);
      sizes_.push_back(x.size);
      members_.add(x.member, x.label);
      max_label = std::max<int64_t>(max_label, x.label);
    }
  }
  if (members_.size() == 0) throw std::runtime_error("shards: " + source.string() + " holds no sample (key.jpg + key.cls members)");
  members_.shrink_to_fit();
  shard_.shrink_to_fit();
  offsets_.shrink_to_fit();
  sizes_.shrink_to_fit();
  for (int64_t c = 0; c <= max_label; ++c) classes_.push_back(std::to_string(c));
  if (cache) {
    detail::write_cache(*cache, key, deps, started, [&](detail::CacheWriter& out) {
      out.strings(classes_);
      out.section(shard_);
      out.section(offsets_);
      out.section(sizes_);
      detail::write_table(out, members_);
    });
  }
}

SampleRef TarShards::at(int64_t i) const {
  if (i < 0 || i >= size()) {
    throw std::out_of_range("dataset index " + std::to_string(i) + " out of range [0, " + std::to_string(size()) + ")");
  }
  const auto k = static_cast<size_t>(i);
  SampleRef r;
  r.path = shards_[shard_[k]];
  r.label = members_.label(i);
  r.offset = offsets_[k];
  r.size = sizes_[k];
  r.member = members_.path(i);
  return r;
}

// ---- the shard index beside a shard (format_shard_index) and the shard's trailer

namespace {

bool is_sha256_hex(std::string_view s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

constexpr std::string_view kTrailerMagic = "gpufeed-shard-trailer 1\n";

}  // namespace

std::string format_shard_trailer(const ShardTrailer& trailer) {
  if (!is_sha256_hex(trailer.sha256)) throw std::invalid_argument("shard trailer: '" + trailer.sha256 + "' is not a SHA-256");
  std::string out = fmt::format("{}sha256 {}\ntar_bytes {}\n", kTrailerMagic, trailer.sha256, trailer.tar_bytes);
  out.resize(static_cast<size_t>(kShardTrailerBytes), '\0');
  return out;
}

std::optional<ShardTrailer> parse_shard_trailer(std::string_view tail, int64_t file_size) {
  if (static_cast<int64_t>(tail.size()) < kShardTrailerBytes) return std::nullopt;
  tail = tail.substr(tail.size() - static_cast<size_t>(kShardTrailerBytes));
  if (!tail.starts_with(kTrailerMagic)) return std::nullopt;
  tail.remove_prefix(kTrailerMagic.size());
  if (!tail.starts_with("sha256 ") || tail.size() < 7 + 64 + 1 || tail[7 + 64] != '\n') return std::nullopt;
  ShardTrailer t{.sha256 = std::string(tail.substr(7, 64))};
  if (!is_sha256_hex(t.sha256)) return std::nullopt;
  tail.remove_prefix(7 + 64 + 1);
  if (!tail.starts_with("tar_bytes ")) return std::nullopt;
  tail.remove_prefix(10);
  const auto [p, ec] = std::from_chars(tail.data(), tail.data() + tail.size(), t.tar_bytes);
  if (ec != std::errc() || p == tail.data() + tail.size() || *p != '\n') return std::nullopt;
  if (!std::all_of(p + 1, tail.data() + tail.size(), [](char c) { return c == '\0'; })) return std::nullopt;
  if (t.tar_bytes != file_size - kShardTrailerBytes) return std::nullopt;
  return t;
}

std::string format_shard_index(const ShardIndex& index) {
  std::string out = fmt::format("gpufeed-shard-index 2\nshard_size {}\n", index.shard_size);
  if (!index.sha256.empty()) out += "sha256 " + index.sha256 + "\n";
  if (!index.etag.empty()) out += "etag " + index.etag + "\n";
  out += fmt::format("samples {}\n", index.samples.size());
  for (const ShardSample& x : index.samples) {
    if (x.member.find_first_of("\r\n") != std::string::npos)
      throw std::invalid_argument("shard index: member name '" + x.member + "' holds a line break");
    out += fmt::format("{} {} {} {}\n", x.offset, x.size, x.label, x.member);
  }
  return out;
}

ShardIndex parse_shard_index(std::string_view text, const std::string& source) {
  ShardIndex index;
  size_t at = 0;
  int64_t line_no = 0;
  const auto fail = [&](const std::string& why) -> ShardError {
    return ShardError(fmt::format("shard index {}: line {}: {}", source, line_no, why));
  };
  const auto next_line = [&](std::string_view& line) {
    if (at >= text.size()) return false;
    const size_t end = std::min(text.find('\n', at), text.size());
    line = text.substr(at, end - at);
    at = end + 1;
    ++line_no;
    return true;
  };
  const auto number = [&](std::string_view field, const char* what) {
    int64_t v = 0;
    const auto [p, ec] = std::from_chars(field.data(), field.data() + field.size(), v);
    if (ec != std::errc() || p != field.data() + field.size() || v < 0)
      throw fail(fmt::format("{} '{}' is not a number >= 0", what, field));
    return v;
  };
  std::string_view line;
  if (!next_line(line) || (line != "gpufeed-shard-index 1" && line != "gpufeed-shard-index 2"))
    throw fail("not a gpufeed shard index of version 1 or 2 (the first line should read 'gpufeed-shard-index 2')");
  const bool v2 = line.back() == '2';
  const auto keyed = [&](std::string_view key) {
    if (!next_line(line) || !line.starts_with(key) || line.size() <= key.size() || line[key.size()] != ' ')
      throw fail(fmt::format("expected '{} <value>'", key));
    return line.substr(key.size() + 1);
  };
  index.shard_size = number(keyed("shard_size"), "shard_size");
  std::string_view count_text;
  if (v2 && text.substr(at).starts_with("sha256 ")) {
    index.sha256 = std::string(keyed("sha256"));
    if (!is_sha256_hex(index.sha256)) throw fail("sha256 '" + index.sha256 + "' is not 64 lower-case hex digits");
  }
  if (text.substr(at).starts_with("etag ")) index.etag = std::string(keyed("etag"));
  count_text = keyed("samples");
  const int64_t count = number(count_text, "samples");
  if (count > static_cast<int64_t>(text.size())) throw fail("the sample count exceeds the file");
  index.samples.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    if (!next_line(line)) throw fail(fmt::format("the index ends after {} of its {} samples", i, count));
    ShardSample x;
    std::string_view rest = line;
    const auto field = [&](const char* what) {
      const size_t sp = rest.find(' ');
      if (sp == std::string_view::npos) throw fail(fmt::format("expected '<offset> <size> <label> <member>' ({})", what));
      const std::string_view f = rest.substr(0, sp);
      rest = rest.substr(sp + 1);
      return f;
    };
    x.offset = number(field("offset"), "offset");
    x.size = number(field("size"), "size");
    const int64_t label = number(field("label"), "label");
    if (label > kMaxLabel) throw fail(fmt::format("label {} is above {}", label, kMaxLabel));
    x.label = static_cast<int32_t>(label);
    if (rest.empty()) throw fail("a sample without a member name");
    x.member = std::string(rest);
    if (x.offset > index.shard_size || x.size > index.shard_size - x.offset)
      throw fail(fmt::format("member {} [{}, +{}) runs past the shard's {} bytes", x.member, x.offset, x.size,
                             index.shard_size));
    index.samples.push_back(std::move(x));
  }
  if (next_line(line) && !line.empty()) throw fail("more lines than its sample count");
  return index;
}

}  // namespace gpufeed::datasets
