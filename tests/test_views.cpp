// Multi-crop views (views.h): per-view streams, one decode per sample, and each view's pixels
// against the single-view path (plan_sample / decode_options_for / resize_sample / apply_augment).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "gpufeed/decode/decoder.h"
#include "gpufeed/transforms/views.h"

using namespace gpufeed::transforms;
namespace decode = gpufeed::decode;

namespace {

constexpr uint64_t kSeed = 1234;

// A smooth image with detail in every direction (an edge-free pattern keeps JPEG artefacts mild).
std::vector<uint8_t> make_jpeg(int width, int height, decode::Subsampling subsampling) {
  std::vector<uint8_t> rgb(static_cast<size_t>(width) * height * 3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      uint8_t* p = &rgb[(static_cast<size_t>(y) * width + x) * 3];
      p[0] = static_cast<uint8_t>((x * 255) / width);
      p[1] = static_cast<uint8_t>((y * 255) / height);
      p[2] = static_cast<uint8_t>(((x * 7 + y * 13) / 3) % 256);
    }
  }
  return decode::encode_jpeg(rgb.data(), width, height, 92, subsampling);
}

ViewOptions view(int size, float scale_min, float scale_max, ResizeFilter filter, float flip_p) {
  ViewOptions v;
  v.rrc.size = size;
  v.rrc.scale_min = scale_min;
  v.rrc.scale_max = scale_max;
  v.interpolation = filter;
  v.flip_probability = flip_p;
  return v;
}

// DINO's crops: 2 global 224 (scale 0.4..1, bicubic, blur / solarize), 8 local 96 (0.05..0.4).
ViewsOptions dino_like() {
  ViewsOptions o;
  for (int k = 0; k < 10; ++k) {
    ViewOptions v = k < 2 ? view(224, 0.4f, 1.0f, ResizeFilter::kBicubic, 0.5f)
                          : view(96, 0.05f, 0.4f, ResizeFilter::kBicubic, 0.5f);
    v.augment.color_jitter = {0.4f, 0.4f, 0.2f, 0.1f};
    v.augment.color_jitter_p = 0.8f;
    v.augment.grayscale_p = 0.2f;
    v.augment.gaussian_blur.p = k == 0 ? 1.0f : 0.5f;
    v.augment.solarize_p = k == 1 ? 0.2f : 0;
    o.views.push_back(v);
  }
  return o;
}

struct Outputs {
  std::vector<std::vector<uint8_t>> pixels;
  std::vector<uint8_t*> pointers;
  explicit Outputs(const ViewsOptions& o) {
    for (const ViewOptions& v : o.views) {
      pixels.emplace_back(static_cast<size_t>(v.rrc.size) * v.rrc.size * 3);
      pointers.push_back(pixels.back().data());
    }
  }
};

// The single-view loader path for `plan` (what loader.cpp's decode_bytes_into does).
std::vector<uint8_t> single_view(const std::vector<uint8_t>& jpeg, const SamplePlan& plan,
                                 const AugmentOptions& aug) {
  decode::Decoder decoder;
  decode::ImageBuffer image;
  Resizer resizer;
  const decode::ImageInfo info = decode::probe(jpeg, "test");
  const decode::DecodeResult r =
      decoder.decode(jpeg, "test", decode_options_for(plan, info, {}), image);
  const int s = plan.output_size;
  std::vector<uint8_t> out(static_cast<size_t>(s) * s * 3);
  resize_sample(plan, r, image, resizer, out.data());
  if (aug.enabled()) {
    SampleRng rng = *plan.rng;
    RngDrawSource draws(rng);
    AugmentPlan ap;
    AugmentScratch scratch;
    plan_augment(aug, s, s, draws, ap);
    apply_augment(ap, out.data(), s, s, scratch);
  }
  return out;
}

void expect_same_plan(const SamplePlan& a, const SamplePlan& b) {
  EXPECT_EQ(a.box, b.box);
  EXPECT_EQ(a.flip, b.flip);
  EXPECT_EQ(a.output_size, b.output_size);
  EXPECT_EQ(a.filter, b.filter);
  // The streams continue identically.
  SampleRng ra = *a.rng, rb = *b.rng;
  for (int i = 0; i < 8; ++i) EXPECT_EQ(ra.next_u32(), rb.next_u32());
}

}  // namespace

TEST(Views, PlansArePerSampleAndViewAndIgnoreLaterViews) {
  const ViewsOptions ten = dino_like();
  ViewsOptions three = ten;
  three.views.resize(3);
  std::vector<SamplePlan> a, b, c;
  for (int64_t index : {0, 1, 17, 4096}) {
    plan_views(ten, 640, 480, kSeed, 3, index, a);
    plan_views(ten, 640, 480, kSeed, 3, index, b);
    plan_views(three, 640, 480, kSeed, 3, index, c);
    ASSERT_EQ(a.size(), 10u);
    ASSERT_EQ(c.size(), 3u);
    for (size_t k = 0; k < a.size(); ++k) expect_same_plan(a[k], b[k]);
    for (size_t k = 0; k < c.size(); ++k) expect_same_plan(a[k], c[k]);
    for (size_t k = 0; k < a.size(); ++k) {
      expect_same_plan(a[k],
                       plan_view(ten.views[k], 640, 480, kSeed, 3, index, static_cast<int>(k)));
    }
  }
}

TEST(Views, ViewZeroIsTheSingleViewStreamAndOtherViewsDiffer) {
  ViewsOptions o;
  o.views = {view(224, 0.08f, 1.0f, ResizeFilter::kBicubic, 0.5f),
             view(224, 0.08f, 1.0f, ResizeFilter::kBicubic, 0.5f)};
  TransformOptions t;
  t.rrc = o.views[0].rrc;
  t.interpolation = ResizeFilter::kBicubic;
  int same_box = 0;
  std::vector<SamplePlan> plans;
  for (int64_t index = 0; index < 50; ++index) {
    plan_views(o, 500, 375, kSeed, 1, index, plans);
    expect_same_plan(plans[0], plan_sample(t, 500, 375, kSeed, 1, index));
    same_box += plans[0].box == plans[1].box ? 1 : 0;
  }
  // Equal options, independent streams: the boxes (random in 4 dimensions) never coincide here.
  EXPECT_EQ(same_box, 0);
  // Another epoch or seed moves view 1 too.
  plan_views(o, 500, 375, kSeed, 1, 5, plans);
  const CropRect box1 = plans[1].box;
  EXPECT_NE(plan_view(o.views[1], 500, 375, kSeed, 2, 5, 1).box, box1);
  EXPECT_NE(plan_view(o.views[1], 500, 375, kSeed + 1, 1, 5, 1).box, box1);
}

TEST(Views, OneDecodePerSampleOfTheUnionAtTheFinestScale) {
  const std::vector<uint8_t> jpeg = make_jpeg(1600, 1200, decode::Subsampling::k420);
  const decode::ImageInfo info = decode::probe(jpeg, "test");
  const ViewsOptions o = dino_like();
  Outputs outs(o);
  ViewsWorker w;
  std::vector<SamplePlan> plans;
  int scales_below_8 = 0, mixed_scales = 0;
  for (int64_t index = 0; index < 12; ++index) {
    const decode::DecodeOptions d =
        decode_views_into(jpeg, "test", o, {}, kSeed, 0, index, outs.pointers, w);
    EXPECT_EQ(w.decodes, index + 1);
    plan_views(o, 1600, 1200, kSeed, 0, index, plans);
    int x0 = 1600, y0 = 1200, x1 = 0, y1 = 0, num = 1, coarsest = 8;
    for (const SamplePlan& p : plans) {
      x0 = std::min(x0, p.box.x);
      y0 = std::min(y0, p.box.y);
      x1 = std::max(x1, p.box.x + p.box.width);
      y1 = std::max(y1, p.box.y + p.box.height);
      const int own = decode::choose_scale(info, p.box, p.output_size, p.output_size).num;
      num = std::max(num, own);
      coarsest = std::min(coarsest, own);
    }
    EXPECT_EQ(d.crop, (CropRect{x0, y0, x1 - x0, y1 - y0}));
    EXPECT_EQ(d.scale.num, num);
    scales_below_8 += num < 8 ? 1 : 0;
    mixed_scales += coarsest < num ? 1 : 0;
  }
  // The rule is visible: some samples decode below 8/8, some have views that alone would take a
  // coarser scale than the finest one the union is decoded at.
  EXPECT_GT(scales_below_8, 0);
  EXPECT_GT(mixed_scales, 0);
}

TEST(Views, OneViewIsByteEqualToTheSingleViewPath) {
  const std::vector<uint8_t> jpeg = make_jpeg(640, 480, decode::Subsampling::k420);
  ViewsOptions o;
  o.views = {dino_like().views[1]};  // bicubic, jitter, grayscale, blur, solarize
  Outputs outs(o);
  ViewsWorker w;
  for (int64_t index = 0; index < 16; ++index) {
    decode_views_into(jpeg, "test", o, {}, kSeed, 2, index, outs.pointers, w);
    const SamplePlan plan = plan_view(o.views[0], 640, 480, kSeed, 2, index, 0);
    EXPECT_EQ(outs.pixels[0], single_view(jpeg, plan, o.views[0].augment)) << "index " << index;
  }
}

TEST(Views, CoincidingBoxesAreByteEqualToTheSingleViewPathForEveryView) {
  // scale 1 and the ratio fixed to the image's: every view's box is the whole image.
  const std::vector<uint8_t> jpeg = make_jpeg(400, 300, decode::Subsampling::k420);
  ViewsOptions o;
  for (int k = 0; k < 3; ++k) {
    ViewOptions v = view(112, 1.0f, 1.0f, ResizeFilter::kBicubic, 0.5f);
    v.rrc.ratio_min = v.rrc.ratio_max = 4.0f / 3;
    v.augment.gaussian_blur.p = 0.5f;
    v.augment.solarize_p = 0.5f;
    o.views.push_back(v);
  }
  Outputs outs(o);
  ViewsWorker w;
  for (int64_t index = 0; index < 6; ++index) {
    decode_views_into(jpeg, "test", o, {}, kSeed, 0, index, outs.pointers, w);
    for (int k = 0; k < 3; ++k) {
      const SamplePlan plan = plan_view(o.views[k], 400, 300, kSeed, 0, index, k);
      ASSERT_EQ(plan.box, (CropRect{0, 0, 400, 300}));
      EXPECT_EQ(outs.pixels[k], single_view(jpeg, plan, o.views[k].augment))
          << "index " << index << " view " << k;
    }
  }
}

TEST(Views, EachViewSeesItsOwnBoxOfTheUnionDecode) {
  // 4:4:4 (no chroma upsampling) at 8/8 (outputs larger than the image force it): a decode's
  // pixels do not depend on its crop, so every view equals its single-view decode exactly.
  const std::vector<uint8_t> jpeg = make_jpeg(200, 150, decode::Subsampling::k444);
  ViewsOptions o;
  o.views = {view(240, 0.3f, 1.0f, ResizeFilter::kBicubic, 0.5f),
             view(240, 0.05f, 0.3f, ResizeFilter::kBilinear, 0.5f),
             view(240, 0.05f, 0.3f, ResizeFilter::kBicubic, 0.5f)};
  Outputs outs(o);
  ViewsWorker w;
  int union_larger = 0;
  for (int64_t index = 0; index < 10; ++index) {
    const decode::DecodeOptions d =
        decode_views_into(jpeg, "test", o, {}, kSeed, 0, index, outs.pointers, w);
    ASSERT_EQ(d.scale.num, 8);
    for (int k = 0; k < 3; ++k) {
      const SamplePlan plan = plan_view(o.views[k], 200, 150, kSeed, 0, index, k);
      union_larger += d.crop == plan.box ? 0 : 1;
      EXPECT_EQ(outs.pixels[k], single_view(jpeg, plan, {})) << "index " << index << " view " << k;
    }
  }
  EXPECT_GT(union_larger, 20);  // the local views are smaller than the union
}

TEST(Views, FlipMirrorsExactly) {
  const std::vector<uint8_t> jpeg = make_jpeg(320, 240, decode::Subsampling::k420);
  ViewsOptions o;
  for (float p : {0.0f, 1.0f}) {
    ViewOptions v = view(64, 1.0f, 1.0f, ResizeFilter::kBicubic, p);
    v.rrc.ratio_min = v.rrc.ratio_max = 4.0f / 3;
    o.views.push_back(v);
  }
  Outputs outs(o);
  ViewsWorker w;
  decode_views_into(jpeg, "test", o, {}, kSeed, 0, 7, outs.pointers, w);
  const int s = 64;
  int differing = 0;
  for (int y = 0; y < s; ++y) {
    for (int x = 0; x < s; ++x) {
      const uint8_t* a = &outs.pixels[0][(static_cast<size_t>(y) * s + x) * 3];
      const uint8_t* b = &outs.pixels[1][(static_cast<size_t>(y) * s + (s - 1 - x)) * 3];
      EXPECT_EQ(0, std::memcmp(a, b, 3)) << "y " << y << " x " << x;
      differing +=
          std::memcmp(a, &outs.pixels[0][(static_cast<size_t>(y) * s + (s - 1 - x)) * 3], 3) != 0;
    }
  }
  EXPECT_GT(differing, s * s / 2);  // the image is not symmetric, so the mirror is visible
}

TEST(Views, RefusesBadOptionsAndOutputCounts) {
  ViewsOptions o;
  EXPECT_THROW(o.validate(), std::invalid_argument);
  o.views = {view(0, 0.1f, 1.0f, ResizeFilter::kBilinear, 0.5f)};
  EXPECT_THROW(o.validate(), std::invalid_argument);
  o.views = {view(96, 0.5f, 0.1f, ResizeFilter::kBilinear, 0.5f)};
  EXPECT_THROW(o.validate(), std::invalid_argument);
  o.views = {view(96, 0.1f, 0.5f, ResizeFilter::kBilinear, 1.5f)};
  EXPECT_THROW(o.validate(), std::invalid_argument);
  o.views = {view(96, 0.1f, 0.5f, ResizeFilter::kBilinear, 0.5f)};
  EXPECT_NO_THROW(o.validate());
  const std::vector<uint8_t> jpeg = make_jpeg(64, 48, decode::Subsampling::k420);
  ViewsWorker w;
  std::vector<uint8_t*> none;
  EXPECT_THROW(decode_views_into(jpeg, "test", o, {}, kSeed, 0, 0, none, w), std::invalid_argument);
  EXPECT_EQ(w.decodes, 0);
}

TEST(ViewsCost, TheModelOfADecode) {
  decode::ImageInfo info;
  info.format = decode::ImageFormat::kJpeg;
  info.width = 1000;
  info.height = 800;
  decode::DecodeOptions whole;
  EXPECT_DOUBLE_EQ(decode_cost(info, whole), 1.0);  // scale_cost's unit
  decode::DecodeOptions top;
  top.crop = {100, 0, 200, 100};
  // Rows 0..100 entropy-decoded whole, 200 x 100 pixels made.
  EXPECT_NEAR(decode_cost(info, top), (0.7 * 1000 * 100 + 0.3 * 200 * 100) / 800000.0, 1e-12);
  decode::DecodeOptions bottom = top;
  bottom.crop.y = 700;  // every row above is entropy-decoded too
  EXPECT_NEAR(decode_cost(info, bottom), (0.7 * 1000 * 800 + 0.3 * 200 * 100) / 800000.0, 1e-12);
  bottom.scale.num = 4;
  EXPECT_NEAR(decode_cost(info, bottom), (0.7 * 1000 * 800 + (0.88 - 0.7) * 200 * 100) / 800000.0, 1e-12);
  info.progressive = true;  // the scans are read whole
  EXPECT_NEAR(decode_cost(info, top), (0.7 * 1000 * 800 + 0.3 * 200 * 100) / 800000.0, 1e-12);
}

TEST(ViewsCost, SeparateDecodesOnlyWhereTheyAreCheaper) {
  decode::ImageInfo info;
  info.format = decode::ImageFormat::kJpeg;
  info.width = 2000;
  info.height = 2000;
  const auto plan = [](CropRect box, int size) {
    SamplePlan p;
    p.box = box;
    p.region = {double(box.x), double(box.y), double(box.x + box.width), double(box.y + box.height)};
    p.output_size = size;
    return p;
  };
  // Two small crops at the top and the bottom: the union is the whole image at 8/8 (cost 1.0),
  // the first alone entropy-decodes 40 rows, the second all of them: about 0.71.
  const std::vector<SamplePlan> apart{plan({0, 0, 40, 40}, 32), plan({1960, 1960, 40, 40}, 32)};
  EXPECT_TRUE(decode_views_separately(apart, info, {}));
  // Two crops sharing their rows: the union adds little and entropy-decodes once.
  const std::vector<SamplePlan> side{plan({0, 1900, 40, 40}, 32), plan({1960, 1900, 40, 40}, 32)};
  EXPECT_FALSE(decode_views_separately(side, info, {}));
  // DINO's ten views: every separate decode repeats the entropy decoding; the union always wins.
  std::vector<SamplePlan> plans;
  for (int64_t index = 0; index < 50; ++index) {
    plan_views(dino_like(), 2000, 2000, kSeed, 0, index, plans);
    EXPECT_FALSE(decode_views_separately(plans, info, {})) << index;
  }
  EXPECT_FALSE(decode_views_separately(std::span(apart).first(1), info, {}));  // one view
  info.format = decode::ImageFormat::kPng;
  EXPECT_FALSE(decode_views_separately(apart, info, {}));
}

TEST(ViewsCost, ViewsDecodedSeparatelyAreTheSingleViewPathsBytes) {
  // Two tiny crops of a tall, narrow image: a few samples (about 1 in 20) put them so far apart
  // vertically, the first near the top, that two decodes cost less than the union (in square
  // images the model hardly ever prefers them: every decode entropy-decodes whole rows).
  const std::vector<uint8_t> jpeg = make_jpeg(240, 1600, decode::Subsampling::k420);
  const decode::ImageInfo info = decode::probe(jpeg, "test");
  ViewsOptions o;
  o.views = {view(16, 0.0005f, 0.001f, ResizeFilter::kBicubic, 0.5f),
             view(16, 0.0005f, 0.001f, ResizeFilter::kBilinear, 0.5f)};
  o.views[1].augment.grayscale_p = 0.5f;
  Outputs outs(o);
  ViewsWorker w;
  std::vector<SamplePlan> plans;
  int separate = 0;
  for (int64_t index = 0; index < 200; ++index) {
    const int64_t before = w.decodes;
    decode_views_into(jpeg, "test", o, {}, kSeed, 2, index, outs.pointers, w);
    plan_views(o, 240, 1600, kSeed, 2, index, plans);
    const bool apart = decode_views_separately(plans, info, {});
    EXPECT_EQ(w.decodes - before, apart ? 2 : 1);
    if (!apart) continue;
    ++separate;
    for (size_t k = 0; k < 2; ++k) EXPECT_EQ(outs.pixels[k], single_view(jpeg, plans[k], o.views[k].augment)) << index;
  }
  EXPECT_GT(separate, 3);
  EXPECT_LT(separate, 40);
}
