// gpufeed pack SRC OUT_DIR: an ImageFolder, flat folder, file list (or shards) written as
// WebDataset tar shards plus manifest.json (gpufeed/pack/pack.h has the rules).
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "commands.h"
#include "schema_cli.h"
#include "gpufeed/datasets/dataset.h"
#include "gpufeed/pack/pack.h"

namespace gpufeed::tools {
namespace {

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
    std::string src, out, progress = "lines";
    pack::PackOptions o;
    datasets::DataOptions data;
  };
  auto a = std::make_shared<Args>();
  app.add_option("src", a->src, "ImageFolder root, flat image folder or file list (what --data takes; shards too)")
      ->required();
  app.add_option("out_dir", a->out, "folder for <prefix>-000000.tar, ... and manifest.json (created)")->required();
  // PackOptions' flags (--shard-size, --max-side, --num-workers, ...) from its schema (gpufeed/pack/pack.h).
  const SchemaFlags flags = add_schema_options(app, pack::pack_options_schema(), a->o);
  const SchemaFlags data_flags = add_schema_options(app, datasets::data_options_schema(), a->data);
  app.add_option("--progress", a->progress, "lines: a progress line on stderr every 2 s; off")
      ->capture_default_str()->check(CLI::IsMember({"lines", "off"}));
  return [a, flags, data_flags] {
    flags.apply();
    data_flags.apply();
    const std::shared_ptr<datasets::Dataset> ds = datasets::open_dataset(a->src, a->data);
    auto last = std::chrono::steady_clock::now();
    std::function<void(const pack::PackProgress&)> progress = [&last, lines = a->progress == "lines"](const pack::PackProgress& p) {
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
    std::optional<pack::PackResult> packed;
    try {
      packed = pack::pack_dataset(*ds, a->src, a->out, a->o, progress);
    } catch (const PackInterrupted& stop) {
      std::cerr << fmt::format("gpufeed pack: {}: stopped; the shards this run wrote were removed\n",
                               stop.sig == SIGINT ? "SIGINT" : "SIGTERM");
      return 128 + stop.sig;
    }
    const pack::PackResult& r = *packed;
    for (const pack::PackSkip& s : r.skipped) std::cout << "skipped " << s.path << ": " << s.kind << ": " << s.reason << "\n";
    std::cout << r.summary() << "\n";
    std::cout << "shards: " << (std::filesystem::path(a->out) / r.pattern).string() << " (manifest.json beside them)\n";
    return 0;
  };
}

}  // namespace gpufeed::tools
