// The loader's resize (PIL's antialiased bilinear), how a sample plan becomes a decode (DCT scale
// by the cost model, crop, widened crop for eval) and the end-to-end pixel quality against
// torchvision on real JPEGs. Golden values: tests/goldens/gen_resize.py and gen_transform.py.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>

#include <unistd.h>

#include "golden.h"
#include "gpufeed/decode/decoder.h"
#include "gpufeed/datasets/dataset.h"
#include "gpufeed/loader/loader.h"
#include "gpufeed/transforms/resize.h"
#include "gpufeed/transforms/transform.h"

namespace fs = std::filesystem;
using namespace gpufeed::loader;
using namespace gpufeed::datasets;
using namespace gpufeed::transforms;
using gpufeed::decode::ImageFormat;
using gpufeed::decode::ImageInfo;
using gpufeed::decode::ScaleFactor;

namespace {

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

double mean_abs_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  EXPECT_EQ(a.size(), b.size());
  double sum = 0;
  for (size_t k = 0; k < std::min(a.size(), b.size()); ++k) sum += std::abs(int(a[k]) - int(b[k]));
  return sum / static_cast<double>(std::max<size_t>(a.size(), 1));
}

// Every kernel this build and CPU run, the scalar one first (the comparisons' reference).
std::vector<ResizeKernel> kernels() {
  std::vector<ResizeKernel> ks;
  for (auto k : {ResizeKernel::kScalar, ResizeKernel::kHighway, ResizeKernel::kAvx2, ResizeKernel::kAvx512})
    if (Resizer::supported(k)) ks.push_back(k);
  return ks;
}

ImageInfo jpeg_info(int w, int h) {
  ImageInfo info;
  info.format = ImageFormat::kJpeg;
  info.width = w;
  info.height = h;
  info.components = 3;
  return info;
}

// One case of resize.json's "resize" / "resize_bicubic": its source resized as the case says.
std::vector<uint8_t> resize_golden_case(Resizer& resizer, const nlohmann::json& c, ResizeFilter filter) {
  const std::vector<uint8_t> src = read_bytes(c["source"]);
  const int w = c["width"], h = c["height"], ow = c["out"][0], oh = c["out"][1];
  const auto& b = c["box"];
  std::vector<uint8_t> out(static_cast<size_t>(ow) * oh * 3);
  resizer.resize(src.data(), w, h, static_cast<size_t>(w) * 3, BoxF{b[0], b[1], b[2], b[3]}, out.data(), ow, oh,
                 static_cast<size_t>(ow) * 3, c["flip"], filter);
  return out;
}

}  // namespace

// PIL filters horizontally first and rounds that intermediate; the Resizer filters vertically
// first (cheaper when shrinking) and its weights have 14 bits, not 22. Pixels differ by at most
// two levels, on average by a quarter level on pure noise and almost never on smooth images.
TEST(Resizer, MatchesPilWithinTwoLevelsForEveryKernel) {
  const auto g = gpufeed::test::load_golden("resize.json");
  const auto& cases = g.at("resize");
  ASSERT_GE(cases.size(), 20u);
  for (const ResizeKernel kernel : kernels()) {
    Resizer resizer(kernel);
    for (const auto& c : cases) {
      const std::vector<uint8_t> ref = read_bytes(c["reference"]);
      const std::vector<uint8_t> out = resize_golden_case(resizer, c, ResizeFilter::kBilinear);
      ASSERT_EQ(out.size(), ref.size());
      int worst = 0;
      for (size_t k = 0; k < out.size(); ++k) worst = std::max(worst, std::abs(out[k] - ref[k]));
      EXPECT_LE(worst, 2) << "kernel " << static_cast<int>(kernel) << " " << c.dump();
      const bool noise = c["source"].get<std::string>().find("noise") != std::string::npos;
      EXPECT_LT(mean_abs_diff(out, ref), noise ? 0.3 : 0.05) << c.dump();
    }
  }
}

// PIL's BICUBIC (torchvision's InterpolationMode.BICUBIC on PIL images). The Resizer runs
// Pillow's pass order as its source has it (horizontal first, the 8-bit intermediate clipped)
// with 14-bit weights, which alone moves pixels by a level or two; but the venv's Pillow (13.0)
// runs some resizes vertical first (most of those that shrink the height more than the width),
// and there the overshoots of the negative lobes are clipped after the other pass: measured on
// these goldens, up to 21 levels on random noise and 16 on the smooth patterns' sharp edges, on
// average at most 0.37 (noise) and 0.034 (smooth) levels per case.
TEST(Resizer, BicubicMatchesPilWithinMeasuredLevelsForEveryKernel) {
  const auto g = gpufeed::test::load_golden("resize.json");
  const auto& cases = g.at("resize_bicubic");
  ASSERT_GE(cases.size(), 20u);
  for (const ResizeKernel kernel : kernels()) {
    Resizer resizer(kernel);
    int worst_noise = 0, worst_smooth = 0;
    double mean_noise = 0, mean_smooth = 0;
    for (const auto& c : cases) {
      const std::vector<uint8_t> ref = read_bytes(c["reference"]);
      const std::vector<uint8_t> out = resize_golden_case(resizer, c, ResizeFilter::kBicubic);
      ASSERT_EQ(out.size(), ref.size());
      int worst = 0;
      for (size_t k = 0; k < out.size(); ++k) worst = std::max(worst, std::abs(out[k] - ref[k]));
      const bool noise = c["source"].get<std::string>().find("noise") != std::string::npos;
      const double mean = mean_abs_diff(out, ref);
      (noise ? worst_noise : worst_smooth) = std::max(noise ? worst_noise : worst_smooth, worst);
      (noise ? mean_noise : mean_smooth) = std::max(noise ? mean_noise : mean_smooth, mean);
      EXPECT_LE(worst, noise ? 21 : 16) << "kernel " << static_cast<int>(kernel) << " " << c.dump();
      EXPECT_LT(mean, noise ? 0.38 : 0.035) << c.dump();
    }
    std::printf("bicubic kernel %d: worst %d (noise) %d (smooth), mean %.4f (noise) %.4f (smooth)\n",
                static_cast<int>(kernel), worst_noise, worst_smooth, mean_noise, mean_smooth);
  }
}

// Bicubic weights are negative in part: the SIMD kernels' signed arithmetic and their clipping of
// sums below 0 and above 255 give the scalar kernel's bytes. High-contrast stripes and noise
// make the overshoots, every scale from a 4x upscale to a 6x downscale.
TEST(Resizer, BicubicKernelsGiveTheScalarBytesWhereTheLobesOvershoot) {
  const auto ks = kernels();
  std::mt19937 rng(17);
  int clipped_low = 0, clipped_high = 0;
  for (int t = 0; t < 48; ++t) {
    const int w = 8 + static_cast<int>(rng() % 400), h = 8 + static_cast<int>(rng() % 300);
    std::vector<uint8_t> src(static_cast<size_t>(w) * h * 3);
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x)
        for (int ch = 0; ch < 3; ++ch)  // stripes of 0 and 255, or noise
          src[(static_cast<size_t>(y) * w + x) * 3 + ch] =
              t % 2 ? static_cast<uint8_t>(rng()) : ((x / (1 + t % 5) + y / (1 + t % 3) + ch) % 2 ? 255 : 0);
    const double scale = std::array{0.25, 0.6, 1.0, 1.3, 1.8, 2.7, 4.5, 6.0}[static_cast<size_t>(t % 8)];
    const int ow = std::max(1, std::min(260, static_cast<int>((w - 0.5) / scale)));
    const int oh = std::max(1, std::min(200, static_cast<int>((h - 0.5) / scale)));
    const BoxF box{0.25, 0.5, 0.25 + std::min(ow * scale, w - 0.25), 0.5 + std::min(oh * scale, h - 0.5)};
    std::vector<uint8_t> first;
    for (const ResizeKernel kernel : ks) {
      Resizer r(kernel);
      const size_t stride = static_cast<size_t>(ow) * 3 + 5;
      std::vector<uint8_t> out(stride * oh, 0xAB);
      r.resize(src.data(), w, h, static_cast<size_t>(w) * 3, box, out.data(), ow, oh, stride, t % 3 == 1,
               ResizeFilter::kBicubic);
      for (int y = 0; y < oh; ++y)
        for (size_t k = static_cast<size_t>(ow) * 3; k < stride; ++k)
          ASSERT_EQ(out[y * stride + k], 0xAB) << "wrote past row " << y;
      if (first.empty()) {
        first = out;
        for (uint8_t v : out) {
          clipped_low += v == 0;
          clipped_high += v == 255;
        }
      }
      ASSERT_EQ(out, first) << "kernel " << static_cast<int>(kernel) << " case " << t << " scale " << scale;
    }
  }
  // The stripes' overshoots were clipped at both ends (0 and 255 away from the sources' own).
  EXPECT_GT(clipped_low, 1000);
  EXPECT_GT(clipped_high, 1000);
}

// A step upscaled 2x along one row (one tap vertically, so no rounding differs from PIL): Keys'
// cubic rings on both sides of the step, undershooting 30 and overshooting 200, and a step from
// 0 to 255 rings past the range and is clipped. The values are PIL's.
TEST(Resizer, BicubicUpscaleOfAStepRingsAndClipsLikePil) {
  const auto upscale = [](ResizeKernel kernel, int lo, int hi) {
    std::vector<uint8_t> src(8 * 3);
    for (int x = 0; x < 8; ++x) src[x * 3] = src[x * 3 + 1] = src[x * 3 + 2] = static_cast<uint8_t>(x < 4 ? lo : hi);
    Resizer r(kernel);
    std::vector<uint8_t> out(16 * 3);
    r.resize(src.data(), 8, 1, 24, BoxF{0, 0, 8, 1}, out.data(), 16, 1, 48, false, ResizeFilter::kBicubic);
    std::vector<int> values;
    for (int x = 0; x < 16; ++x) values.push_back(out[x * 3 + (x % 3)]);
    return values;
  };
  for (const ResizeKernel kernel : kernels()) {
    EXPECT_EQ(upscale(kernel, 30, 200),
              (std::vector<int>{30, 30, 30, 30, 30, 26, 18, 65, 165, 212, 204, 200, 200, 200, 200, 200}))
        << "kernel " << static_cast<int>(kernel);
    EXPECT_EQ(upscale(kernel, 0, 255),
              (std::vector<int>{0, 0, 0, 0, 0, 0, 0, 52, 203, 255, 255, 255, 255, 255, 255, 255}))
        << "kernel " << static_cast<int>(kernel);
  }
}

TEST(Resizer, AllKernelsGiveIdenticalBytes) {
  std::mt19937 rng(11);
  const auto ks = kernels();
  ASSERT_GE(ks.size(), 1u);
  for (int t = 0; t < 60; ++t) {
    const int w = 1 + static_cast<int>(rng() % 700), h = 1 + static_cast<int>(rng() % 500);
    const int ow = 1 + static_cast<int>(rng() % 260), oh = 1 + static_cast<int>(rng() % 260);
    std::vector<uint8_t> src(static_cast<size_t>(w) * h * 3);
    for (auto& v : src) v = static_cast<uint8_t>(rng());
    std::uniform_real_distribution<double> ux(0, w - 0.25), uy(0, h - 0.25);
    const double x0 = ux(rng), y0 = uy(rng);
    const BoxF box{x0, y0, x0 + (w - x0) * (0.1 + 0.9 * (rng() % 1000) / 1000.0),
                   y0 + (h - y0) * (0.1 + 0.9 * (rng() % 1000) / 1000.0)};
    std::vector<uint8_t> first;
    for (const ResizeKernel kernel : ks) {
      Resizer r(kernel);
      // A destination stride wider than the row: nothing may be written past the row.
      const size_t stride = static_cast<size_t>(ow) * 3 + 5;
      std::vector<uint8_t> out(stride * oh, 0xAB);
      r.resize(src.data(), w, h, static_cast<size_t>(w) * 3, box, out.data(), ow, oh, stride,
               t % 2 == 1);
      for (int y = 0; y < oh; ++y)
        for (size_t k = static_cast<size_t>(ow) * 3; k < stride; ++k)
          ASSERT_EQ(out[y * stride + k], 0xAB) << "wrote past row " << y;
      if (first.empty()) first = out;
      ASSERT_EQ(out, first) << "kernel " << static_cast<int>(kernel) << " case " << t;
    }
  }
}

// The SIMD kernels specialise by tap count (AVX2: horizontal taps padded to two, fixed loops for
// 1-5 vertical taps and for 2, 4, 6, 8 horizontal taps) and finish rows of any width (four
// pixels per step, a 16-byte store only where the row has room): every scale from a 4x upscale
// to a 6x downscale, on both axes, and output widths 1..13, against the scalar kernel.
TEST(Resizer, EveryTapCountAndRowTailGivesTheScalarBytes) {
  const auto ks = kernels();
  std::mt19937 rng(5);
  const int w = 160, h = 150;
  std::vector<uint8_t> src(static_cast<size_t>(w) * h * 3);
  for (auto& v : src) v = static_cast<uint8_t>(rng());
  int cases = 0;
  for (const double scale : {0.25, 0.6, 1.0, 1.3, 1.5, 1.8, 2.2, 2.7, 3.5, 4.5, 6.0}) {
    for (int ow = 1; ow <= 13; ++ow) {
      const int oh = 1 + (ow * 5) % 11;
      const double bw = std::min(ow * scale, w - 1.5), bh = std::min(oh * scale, h - 1.5);
      const BoxF box{0.75, 1.25, 0.75 + bw, 1.25 + bh};
      std::vector<uint8_t> first;
      for (const ResizeKernel kernel : ks) {
        Resizer r(kernel);
        const size_t stride = static_cast<size_t>(ow) * 3 + 7;
        std::vector<uint8_t> out(stride * oh, 0xCD);
        r.resize(src.data(), w, h, static_cast<size_t>(w) * 3, box, out.data(), ow, oh, stride, ow % 2 == 0);
        for (int y = 0; y < oh; ++y)
          for (size_t k = static_cast<size_t>(ow) * 3; k < stride; ++k)
            ASSERT_EQ(out[y * stride + k], 0xCD) << "wrote past row " << y << " at scale " << scale << ", width " << ow;
        if (first.empty()) first = out;
        ASSERT_EQ(out, first) << "kernel " << static_cast<int>(kernel) << " scale " << scale << " width " << ow;
      }
      ++cases;
    }
  }
  // Wide rows too (the vertical pass's 32- and 64-byte steps and tails), for each tap count.
  for (const double scale : {0.5, 1.2, 1.7, 2.4, 3.1}) {
    for (const int ow : {37, 64, 101}) {
      const BoxF box{0.5, 0.5, 0.5 + std::min(ow * scale, w - 1.0), 0.5 + std::min(20 * scale, h - 1.0)};
      std::vector<uint8_t> first;
      for (const ResizeKernel kernel : ks) {
        Resizer r(kernel);
        std::vector<uint8_t> out(static_cast<size_t>(ow) * 20 * 3);
        r.resize(src.data(), w, h, static_cast<size_t>(w) * 3, box, out.data(), ow, 20, static_cast<size_t>(ow) * 3);
        if (first.empty()) first = out;
        ASSERT_EQ(out, first) << "kernel " << static_cast<int>(kernel) << " scale " << scale << " width " << ow;
      }
      ++cases;
    }
  }
  EXPECT_EQ(cases, 11 * 13 + 5 * 3);
}

// The Highway kernel runs wherever this suite runs on aarch64 (NEON) or an x86 CPU with SSE4.2,
// so the comparisons above and below include it; kAuto picks it only off x86 (on x86 the
// hand-written AVX2/AVX-512 kernels stay the choice).
TEST(Resizer, HighwayKernelIsBuiltAndAutoPicksItOnlyOffX86) {
#if defined(__aarch64__)
  EXPECT_TRUE(Resizer::supported(ResizeKernel::kHighway));
#endif
  if (Resizer::supported(ResizeKernel::kHighway)) EXPECT_EQ(Resizer(ResizeKernel::kHighway).kernel(), ResizeKernel::kHighway);
  else EXPECT_THROW(Resizer{ResizeKernel::kHighway}, std::invalid_argument);
  if (std::getenv("GPUFEED_RESIZE_KERNEL") != nullptr) GTEST_SKIP() << "GPUFEED_RESIZE_KERNEL is set";
#if defined(__x86_64__) || defined(__i386__)
  EXPECT_NE(Resizer().kernel(), ResizeKernel::kHighway);
#elif defined(__aarch64__)
  EXPECT_EQ(Resizer().kernel(), ResizeKernel::kHighway);
#endif
}

// Sources narrower than one vector (the vertical pass's 16 or 32 bytes: 1-6 pixels), outputs of
// 1-9 pixels, and long filters (a 40x downscale: 81 bilinear taps, 161 bicubic per axis), both
// filters, flipped or not: every kernel gives the scalar bytes.
TEST(Resizer, NarrowSourcesAndLongFiltersGiveTheScalarBytes) {
  const auto ks = kernels();
  std::mt19937 rng(23);
  std::vector<uint8_t> src(400 * 300 * 3);
  for (auto& v : src) v = static_cast<uint8_t>(rng() % 2 ? 255 : rng());
  int cases = 0;
  for (const ResizeFilter filter : {ResizeFilter::kBilinear, ResizeFilter::kBicubic}) {
    for (int w = 1; w <= 6; ++w) {
      for (int ow = 1; ow <= 9; ++ow) {
        const int h = 1 + (w * 7 + ow) % 9, oh = 1 + (ow * 3) % 7;
        const BoxF box{0, 0, static_cast<double>(w), static_cast<double>(h)};
        std::vector<uint8_t> first;
        for (const ResizeKernel kernel : ks) {
          Resizer r(kernel);
          std::vector<uint8_t> out(static_cast<size_t>(ow) * oh * 3);
          r.resize(src.data(), w, h, 400 * 3, box, out.data(), ow, oh, static_cast<size_t>(ow) * 3, ow % 2 == 1, filter);
          if (first.empty()) first = out;
          ASSERT_EQ(out, first) << "kernel " << static_cast<int>(kernel) << " source " << w << "x" << h << " to " << ow << "x" << oh;
        }
        ++cases;
      }
    }
    for (const int ow : {1, 3, 7, 10}) {  // 400x300 to 10x7 at most: 40x down, 43 or 86 taps
      const int oh = 1 + ow * 2 / 3;
      std::vector<uint8_t> first;
      for (const ResizeKernel kernel : ks) {
        Resizer r(kernel);
        std::vector<uint8_t> out(static_cast<size_t>(ow) * oh * 3);
        r.resize(src.data(), 400, 300, 400 * 3, BoxF{0.5, 0.25, 399.5, 299}, out.data(), ow, oh,
                 static_cast<size_t>(ow) * 3, false, filter);
        if (first.empty()) first = out;
        ASSERT_EQ(out, first) << "kernel " << static_cast<int>(kernel) << " to " << ow << "x" << oh;
      }
      ++cases;
    }
  }
  EXPECT_EQ(cases, 2 * (6 * 9 + 4));
}

TEST(Resizer, FlipMirrorsTheUnflippedOutput) {
  std::vector<uint8_t> src(97 * 61 * 3);
  for (size_t k = 0; k < src.size(); ++k) src[k] = static_cast<uint8_t>(k * 37 + k / 7);
  for (const ResizeKernel kernel : kernels()) {
    Resizer r(kernel);
    const int ow = 45, oh = 33;
    std::vector<uint8_t> a(ow * oh * 3), b(ow * oh * 3);
    const BoxF box{3.5, 2.25, 90.0, 60.0};
    r.resize(src.data(), 97, 61, 97 * 3, box, a.data(), ow, oh, ow * 3, false);
    r.resize(src.data(), 97, 61, 97 * 3, box, b.data(), ow, oh, ow * 3, true);
    for (int y = 0; y < oh; ++y)
      for (int x = 0; x < ow; ++x)
        for (int c = 0; c < 3; ++c)
          ASSERT_EQ(a[(y * ow + x) * 3 + c], b[(y * ow + (ow - 1 - x)) * 3 + c]);
  }
}

TEST(Resizer, SameSizeIntegerBoxIsACopy) {
  std::vector<uint8_t> src(40 * 30 * 3);
  for (size_t k = 0; k < src.size(); ++k) src[k] = static_cast<uint8_t>(k * 13);
  for (const ResizeKernel kernel : kernels()) {
    Resizer r(kernel);
    std::vector<uint8_t> out(20 * 10 * 3);
    r.resize(src.data(), 40, 30, 40 * 3, BoxF{5, 7, 25, 17}, out.data(), 20, 10, 20 * 3);
    for (int y = 0; y < 10; ++y)
      for (int x = 0; x < 60; ++x) ASSERT_EQ(out[y * 60 + x], src[(y + 7) * 120 + 15 + x]);
  }
}

TEST(Resizer, RejectsBoxesOutsideTheSourceAndBadSizes) {
  std::vector<uint8_t> src(10 * 10 * 3), out(4 * 4 * 3);
  Resizer r;
  EXPECT_THROW(r.resize(src.data(), 10, 10, 30, BoxF{0, 0, 10.5, 10}, out.data(), 4, 4, 12),
               std::invalid_argument);
  EXPECT_THROW(r.resize(src.data(), 10, 10, 30, BoxF{3, 3, 3, 8}, out.data(), 4, 4, 12),
               std::invalid_argument);
  EXPECT_THROW(r.resize(src.data(), 10, 10, 29, BoxF{0, 0, 10, 10}, out.data(), 4, 4, 12),
               std::invalid_argument);
  EXPECT_THROW(r.resize(src.data(), 10, 10, 30, BoxF{0, 0, 10, 10}, out.data(), 0, 4, 12),
               std::invalid_argument);
  EXPECT_THROW(r.resize(nullptr, 10, 10, 30, BoxF{0, 0, 10, 10}, out.data(), 4, 4, 12),
               std::invalid_argument);
}

TEST(ResizeCenterCrop, RegionIsTorchvisionsCropMappedBackExactly) {
  const auto g = gpufeed::test::load_golden("transform.json");
  for (const auto& c : g.at("center_crop")) {
    const int w = c["width"], h = c["height"], crop = c["crop"];
    const double sx = static_cast<double>(w) / c["resized"][0].get<int>();
    const double sy = static_cast<double>(h) / c["resized"][1].get<int>();
    const BoxF r = center_crop_region(w, h, {c["resize"], crop});
    const int left = c["left"], top = c["top"];
    EXPECT_NEAR(r.x0, left * sx, 1e-9) << c.dump();
    EXPECT_NEAR(r.y0, top * sy, 1e-9) << c.dump();
    EXPECT_NEAR(r.x1, std::min((left + crop) * sx, double(w)), 1e-9) << c.dump();
    EXPECT_NEAR(r.y1, std::min((top + crop) * sy, double(h)), 1e-9) << c.dump();
    // The plan decodes the smallest integer box containing the region.
    TransformOptions o;
    o.kind = TransformOptions::Kind::kEval;
    o.eval = {c["resize"], crop};
    const SamplePlan p = plan_sample(o, w, h, 0, 0, 0);
    EXPECT_FALSE(p.taps_clamped_to_box);
    EXPECT_LE(p.box.x, r.x0);
    EXPECT_GT(p.box.x + 1, r.x0);
    EXPECT_GE(p.box.x + p.box.width, r.x1 - 1e-9);
    EXPECT_LT(p.box.x + p.box.width - 1, r.x1);
  }
  EXPECT_THROW(center_crop_region(100, 100, {200, 201}), std::invalid_argument);
}

TEST(ChooseScale, PicksTheCheapestScaleByTheCostModelThatStillCoversTheOutput) {
  using gpufeed::decode::choose_scale;
  using gpufeed::decode::scale_cost;
  // The model: the power-of-two scales (SIMD IDCTs) are cheaper than 8/8, 5/8..7/8 dearer.
  EXPECT_DOUBLE_EQ(scale_cost(ScaleFactor{8}), 1.0);
  for (int num : {1, 2, 4}) EXPECT_LT(scale_cost(ScaleFactor{num}), 1.0) << num;
  for (int num : {5, 6, 7}) EXPECT_GT(scale_cost(ScaleFactor{num}), 1.0) << num;
  EXPECT_LT(scale_cost(ScaleFactor{4}), scale_cost(ScaleFactor{3}));
  EXPECT_THROW(scale_cost(ScaleFactor{0}), std::invalid_argument);
  EXPECT_THROW(scale_cost(ScaleFactor{9}), std::invalid_argument);

  const ImageInfo big = jpeg_info(4000, 3000);
  // A 2000 px crop to 224: 1/8 gives 250 >= 224.
  EXPECT_EQ(choose_scale(big, {0, 0, 2000, 2000}, 224, 224).num, 1);
  // 600 px: 1/8 = 75 and 2/8 = 150 fall short; 3/8 = 225 covers, but 4/8 costs less.
  EXPECT_EQ(choose_scale(big, {0, 0, 600, 600}, 224, 224).num, 4);
  // 300 px: only 6/8 (225), 7/8 and 8/8 cover; 8/8 is the cheapest of them.
  EXPECT_EQ(choose_scale(big, {0, 0, 300, 300}, 224, 224).num, 8);
  // Exactly covering counts: 896 * 2 / 8 = 224.
  EXPECT_EQ(choose_scale(big, {0, 0, 896, 896}, 224, 224).num, 2);
  EXPECT_EQ(choose_scale(big, {0, 0, 895, 896}, 224, 224).num, 4);
  // Every choice is the cheapest covering one, over a grid.
  for (int side = 100; side < 3000; side += 37) {
    const int num = choose_scale(big, {0, 0, side, side}, 224, 224).num;
    EXPECT_TRUE(num == 8 || side * num >= 224 * 8) << side;
    for (int other = 1; other <= 8; ++other) {
      if (side * other >= 224 * 8) {
        EXPECT_LE(scale_cost(ScaleFactor{num}), scale_cost(ScaleFactor{other})) << side;
      }
    }
  }
}

TEST(DecodeOptionsFor, TrainDecodesTheBoxAndEvalWidensItByTheFilterReach) {
  const ImageInfo info = jpeg_info(1200, 900);
  TransformOptions train;
  const SamplePlan t = plan_sample(train, 1200, 900, 3, 0, 17);
  const auto dt = decode_options_for(t, info, {});
  EXPECT_EQ(dt.crop, t.box);
  EXPECT_EQ(dt.scale, gpufeed::decode::choose_scale(info, t.box, 224, 224));

  TransformOptions eval;
  eval.kind = TransformOptions::Kind::kEval;
  const SamplePlan e = plan_sample(eval, 1200, 900, 0, 0, 0);
  const auto de = decode_options_for(e, info, {});
  // 900 -> 256: the region is about 788 px for 224 outputs; 3/8 (296) is the smallest scale that
  // covers it and 4/8 the cheapest.
  EXPECT_EQ(de.scale.num, 4);
  const int reach = static_cast<int>(std::ceil(std::max(e.region.width() / 224, 8.0 / 4))) + 1;
  EXPECT_EQ(reach, 5);
  EXPECT_EQ(de.crop.x, e.box.x - reach);
  EXPECT_EQ(de.crop.y, e.box.y - reach);
  EXPECT_EQ(de.crop.x + de.crop.width, e.box.x + e.box.width + reach);
  EXPECT_EQ(de.crop.y + de.crop.height, e.box.y + e.box.height + reach);
  // Clamped at the image's edges.
  const SamplePlan tiny = plan_sample(eval, 230, 240, 0, 0, 0);
  const auto dtiny = decode_options_for(tiny, jpeg_info(230, 240), {});
  EXPECT_GE(dtiny.crop.x, 0);
  EXPECT_LE(dtiny.crop.x + dtiny.crop.width, 230);
  EXPECT_LE(dtiny.crop.y + dtiny.crop.height, 240);
}

// Bicubic's support is two source pixels per output pixel's footprint, twice bilinear's: the eval
// decode is widened by twice the reach, and the plan carries the filter to the resize.
TEST(DecodeOptionsFor, BicubicEvalWidensTheCropByTwiceTheReach) {
  const ImageInfo info = jpeg_info(1200, 900);
  TransformOptions eval;
  eval.kind = TransformOptions::Kind::kEval;
  eval.interpolation = ResizeFilter::kBicubic;
  const SamplePlan e = plan_sample(eval, 1200, 900, 0, 0, 0);
  EXPECT_EQ(e.filter, ResizeFilter::kBicubic);
  const auto de = decode_options_for(e, info, {});
  EXPECT_EQ(de.scale.num, 4);
  const int reach = static_cast<int>(std::ceil(2 * std::max(e.region.width() / 224, 8.0 / 4))) + 1;
  EXPECT_EQ(reach, 9);
  EXPECT_EQ(de.crop.x, e.box.x - reach);
  EXPECT_EQ(de.crop.y, e.box.y - reach);
  EXPECT_EQ(de.crop.x + de.crop.width, e.box.x + e.box.width + reach);
  EXPECT_EQ(de.crop.y + de.crop.height, e.box.y + e.box.height + reach);
  TransformOptions train;
  train.interpolation = ResizeFilter::kBicubic;
  const SamplePlan t = plan_sample(train, 1200, 900, 3, 0, 17);
  EXPECT_EQ(t.filter, ResizeFilter::kBicubic);
  EXPECT_EQ(decode_options_for(t, info, {}).crop, t.box);  // train: the box, whatever the filter
  EXPECT_EQ(parse_resize_filter("bicubic"), ResizeFilter::kBicubic);
  EXPECT_THROW(parse_resize_filter("lanczos"), std::invalid_argument);
}

TEST(DecodedRegion, MapsTheSourceRegionIntoTheScaledCrop) {
  SamplePlan p;
  p.region = {100.5, 40.0, 300.0, 240.25};
  p.output_size = 50;
  gpufeed::decode::DecodeResult r;
  r.scale = ScaleFactor{4};
  r.scaled_region = {50, 20, 100, 101};  // floor(100 * 0.5) .. ceil(300 * 0.5)
  const BoxF b = decoded_region(p, r);
  EXPECT_DOUBLE_EQ(b.x0, 0.25);
  EXPECT_DOUBLE_EQ(b.y0, 0.0);
  EXPECT_DOUBLE_EQ(b.x1, 100.0);
  EXPECT_DOUBLE_EQ(b.y1, 100.125);
}

// The whole sample path (plan, DCT-scaled crop decode, resize into the output) against
// torchvision's PIL pipeline on real ImageNet JPEGs, including large ones decoded at 1/8..4/8.
TEST(Quality, RealJpegsAreCloseToTorchvisionForEvalAndTrain) {
  const auto g = gpufeed::test::load_golden("resize.json");
  const auto& files = g.at("files");
  if (files.empty()) GTEST_SKIP() << "../shared/data/imagenet-sample is absent in this checkout";
  gpufeed::decode::Decoder decoder;
  gpufeed::decode::ImageBuffer image;
  Resizer resizer;
  int scaled = 0, train_cases = 0;
  double train_sum = 0;
  for (const auto& f : files) {
    const std::string path = f["path"];
    // Eval: the loader's own path, as the loader runs it.
    const fs::path list = fs::temp_directory_path() / ("gpufeed_quality_" + std::to_string(::getpid()) + ".txt");
    std::ofstream(list) << path << " 0\n";
    FileList ds(list, "/");
    fs::remove(list);
    LoaderOptions o;
    o.transform.kind = TransformOptions::Kind::kEval;
    std::vector<uint8_t> ours(224 * 224 * 3);
    load_sample(ds, 0, 0, o, ours.data());
    const double eval_diff = mean_abs_diff(ours, read_bytes(f["eval_reference"]));
    EXPECT_LE(eval_diff, 3.0) << path;  // mean |gpufeed - torchvision|, 0..255 scale
    // Train: torchvision's box and flip, planned and decoded as the loader does.
    std::vector<uint8_t> bytes;
    gpufeed::decode::read_file(path, bytes);
    const ImageInfo info = gpufeed::decode::probe(bytes, path);
    for (const auto& t : f["train"]) {
      SamplePlan p;
      p.box = {t["box"][0], t["box"][1], t["box"][2], t["box"][3]};
      p.region = {double(p.box.x), double(p.box.y), double(p.box.x + p.box.width),
                  double(p.box.y + p.box.height)};
      p.taps_clamped_to_box = true;
      p.flip = t["flip"];
      p.output_size = 224;
      const auto d = decode_options_for(p, info, {});
      if (d.scale.num < 8) ++scaled;
      const auto result = decoder.decode(bytes, path, d, image);
      resize_sample(p, result, image, resizer, ours.data());
      const double diff = mean_abs_diff(ours, read_bytes(t["reference"]));
      // At 8/8 the path is PIL's arithmetic on the same libjpeg-turbo pixels. A DCT-scaled decode
      // low-passes sharply before the (narrower) triangle filter, where PIL's wide triangle lets
      // some aliasing through: on fine texture that differs by a few levels.
      EXPECT_LE(diff, d.scale.num == 8 ? 0.5 : 6.0) << path << " " << t.dump() << " at "
                                                    << d.scale.num << "/8";
      train_sum += diff;
      ++train_cases;
    }
  }
  EXPECT_GT(scaled, 0) << "the chosen files must exercise DCT-scaled decoding";
  EXPECT_LE(train_sum / train_cases, 3.0);
}
