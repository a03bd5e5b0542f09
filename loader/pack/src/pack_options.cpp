// PackOptions' option schema (gpufeed/option.h): every user-facing field of `gpufeed pack`,
// declared once. The CLI's flags are generated from these rows and pack_dataset checks its
// options against them. Rows for concepts the loader has too (num_workers, on_error, max_skips,
// strict_decode) take the loader's spec, so a name means one thing with one range everywhere.

// The rows name only the Spec fields they set (designated initialisers); the rest keep their
// defaults on purpose, which GCC's -Wextra would report one by one.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>
#include <utility>

#include "gpufeed/loader/loader.h"
#include "gpufeed/pack/pack.h"

namespace gpufeed::pack {
namespace {

using options::OptionError;
using options::Schema;
using options::Spec;
using options::Type;
using options::Value;

constexpr double kIntMax = std::numeric_limits<int>::max();  // the int fields' bound
constexpr double kMostBytes = 9e18;                           // below INT64_MAX, exactly a double

/// The loader's row of the same name, with pack's own help where the loader's would mislead.
Spec loader_spec(std::string_view name, std::string help = "") {
  Spec s = loader::loader_options_schema().find(name)->spec;
  if (!help.empty()) s.help = std::move(help);
  return s;
}

/// A count of bytes written as a number ("1e9", "20000000", "2.5e8"): whole and at most 9e18.
int64_t whole_bytes(const std::string& option, double v) {
  if (v != std::floor(v) || v > kMostBytes) {
    throw OptionError(option, "must be a whole number of bytes <= 9e18 (e.g. 1e9), not " + options::format_number(v));
  }
  return static_cast<int64_t>(v);
}

/// raw_budget's text: bytes ("2e9"), a fraction below 1 ("0.25") or a percentage ("25%") of the
/// pack's JPEG bytes; "0" (or "") is none.
void set_raw_budget(PackOptions& o, const std::string& text) {
  o.raw_budget = 0;
  o.raw_budget_fraction = 0;
  if (text.empty()) return;
  const bool percent = text.back() == '%';
  const std::string number = percent ? text.substr(0, text.size() - 1) : text;
  char* end = nullptr;
  const double v = std::strtod(number.c_str(), &end);
  if (number.empty() || end != number.c_str() + number.size() || !(v >= 0) || !std::isfinite(v)) {
    throw OptionError("raw_budget", "must be bytes (2e9), a fraction (0.25) or a percentage (25%), not '" + text + "'");
  }
  if (percent || v < 1) {
    o.raw_budget_fraction = percent ? v / 100 : v;
  } else {
    o.raw_budget = whole_bytes("raw_budget", v);
  }
}

/// raw_budget as set_raw_budget reads it back.
std::string raw_budget_text(const PackOptions& o) {
  if (o.raw_budget_fraction >= 1) return options::format_number(o.raw_budget_fraction * 100) + "%";
  if (o.raw_budget_fraction > 0) return options::format_number(o.raw_budget_fraction);
  return std::to_string(o.raw_budget);
}

void add_shard_rows(Schema<PackOptions>& s) {
  s.member({.name = "prefix", .type = Type::kString,
            .help = "shard name prefix: <prefix>-000000.tar, ... (a file name part, no '/')"},
           &PackOptions::prefix);
  s.add({.name = "shard_size", .type = Type::kFloat,
         .help = "bytes per shard at most (the tar file's size; a sample is never split, a shard holds >= 1 sample)",
         .unit = "bytes", .min = 1},
        [](PackOptions& o, const Value& v) { o.shard_size = whole_bytes("shard_size", std::get<double>(v)); },
        [](const PackOptions& o) -> Value { return static_cast<double>(o.shard_size); });
  s.member({.name = "max_samples_per_shard", .type = Type::kInt,
            .help = "samples per shard at most (webdataset's ShardWriter maxcount); 0 = no limit",
            .unit = "samples", .min = 0},
           &PackOptions::max_samples_per_shard);
}

void add_pixel_rows(Schema<PackOptions>& s) {
  s.member({.name = "max_side", .type = Type::kInt,
            .help = "resize images whose longer side exceeds this to it (aspect kept, PIL's antialiased bilinear: "
                    "torchvision's Resize(antialias=True)) and re-encode them as JPEG; others are copied byte for "
                    "byte; 0 = never",
            .unit = "pixels", .min = 0, .max = kIntMax},
           &PackOptions::max_side);
  s.member({.name = "quality", .type = Type::kInt, .help = "JPEG quality of re-encoded images", .min = 1, .max = 100},
           &PackOptions::quality);
  s.member({.name = "reencode", .type = Type::kBool,
            .help = "re-encode every image as JPEG at the quality, resized or not (FFCV's write_mode=\"jpg\"); "
                    "without it, images within max_side are copied byte for byte"},
           &PackOptions::reencode);
}

void add_order_rows(Schema<PackOptions>& s) {
  s.member({.name = "shuffle", .type = Type::kBool,
            .help = "write the samples in a seeded random order (torch.randperm(N) of the seed), not the dataset's "
                    "class-by-class order: what readers that mix a few shards at a time need (webdataset's shuffle "
                    "buffer, shuffle_order shards)"},
           &PackOptions::shuffle);
  s.member({.name = "seed", .type = Type::kInt, .help = "shuffle's seed (torch.manual_seed's)", .min = 0},
           &PackOptions::seed);
}

// num_workers, on_error and max_skips: the loader's rows, with pack's words where they differ.
void add_worker_rows(Schema<PackOptions>& s) {
  // No "auto": pack has no consumer whose rate would size the pool; it runs the whole budget.
  Spec workers = loader_spec("num_workers", "decode/resize/encode threads; 0 = the CPU budget (the affinity mask's "
                                            "CPUs capped by the cgroup CPU quota); the shards are the same for any count");
  workers.words.clear();
  s.member(std::move(workers), &PackOptions::num_workers);
  s.add(loader_spec("on_error", "a file that cannot be read or decoded: raise (stop, naming it) or skip (leave it "
                                "out, counted and listed in the summary and manifest.json)"),
        [](PackOptions& o, const Value& v) { o.error_policy = loader::parse_error_policy(std::get<std::string>(v)); },
        [](const PackOptions& o) -> Value { return std::string(to_string(o.error_policy)); });
  s.member(loader_spec("max_skips", "on_error skip: more skipped files than this is an error"),
           &PackOptions::max_skips);
}

Schema<PackOptions> make_pack_schema() {
  Schema<PackOptions> s;
  add_shard_rows(s);
  add_pixel_rows(s);
  add_order_rows(s);
  add_worker_rows(s);
  s.add({.name = "raw_budget", .type = Type::kString,
         .help = "store some samples as raw PPM (KEY.ppm: no decode when loading) within this many extra bytes "
                 "(2e9), or this share of the pack's JPEG bytes (0.25 or 25%): those with the most pixels per "
                 "extra byte first; 0 = none"},
        [](PackOptions& o, const Value& v) { set_raw_budget(o, std::get<std::string>(v)); },
        [](const PackOptions& o) -> Value { return raw_budget_text(o); });
  s.add(loader_spec("strict_decode"), [](PackOptions& o, const Value& v) { o.decode.strict = std::get<bool>(v); },
        [](const PackOptions& o) -> Value { return o.decode.strict; });
  s.member({.name = "overwrite", .type = Type::kBool,
            .help = "replace the shards of this prefix and the manifest.json already in the output folder"},
           &PackOptions::overwrite);
  return s;
}

}  // namespace

const options::Schema<PackOptions>& pack_options_schema() {
  return options::made_once<make_pack_schema>();
}

}  // namespace gpufeed::pack
