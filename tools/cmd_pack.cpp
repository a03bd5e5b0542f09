// gpufeed pack SRC OUT_DIR: an ImageFolder, flat folder, file list (or shards) written as
// WebDataset tar shards plus manifest.json (gpufeed/loader/pack.h has the rules).
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "commands.h"
#include "gpufeed/loader/dataset.h"
#include "gpufeed/loader/pack.h"

namespace gpufeed::tools {
namespace {

// "1e9", "20000000", "2.5e8": a whole, positive number of bytes.
int64_t parse_bytes(const std::string& text, const char* option) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || !(v >= 1) || v > 9e18 || v != std::floor(v))
    throw std::invalid_argument(fmt::format("{} {}: expected a whole number of bytes >= 1 (e.g. 1e9)", option, text));
  return static_cast<int64_t>(v);
}

// --raw-budget: "2e9" bytes, "0.25" (a number below 1) or "25%" of the pack's JPEG bytes.
void parse_raw_budget(const std::string& text, loader::PackOptions& o) {
  if (text.empty() || text == "0") return;
  const bool percent = text.back() == '%';
  const std::string number = percent ? text.substr(0, text.size() - 1) : text;
  size_t used = 0;
  double v = -1;
  try {
    v = std::stod(number, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != number.size() || !(v >= 0) || !std::isfinite(v))
    throw std::invalid_argument("--raw-budget " + text + ": expected bytes (2e9), a fraction (0.25) or a percentage (25%)");
  if (percent || v < 1) {
    o.raw_budget_fraction = percent ? v / 100 : v;
  } else {
    o.raw_budget = parse_bytes(number, "--raw-budget");
  }
}

// SIGINT/SIGTERM: the pack stops after the chunk in hand (a progress call), removes the shards
// this run wrote and its unfinished one, and exits 130/143: an interrupted pack leaves no partial
// set that a folder read would take for the dataset. A second SIGINT exits at once.
std::atomic<int> g_pack_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "read in a signal handler");

extern "C" void on_pack_signal(int sig) {
  int expected = 0;
  if (!g_pack_signal.compare_exchange_strong(expected, sig)) {
    static const char msg[] = "gpufeed pack: second signal, exiting now (shards and .tmp files may be left)\n";
    [[maybe_unused]] ssize_t w = ::write(STDERR_FILENO, msg, sizeof msg - 1);
    ::_exit(128 + sig);
  }
  static const char msg[] = "gpufeed pack: stopping after the current chunk; removing what this run wrote (again to exit now)\n";
  [[maybe_unused]] ssize_t w = ::write(STDERR_FILENO, msg, sizeof msg - 1);
}

struct PackInterrupted {
  int sig;
};

}  // namespace

Run add_pack(CLI::App& app) {
  struct Args {
    std::string src, out, shard_size = "1e9", on_error = "raise", index_cache, progress = "lines", raw_budget = "0";
    loader::PackOptions o;
  };
  auto a = std::make_shared<Args>();
  app.add_option("src", a->src, "ImageFolder root, flat image folder or file list (what --data takes; shards too)")
      ->required();
  app.add_option("out_dir", a->out, "folder for <prefix>-000000.tar, ... and manifest.json (created)")->required();
  app.add_option("--prefix", a->o.prefix, "shard name prefix")->capture_default_str();
  app.add_option("--shard-size", a->shard_size,
                 "bytes per shard at most (tar file size; a sample is never split, a shard holds >= 1 sample)")
      ->capture_default_str();
  app.add_option("--max-samples-per-shard", a->o.max_samples_per_shard,
                 "samples per shard at most (webdataset's maxcount); 0 = no limit")
      ->capture_default_str()->check(kAtLeastZero);
  app.add_option("--max-side", a->o.max_side,
                 "resize images whose longer side exceeds N to N (aspect kept, PIL's antialiased bilinear) and "
                 "re-encode them as JPEG; others are copied byte for byte; 0 = never")
      ->capture_default_str()->check(kAtLeastZero);
  app.add_option("--quality", a->o.quality, "JPEG quality of re-encoded images")
      ->capture_default_str()->check(CLI::Range(1, 100));
  app.add_flag("--reencode", a->o.reencode,
               "re-encode every image as JPEG at --quality, resized or not (FFCV's write_mode=\"jpg\"); "
               "without it, images within --max-side are copied byte for byte");
  app.add_option("--num-workers", a->o.num_workers, "decode/resize/encode threads (0 = the CPU budget: affinity mask, cgroup quota); the output is the same for any count")
      ->capture_default_str()->check(kAtLeastZero);
  app.add_option("--on-error", a->on_error,
                 "a file that cannot be read or decoded: raise (stop, naming it) or skip (leave it out, "
                 "counted and listed in the summary and manifest.json)")
      ->capture_default_str()->check(CLI::IsMember({"raise", "skip"}));
  app.add_option("--max-skips", a->o.max_skips, "--on-error skip: more skipped files than this is an error")
      ->capture_default_str()->check(kAtLeastZero);
  app.add_option("--raw-budget", a->raw_budget,
                 "store some samples as raw PPM (KEY.ppm: no decode when loading) within this many extra bytes "
                 "(2e9), or this share of the pack's JPEG bytes (0.25 or 25%): those with the most pixels per "
                 "extra byte first")
      ->capture_default_str();
  app.add_flag("--strict-decode", a->o.decode.strict, "treat every decoder warning as an error");
  app.add_flag("--overwrite", a->o.overwrite, "replace shards of this prefix and manifest.json already in out_dir");
  app.add_option("--index-cache", a->index_cache,
                 "where the source's listing is cached: unset for the user's cache folder "
                 "($XDG_CACHE_HOME/gpufeed, else ~/.cache/gpufeed), 'beside' for <parent>/<name>.gpufeed-index "
                 "beside it (never in a folder whose mode forbids writing), 'off', or a folder");
  app.add_option("--progress", a->progress, "lines: a progress line on stderr every 2 s; off")
      ->capture_default_str()->check(CLI::IsMember({"lines", "off"}));
  return [a] {
    a->o.shard_size = parse_bytes(a->shard_size, "--shard-size");
    parse_raw_budget(a->raw_budget, a->o);
    a->o.error_policy = a->on_error == "skip" ? loader::ErrorPolicy::kSkip : loader::ErrorPolicy::kRaise;
    const std::shared_ptr<loader::Dataset> ds = loader::open_dataset(a->src, {.index_cache = a->index_cache});
    auto last = std::chrono::steady_clock::now();
    std::function<void(const loader::PackProgress&)> progress = [&last, lines = a->progress == "lines"](const loader::PackProgress& p) {
        if (const int sig = g_pack_signal.load()) throw PackInterrupted{sig};
        if (!lines) return;
        const auto now = std::chrono::steady_clock::now();
        if (now - last < std::chrono::seconds(2) && p.done < p.total) return;
        last = now;
        const double rate = p.seconds > 0 ? p.done / p.seconds : 0;
        std::cerr << fmt::format("pack: {}/{} samples ({:.0f}%), {} shards, {:.1f} MB out, {:.1f} images/s, ETA {:.0f} s\n",
                                 p.done, p.total, 100.0 * p.done / std::max<int64_t>(p.total, 1), p.shards,
                                 p.bytes_out / 1e6, rate, rate > 0 ? (p.total - p.done) / rate : 0.0);
      };
    struct sigaction sa {};
    sa.sa_handler = on_pack_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (const int sig : {SIGINT, SIGTERM}) {
      struct sigaction old {};
      sigaction(sig, nullptr, &old);
      if (old.sa_handler != SIG_IGN) sigaction(sig, &sa, nullptr);  // an ignored one stays ignored (nohup, `cmd &`)
    }
    std::optional<loader::PackResult> packed;
    try {
      packed = loader::pack_dataset(*ds, a->src, a->out, a->o, progress);
    } catch (const PackInterrupted& stop) {
      std::cerr << fmt::format("gpufeed pack: {}: stopped; the shards this run wrote were removed\n",
                               stop.sig == SIGINT ? "SIGINT" : "SIGTERM");
      return 128 + stop.sig;
    }
    const loader::PackResult& r = *packed;
    for (const loader::PackSkip& s : r.skipped) std::cout << "skipped " << s.path << ": " << s.kind << ": " << s.reason << "\n";
    std::cout << r.summary() << "\n";
    std::cout << "shards: " << (std::filesystem::path(a->out) / r.pattern).string() << " (manifest.json beside them)\n";
    return 0;
  };
}

}  // namespace gpufeed::tools
