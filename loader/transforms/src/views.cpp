#include "gpufeed/transforms/views.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace gpufeed::transforms {
namespace {

[[noreturn]] void refuse(const std::string& field, double value, const char* range) {
  throw std::invalid_argument("views: " + field + " = " + std::to_string(value) + " (expected " +
                              range + ")");
}

// floor(v * num / 8) and ceil(v * num / 8) for v >= 0: the decoder's scaled-grid edges.
int scaled_floor(int v, int num) { return v * num / 8; }
int scaled_ceil(int v, int num) { return (v * num + 7) / 8; }

}  // namespace

void ViewOptions::validate() const {
  if (rrc.size < 1) refuse("size", rrc.size, ">= 1");
  if (!(rrc.scale_min > 0 && rrc.scale_min <= rrc.scale_max)) {
    refuse("scale_min", rrc.scale_min, "0 < scale_min <= scale_max");
  }
  if (!(rrc.ratio_min > 0 && rrc.ratio_min <= rrc.ratio_max)) {
    refuse("ratio_min", rrc.ratio_min, "0 < ratio_min <= ratio_max");
  }
  if (!(flip_probability >= 0 && flip_probability <= 1)) {
    refuse("flip_probability", flip_probability, "[0, 1]");
  }
  augment.validate();
}

void ViewsOptions::validate() const {
  if (views.empty()) throw std::invalid_argument("views: no views (expected at least one)");
  for (size_t k = 0; k < views.size(); ++k) {
    try {
      views[k].validate();
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("view " + std::to_string(k) + ": " + e.what());
    }
  }
}

SamplePlan plan_view(const ViewOptions& options, int width, int height, uint64_t seed,
                     int64_t epoch, int64_t index, int view) {
  return plan_random_resized_crop(options.rrc, options.interpolation, options.flip_probability,
                                  width, height,
                                  SampleRng(seed, epoch, index, static_cast<uint32_t>(view)));
}

void plan_views(const ViewsOptions& options, int width, int height, uint64_t seed, int64_t epoch,
                int64_t index, std::vector<SamplePlan>& plans) {
  plans.resize(options.views.size());
  for (size_t k = 0; k < plans.size(); ++k) {
    plans[k] = plan_view(options.views[k], width, height, seed, epoch, index, static_cast<int>(k));
  }
}

decode::DecodeOptions decode_options_for_views(std::span<const SamplePlan> plans,
                                               const decode::ImageInfo& info,
                                               const decode::DecodeOptions& base) {
  if (plans.empty()) throw std::invalid_argument("decode_options_for_views: no plans");
  decode::DecodeOptions d = base;
  d.scale.num = 1;
  int x0 = plans[0].box.x, y0 = plans[0].box.y;
  int x1 = x0 + plans[0].box.width, y1 = y0 + plans[0].box.height;
  for (const SamplePlan& p : plans) {
    const int s = p.output_size;
    d.scale.num = std::max(d.scale.num, decode::choose_scale(info, p.box, s, s).num);
    x0 = std::min(x0, p.box.x);
    y0 = std::min(y0, p.box.y);
    x1 = std::max(x1, p.box.x + p.box.width);
    y1 = std::max(y1, p.box.y + p.box.height);
  }
  d.crop = {x0, y0, x1 - x0, y1 - y0};
  return d;
}

void resize_view(const SamplePlan& plan, const decode::DecodeResult& result,
                 const decode::ImageBuffer& image, Resizer& resizer, uint8_t* out) {
  const CropRect& at = result.scaled_region;
  if (image.width != at.width || image.height != at.height) {
    throw std::invalid_argument("resize_view: the image is " + std::to_string(image.width) + "x" +
                                std::to_string(image.height) + " but the decode result says " +
                                std::to_string(at.width) + "x" + std::to_string(at.height));
  }
  // The view's own pixels in the decode: the scaled grid's cells its box touches.
  const int num = result.scale.num;
  const CropRect& b = plan.box;
  const int xs0 = scaled_floor(b.x, num) - at.x, ys0 = scaled_floor(b.y, num) - at.y;
  const int xs1 = scaled_ceil(b.x + b.width, num) - at.x;
  const int ys1 = scaled_ceil(b.y + b.height, num) - at.y;
  if (xs0 < 0 || ys0 < 0 || xs1 > at.width || ys1 > at.height) {
    throw std::invalid_argument("resize_view: the view's box is not inside the decoded region");
  }
  // The region relative to that sub-image, as decoded_region places it for a decode of the box.
  const double s = num / 8.0;
  const double w = xs1 - xs0, h = ys1 - ys0;
  const BoxF region{std::clamp(plan.region.x0 * s - (xs0 + at.x), 0.0, w),
                    std::clamp(plan.region.y0 * s - (ys0 + at.y), 0.0, h),
                    std::clamp(plan.region.x1 * s - (xs0 + at.x), 0.0, w),
                    std::clamp(plan.region.y1 * s - (ys0 + at.y), 0.0, h)};
  const int o = plan.output_size;
  resizer.resize(image.row(ys0) + static_cast<size_t>(xs0) * 3, xs1 - xs0, ys1 - ys0,
                 static_cast<size_t>(image.width) * 3, region, out, o, o,
                 static_cast<size_t>(o) * 3, plan.flip, plan.filter);
}

double decode_cost(const decode::ImageInfo& info, const decode::DecodeOptions& d) {
  const double w = info.width, h = info.height;
  CropRect c = d.crop;
  if (c.width <= 0) c = {0, 0, info.width, info.height};
  const double bottom = info.progressive ? h : std::min<double>(h, c.y + c.height);
  const double area = static_cast<double>(c.width) * c.height;
  return (kEntropyShare * w * bottom + (decode::scale_cost(d.scale) - kEntropyShare) * area) / (w * h);
}

bool decode_views_separately(std::span<const SamplePlan> plans, const decode::ImageInfo& info,
                             const decode::DecodeOptions& base) {
  if (plans.size() < 2 || info.format != decode::ImageFormat::kJpeg) return false;
  double separate = 0;
  for (const SamplePlan& p : plans) separate += decode_cost(info, decode_options_for(p, info, base));
  return separate < 0.9 * decode_cost(info, decode_options_for_views(plans, info, base));
}

decode::DecodeOptions decode_views_into(std::span<const uint8_t> bytes, std::string_view source,
                                        const ViewsOptions& options,
                                        const decode::DecodeOptions& base, uint64_t seed,
                                        int64_t epoch, int64_t index,
                                        std::span<uint8_t* const> outs, ViewsWorker& w) {
  if (outs.size() != options.views.size()) {
    throw std::invalid_argument("decode_views_into: " + std::to_string(outs.size()) +
                                " outputs for " + std::to_string(options.views.size()) + " views");
  }
  const auto t0 = std::chrono::steady_clock::now();
  const decode::ImageInfo info = decode::probe(bytes, source);
  // Plans are made in the frame the decoder returns (the loader's plan_for does the same).
  const bool upright =
      base.apply_exif_orientation && decode::orientation_swaps_axes(info.orientation);
  plan_views(options, upright ? info.height : info.width, upright ? info.width : info.height, seed,
             epoch, index, w.plans);
  const decode::DecodeOptions d = decode_options_for_views(w.plans, info, base);
  const bool separately = decode_views_separately(w.plans, info, base);
  decode::DecodeResult decoded{};
  const auto decode_now = [&](const decode::DecodeOptions& options) {
    const auto start = std::chrono::steady_clock::now();
    decoded = w.decoder.decode(bytes, source, options, w.image);
    ++w.decodes;
    w.decode_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
  };
  w.decode_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  if (!separately) decode_now(d);
  for (size_t k = 0; k < outs.size(); ++k) {
    const SamplePlan& p = w.plans[k];
    if (separately) {
      decode_now(decode_options_for(p, info, base));
      resize_sample(p, decoded, w.image, w.resizer, outs[k]);
    } else {
      resize_view(p, decoded, w.image, w.resizer, outs[k]);
    }
    const AugmentOptions& aug = options.views[k].augment;
    if (!aug.enabled()) continue;
    SampleRng rng = *p.rng;  // the view's stream after its crop and flip draws
    RngDrawSource draws(rng);
    plan_augment(aug, p.output_size, p.output_size, draws, w.augment);
    apply_augment(w.augment, outs[k], p.output_size, p.output_size, w.scratch);
  }
  return d;
}

ViewOptions view_of(const TransformOptions& t) {
  if (t.kind != TransformOptions::Kind::kTrain) {
    throw std::invalid_argument("views: a view is a train transform (RandomResizedCrop), not an eval one");
  }
  ViewOptions v;
  v.rrc = t.rrc;
  v.interpolation = t.interpolation;
  v.flip_probability = t.flip_probability;
  v.augment = t.augment;
  return v;
}

TransformOptions transform_of(const ViewOptions& v) {
  TransformOptions t;
  t.kind = TransformOptions::Kind::kTrain;
  t.rrc = v.rrc;
  t.eval.crop = v.rrc.size;
  t.interpolation = v.interpolation;
  t.flip_probability = v.flip_probability;
  t.augment = v.augment;
  return t;
}

const std::vector<std::string>& view_keywords() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& f : transform_options_schema().fields()) {
      if (f.spec.name != "train" && f.spec.name != "resize_size") out.push_back(f.spec.name);
    }
    return out;
  }();
  return names;
}

ViewsOptions views_from_rows(const std::vector<std::map<std::string, options::Value>>& rows) {
  if (rows.empty()) throw std::invalid_argument("views: no views (expected at least one)");
  const std::vector<std::string>& keys = view_keywords();
  ViewsOptions out;
  for (size_t k = 0; k < rows.size(); ++k) {
    const std::string where = fmt::format("views[{}].", k);
    for (const auto& [name, value] : rows[k]) {
      if (std::find(keys.begin(), keys.end(), name) == keys.end()) {
        throw options::OptionError(where + name, fmt::format("is not a view keyword (accepted: {})",
                                                             fmt::join(keys, ", ")));
      }
    }
    TransformOptions t;  // the default train transform
    try {
      transform_options_schema().apply(t, rows[k]);
    } catch (const options::OptionError& e) {
      throw options::OptionError(where + e.option(), std::string(e.what()).substr(e.option().size() + 3));
    }
    out.views.push_back(view_of(t));
  }
  out.validate();
  return out;
}

std::vector<std::map<std::string, options::Value>> views_to_rows(const ViewsOptions& views) {
  std::vector<std::map<std::string, options::Value>> rows;
  const auto& schema = transform_options_schema();
  for (const ViewOptions& v : views.views) {
    const TransformOptions t = transform_of(v);
    std::map<std::string, options::Value> row;
    for (const std::string& name : view_keywords()) row[name] = schema.find(name)->get(t);
    rows.push_back(std::move(row));
  }
  return rows;
}

const std::vector<std::string>& views_preset_names() {
  static const std::vector<std::string> names{"dino", "dinov2", "dinov2_paper"};
  return names;
}

namespace {

// One crop of the DINO family: RandomResizedCrop(size, scale, bicubic), flip 0.5,
// RandomApply(ColorJitter(0.4, 0.4, 0.2, 0.1), 0.8), RandomGrayscale(0.2), GaussianBlur(9,
// (0.1, 2.0)) with probability `blur_p`, RandomSolarize(128, solarize_p).
ViewOptions dino_crop(int size, float scale_min, float scale_max, float blur_p, float solarize_p) {
  ViewOptions v;
  v.rrc.size = size;
  v.rrc.scale_min = scale_min;
  v.rrc.scale_max = scale_max;
  v.interpolation = ResizeFilter::kBicubic;
  v.flip_probability = 0.5f;
  v.augment.color_jitter = ColorJitterOptions{0.4f, 0.4f, 0.2f, 0.1f};
  v.augment.color_jitter_p = 0.8f;
  v.augment.grayscale_p = 0.2f;
  v.augment.gaussian_blur = GaussianBlurOptions{blur_p, 9, 0.1f, 2.0f};
  v.augment.solarize_p = solarize_p;
  v.augment.solarize_threshold = 128;
  return v;
}

}  // namespace

ViewsOptions views_preset(std::string_view name, int local_crops_number) {
  if (local_crops_number < -1 || local_crops_number > 64) {
    throw std::invalid_argument(
        fmt::format("views: local_crops_number {} is outside [0, 64] (-1: the preset's 8)", local_crops_number));
  }
  struct Recipe {
    float global_min, local_max, blur_global1, blur_global2, blur_local;
  };
  Recipe r{};
  if (name == "dino") {
    r = {0.4f, 0.4f, 1.0f, 0.1f, 0.5f};
  } else if (name == "dinov2") {
    r = {0.32f, 0.32f, 0.0f, 0.9f, 0.5f};
  } else if (name == "dinov2_paper") {
    r = {0.32f, 0.32f, 1.0f, 0.1f, 0.5f};
  } else {
    throw std::invalid_argument(fmt::format("views: no preset named '{}' (presets: {})", name,
                                            fmt::join(views_preset_names(), ", ")));
  }
  ViewsOptions out;
  out.preset = std::string(name);
  out.local_crops_number = local_crops_number;
  out.views.push_back(dino_crop(224, r.global_min, 1.0f, r.blur_global1, 0.0f));
  out.views.push_back(dino_crop(224, r.global_min, 1.0f, r.blur_global2, 0.2f));
  const int locals = local_crops_number < 0 ? 8 : local_crops_number;
  for (int k = 0; k < locals; ++k) out.views.push_back(dino_crop(96, 0.05f, r.local_max, r.blur_local, 0.0f));
  return out;
}

}  // namespace gpufeed::transforms
