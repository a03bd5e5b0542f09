// gpufeed bench: the loader alone, decoding and augmenting into slots as fast as it can.
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "commands.h"
#include "gpufeed/loader/loader.h"

namespace gpufeed::tools {

Run add_bench(CLI::App& app) {
  struct Args {
    std::string data;
    int workers = 0;
    int64_t batch_size = 256;
    int image_size = 224;
    std::string transform = "train";
    int epochs = 1;
    int prefetch_depth = 3;
    uint64_t seed = 0;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  app.add_option("--data", a->data, "ImageFolder root, flat image folder or file list")->required();
  app.add_option("--workers", a->workers, "loader threads (0 = all)")->capture_default_str();
  app.add_option("--batch-size", a->batch_size)->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--image-size", a->image_size, "output side, pixels")->capture_default_str();
  app.add_option("--transform", a->transform, "train (RandomResizedCrop+flip) or eval (Resize+CenterCrop)")
      ->capture_default_str()->check(CLI::IsMember({"train", "eval"}));
  app.add_option("--epochs", a->epochs, "passes over the data")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--prefetch-depth", a->prefetch_depth)->capture_default_str();
  app.add_option("--seed", a->seed)->capture_default_str();
  app.add_flag("--json", a->json, "print one JSON object instead of text");
  return [a] {
    std::shared_ptr<const loader::Dataset> ds = loader::open_dataset(a->data);
    loader::LoaderOptions o;
    o.batch_size = a->batch_size;
    o.num_workers = a->workers;
    o.prefetch_depth = a->prefetch_depth;
    o.seed = a->seed;
    if (a->transform == "train") {
      o.transform.kind = loader::TransformOptions::Kind::kTrain;
      o.transform.rrc.size = a->image_size;
    } else {
      o.transform.kind = loader::TransformOptions::Kind::kEval;
      o.transform.eval.crop = a->image_size;
      o.transform.eval.resize = static_cast<int>(std::lround(a->image_size * 256.0 / 224.0));
    }
    loader::Loader loader(ds, std::make_shared<sampler::SequentialSampler>(ds->size()), o);
    int64_t samples = 0, batches = 0;
    uint64_t checksum = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int e = 0; e < a->epochs; ++e) {
      loader.start_epoch(e);
      while (auto b = loader.next()) {
        samples += b->size;
        ++batches;
        // Touch the batch as a consumer would, and make the run's output checkable.
        for (int64_t k = 0; k < b->size; ++k) checksum += b->images[k * b->height * b->width * 3];
      }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto st = loader.stats();
    const double per_s = samples / seconds;
    if (a->json) {
      nlohmann::json j = {{"data", a->data}, {"files", ds->size()}, {"samples", samples},
                          {"batches", batches}, {"seconds", seconds}, {"images_per_s", per_s},
                          {"workers", a->workers}, {"batch_size", a->batch_size},
                          {"image_size", a->image_size}, {"transform", a->transform},
                          {"skipped", st.skipped}, {"read_s", st.read_s}, {"decode_s", st.decode_s},
                          {"resize_s", st.resize_s}, {"bytes_read", st.bytes_read},
                          {"decoded_pixels", st.decoded_pixels}, {"checksum", checksum}};
      std::cout << j.dump(2) << "\n";
    } else {
      std::cout << fmt::format(
          "bench: {} samples ({} files, {} epochs) in {:.2f} s = {:.1f} images/s, {} threads; "
          "thread time: read {:.2f} s, decode {:.2f} s, resize {:.2f} s\n",
          samples, ds->size(), a->epochs, seconds, per_s, a->workers, st.read_s, st.decode_s,
          st.resize_s);
    }
    return 0;
  };
}

}  // namespace gpufeed::tools
