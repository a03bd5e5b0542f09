#pragma once
// Synthetic ImageFolder datasets of real JPEG files, for the default main job, tests and
// benchmarks on machines without a dataset. The classes are learnable: each class has its own
// hue, and every image adds brightness jitter, a gradient, noise and distractor rectangles, so a
// model must learn colour statistics robust to crops and flips.

#include <cstdint>
#include <filesystem>
#include <string>

namespace gpufeed::datasets {

/// Options of write_synthetic_image_folder.
struct SyntheticOptions {
  int num_classes = 10;          ///< classes, named class_000, class_001, ...
  int images_per_class = 50;     ///< JPEG files per class
  int min_size = 160;            ///< smallest width/height, pixels
  int max_size = 320;            ///< largest width/height, pixels
  int quality = 90;              ///< JPEG quality 1..100
  uint64_t seed = 0;             ///< the same seed writes byte-identical files
};

/// Writes root/class_XXX/img_YYYYY.jpg, in parallel on oneTBB's pool (the same bytes for any thread
/// count). Creates root; existing files are overwritten. Returns the
/// number of files written. Throws std::runtime_error naming the path on an I/O failure, and
/// std::invalid_argument for bad options.
int64_t write_synthetic_image_folder(const std::filesystem::path& root, const SyntheticOptions& options);

}  // namespace gpufeed::datasets
