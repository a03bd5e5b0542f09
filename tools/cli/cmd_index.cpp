// gpufeed index: lists a dataset as the loader would (ImageFolder, flat folder, file list),
// writes or reads its index cache, and reports how long that took and what the sample table
// costs in memory. tools/bench/bench_listing.py runs it beside torchvision.datasets.ImageFolder.
#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include <fmt/format.h>

#include "commands.h"
#include "gpufeed/json_text.h"
#include "gpufeed/datasets/dataset.h"
#include "gpufeed/datasets/shards.h"
#include "proc_stats.h"

namespace gpufeed::tools {

Run add_index(CLI::App& app) {
  struct Args {
    std::string data, index_cache, write_list;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  app.add_option("data", a->data, "ImageFolder root, flat image folder, file list, or tar shards (brace pattern, folder, list)")->required();
  app.add_option("--index-cache", a->index_cache,
                 "where the listing is cached: unset for the user's cache folder "
                 "($XDG_CACHE_HOME/gpufeed, else ~/.cache/gpufeed), 'beside' for <parent>/<name>.gpufeed-index "
                 "beside the dataset (never in a folder whose mode forbids writing), 'off', or a folder");
  app.add_option("--write-list", a->write_list,
                 "also write the samples, one '<path> <label>' line each in dataset order, to this file");
  app.add_flag("--json", a->json, "print one JSON object instead of text");
  return [a] {
    const int64_t rss_before = proc_status_bytes("VmRSS");
    const auto t0 = std::chrono::steady_clock::now();
    const std::shared_ptr<datasets::Dataset> ds = datasets::open_dataset(a->data, {.index_cache = a->index_cache});
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const int64_t peak = proc_status_bytes("VmHWM");
    nlohmann::json r = {{"data", a->data},
                        {"samples", ds->size()},
                        {"classes", ds->classes().size()},
                        {"seconds", seconds},
                        {"rss_growth", peak - rss_before}};
    bool from_cache = false;
    if (const auto* f = dynamic_cast<const datasets::ImageFolder*>(ds.get())) from_cache = f->from_cache();
    if (const auto* f = dynamic_cast<const datasets::FileList*>(ds.get())) from_cache = f->from_cache();
    if (const auto* f = dynamic_cast<const datasets::TarShards*>(ds.get())) from_cache = f->from_cache();
    r["from_cache"] = from_cache;
    if (const auto* l = dynamic_cast<const datasets::SampleList*>(ds.get())) {
      r["path_bytes"] = l->table().path_bytes();
      r["table_bytes"] = l->table().memory_bytes();
    }
    if (!a->write_list.empty()) {
      std::ofstream out(a->write_list, std::ios::binary);
      for (int64_t i = 0; i < ds->size(); ++i) {
        const datasets::SampleRef s = ds->at(i);
        out << s.path << ' ' << s.label << '\n';
      }
      if (!out.flush()) throw std::runtime_error("index: cannot write " + a->write_list);
    }
    if (a->json) {
      std::cout << json_text(r) << "\n";
    } else {
      const double n = static_cast<double>(std::max<int64_t>(ds->size(), 1));
      std::cout << fmt::format("{}: {} samples, {} classes, listed in {:.3f} s{}; peak RSS growth {:.1f} MB ({:.0f} B/sample)",
                               a->data, ds->size(), ds->classes().size(), seconds,
                               from_cache ? " (from the index cache)" : "", (peak - rss_before) / 1048576.0,
                               (peak - rss_before) / n);
      if (r.contains("table_bytes"))
        std::cout << fmt::format("; table {:.1f} B/sample beyond {:.1f} B/sample of paths",
                                 (r["table_bytes"].get<double>() - r["path_bytes"].get<double>()) / n,
                                 r["path_bytes"].get<double>() / n);
      std::cout << "\n";
    }
    return 0;
  };
}

}  // namespace gpufeed::tools
