// The Highway kernels against the scalar ones, byte for byte, through the public functions: the
// check tools/qemu_kernels.sh runs on every CI run with this file cross-compiled for aarch64 (the
// NEON build) and run under qemu-user. No GoogleTest: it links only the transforms' sources.
//   qemu_kernels            every case; exit status 0 when every byte is equal, 1 otherwise
// Each case runs its kernel with kHighway and with kScalar on the same seeded pseudo-random images
// (noise, and images of extreme levels only) of the sizes below, once per parameter of its list,
// and prints "CASE: N images, N bytes equal"; the first difference fails the run and names the
// case, the size, the parameter, the seed and the byte. A kernel added to Highway is one row of
// kCases.
#include <hwy/targets.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iterator>
#include <vector>

#include "gpufeed/transforms/augment.h"
#include "gpufeed/transforms/resize.h"

namespace {

using gpufeed::transforms::BoxF;
using gpufeed::transforms::ColorKernel;
using gpufeed::transforms::ResizeFilter;
using gpufeed::transforms::ResizeKernel;
using gpufeed::transforms::Resizer;

struct Image {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;  // [height, width, 3]
};

// splitmix64: the same images on every machine and compiler.
uint64_t next(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Odd seeds: noise; even seeds: the levels where rounding and clipping turn (0, 1, 127, 128,
// 254, 255) only.
Image random_image(int width, int height, uint64_t seed) {
  static constexpr uint8_t kExtremes[] = {0, 1, 127, 128, 254, 255};
  Image image{width, height, std::vector<uint8_t>(static_cast<size_t>(width) * height * 3)};
  uint64_t state =
      seed * 1000003u + static_cast<uint64_t>(width) * 131u + static_cast<uint64_t>(height);
  for (uint8_t& v : image.pixels) {
    const uint64_t r = next(state);
    v = (seed % 2) ? static_cast<uint8_t>(r >> 56) : kExtremes[r % 6];
  }
  return image;
}

struct Output {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> bytes;
};

// Resizes a box of the image with fractional edges (BoxF's; the taps at the edges then weigh
// less) to `scale` times its width and 0.9 `scale` times its height.
template <ResizeFilter filter, bool flip>
Output resize(const Image& in, double scale, bool highway) {
  Output out;
  out.width = std::max(1, static_cast<int>(in.width * scale + 0.5));
  out.height = std::max(1, static_cast<int>(in.height * scale * 0.9 + 0.5));
  out.bytes.assign(static_cast<size_t>(out.width) * out.height * 3, 0);
  const BoxF box{in.width * 0.1, in.height * 0.05, in.width * 0.93, static_cast<double>(in.height)};
  Resizer resizer(highway ? ResizeKernel::kHighway : ResizeKernel::kScalar);
  resizer.resize(in.pixels.data(), in.width, in.height, static_cast<size_t>(in.width) * 3, box,
                 out.bytes.data(), out.width, out.height, static_cast<size_t>(out.width) * 3, flip,
                 filter);
  return out;
}

template <void (*Adjust)(uint8_t*, int, int, double, ColorKernel)>
Output colour(const Image& in, double factor, bool highway) {
  Output out{in.width, in.height, in.pixels};
  Adjust(out.bytes.data(), in.height, in.width, factor,
         highway ? ColorKernel::kHighway : ColorKernel::kScalar);
  return out;
}

struct KernelCase {
  const char* name;
  std::vector<double> params;  // each image runs every one
  Output (*run)(const Image& in, double param, bool highway);
};

// Saturation and contrast factors: the blends' ends, ordinary ones, one whose mean term dominates
// (34) and ones whose float products overflow to infinities and NaN (1e30, 1e300).
const std::vector<double> kFactors = {0.0, 1.0, 0.6, 1.4, 34.0, 1e30, 1e300};
const std::vector<double> kScales = {0.37, 1.0, 2.3};

// gaussian_blur with kernel_size kSize and sigma `param`; a size the reflect padding cannot take
// (kSize / 2 >= a side: std::invalid_argument) gives no output in either run.
template <int kSize>
Output blur(const Image& in, double sigma, bool highway) {
  if (kSize / 2 >= in.width || kSize / 2 >= in.height) return Output{};
  Output out{in.width, in.height, in.pixels};
  gpufeed::transforms::AugmentScratch scratch;
  gpufeed::transforms::gaussian_blur(out.bytes.data(), in.height, in.width, kSize, sigma, scratch,
                                     highway ? ColorKernel::kHighway : ColorKernel::kScalar);
  return out;
}

// The bilinear affine warp: a rotation by `param` degrees about the centre with shears and a
// fractional translation that moves part of the image out (those pixels become 0).
Output warp(const Image& in, double angle, bool highway) {
  Output out{in.width, in.height, in.pixels};
  gpufeed::transforms::AugmentScratch scratch;
  gpufeed::transforms::affine(out.bytes.data(), in.height, in.width, angle, 0.3 * in.width, -1.7, 12.0,
                              -4.5, false, gpufeed::transforms::InterpolationMode::kBilinear, scratch,
                              highway ? ColorKernel::kHighway : ColorKernel::kScalar);
  return out;
}

const KernelCase kCases[] = {
    {"resize_bilinear", kScales, resize<ResizeFilter::kBilinear, false>},
    {"resize_bilinear_flip", kScales, resize<ResizeFilter::kBilinear, true>},
    {"resize_bicubic", kScales, resize<ResizeFilter::kBicubic, false>},
    {"adjust_saturation", kFactors, colour<gpufeed::transforms::adjust_saturation>},
    {"adjust_contrast", kFactors, colour<gpufeed::transforms::adjust_contrast>},
    {"adjust_hue", {-0.5, -0.2, 0.0, 0.13, 0.5}, colour<gpufeed::transforms::adjust_hue>},
    {"gaussian_blur_k5", {0.3, 1.1, 2.0}, blur<5>},
    {"gaussian_blur_k23", {6.5}, blur<23>},
    {"affine_bilinear", {-30.0, 0.0, 7.5, 90.0}, warp},
};

// Around the 16-pixel and 16-byte vector widths, odd ones, one row or column, and the loader's
// 224x224.
constexpr int kSizes[][2] = {{1, 1},   {3, 2},   {5, 7},   {16, 1},  {1, 17},   {17, 9},
                             {31, 16}, {33, 33}, {64, 48}, {97, 61}, {224, 224}};
constexpr uint64_t kSeeds[] = {1, 2, 3};

// Compares one case over every size, seed and parameter; prints its counts or its first difference.
bool check(const KernelCase& c) {
  size_t images = 0, bytes = 0;
  for (const auto& size : kSizes) {
    for (const uint64_t seed : kSeeds) {
      const Image in = random_image(size[0], size[1], seed);
      for (const double param : c.params) {
        const Output hwy = c.run(in, param, true);
        const Output scalar = c.run(in, param, false);
        for (size_t i = 0; i < scalar.bytes.size(); ++i) {
          if (hwy.bytes[i] == scalar.bytes[i]) continue;
          std::printf(
              "qemu_kernels: %s DIFFERS: input %dx%d seed %llu param %g -> output %dx%d: first "
              "differing byte %zu (pixel %zu, channel %zu): highway %d, scalar %d\n",
              c.name, in.width, in.height, static_cast<unsigned long long>(seed), param,
              scalar.width, scalar.height, i, i / 3, i % 3, hwy.bytes[i], scalar.bytes[i]);
          return false;
        }
        if (scalar.bytes.empty()) continue;  // a size the kernel does not take
        ++images;
        bytes += scalar.bytes.size();
      }
    }
  }
  std::printf("qemu_kernels: %s: %zu images, %zu bytes equal\n", c.name, images, bytes);
  return true;
}

}  // namespace

int main() {
  std::printf("qemu_kernels: Highway's static target: %s\n", hwy::TargetName(HWY_STATIC_TARGET));
  if (!Resizer::supported(ResizeKernel::kHighway) ||
      !gpufeed::transforms::color_kernel_supported(ColorKernel::kHighway) ||
      !gpufeed::transforms::fma_kernel_supported(ColorKernel::kHighway)) {
    std::printf("qemu_kernels: this build has no Highway kernels (resize %d, colour %d, blur and warp %d)\n",
                Resizer::supported(ResizeKernel::kHighway),
                gpufeed::transforms::color_kernel_supported(ColorKernel::kHighway),
                gpufeed::transforms::fma_kernel_supported(ColorKernel::kHighway));
    return 1;
  }
  int failed = 0;
  try {
    for (const KernelCase& c : kCases) failed += check(c) ? 0 : 1;
  } catch (const std::exception& e) {
    std::printf("qemu_kernels: exception: %s\n", e.what());
    return 1;
  }
  std::printf("qemu_kernels: %zu kernels, %d differ\n", std::size(kCases), failed);
  return failed ? 1 : 0;
}
