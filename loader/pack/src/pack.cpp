// `gpufeed pack`: datasets written as WebDataset tar shards (gpufeed/pack/pack.h). Workers
// decode/resize/encode one chunk of samples in parallel; the calling thread then writes that
// chunk in dataset order, so the bytes never depend on the thread count.
#include "gpufeed/pack/pack.h"

#include <fmt/format.h>
#include <tbb/blocked_range.h>
#include <tbb/enumerable_thread_specific.h>
#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <fstream>
#include <memory>
#include <numeric>
#include <nlohmann/json.hpp>
#include <openssl/evp.h>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <tuple>
#include <utility>

#include "gpufeed/cpu_budget.h"
#include "gpufeed/json_text.h"
#include "gpufeed/transforms/resize.h"
#include "gpufeed/datasets/shards.h"
#include "gpufeed/sampler/randperm.h"
#include "gpufeed/version.h"
#include "gpufeed/datasets/tbb_tsan.h"

namespace fs = std::filesystem;

namespace gpufeed::pack {
namespace {

std::string os_reason(int err) { return std::error_code(err, std::generic_category()).message(); }

// `v` as `width` octal digits (the caller checked that it fits).
void put_octal(char* field, uint64_t v, int width) {
  for (int i = width - 1; i >= 0; --i, v >>= 3) field[i] = static_cast<char>('0' + (v & 7));
}

}  // namespace

// ---- TarWriter

// The running SHA-256 of what a TarWriter wrote (OpenSSL's libcrypto).
struct TarDigest {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  TarDigest() {
    if (!ctx || EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) != 1) throw std::runtime_error("pack: SHA-256 unavailable");
  }
  ~TarDigest() { EVP_MD_CTX_free(ctx); }
  void update(const void* data, size_t n) {
    if (n && EVP_DigestUpdate(ctx, data, n) != 1) throw std::runtime_error("pack: SHA-256 update failed");
  }
  std::string hex() {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned len = 0;
    if (EVP_DigestFinal_ex(ctx, md, &len) != 1) throw std::runtime_error("pack: SHA-256 final failed");
    std::string out;
    for (unsigned i = 0; i < len; ++i) out += fmt::format("{:02x}", md[i]);
    return out;
  }
};

TarWriter::TarWriter(const fs::path& path) : path_(path), digest_(std::make_unique<TarDigest>()) {
  file_ = std::fopen(path.c_str(), "wb");
  if (!file_) throw std::runtime_error("pack: cannot create " + path.string() + ": " + os_reason(errno));
}

TarWriter::~TarWriter() {
  if (file_) std::fclose(file_);
}

void TarWriter::write(const void* data, size_t n) {
  if (n && std::fwrite(data, 1, n, file_) != n)
    throw std::runtime_error("pack: cannot write " + path_.string() + ": " + os_reason(errno));
  digest_->update(data, n);
  bytes_ += static_cast<int64_t>(n);
}

void TarWriter::add(std::string_view name, std::span<const uint8_t> data) {
  if (!file_) throw std::logic_error("TarWriter::add after close");
  if (name.empty() || name.find('\0') != std::string_view::npos)
    throw std::invalid_argument("tar member name is empty or holds a NUL byte");
  std::string_view prefix, base = name;
  if (name.size() > 100) {
    // ustar: the name is prefix + '/' + name, split at a '/'.
    const size_t cut = name.rfind('/', 155);
    if (cut == std::string_view::npos || name.size() - cut - 1 > 100 || name.size() - cut - 1 == 0)
      throw std::invalid_argument("tar member name '" + std::string(name) +
                                  "' fits neither ustar's 100-byte name nor its 155-byte prefix + name");
    prefix = name.substr(0, cut);
    base = name.substr(cut + 1);
  }
  const uint64_t size = data.size();
  if (size >= (uint64_t{1} << 33))
    throw std::invalid_argument("tar member '" + std::string(name) + "' is 8 GiB or more (ustar's size field)");
  char h[512] = {};
  std::memcpy(h, base.data(), base.size());
  put_octal(h + 100, 0644, 7);   // mode
  put_octal(h + 108, 0, 7);      // uid
  put_octal(h + 116, 0, 7);      // gid
  put_octal(h + 124, size, 11);  // size
  put_octal(h + 136, 0, 11);     // mtime
  h[156] = '0';                  // regular file
  std::memcpy(h + 257, "ustar", 6);  // magic "ustar\0"
  std::memcpy(h + 263, "00", 2);     // version
  put_octal(h + 329, 0, 7);      // devmajor
  put_octal(h + 337, 0, 7);      // devminor
  if (!prefix.empty()) std::memcpy(h + 345, prefix.data(), prefix.size());  // (an empty view may be null)
  std::memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (const char c : h) sum += static_cast<unsigned char>(c);
  put_octal(h + 148, sum, 6);
  h[154] = '\0';
  h[155] = ' ';
  write(h, sizeof h);
  write(data.data(), data.size());
  static const char zeros[512] = {};
  write(zeros, (512 - size % 512) % 512);
}

void TarWriter::close() {
  if (!file_) return;
  static const char zeros[1024] = {};
  write(zeros, sizeof zeros);
  sha256_ = digest_->hex();
  const std::string trailer = datasets::format_shard_trailer({.sha256 = sha256_, .tar_bytes = bytes_});
  if (std::fwrite(trailer.data(), 1, trailer.size(), file_) != trailer.size())
    throw std::runtime_error("pack: cannot write " + path_.string() + ": " + os_reason(errno));
  bytes_ += static_cast<int64_t>(trailer.size());
  std::FILE* f = file_;
  file_ = nullptr;
  const bool flushed = std::fflush(f) == 0;
  const int err = errno;
  if (std::fclose(f) != 0 || !flushed)
    throw std::runtime_error("pack: cannot write " + path_.string() + ": " + os_reason(flushed ? errno : err));
}

// ---- keys and extensions

std::string pack_key(int64_t index, int64_t size, std::string_view path, std::string_view member,
                     const fs::path& base) {
  int digits = 1;
  for (int64_t v = std::max<int64_t>(size - 1, 0); v >= 10; v /= 10) ++digits;
  std::string key = fmt::format("{:0{}d}", index, std::max(6, digits));
  std::string_view rel = path;
  if (!member.empty()) {
    rel = member;
  } else {
    std::string b = base.string();
    while (b.size() > 1 && b.back() == '/') b.pop_back();
    if (b.empty() || b == ".") {
      while (rel.substr(0, 2) == "./") rel.remove_prefix(2);
    } else if (rel.size() > b.size() && rel.substr(0, b.size()) == b && (rel[b.size()] == '/' || b == "/")) {
      rel.remove_prefix(b.size() + (b == "/" ? 0 : 1));
    } else if (const size_t slash = rel.rfind('/'); slash != std::string_view::npos) {
      rel.remove_prefix(slash + 1);  // outside the base: the file name alone
    }
    while (!rel.empty() && rel.front() == '/') rel.remove_prefix(1);
  }
  // Without the extension: the last '.' of the last component (not a leading one).
  const size_t last = rel.rfind('/');
  const size_t dot = rel.rfind('.');
  if (dot != std::string_view::npos && (last == std::string_view::npos || dot > last + 1) && dot > 0)
    rel = rel.substr(0, dot);
  if (rel.empty()) return key;
  key += '_';
  for (const char c : rel) {
    if (key.size() >= 95) break;
    const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
    key += keep ? c : '_';
  }
  return key;
}

namespace {

std::string lower_extension(std::string_view name) {
  const size_t slash = name.rfind('/');
  if (slash != std::string_view::npos) name.remove_prefix(slash + 1);
  const size_t dot = name.rfind('.');
  if (dot == std::string_view::npos) return {};
  std::string ext(name.substr(dot + 1));
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext;
}

// The member extension of a copied image (see pack.h).
std::string copied_extension(decode::ImageFormat format, std::string_view name) {
  const std::string ext = lower_extension(name);
  switch (format) {
    case decode::ImageFormat::kJpeg: return "jpg";
    case decode::ImageFormat::kPng: return "png";
    case decode::ImageFormat::kWebp: return "webp";
    case decode::ImageFormat::kGif: return "gif";
    case decode::ImageFormat::kBmp: return "bmp";
    case decode::ImageFormat::kTiff: return ext == "tiff" ? "tiff" : "tif";
    case decode::ImageFormat::kPnm: return ext == "pgm" ? "pgm" : "ppm";
    case decode::ImageFormat::kUnknown: break;
  }
  throw std::logic_error("copied_extension: unknown format");
}

// One sample's outcome, filled by a worker, consumed by the writer.
struct Item {
  std::vector<uint8_t> bytes;  // the member's data
  std::string ext;
  bool reencoded = false, raw = false;
  int64_t bytes_in = 0;
  std::exception_ptr error;
  std::string kind, reason;
};

struct WorkerState {
  decode::Decoder decoder;
  decode::ImageBuffer image;
  std::vector<uint8_t> bytes, resized;
  transforms::Resizer resizer;
  std::string source;
};

// Longer side to max_side, the shorter rounded half up (at least 1).
std::pair<int, int> target_size(int w, int h, int max_side) {
  const int64_t longer = std::max(w, h), shorter = std::min(w, h);
  const int s = static_cast<int>(std::max<int64_t>(1, (2 * shorter * max_side + longer) / (2 * longer)));
  return w >= h ? std::pair{max_side, s} : std::pair{s, max_side};
}

std::string ppm_header(int w, int h) { return fmt::format("P6\n{} {}\n255\n", w, h); }

// `raw`: store the sample as PPM (the raw budget chose it).
void process(const datasets::Dataset& dataset, int64_t i, const PackOptions& o, bool raw, WorkerState& st, Item& it) {
  it.bytes.clear();
  it.ext.clear();
  it.reencoded = it.raw = false;
  it.bytes_in = 0;
  it.error = nullptr;
  it.kind.clear();
  it.reason.clear();
  st.source.clear();
  try {
    const datasets::SampleRef s = dataset.at(i);
    s.source(st.source);
    datasets::read_sample(s, st.bytes);
    it.bytes_in = static_cast<int64_t>(st.bytes.size());
    const decode::ImageInfo info = decode::probe(st.bytes, st.source);
    decode::DecodeOptions d = o.decode;
    d.crop = {};
    d.apply_exif_orientation = false;
    const bool resize = o.max_side > 0 && std::max(info.width, info.height) > o.max_side;
    if (!resize && !raw && !o.reencode) {
      // Validation only: at 1/8 a JPEG's entropy data is still decoded whole.
      d.scale = decode::ScaleFactor{info.format == decode::ImageFormat::kJpeg ? 1 : 8};
      st.decoder.decode(st.bytes, st.source, d, st.image);
      it.ext = copied_extension(info.format, s.member.empty() ? s.path : s.member);
      it.bytes.swap(st.bytes);  // the original bytes; st keeps the item's old buffer to reuse
      return;
    }
    d.scale = decode::ScaleFactor{8};
    st.decoder.decode(st.bytes, st.source, d, st.image);
    const uint8_t* pixels = st.image.pixels.data();
    int w = st.image.width, h = st.image.height;
    if (resize) {
      std::tie(w, h) = target_size(st.image.width, st.image.height, o.max_side);
      st.resized.resize(static_cast<size_t>(w) * h * 3);
      st.resizer.resize(st.image.pixels.data(), st.image.width, st.image.height, static_cast<size_t>(st.image.width) * 3,
                        transforms::BoxF{0, 0, static_cast<double>(st.image.width), static_cast<double>(st.image.height)},
                        st.resized.data(), w, h, static_cast<size_t>(w) * 3);
      pixels = st.resized.data();
    }
    if (raw) {
      const std::string header = ppm_header(w, h);
      it.bytes.assign(header.begin(), header.end());
      it.bytes.insert(it.bytes.end(), pixels, pixels + static_cast<size_t>(w) * h * 3);
      it.ext = "ppm";
      it.raw = true;
      return;
    }
    it.bytes = decode::encode_jpeg(pixels, w, h, o.quality);
    it.ext = "jpg";
    it.reencoded = true;
  } catch (const decode::DecodeError& e) {
    it.error = std::current_exception();
    it.kind = std::string(decode::to_string(e.kind()));
    it.reason = e.reason();
  } catch (const std::exception& e) {
    it.kind = "error";
    it.reason = e.what();
    it.error = std::make_exception_ptr(std::runtime_error(st.source + ": " + e.what()));
  }
}

// The raw budget's choice (pack.h): which samples are stored as PPM.
struct RawPlan {
  std::vector<char> pick;  // per sample
  int64_t budget = 0, extra = 0;
  // What the first pass made of the samples it encoded to learn their JPEG size (resized ones;
  // every one with reencode): the JPEG (`encoded`) and the PPM of the same pixels (`ppm`), each
  // kept up to PackOptions::plan_keep_bytes, so that the main pass writes the one the plan chose
  // instead of decoding, resizing and encoding again (the same bytes: both are deterministic).
  // The two have separate allowances because the JPEGs, a tenth of the pixels' size, are the
  // form most samples end in: PPMs filling a shared allowance first would crowd out JPEGs whose
  // sample is then encoded twice, to save a PPM the plan may not pick (and a PPM not kept costs
  // only its decode and resize again). Once the choice is made only the chosen form is kept;
  // empty where not kept.
  std::vector<std::unique_ptr<Item>> encoded, ppm;
};

// One sample as the raw budget weighs it: its pixels, its member's bytes as JPEG, and the extra
// bytes storing it as PPM would cost (ok: it could be read and probed).
struct SampleModel {
  int64_t pixels = 0, jpeg = 0, extra = 0;
  bool ok = false;
};

// plan_raw's first pass: every sample's model, and the encoded forms kept for the main pass
// (RawPlan::encoded, ppm).
class RawSurvey {
 public:
  RawSurvey(const datasets::Dataset& dataset, const PackOptions& o)
      : models(static_cast<size_t>(dataset.size())), kept(models.size()), kept_ppm(models.size()),
        dataset_(dataset), o_(o), n_(dataset.size()) {}

  void run(tbb::task_arena& arena, tbb::enumerable_thread_specific<WorkerState>& states) {
    arena.execute([&] {
      datasets::detail::parallel_for_ordered(tbb::blocked_range<int64_t>(0, n_, 1), [&](const tbb::blocked_range<int64_t>& range) {
        std::vector<uint8_t> bytes;
        std::string source;
        Item encoded;
        for (int64_t i = range.begin(); i < range.end(); ++i) {
          try {
            model(i, bytes, source, encoded, states);
          } catch (const std::exception&) {
            models[static_cast<size_t>(i)].ok = false;  // the main pass reports it (or skips it)
          }
        }
      });
    });
  }

  std::vector<SampleModel> models;
  std::vector<std::unique_ptr<Item>> kept, kept_ppm;

 private:
  // Sample i's model; a resized or re-encoded one is encoded to learn its JPEG size, and its
  // JPEG and PPM kept as the allowances and ppm_worth_keeping say. `bytes`, `source` and
  // `encoded` are the calling thread's buffers.
  void model(int64_t i, std::vector<uint8_t>& bytes, std::string& source, Item& encoded,
             tbb::enumerable_thread_specific<WorkerState>& states) {
    SampleModel& m = models[static_cast<size_t>(i)];
    const datasets::SampleRef s = dataset_.at(i);
    s.source(source);
    datasets::read_sample(s, bytes);
    const decode::ImageInfo info = decode::probe(bytes, source);
    const bool resize = o_.max_side > 0 && std::max(info.width, info.height) > o_.max_side;
    const auto [w, h] = resize ? target_size(info.width, info.height, o_.max_side) : std::pair{info.width, info.height};
    m.pixels = int64_t{w} * h;
    m.jpeg = static_cast<int64_t>(bytes.size());
    const std::string header = ppm_header(w, h);
    const int64_t ppm = static_cast<int64_t>(header.size()) + 3 * m.pixels;
    if (resize || o_.reencode) {  // the re-encoded JPEG's size: encode it
      WorkerState& st = states.local();
      process(dataset_, i, o_, /*raw=*/false, st, encoded);
      if (encoded.error) return;
      m.jpeg = static_cast<int64_t>(encoded.bytes.size());
      m.extra = TarWriter::member_bytes(ppm) - TarWriter::member_bytes(m.jpeg);
      if (ppm_worth_keeping(m.jpeg, m.extra) && reserve(kept_ppm_bytes_, ppm)) {
        // The pixels process() encoded: the resize's output, or the whole decode.
        const uint8_t* pixels = resize ? st.resized.data() : st.image.pixels.data();
        auto raw = std::make_unique<Item>();
        raw->bytes.reserve(static_cast<size_t>(ppm));
        raw->bytes.assign(header.begin(), header.end());
        raw->bytes.insert(raw->bytes.end(), pixels, pixels + 3 * m.pixels);
        raw->ext = "ppm";
        raw->raw = true;
        raw->bytes_in = encoded.bytes_in;
        kept_ppm[static_cast<size_t>(i)] = std::move(raw);
      }
      if (reserve(kept_jpeg_bytes_, m.jpeg)) kept[static_cast<size_t>(i)] = std::make_unique<Item>(std::move(encoded));
    } else {
      m.extra = TarWriter::member_bytes(ppm) - TarWriter::member_bytes(m.jpeg);
      ppm_worth_keeping(m.jpeg, m.extra);  // counted for the estimate
    }
    m.ok = true;
  }

  // Takes `bytes` of an allowance (PackOptions::plan_keep_bytes); false when they do not fit.
  bool reserve(std::atomic<int64_t>& kept_bytes, int64_t bytes) const {
    return kept_bytes.fetch_add(bytes) + bytes <= o_.plan_keep_bytes;
  }

  // Keeping a PPM costs its copy into fresh memory (~0.2 ms for 0.5 MB here) and pays only if the
  // plan picks the sample (it then skips a decode and resize, ~1.5 ms). The share of samples
  // the budget takes is about the budget over every sample's extra bytes, estimated from the
  // samples seen so far; below 1 in 8, no PPM is kept (measured on 900 ImageNet files: a 17 MB
  // budget over ~440 MB of extra bytes packed 9% faster without them; a 144 MB one over ~300 MB,
  // 30% faster with them). What is kept never changes the output.
  bool ppm_worth_keeping(int64_t jpeg, int64_t extra) {
    const int64_t j = TarWriter::member_bytes(jpeg), x = std::max<int64_t>(extra, 0);
    const auto k = static_cast<double>(seen_.fetch_add(1) + 1);
    const auto jpeg_seen = static_cast<double>(seen_jpeg_member_bytes_.fetch_add(j) + j);
    const auto extra_seen = static_cast<double>(seen_extra_.fetch_add(x) + x);
    if (extra_seen <= 0) return true;
    // The budget's share of the samples seen so far: a byte budget scaled to k of n samples, a
    // fraction of the JPEG bytes applied to those seen.
    const double budget_seen = o_.raw_budget > 0 ? static_cast<double>(o_.raw_budget) * k / static_cast<double>(n_)
                                                 : o_.raw_budget_fraction * jpeg_seen;
    return budget_seen / extra_seen >= 0.125;
  }

  const datasets::Dataset& dataset_;
  const PackOptions& o_;
  const int64_t n_;
  std::atomic<int64_t> kept_jpeg_bytes_{0}, kept_ppm_bytes_{0};
  std::atomic<int64_t> seen_{0}, seen_jpeg_member_bytes_{0}, seen_extra_{0};
};

// The choice from the survey's models: the budget (PackOptions::raw_budget, or its fraction of
// every modelled sample's JPEG member bytes) filled greedily with the samples of most pixels per
// extra byte; of what the survey kept, only each sample's chosen form stays.
RawPlan choose_raw(RawSurvey& survey, const PackOptions& o) {
  const std::vector<SampleModel>& models = survey.models;
  const auto n = static_cast<int64_t>(models.size());
  RawPlan plan;
  plan.pick.assign(static_cast<size_t>(n), 0);
  plan.encoded = std::move(survey.kept);
  plan.ppm = std::move(survey.kept_ppm);
  std::vector<int64_t> order;
  double jpeg_total = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!models[static_cast<size_t>(i)].ok) continue;
    order.push_back(i);
    jpeg_total += static_cast<double>(TarWriter::member_bytes(models[static_cast<size_t>(i)].jpeg));
  }
  plan.budget = o.raw_budget > 0 ? o.raw_budget : static_cast<int64_t>(std::llround(o.raw_budget_fraction * jpeg_total));
  // Pixels per extra byte, highest first: a.pixels / a.extra > b.pixels / b.extra (extra >= 1).
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    const SampleModel &ma = models[static_cast<size_t>(a)], &mb = models[static_cast<size_t>(b)];
    return static_cast<__int128>(ma.pixels) * std::max<int64_t>(mb.extra, 1) >
           static_cast<__int128>(mb.pixels) * std::max<int64_t>(ma.extra, 1);
  });
  int64_t left = plan.budget;
  for (const int64_t i : order) {
    const int64_t extra = std::max<int64_t>(models[static_cast<size_t>(i)].extra, 0);
    if (extra > left) continue;
    left -= extra;
    plan.extra += extra;
    plan.pick[static_cast<size_t>(i)] = 1;
  }
  for (int64_t i = 0; i < n; ++i) (plan.pick[static_cast<size_t>(i)] ? plan.encoded : plan.ppm)[static_cast<size_t>(i)].reset();
  return plan;
}

RawPlan plan_raw(const datasets::Dataset& dataset, const PackOptions& o, tbb::task_arena& arena,
                 tbb::enumerable_thread_specific<WorkerState>& states) {
  RawSurvey survey(dataset, o);
  survey.run(arena, states);
  return choose_raw(survey, o);
}

bool is_shard_name(const std::string& name, const std::string& prefix) {
  if (name.size() < prefix.size() + 1 + 6 + 4 || name.compare(0, prefix.size(), prefix) != 0) return false;
  if (name[prefix.size()] != '-' || name.compare(name.size() - 4, 4, ".tar") != 0) return false;
  const std::string digits = name.substr(prefix.size() + 1, name.size() - prefix.size() - 5);
  return digits.size() >= 6 && std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// "<prefix>-NNNNNN.tar.gpufeed-idx": a shard's index (format_shard_index).
bool is_shard_index_name(const std::string& name, const std::string& prefix) {
  const std::string_view suffix = datasets::kShardIndexSuffix;
  return name.size() > suffix.size() && name.ends_with(suffix) &&
         is_shard_name(name.substr(0, name.size() - suffix.size()), prefix);
}

std::string shard_name(const std::string& prefix, size_t n) { return fmt::format("{}-{:06d}.tar", prefix, n); }

void write_text_atomically(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw std::runtime_error("pack: cannot write " + tmp.string());
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw std::runtime_error("pack: cannot rename " + tmp.string() + " to " + path.string() + ": " + ec.message());
}

nlohmann::json manifest(const PackResult& r, const PackOptions& o, const fs::path& source) {
  using nlohmann::json;
  json shards = json::array();
  for (const PackedShard& s : r.shards) shards.push_back({{"file", s.file}, {"samples", s.samples}, {"bytes", s.bytes}, {"sha256", s.sha256}});
  json skipped = json::array();
  for (const PackSkip& s : r.skipped)
    skipped.push_back({{"index", s.index}, {"path", s.path}, {"kind", s.kind}, {"reason", s.reason}});
  return {
      {"format", "webdataset"},
      {"gpufeed_version", GPUFEED_VERSION_STRING},
      {"source", source.string()},
      {"pattern", r.pattern},
      {"classes", r.classes},
      {"shards", shards},
      {"totals",
       {{"samples", r.samples},
        {"shards", r.shards.size()},
        {"bytes", r.bytes_out},
        {"bytes_in", r.bytes_in},
        {"reencoded", r.reencoded},
        {"copied", r.copied},
        {"raw", r.raw},
        {"raw_bytes", r.raw_bytes},
        {"raw_budget", r.raw_budget},
        {"raw_extra", r.raw_extra},
        {"skipped", r.skipped.size()}}},
      {"options",
       {{"prefix", o.prefix},
        {"shard_size", o.shard_size},
        {"max_samples_per_shard", o.max_samples_per_shard},
        {"max_side", o.max_side},
        {"quality", o.quality},
        {"reencode", o.reencode},
        {"shuffle", o.shuffle},
        {"seed", o.seed},
        {"raw_budget", o.raw_budget},
        {"raw_budget_fraction", o.raw_budget_fraction},
        {"on_error", o.error_policy == loader::ErrorPolicy::kSkip ? "skip" : "raise"},
        {"max_skips", o.max_skips},
        {"strict_decode", o.decode.strict}}},
      {"skipped", skipped},
      {"skipped_by_kind", r.skipped_by_kind},
  };
}

// Throws std::invalid_argument for the options pack_dataset refuses (pack.h): each value of
// pack_options_schema() against its row (options::OptionError naming it), then what the rows
// cannot say.
void check_options(const PackOptions& o) {
  for (const options::Field<PackOptions>& f : pack_options_schema().fields()) options::check(f.spec, f.get(o));
  if (o.prefix.empty() || o.prefix.find('/') != std::string::npos || o.prefix.find('\0') != std::string::npos)
    throw std::invalid_argument("pack: the prefix '" + o.prefix + "' must be a non-empty file name part without '/'");
  if (o.chunk_samples < 1) throw std::invalid_argument("pack: chunk_samples must be >= 1");
  if (o.plan_keep_bytes < 0) throw std::invalid_argument("pack: plan_keep_bytes must be >= 0");
  if (o.raw_budget < 0 || !(o.raw_budget_fraction >= 0) || (o.raw_budget > 0 && o.raw_budget_fraction > 0))
    throw std::invalid_argument("pack: give raw_budget (bytes >= 0) or raw_budget_fraction (>= 0), not both");
}

// What the output folder already holds of this prefix.
struct OutputFolder {
  std::vector<std::string> existing;  // shards of this prefix, and the manifest, already there
  std::vector<std::string> stale;     // the unfinished shard of a killed pack of this prefix
};

// Creates `out_dir` and lists what it holds of this prefix; throws std::runtime_error when it
// holds such shards or a manifest and o.overwrite is not set.
OutputFolder prepare_output(const fs::path& out_dir, const PackOptions& o) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw std::runtime_error("pack: cannot create " + out_dir.string() + ": " + ec.message());
  OutputFolder folder;
  for (const auto& e : fs::directory_iterator(out_dir)) {
    const std::string name = e.path().filename().string();
    if (is_shard_name(name, o.prefix) || name == "manifest.json" || is_shard_index_name(name, o.prefix))
      folder.existing.push_back(name);
    if (name.size() > 4 && name.ends_with(".tmp") && is_shard_name(name.substr(0, name.size() - 4), o.prefix))
      folder.stale.push_back(name);
  }
  std::sort(folder.existing.begin(), folder.existing.end());
  if (!folder.existing.empty() && !o.overwrite)
    throw std::runtime_error(fmt::format("pack: {} already holds {}{}: pass `overwrite` to replace them",
                                         out_dir.string(), folder.existing.front(),
                                         folder.existing.size() > 1
                                             ? fmt::format(" (and {} more)", folder.existing.size() - 1)
                                             : ""));
  return folder;
}

// Once this pack's manifest is written: an older, longer set of this prefix (its remaining
// shards would join any folder read), and a killed pack's (SIGKILL, a power cut) unfinished
// shard, which is not a shard, go.
void remove_leftovers(const fs::path& out_dir, const OutputFolder& folder, const PackResult& r) {
  std::error_code ec;
  for (const std::string& name : folder.existing) {
    if (name == "manifest.json") continue;
    if (std::none_of(r.shards.begin(), r.shards.end(),
                     [&](const PackedShard& s) { return s.file == name || s.file + datasets::kShardIndexSuffix == name; }))
      fs::remove(out_dir / name, ec);
  }
  for (const std::string& name : folder.stale) fs::remove(out_dir / name, ec);
}

// The shards of one pack, written in order: each to "<name>.tmp", renamed into place when full
// (recorded in the result's shards and bytes_out). Until commit(), destruction (any failure)
// removes the unfinished shard and the shards this pack renamed into place.
class ShardSet {
 public:
  ShardSet(const fs::path& out_dir, const PackOptions& o, PackResult& r) : out_dir_(out_dir), o_(o), r_(r) {}
  ShardSet(const ShardSet&) = delete;
  ShardSet& operator=(const ShardSet&) = delete;
  ~ShardSet() {
    if (!armed_) return;
    shard_.reset();
    std::error_code e;
    if (!tmp_.empty()) fs::remove(tmp_, e);
    for (const fs::path& p : written_) fs::remove(p, e);
  }

  // Adds a sample's members, KEY.<ext> and KEY.cls, first closing the current shard when they
  // would take it past shard_size or max_samples_per_shard.
  void add(const std::string& key, int64_t label, const Item& it) {
    const std::string text = std::to_string(label);
    cls_.assign(text.begin(), text.end());
    const int64_t sample_bytes = TarWriter::member_bytes(static_cast<int64_t>(it.bytes.size())) +
                                 TarWriter::member_bytes(static_cast<int64_t>(cls_.size()));
    if (shard_ && (shard_->bytes() + sample_bytes + TarWriter::kEndBytes > o_.shard_size ||
                   (o_.max_samples_per_shard > 0 && shard_samples_ >= o_.max_samples_per_shard)))
      close_shard();
    if (!shard_) {
      tmp_ = out_dir_ / (shard_name(o_.prefix, r_.shards.size()) + ".tmp");
      shard_.emplace(tmp_);
      shard_samples_ = 0;
    }
    // The image's data follows its 512-byte ustar header (TarWriter writes no pax records).
    index_.samples.push_back({.member = key + "." + it.ext, .offset = shard_->bytes() + 512,
                              .size = static_cast<int64_t>(it.bytes.size()), .label = static_cast<int32_t>(label)});
    shard_->add(key + "." + it.ext, it.bytes);
    shard_->add(key + ".cls", cls_);
    ++shard_samples_;
  }

  // Closes the current shard, if any.
  void close() {
    if (shard_) close_shard();
  }

  // Shards so far (the open one included), and their bytes.
  int64_t count() const { return static_cast<int64_t>(r_.shards.size()) + (shard_ ? 1 : 0); }
  int64_t bytes() const { return r_.bytes_out + (shard_ ? shard_->bytes() : 0); }

  // The pack succeeded: the shards stay.
  void commit() { armed_ = false; }

 private:
  void close_shard() {
    shard_->close();
    const std::string name = shard_name(o_.prefix, r_.shards.size());
    const fs::path final_path = out_dir_ / name;
    r_.shards.push_back({name, shard_samples_, shard_->bytes(), shard_->sha256()});
    r_.bytes_out += shard_->bytes();
    shard_.reset();
    std::error_code e;
    fs::rename(tmp_, final_path, e);
    if (e) throw std::runtime_error("pack: cannot rename " + tmp_.string() + " to " + final_path.string() + ": " + e.message());
    tmp_.clear();
    written_.push_back(final_path);
    // Its index beside it (shard_index.h's format), for opening it remotely without its headers.
    index_.shard_size = r_.shards.back().bytes;
    index_.sha256 = r_.shards.back().sha256;
    const fs::path index_path = final_path.string() + datasets::kShardIndexSuffix;
    write_text_atomically(index_path, datasets::format_shard_index(index_));
    written_.push_back(index_path);
    index_ = datasets::ShardIndex{};
  }

  const fs::path& out_dir_;
  const PackOptions& o_;
  PackResult& r_;
  std::optional<TarWriter> shard_;
  int64_t shard_samples_ = 0;
  fs::path tmp_;
  std::vector<fs::path> written_;  // renamed into place by this pack
  std::vector<uint8_t> cls_;       // the label member's bytes
  datasets::ShardIndex index_;               // the open shard's samples
  bool armed_ = true;
};

// Fills items[0, end - start) with samples start..end-1, in parallel: what the raw plan's first
// pass kept (made, and so validated, already), else process()'s output.
void process_chunk(const datasets::Dataset& dataset, const PackOptions& o, int64_t start, int64_t end, RawPlan& raw_plan,
                   tbb::task_arena& arena, tbb::enumerable_thread_specific<WorkerState>& states,
                   std::vector<Item>& items) {
  arena.execute([&] {
    datasets::detail::parallel_for_ordered(tbb::blocked_range<int64_t>(start, end, 1), [&](const tbb::blocked_range<int64_t>& range) {
      WorkerState& st = states.local();
      for (int64_t i = range.begin(); i < range.end(); ++i) {
        const bool raw = raw_plan.pick[static_cast<size_t>(i)] != 0;
        Item& it = items[static_cast<size_t>(i - start)];
        std::unique_ptr<Item>* kept =
            raw_plan.encoded.empty() ? nullptr : &(raw ? raw_plan.ppm : raw_plan.encoded)[static_cast<size_t>(i)];
        if (kept && *kept) {
          it = std::move(**kept);
          kept->reset();
        } else {
          process(dataset, i, o, raw, st, it);
        }
      }
    });
  });
}

// The dataset in pack order (PackOptions::shuffle): position i is sample order[i]. Only what pack
// reads of a dataset: its size, samples and classes.
class PackOrder final : public datasets::Dataset {
 public:
  PackOrder(const datasets::Dataset& dataset, std::vector<int64_t> order) : dataset_(dataset), order_(std::move(order)) {}
  int64_t size() const override { return static_cast<int64_t>(order_.size()); }
  datasets::SampleRef at(int64_t i) const override { return dataset_.at(index(i)); }
  const std::vector<std::string>& classes() const override { return dataset_.classes(); }
  int64_t index(int64_t i) const { return order_[static_cast<size_t>(i)]; }  // the dataset's index

 private:
  const datasets::Dataset& dataset_;
  std::vector<int64_t> order_;
};

// Sample i (in pack order), which failed: rethrown under ErrorPolicy::kRaise, else recorded as skipped (by
// kind), which throws std::runtime_error once more than max_skips are.
void skip(const PackOrder& dataset, int64_t i, const PackOptions& o, const Item& it, PackResult& r) {
  if (o.error_policy == loader::ErrorPolicy::kRaise) std::rethrow_exception(it.error);
  const datasets::SampleRef s = dataset.at(i);
  r.skipped.push_back({dataset.index(i), s.source(), it.kind, it.reason});
  ++r.skipped_by_kind[it.kind];
  if (static_cast<int64_t>(r.skipped.size()) > o.max_skips)
    throw std::runtime_error(fmt::format("pack: more than {} files skipped (`max_skips`); the last: {}: {}: {}",
                                         o.max_skips, r.skipped.back().path, it.kind, it.reason));
}

// A packed sample in the result's totals.
void count_packed(const Item& it, PackResult& r) {
  ++r.samples;
  r.bytes_in += it.bytes_in;
  if (it.raw) {
    ++r.raw;
    r.raw_bytes += static_cast<int64_t>(it.bytes.size());
  } else {
    ++(it.reencoded ? r.reencoded : r.copied);
  }
}

}  // namespace

std::string PackResult::summary() const {
  std::string kinds;
  for (const auto& [kind, n] : skipped_by_kind) kinds += fmt::format("{}{} {}", kinds.empty() ? " (" : ", ", kind, n);
  if (!kinds.empty()) kinds += ")";
  return fmt::format(
      "packed {} samples into {} shards: {:.1f} MB in -> {:.1f} MB out, {} re-encoded, {} copied{}, {} skipped{}, "
      "{:.2f} s, {:.1f} images/s",
      samples, shards.size(), bytes_in / 1e6, bytes_out / 1e6, reencoded, copied,
      raw_budget > 0 ? fmt::format(", {} raw ({:.1f} MB)", raw, raw_bytes / 1e6) : "", skipped.size(), kinds, seconds,
      seconds > 0 ? static_cast<double>(samples + static_cast<int64_t>(skipped.size())) / seconds : 0.0);
}

PackResult pack_dataset(const datasets::Dataset& source_dataset, const fs::path& source, const fs::path& out_dir,
                        const PackOptions& o, const std::function<void(const PackProgress&)>& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  check_options(o);
  const OutputFolder folder = prepare_output(out_dir, o);
  std::error_code ec;
  const fs::path base = !o.base.empty() ? o.base : fs::is_directory(source, ec) ? source : source.parent_path();
  const int64_t n = source_dataset.size();
  std::vector<int64_t> order(static_cast<size_t>(n));
  if (o.shuffle) {
    order = sampler::randperm(n, static_cast<uint64_t>(o.seed));
  } else {
    std::iota(order.begin(), order.end(), int64_t{0});
  }
  const PackOrder dataset(source_dataset, std::move(order));
  PackResult r;
  r.classes = dataset.classes();
  ShardSet shards(out_dir, o, r);

  const int workers = o.num_workers > 0 ? o.num_workers : gpufeed::cpu_budget();
  // As the loader does: num_workers threads even where oneTBB's default pool is smaller (the
  // calling thread joins the arena, so workers - 1 of oneTBB's).
  tbb::global_control parallelism(
      tbb::global_control::max_allowed_parallelism,
      std::max<size_t>(tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism),
                       static_cast<size_t>(workers)));
  tbb::task_arena arena(workers);
  tbb::enumerable_thread_specific<WorkerState> states;
  RawPlan raw_plan =
      o.raw_budget > 0 || o.raw_budget_fraction > 0 ? plan_raw(dataset, o, arena, states) : RawPlan{std::vector<char>(static_cast<size_t>(n), 0), 0, 0, {}, {}};
  r.raw_budget = raw_plan.budget;
  r.raw_extra = raw_plan.extra;
  std::vector<Item> items(static_cast<size_t>(std::min<int64_t>(o.chunk_samples, std::max<int64_t>(n, 1))));
  for (int64_t start = 0; start < n; start += o.chunk_samples) {
    const int64_t end = std::min(n, start + o.chunk_samples);
    process_chunk(dataset, o, start, end, raw_plan, arena, states, items);
    for (int64_t i = start; i < end; ++i) {  // written in pack order, whatever the threads did
      const Item& it = items[static_cast<size_t>(i - start)];
      if (it.error) {
        skip(dataset, i, o, it, r);
        continue;
      }
      const datasets::SampleRef s = dataset.at(i);
      shards.add(pack_key(i, n, s.path, s.member, base), s.label, it);
      count_packed(it, r);
    }
    if (progress) progress({end, n, shards.count(), shards.bytes(), elapsed()});
  }
  shards.close();
  if (r.samples == 0)
    throw std::runtime_error(fmt::format("pack: no sample of {} could be packed ({} skipped)", source.string(),
                                         r.skipped.size()));
  r.pattern = r.shards.size() == 1
                  ? r.shards.front().file
                  : fmt::format("{}-{{{:06d}..{:06d}}}.tar", o.prefix, 0, r.shards.size() - 1);
  r.seconds = elapsed();
  write_text_atomically(out_dir / "manifest.json", json_text(manifest(r, o, source), 1) + "\n");
  shards.commit();
  remove_leftovers(out_dir, folder, r);
  r.seconds = elapsed();
  return r;
}

}  // namespace gpufeed::pack
