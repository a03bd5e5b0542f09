// The per-sample augmentations against torchvision.transforms.v2 (goldens: gen_augment.py).
//
// Tolerance: none. Every op, every magnitude of the grid and every replayed transform must equal
// torchvision's output in every pixel (augment.h says which ops reproduce float32 rounding to
// get there); RandomErasing's expected pixels are torchvision's erased normalised values mapped
// to uint8 as RandomErasingOptions documents.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>

#include "golden.h"
#include "recorded_draws.h"
#include "test_util.h"
#include "gpufeed/loader/augment.h"
#include "gpufeed/loader/loader.h"
#include "gpufeed/loader/synthetic.h"
#include "gpufeed/sampler/sampler.h"

namespace fs = std::filesystem;
using namespace gpufeed::loader;
using gpufeed::test::RecordedDraws;

namespace {

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

struct Image {
  std::vector<uint8_t> pixels;
  int height = 0, width = 0;
};

const nlohmann::json& goldens() {
  static const nlohmann::json g = gpufeed::test::load_golden("augment.json");
  return g;
}

Image input(const std::string& name) {
  const auto& i = goldens()["images"][name];
  return {read_bytes(i["path"]), i["height"].get<int>(), i["width"].get<int>()};
}

AugmentOp op_named(const std::string& name) {
  for (int k = 0; k <= static_cast<int>(AugmentOp::kInvert); ++k) {
    if (to_string(static_cast<AugmentOp>(k)) == name) return static_cast<AugmentOp>(k);
  }
  throw std::runtime_error("unknown op " + name);
}

// Compares `got` with torchvision's `want`, every value; returns a description of the first
// difference, or "" when equal.
std::string compare(const Image& in, const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
  if (got.size() != want.size()) return "size differs";
  for (size_t k = 0; k < got.size(); ++k) {
    if (got[k] == want[k]) continue;
    const size_t p = k / 3;
    return "pixel (" + std::to_string(p / static_cast<size_t>(in.width)) + ", " +
           std::to_string(p % static_cast<size_t>(in.width)) + ") channel " + std::to_string(k % 3) + ": " +
           std::to_string(got[k]) + " vs torchvision " + std::to_string(want[k]);
  }
  return "";
}

void apply_named(const std::string& fn, AugmentOp op, double m, InterpolationMode mode, Image& img,
                 AugmentScratch& scratch) {
  if (fn.empty()) return apply_augment_op(op, m, img.pixels.data(), img.height, img.width, mode, scratch);
  if (fn == "brightness") return adjust_brightness(img.pixels.data(), img.height, img.width, m);
  if (fn == "contrast") return adjust_contrast(img.pixels.data(), img.height, img.width, m);
  if (fn == "saturation") return adjust_saturation(img.pixels.data(), img.height, img.width, m);
  if (fn == "hue") return adjust_hue(img.pixels.data(), img.height, img.width, m);
  throw std::runtime_error("unknown fn " + fn);
}

AugmentOptions options_from(const nlohmann::json& j) {
  AugmentOptions o;
  if (j.contains("auto_augment")) o.auto_augment = parse_auto_augment(j["auto_augment"].get<std::string>());
  if (j.contains("ra_num_ops")) o.ra_num_ops = j["ra_num_ops"];
  if (j.contains("ra_magnitude")) o.ra_magnitude = j["ra_magnitude"];
  if (j.contains("interpolation")) o.interpolation = parse_interpolation(j["interpolation"].get<std::string>());
  if (j.contains("color_jitter")) {
    o.color_jitter = {j["color_jitter"][0], j["color_jitter"][1], j["color_jitter"][2], j["color_jitter"][3]};
  }
  if (j.contains("random_erase")) {
    o.random_erasing.p = j["random_erase"];
    if (j["random_erase_value"].is_string()) {
      o.random_erasing.random_value = true;
    } else {
      o.random_erasing.value = j["random_erase_value"];
    }
  }
  for (size_t c = 0; c < 3; ++c) {
    o.mean[c] = goldens()["mean"][c];
    o.std[c] = goldens()["std"][c];
  }
  o.validate();
  return o;
}

}  // namespace

TEST(Augment, EveryOpEqualsTorchvisionsInEveryPixel) {
  std::map<std::string, Image> inputs;
  AugmentScratch scratch;
  std::map<std::string, int> checked;
  for (const auto& c : goldens()["ops"]) {
    const std::string name = c["image"];
    if (!inputs.count(name)) inputs[name] = input(name);
    Image img = inputs[name];
    const std::string op = c["op"];
    const std::string fn = c.value("fn", "");
    const double m = c["magnitude"];
    const InterpolationMode mode = parse_interpolation(c.value("interpolation", "nearest"));
    apply_named(fn, fn.empty() ? op_named(op) : AugmentOp::kIdentity, m, mode, img, scratch);
    EXPECT_EQ(compare(inputs[name], img.pixels, read_bytes(c["output"])), "")
        << op << " magnitude " << m << " " << to_string(mode) << " on image " << name;
    ++checked[op + (mode == InterpolationMode::kBilinear ? " bilinear" : "")];
  }
  // Every op of the three policies and the four ColorJitter adjustments were checked.
  for (const char* op : {"Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color",
                         "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize", "Invert",
                         "brightness", "contrast", "saturation", "hue", "ShearX bilinear", "ShearY bilinear",
                         "TranslateX bilinear", "TranslateY bilinear", "Rotate bilinear"}) {
    EXPECT_GT(checked[op], 0) << op;
  }
}

TEST(Augment, OneMovedPixelFailsTheComparison) {
  // The comparison itself can fail: one value off by one is reported with its place.
  const auto& c = goldens()["ops"][0];
  const Image in = input(c["image"]);
  const std::vector<uint8_t> want = read_bytes(c["output"]);
  std::vector<uint8_t> got = want;
  got[3 * (static_cast<size_t>(in.width) * 5 + 7) + 1] ^= 1;
  EXPECT_EQ(compare(in, want, want), "");
  EXPECT_EQ(compare(in, got, want).rfind("pixel (5, 7) channel 1", 0), 0u) << compare(in, got, want);
}

TEST(Augment, MagnitudeTablesEqualTorchvisionsBitForBit) {
  for (const auto& t : goldens()["magnitudes"]) {
    const AutoAugmentPolicy policy = parse_auto_augment(t["policy"].get<std::string>());
    const AugmentOp op = op_named(t["op"]);
    const int bins = t["bins"];
    EXPECT_EQ(augment_signed(op), t["signed"].get<bool>()) << t["op"];
    EXPECT_EQ(augment_has_magnitude(op), !t["values"].is_null()) << t["op"];
    if (t["values"].is_null()) continue;
    for (int b = 0; b < bins; ++b) {
      EXPECT_EQ(augment_magnitude(policy, op, b, bins, t["height"], t["width"]),
                t["values"][static_cast<size_t>(b)].get<float>())
          << t["policy"] << " " << t["op"] << " bin " << b << " at " << t["height"] << "x" << t["width"];
    }
  }
}

TEST(Augment, PlansReplayTorchvisionsDrawsAndOutputs) {
  std::map<std::string, Image> inputs;
  AugmentScratch scratch;
  AugmentPlan plan;
  std::set<std::string> configs;
  for (const auto& c : goldens()["replays"]) {
    const std::string name = c["image"];
    if (!inputs.count(name)) inputs[name] = input(name);
    Image img = inputs[name];
    const AugmentOptions o = options_from(c["options"]);
    RecordedDraws draws(c["draws"]);
    plan_augment(o, img.height, img.width, draws, plan);
    EXPECT_EQ(draws.used(), c["draws"].size()) << c["config"] << " seed " << c["seed"] << ": draws left over";
    apply_augment(plan, img.pixels.data(), img.height, img.width, scratch);
    EXPECT_EQ(compare(img, img.pixels, read_bytes(c["output"])), "")
        << c["config"] << " seed " << c["seed"] << " on image " << name;
    configs.insert(c["config"]);
  }
  EXPECT_EQ(configs.size(), 12u);
}

TEST(Augment, OptionsAreValidatedWithTheirNames) {
  const auto message = [](const AugmentOptions& o) {
    try {
      o.validate();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  AugmentOptions o;
  EXPECT_EQ(message(o), "");
  o.ra_magnitude = 31;
  EXPECT_NE(message(o).find("ra_magnitude"), std::string::npos);
  o = {};
  o.ra_num_ops = -1;
  EXPECT_NE(message(o).find("ra_num_ops"), std::string::npos);
  o = {};
  o.color_jitter.hue = 0.6f;
  EXPECT_NE(message(o).find("hue"), std::string::npos);
  o = {};
  o.random_erasing.p = 1.5f;
  EXPECT_NE(message(o).find("random_erase"), std::string::npos);
  EXPECT_THROW(parse_auto_augment("augmix"), std::invalid_argument);
  EXPECT_THROW(parse_interpolation("bicubic"), std::invalid_argument);
  EXPECT_EQ(parse_interpolation("bilinear"), InterpolationMode::kBilinear);
  EXPECT_EQ(parse_auto_augment("ta_wide"), AutoAugmentPolicy::kTrivialAugmentWide);
}

namespace {

std::vector<uint8_t> epoch_images(const fs::path& root, int workers, const AugmentOptions& aug) {
  auto dataset = open_dataset(root);
  auto sampler = std::make_shared<gpufeed::sampler::RandomSampler>(dataset->size(), 5);
  LoaderOptions o;
  o.batch_size = 4;
  o.num_workers = workers;
  o.seed = 99;
  o.transform = TransformOptions::imagenet(TransformOptions::Kind::kTrain, 48);
  o.transform.augment = aug;
  Loader loader(dataset, sampler, o);
  std::vector<uint8_t> all;
  loader.start_epoch(2);
  while (auto b = loader.next()) all.insert(all.end(), b->images, b->images + b->size * 48 * 48 * 3);
  return all;
}

}  // namespace

TEST(Augment, AugmentedBatchesAreIdenticalAtOneAndFourThreads) {
  const gpufeed::test::TempDir dir("test_augment");
  const fs::path root = dir.path / "data";
  SyntheticOptions s;
  s.num_classes = 2;
  s.images_per_class = 12;
  s.min_size = 40;
  s.max_size = 90;
  write_synthetic_image_folder(root, s);
  for (auto policy : {AutoAugmentPolicy::kTrivialAugmentWide, AutoAugmentPolicy::kRandAugment,
                      AutoAugmentPolicy::kImageNet}) {
    AugmentOptions aug;
    aug.auto_augment = policy;
    aug.color_jitter = {0.4f, 0.4f, 0.4f, 0.1f};
    aug.random_erasing.p = 0.5f;
    aug.random_erasing.random_value = policy == AutoAugmentPolicy::kRandAugment;
    if (policy == AutoAugmentPolicy::kImageNet) aug.interpolation = InterpolationMode::kBilinear;
    const auto one = epoch_images(root, 1, aug);
    const auto four = epoch_images(root, 4, aug);
    EXPECT_EQ(one, four) << to_string(policy);
    // and the augmentation did something
    EXPECT_NE(one, epoch_images(root, 1, AugmentOptions{})) << to_string(policy);
  }
}
