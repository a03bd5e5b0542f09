// Multi-crop views in the loader (LoaderOptions::views): the slot layout, one decode per sample,
// thread-count independence, mid-epoch resume, the presets and the option schema's rows.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gpufeed/datasets/dataset.h"
#include "gpufeed/datasets/synthetic.h"
#include "gpufeed/loader/loader.h"
#include "gpufeed/transforms/views.h"

namespace fs = std::filesystem;
using namespace gpufeed::loader;
using namespace gpufeed::datasets;
using namespace gpufeed::transforms;
using gpufeed::options::OptionError;
using gpufeed::options::Value;
using gpufeed::sampler::DistributedSampler;
using gpufeed::sampler::DistributedSamplerOptions;

namespace {

fs::path root_path() { return fs::temp_directory_path() / ("gpufeed_test_loader_views_" + std::to_string(::getpid())); }

const fs::path& synthetic_root() {
  static const fs::path root = [] {
    SyntheticOptions o;
    o.num_classes = 3;
    o.images_per_class = 7;
    o.min_size = 40;
    o.max_size = 90;
    write_synthetic_image_folder(root_path(), o);
    return root_path();
  }();
  return root;
}

struct Cleanup {
  ~Cleanup() {
    std::error_code ec;
    fs::remove_all(root_path(), ec);
  }
} cleanup;

// 2 "global" views of 32 px and 2 "local" ones of 16 px, DINO-like augmentations on some.
ViewsOptions small_views() {
  ViewsOptions v = views_preset("dinov2_paper", 2);
  for (size_t k = 0; k < v.views.size(); ++k) v.views[k].rrc.size = k < 2 ? 32 : 16;
  for (ViewOptions& view : v.views) view.augment.gaussian_blur.kernel_size = 5;
  v.preset.clear();
  return v;
}

LoaderOptions view_options(int workers) {
  LoaderOptions o;
  o.batch_size = 4;
  o.num_workers = workers;
  o.prefetch_depth = 2;
  o.seed = 7;
  o.prefetch_next_epoch = false;
  o.views = small_views();
  return o;
}

// Every batch's views, copied: [batch][view] -> bytes.
struct Collected {
  std::vector<std::vector<std::vector<uint8_t>>> views;
  std::vector<std::vector<int64_t>> indices;
};

Collected run_epoch(Loader& loader, int64_t epoch, int64_t start = 0) {
  Collected c;
  loader.start_epoch(epoch, start);
  while (auto b = loader.next()) {
    std::vector<std::vector<uint8_t>> views;
    for (const BatchView& v : b->views) views.emplace_back(v.images, v.images + b->size * v.height * v.width * 3);
    c.views.push_back(std::move(views));
    c.indices.push_back(b->indices);
  }
  return c;
}

std::shared_ptr<DistributedSampler> sampler_for(const Dataset& ds, uint64_t seed) {
  DistributedSamplerOptions so;
  so.seed = seed;
  return std::make_shared<DistributedSampler>(ds.size(), so);
}

}  // namespace

TEST(LoaderViews, EachViewIsItsOwnContiguousTensorMatchingLoadSample) {
  auto ds = std::make_shared<ImageFolder>(synthetic_root());
  const LoaderOptions o = view_options(2);
  Loader loader(ds, sampler_for(*ds, 3), o);
  EXPECT_EQ(sample_bytes(o), 2 * 32 * 32 * 3 + 2 * 16 * 16 * 3);
  loader.start_epoch(1);
  int batches = 0;
  std::vector<uint8_t> expected(static_cast<size_t>(sample_bytes(o)));
  while (auto b = loader.next()) {
    ++batches;
    ASSERT_EQ(b->views.size(), 4u);
    EXPECT_EQ(b->images, b->views[0].images);
    EXPECT_EQ(b->height, 32);
    for (size_t v = 0; v < 4; ++v) EXPECT_EQ(b->views[v].height, v < 2 ? 32 : 16);
    for (int64_t k = 0; k < b->size; ++k) {
      load_sample(*ds, b->indices[static_cast<size_t>(k)], 1, o, expected.data());
      const uint8_t* want = expected.data();
      for (const BatchView& v : b->views) {
        const int64_t row = v.height * v.width * 3;
        ASSERT_EQ(std::memcmp(v.images + k * row, want, static_cast<size_t>(row)), 0)
            << "batch " << b->batch_index << " row " << k << " view of side " << v.height;
        want += row;
      }
    }
  }
  EXPECT_EQ(batches, 6);  // ceil(21 / 4)
}

TEST(LoaderViews, EverySampleIsDecodedOnceForAllItsViews) {
  auto ds = std::make_shared<ImageFolder>(synthetic_root());
  Loader loader(ds, sampler_for(*ds, 3), view_options(2));
  run_epoch(loader, 0);
  run_epoch(loader, 1);
  const LoaderStats s = loader.stats();
  EXPECT_EQ(s.samples, 42);
  EXPECT_EQ(s.decodes, 42) << "one decode per sample, 4 views each";
  EXPECT_GT(s.decode_s, 0);
  EXPECT_GT(s.resize_s, 0);

  // The single-view loader counts alike.
  LoaderOptions single = view_options(2);
  single.views = {};
  single.transform.rrc.size = 32;
  Loader plain(ds, sampler_for(*ds, 3), single);
  run_epoch(plain, 0);
  EXPECT_EQ(plain.stats().decodes, 21);
}

TEST(LoaderViews, IdenticalForOneAndTwoThreadsAndDependOnTheEpoch) {
  auto ds = std::make_shared<ImageFolder>(synthetic_root());
  Loader one(ds, sampler_for(*ds, 5), view_options(1));
  Loader two(ds, sampler_for(*ds, 5), view_options(2));
  const Collected a = run_epoch(one, 2), b = run_epoch(two, 2), c = run_epoch(two, 3);
  ASSERT_EQ(a.views.size(), 6u);
  EXPECT_EQ(a.indices, b.indices);
  EXPECT_EQ(a.views, b.views);
  EXPECT_NE(a.views, c.views);
  // The views of one sample differ from each other (their own crops, flips and draws).
  EXPECT_NE(a.views[0][0], a.views[0][1]);
  EXPECT_NE(a.views[0][2], a.views[0][3]);
}

TEST(LoaderViews, MidEpochResumeGivesTheRemainingBatchesOfAnUninterruptedRun) {
  auto ds = std::make_shared<ImageFolder>(synthetic_root());
  Loader loader(ds, sampler_for(*ds, 9), view_options(2));
  const Collected full = run_epoch(loader, 4);
  const Collected tail = run_epoch(loader, 4, 2);
  ASSERT_EQ(tail.views.size(), full.views.size() - 2);
  for (size_t k = 0; k < tail.views.size(); ++k) {
    EXPECT_EQ(tail.indices[k], full.indices[k + 2]);
    EXPECT_EQ(tail.views[k], full.views[k + 2]);
  }
}

TEST(LoaderViews, RefusesWhatViewsCannotDo) {
  auto ds = std::make_shared<ImageFolder>(synthetic_root());
  LoaderOptions o = view_options(1);
  o.decode_device = DecodeDevice::kGpu;
  EXPECT_THROW(o.validate(), std::invalid_argument);
  o = view_options(1);
  o.max_image_size = 64;
  EXPECT_THROW(o.validate(), std::invalid_argument);
  o = view_options(1);
  o.transform.augment.grayscale_p = 0.5f;
  EXPECT_THROW(o.validate(), std::invalid_argument);
  o = view_options(1);
  o.transform.kind = TransformOptions::Kind::kEval;
  EXPECT_THROW(o.validate(), std::invalid_argument);
  Loader loader(ds, sampler_for(*ds, 1), view_options(1));
  EXPECT_THROW(loader.set_image_size(24), std::invalid_argument);
  EXPECT_EQ(loader.image_size(), 32);  // view 0's
}

TEST(ViewsPreset, RecipesAsTheReferenceCodeAndPaperState) {
  const ViewsOptions v2 = views_preset("dinov2");
  ASSERT_EQ(v2.views.size(), 10u);
  const ViewsOptions paper = views_preset("dinov2_paper");
  const ViewsOptions dino = views_preset("dino", 6);
  ASSERT_EQ(dino.views.size(), 8u);
  // GaussianBlur's probability in force: global 1, global 2, locals.
  const auto blur = [](const ViewsOptions& v, size_t k) { return v.views[k].augment.gaussian_blur.p; };
  EXPECT_EQ(blur(v2, 0), 0.0f);
  EXPECT_FLOAT_EQ(blur(v2, 1), 0.9f);
  EXPECT_FLOAT_EQ(blur(v2, 9), 0.5f);
  EXPECT_EQ(blur(paper, 0), 1.0f);
  EXPECT_FLOAT_EQ(blur(paper, 1), 0.1f);
  EXPECT_EQ(blur(dino, 0), 1.0f);
  for (const ViewsOptions* v : {&v2, &paper, &dino}) {
    for (size_t k = 0; k < v->views.size(); ++k) {
      const ViewOptions& view = v->views[k];
      EXPECT_EQ(view.rrc.size, k < 2 ? 224 : 96);
      EXPECT_EQ(view.interpolation, ResizeFilter::kBicubic);
      EXPECT_FLOAT_EQ(view.augment.color_jitter_p, 0.8f);
      EXPECT_FLOAT_EQ(view.augment.grayscale_p, 0.2f);
      EXPECT_FLOAT_EQ(view.augment.solarize_p, k == 1 ? 0.2f : 0.0f);
      EXPECT_EQ(view.augment.gaussian_blur.kernel_size, 9);
    }
  }
  EXPECT_FLOAT_EQ(v2.views[0].rrc.scale_min, 0.32f);
  EXPECT_FLOAT_EQ(v2.views[2].rrc.scale_max, 0.32f);
  EXPECT_FLOAT_EQ(dino.views[0].rrc.scale_min, 0.4f);
  EXPECT_FLOAT_EQ(dino.views[2].rrc.scale_max, 0.4f);
  EXPECT_THROW(views_preset("simclr"), std::invalid_argument);
  EXPECT_THROW(views_preset("dino", 65), std::invalid_argument);
}

TEST(ViewsRows, RoundTripAndErrorsNameTheView) {
  const ViewsOptions v = views_preset("dinov2", 1);
  const ViewsOptions back = views_from_rows(views_to_rows(v));
  ASSERT_EQ(back.views.size(), 3u);
  EXPECT_EQ(views_to_rows(back), views_to_rows(v));
  EXPECT_TRUE(back.preset.empty());

  std::vector<std::map<std::string, Value>> rows(2);
  rows[0]["image_size"] = int64_t{64};
  rows[0]["interpolation"] = std::string("bicubic");
  rows[0]["hflip_p"] = 0.0;
  rows[1]["image_size"] = int64_t{32};
  rows[1]["scale"] = std::vector<double>{0.05, 0.4};
  const ViewsOptions two = views_from_rows(rows);
  EXPECT_EQ(two.views[0].rrc.size, 64);
  EXPECT_EQ(two.views[0].interpolation, ResizeFilter::kBicubic);
  EXPECT_EQ(two.views[0].flip_probability, 0.0f);
  EXPECT_EQ(two.views[1].interpolation, ResizeFilter::kBilinear);  // the transform's default
  EXPECT_FLOAT_EQ(two.views[1].rrc.scale_max, 0.4f);

  rows[1]["train"] = false;
  try {
    views_from_rows(rows);
    FAIL() << "train is not a view keyword";
  } catch (const OptionError& e) {
    EXPECT_EQ(e.option(), "views[1].train");
  }
  rows[1].erase("train");
  rows[1]["grayscale_p"] = 2.0;
  try {
    views_from_rows(rows);
    FAIL() << "grayscale_p 2 is out of range";
  } catch (const OptionError& e) {
    EXPECT_EQ(e.option(), "views[1].grayscale_p");
  }
  EXPECT_THROW(views_from_rows({}), std::invalid_argument);
}

TEST(LoaderViewsSchema, PresetAndLocalCropsNumberRows) {
  const auto& schema = loader_options_schema();
  LoaderOptions o;
  schema.apply(o, {{"views", std::string("dinov2")}, {"local_crops_number", int64_t{4}}});
  EXPECT_EQ(o.views.views.size(), 6u);
  EXPECT_EQ(o.views.preset, "dinov2");
  EXPECT_EQ(std::get<std::string>(schema.find("views")->get(o)), "dinov2");
  EXPECT_EQ(std::get<int64_t>(schema.find("local_crops_number")->get(o)), 4);
  LoaderOptions d;
  schema.apply(d, {{"views", std::string("dino")}});
  EXPECT_EQ(d.views.views.size(), 10u);
  LoaderOptions none;
  schema.apply(none, {});
  EXPECT_TRUE(none.views.empty());
  EXPECT_EQ(std::get<std::string>(schema.find("views")->get(none)), "none");
  LoaderOptions bad;
  EXPECT_THROW(schema.apply(bad, {{"local_crops_number", int64_t{4}}}), OptionError);
  EXPECT_THROW(schema.apply(bad, {{"views", std::string("dinov2")}, {"decode_device", std::string("gpu")}}),
               std::invalid_argument);
}
