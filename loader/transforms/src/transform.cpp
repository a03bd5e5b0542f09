#include "gpufeed/transforms/transform.h"

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <stdexcept>
#include <string>

namespace gpufeed::transforms {
namespace {

constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;

inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

// Python's round(): half to even, which std::nearbyint gives in the default rounding mode.
inline int py_round(double v) { return static_cast<int>(std::nearbyint(v)); }

}  // namespace

SampleRng::SampleRng(uint64_t seed, int64_t epoch, int64_t index, uint32_t stream)
    : key_{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)},
      counter_{0u, stream, static_cast<uint32_t>(index), static_cast<uint32_t>(epoch)} {
  // The upper halves of index and epoch fold into the key; indices beyond 2^32 stay distinct.
  key_[0] ^= static_cast<uint32_t>(static_cast<uint64_t>(index) >> 32);
  key_[1] ^= static_cast<uint32_t>(static_cast<uint64_t>(epoch) >> 32) * kPhiloxW0;
}

void SampleRng::refill() {
  std::array<uint32_t, 4> c = counter_;
  std::array<uint32_t, 2> k = key_;
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kPhiloxM0, c[0], hi0, lo0);
    mulhilo(kPhiloxM1, c[2], hi1, lo1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += kPhiloxW0;
    k[1] += kPhiloxW1;
  }
  block_ = c;
  used_ = 0;
  if (++counter_[0] == 0) ++counter_[1];  // the draw number within this sample
}

uint32_t SampleRng::next_u32() {
  if (used_ == 4) refill();
  return block_[static_cast<size_t>(used_++)];
}

float SampleRng::uniform(float lo, float hi) {
  const float u = static_cast<float>(next_u32() & ((1u << 24) - 1)) * (1.0f / (1u << 24));
  return u * (hi - lo) + lo;
}

int64_t SampleRng::randint(int64_t lo, int64_t hi) {
  const auto range = static_cast<uint64_t>(hi - lo);
  return lo + static_cast<int64_t>(next_u32() % range);
}

CropRect random_resized_crop_box(int width, int height, const RandomResizedCropOptions& o,
                                 DrawSource& draws) {
  const double area = static_cast<double>(width) * height;
  // torchvision: log_ratio = torch.log(torch.tensor(ratio)), float32.
  const float log_lo = std::log(o.ratio_min);
  const float log_hi = std::log(o.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * static_cast<double>(draws.uniform(o.scale_min, o.scale_max));
    // torch.exp on a float32 tensor: the exponential is taken in float.
    const double aspect = static_cast<double>(std::exp(draws.uniform(log_lo, log_hi)));
    const int w = py_round(std::sqrt(target_area * aspect));
    const int h = py_round(std::sqrt(target_area / aspect));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const auto i = static_cast<int>(draws.randint(0, height - h + 1));
      const auto j = static_cast<int>(draws.randint(0, width - w + 1));
      return {j, i, w, h};
    }
  }
  // Fallback to a central crop, as torchvision does.
  const double in_ratio = static_cast<double>(width) / height;
  int w, h;
  if (in_ratio < std::min(o.ratio_min, o.ratio_max)) {
    w = width;
    h = py_round(w / static_cast<double>(std::min(o.ratio_min, o.ratio_max)));
  } else if (in_ratio > std::max(o.ratio_min, o.ratio_max)) {
    h = height;
    w = py_round(h * static_cast<double>(std::max(o.ratio_min, o.ratio_max)));
  } else {
    w = width;
    h = height;
  }
  // Python floor division on non-negative values; the box never exceeds the image.
  return {(width - w) / 2, (height - h) / 2, w, h};
}

namespace {

/// torchvision's Resize(resize) + CenterCrop(crop) in source-pixel terms: the crop's offset in the
/// resized image (`left`, `top`) and the source pixels per resized pixel (`sx`, `sy`).
struct CenterCropGeometry {
  int left, top;
  double sx, sy;
};

CenterCropGeometry center_crop_geometry(const char* who, int width, int height,
                                        const ResizeCenterCropOptions& o) {
  if (o.crop > o.resize) {
    throw std::invalid_argument(std::string(who) + ": crop " + std::to_string(o.crop) +
                                " larger than resize " + std::to_string(o.resize));
  }
  // torchvision _compute_resized_output_size for an int size.
  const bool wide = width >= height;
  const int shorter = wide ? height : width;
  const int longer = wide ? width : height;
  const int new_long = static_cast<int>(static_cast<int64_t>(o.resize) * longer / shorter);
  const int new_w = wide ? new_long : o.resize;
  const int new_h = wide ? o.resize : new_long;
  // CenterCrop: int(round((h - crop) / 2.0)).
  return {py_round((new_w - o.crop) / 2.0), py_round((new_h - o.crop) / 2.0),
          static_cast<double>(width) / new_w, static_cast<double>(height) / new_h};
}

}  // namespace

CropRect center_crop_box(int width, int height, const ResizeCenterCropOptions& o) {
  const auto [left, top, sx, sy] = center_crop_geometry("center_crop_box", width, height, o);
  int x0 = static_cast<int>(std::lround(left * sx));
  int y0 = static_cast<int>(std::lround(top * sy));
  int x1 = static_cast<int>(std::lround((left + o.crop) * sx));
  int y1 = static_cast<int>(std::lround((top + o.crop) * sy));
  x1 = std::min(std::max(x1, x0 + 1), width);
  y1 = std::min(std::max(y1, y0 + 1), height);
  x0 = std::min(x0, x1 - 1);
  y0 = std::min(y0, y1 - 1);
  return {x0, y0, x1 - x0, y1 - y0};
}

BoxF center_crop_region(int width, int height, const ResizeCenterCropOptions& o) {
  // The same resized size and offsets as center_crop_box (torchvision's), without rounding back.
  const auto [left, top, sx, sy] = center_crop_geometry("center_crop_region", width, height, o);
  // A crop larger than the resized image (an image with a side below `crop` after resizing)
  // pads with zeros in torchvision; the region is clamped to the image instead.
  BoxF r{left * sx, top * sy, (left + o.crop) * sx, (top + o.crop) * sy};
  r.x0 = std::max(r.x0, 0.0);
  r.y0 = std::max(r.y0, 0.0);
  r.x1 = std::min(r.x1, static_cast<double>(width));
  r.y1 = std::min(r.y1, static_cast<double>(height));
  return r;
}

std::string_view to_string(ResizeFilter filter) {
  return filter == ResizeFilter::kBicubic ? "bicubic" : "bilinear";
}

ResizeFilter parse_resize_filter(std::string_view name) {
  for (auto f : {ResizeFilter::kBilinear, ResizeFilter::kBicubic}) {
    if (name == to_string(f)) return f;
  }
  throw std::invalid_argument("interpolation: unknown mode '" + std::string(name) +
                              "' (expected bilinear or bicubic)");
}

SamplePlan plan_sample(const TransformOptions& options, int width, int height, uint64_t seed,
                       int64_t epoch, int64_t index) {
  SamplePlan plan;
  plan.output_size = options.output_size();
  plan.filter = options.interpolation;
  if (options.kind == TransformOptions::Kind::kEval) {
    plan.region = center_crop_region(width, height, options.eval);
    const int x0 = static_cast<int>(std::floor(plan.region.x0));
    const int y0 = static_cast<int>(std::floor(plan.region.y0));
    const int x1 = std::max(static_cast<int>(std::ceil(plan.region.x1)), x0 + 1);
    const int y1 = std::max(static_cast<int>(std::ceil(plan.region.y1)), y0 + 1);
    plan.box = {x0, y0, std::min(x1, width) - x0, std::min(y1, height) - y0};
    plan.taps_clamped_to_box = false;
    return plan;
  }
  return plan_random_resized_crop(options.rrc, options.interpolation, options.flip_probability,
                                  width, height, SampleRng(seed, epoch, index));
}

SamplePlan plan_random_resized_crop(const RandomResizedCropOptions& rrc, ResizeFilter filter,
                                    float flip_probability, int width, int height, SampleRng rng) {
  SamplePlan plan;
  plan.output_size = rrc.size;
  plan.filter = filter;
  RngDrawSource draws(rng);
  plan.box = random_resized_crop_box(width, height, rrc, draws);
  plan.region = {static_cast<double>(plan.box.x), static_cast<double>(plan.box.y),
                 static_cast<double>(plan.box.x + plan.box.width),
                 static_cast<double>(plan.box.y + plan.box.height)};
  plan.taps_clamped_to_box = true;
  // RandomHorizontalFlip: torch.rand(1) < p.
  plan.flip = rng.uniform(0.0f, 1.0f) < flip_probability;
  plan.rng = rng;  // the augmentations continue the stream here
  return plan;
}

decode::DecodeOptions decode_options_for(const SamplePlan& plan, const decode::ImageInfo& info,
                                         const decode::DecodeOptions& base) {
  decode::DecodeOptions d = base;
  d.scale = decode::choose_scale(info, plan.box, plan.output_size, plan.output_size);
  d.crop = plan.box;
  if (!plan.taps_clamped_to_box) {
    // The filter reaches support * max(scale, 1) decoded pixels from an output pixel's centre
    // (support: bilinear 1, bicubic 2): in source pixels, support * max(region / output, 8 / num).
    // One more pixel covers the rounding of the tap range.
    const double out = plan.output_size;
    const double unit = 8.0 / d.scale.num;
    const double support = plan.filter == ResizeFilter::kBicubic ? 2.0 : 1.0;
    const int mx = static_cast<int>(std::ceil(support * std::max(plan.region.width() / out, unit))) + 1;
    const int my = static_cast<int>(std::ceil(support * std::max(plan.region.height() / out, unit))) + 1;
    const int x0 = std::max(plan.box.x - mx, 0);
    const int y0 = std::max(plan.box.y - my, 0);
    const int x1 = std::min(plan.box.x + plan.box.width + mx, info.width);
    const int y1 = std::min(plan.box.y + plan.box.height + my, info.height);
    d.crop = {x0, y0, x1 - x0, y1 - y0};
  }
  return d;
}

BoxF decoded_region(const SamplePlan& plan, const decode::DecodeResult& result) {
  const double s = result.scale.num / 8.0;
  const CropRect& at = result.scaled_region;
  const double w = at.width, h = at.height;
  return {std::clamp(plan.region.x0 * s - at.x, 0.0, w), std::clamp(plan.region.y0 * s - at.y, 0.0, h),
          std::clamp(plan.region.x1 * s - at.x, 0.0, w), std::clamp(plan.region.y1 * s - at.y, 0.0, h)};
}

void resize_sample(const SamplePlan& plan, const decode::DecodeResult& result,
                   const decode::ImageBuffer& image, Resizer& resizer, uint8_t* out) {
  if (image.width != result.scaled_region.width || image.height != result.scaled_region.height) {
    throw std::invalid_argument("resize_sample: the image is " + std::to_string(image.width) + "x" +
                                std::to_string(image.height) + " but the decode result says " +
                                std::to_string(result.scaled_region.width) + "x" +
                                std::to_string(result.scaled_region.height));
  }
  const int s = plan.output_size;
  resizer.resize(image.pixels.data(), image.width, image.height,
                 static_cast<size_t>(image.width) * 3, decoded_region(plan, result), out, s, s,
                 static_cast<size_t>(s) * 3, plan.flip, plan.filter);
}

}  // namespace gpufeed::transforms
