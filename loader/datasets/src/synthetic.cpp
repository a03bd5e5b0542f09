#include "gpufeed/datasets/synthetic.h"

#include <fmt/format.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "gpufeed/datasets/tbb_tsan.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <random>
#include <stdexcept>
#include <vector>

#include "gpufeed/decode/decoder.h"

namespace gpufeed::datasets {
namespace {

// HSV (h in [0,1), s, v in [0,1]) to RGB in [0,255].
void hsv_to_rgb(double h, double s, double v, double rgb[3]) {
  const double i = std::floor(h * 6);
  const double f = h * 6 - i;
  const double p = v * (1 - s), q = v * (1 - f * s), t = v * (1 - (1 - f) * s);
  double r = 0, g = 0, b = 0;
  switch (static_cast<int>(i) % 6) {
    case 0: r = v, g = t, b = p; break;
    case 1: r = q, g = v, b = p; break;
    case 2: r = p, g = v, b = t; break;
    case 3: r = p, g = q, b = v; break;
    case 4: r = t, g = p, b = v; break;
    default: r = v, g = p, b = q; break;
  }
  rgb[0] = r * 255, rgb[1] = g * 255, rgb[2] = b * 255;
}

uint8_t clamp8(double v) { return static_cast<uint8_t>(std::lround(std::clamp(v, 0.0, 255.0))); }

}  // namespace

int64_t write_synthetic_image_folder(const std::filesystem::path& root, const SyntheticOptions& o) {
  if (o.num_classes < 1 || o.images_per_class < 1 || o.min_size < 1 || o.max_size < o.min_size) {
    throw std::invalid_argument("write_synthetic_image_folder: invalid options");
  }
  // Files are written in parallel on oneTBB's pool; a file's bytes depend only on (seed, class,
  // k), so the output is the same for any thread count.
  std::vector<std::array<double, 3>> bases(static_cast<size_t>(o.num_classes));
  for (int c = 0; c < o.num_classes; ++c) {
    std::filesystem::create_directories(root / fmt::format("class_{:03d}", c));
    hsv_to_rgb(static_cast<double>(c) / o.num_classes, 0.75, 0.85, bases[static_cast<size_t>(c)].data());
  }
  const int64_t total = static_cast<int64_t>(o.num_classes) * o.images_per_class;
  detail::parallel_for_ordered(tbb::blocked_range<int64_t>(0, total), [&](const tbb::blocked_range<int64_t>& range) {
    std::vector<uint8_t> rgb;
    for (int64_t i = range.begin(); i < range.end(); ++i) {
      const int c = static_cast<int>(i / o.images_per_class);
      const int k = static_cast<int>(i % o.images_per_class);
      const double* base = bases[static_cast<size_t>(c)].data();
      // One generator per file: a file's bytes depend only on (seed, class, k).
      std::mt19937_64 rng(o.seed * 1'000'003ULL + static_cast<uint64_t>(c) * 100'003ULL + k);
      std::uniform_int_distribution<int> size(o.min_size, o.max_size);
      std::uniform_real_distribution<double> u(0.0, 1.0);
      std::normal_distribution<double> noise(0.0, 12.0);
      const int w = size(rng), h = size(rng);
      const double gain = 0.8 + 0.4 * u(rng);
      const double gx = (u(rng) - 0.5) * 60, gy = (u(rng) - 0.5) * 60;
      rgb.assign(static_cast<size_t>(w) * h * 3, 0);
      for (int y = 0; y < h; ++y) {
        for (int x = 0; x < w; ++x) {
          const double grad = gx * x / w + gy * y / h;
          uint8_t* px = &rgb[(static_cast<size_t>(y) * w + x) * 3];
          for (int ch = 0; ch < 3; ++ch) px[ch] = clamp8(base[ch] * gain + grad + noise(rng));
        }
      }
      // Distractors: grey-ish rectangles of random colour, each under 1/9 of the image.
      const int rects = 1 + static_cast<int>(u(rng) * 3);
      for (int r = 0; r < rects; ++r) {
        const int rw = 1 + static_cast<int>(u(rng) * w / 3), rh = 1 + static_cast<int>(u(rng) * h / 3);
        const int rx = static_cast<int>(u(rng) * (w - rw)), ry = static_cast<int>(u(rng) * (h - rh));
        const uint8_t col = clamp8(u(rng) * 255);
        for (int y = ry; y < ry + rh; ++y) {
          for (int x = rx; x < rx + rw; ++x) {
            uint8_t* px = &rgb[(static_cast<size_t>(y) * w + x) * 3];
            px[0] = px[1] = px[2] = col;
          }
        }
      }
      const auto jpeg = decode::encode_jpeg(rgb.data(), w, h, o.quality, decode::Subsampling::k420);
      const auto path = root / fmt::format("class_{:03d}", c) / fmt::format("img_{:05d}.jpg", k);
      std::ofstream out(path, std::ios::binary);
      out.write(reinterpret_cast<const char*>(jpeg.data()), static_cast<std::streamsize>(jpeg.size()));
      if (!out) throw std::runtime_error("write_synthetic_image_folder: cannot write " + path.string());
    }
  });
  return total;
}

}  // namespace gpufeed::datasets
