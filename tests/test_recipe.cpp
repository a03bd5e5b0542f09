// The recipe pieces (gpufeed/harness/recipe.h) against the venv's PyTorch/torchvision
// (tests/goldens/gen_recipe.py), and the Trainer options that use them. Part of test_harness.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "golden.h"
#include "gpufeed/harness/recipe.h"
#include "gpufeed/harness/resnet.h"
#include "gpufeed/harness/train_checkpoint.h"
#include "gpufeed/harness/trainer.h"
#include "gpufeed/loader/synthetic.h"
#include "gpufeed/sampler/ra_sampler.h"
#include "test_util.h"

using namespace gpufeed;
namespace fs = std::filesystem;

namespace {

at::Tensor tensor_of(const nlohmann::json& values, std::vector<int64_t> shape = {}) {
  std::vector<float> flat;
  for (const auto& row : values) {
    if (row.is_array()) {
      for (const auto& v : row) flat.push_back(v.get<float>());
    } else {
      flat.push_back(row.get<float>());
    }
  }
  at::Tensor t = at::tensor(flat, at::kFloat);
  if (shape.empty() && values.size() > 0 && values[0].is_array()) {
    shape = {static_cast<int64_t>(values.size()), static_cast<int64_t>(values[0].size())};
  }
  return shape.empty() ? t : t.reshape(shape);
}

// A small run (tests/test_util.h's 4 classes x 8 JPEGs) with BatchNorm frozen and identity
// blocks, as test_harness.cpp's tiny_run.
harness::TrainOptions small_run(const fs::path& data) {
  harness::TrainOptions o;
  o.data = data;
  o.epochs = 1;
  o.batch_size = 8;
  o.image_size = 32;
  o.num_workers = 1;
  o.freeze_bn = true;
  o.zero_init_residual = true;
  o.distributed = harness::DistributedMode::kOff;
  return o;
}

}  // namespace

// Which parameter goes to which group with which decay, name for name and in order, as the
// references' set_weight_decay groups torchvision's resnet18.
TEST(Recipe, WeightDecayGroupsAreTheTorchvisionReferencesGroups) {
  const auto g = test::load_golden("recipe.json").at("weight_decay_groups");
  const harness::ResNet model = harness::make_resnet({"resnet18", 10, false});
  ASSERT_EQ(g.size(), 5u);
  for (const auto& c : g) {
    const auto opt = [](const nlohmann::json& v) { return v.is_null() ? std::nullopt : std::optional<double>(v.get<double>()); };
    const auto groups = harness::weight_decay_groups(*model, c.at("weight_decay").get<double>(),
                                                     opt(c.at("norm_weight_decay")), opt(c.at("bias_weight_decay")));
    const std::string what = c.dump().substr(0, 90);
    ASSERT_EQ(groups.size(), c.at("groups").size()) << what;
    for (size_t i = 0; i < groups.size(); ++i) {
      const auto& want = c.at("groups")[i];
      EXPECT_EQ(groups[i].key, want.at("key").get<std::string>()) << what;
      EXPECT_EQ(groups[i].weight_decay, want.at("weight_decay").get<double>()) << what;
      EXPECT_EQ(groups[i].names, want.at("names").get<std::vector<std::string>>()) << what << " group " << groups[i].key;
      ASSERT_EQ(groups[i].params.size(), groups[i].names.size());
    }
  }
}

// torch.nn.CrossEntropyLoss(label_smoothing=e) on class indices and on probabilities.
TEST(Recipe, CrossEntropyEqualsTorchOnClassIndicesAndSoftTargetsWithLabelSmoothing) {
  const auto g = test::load_golden("recipe.json").at("cross_entropy");
  const at::Tensor logits = tensor_of(g.at("logits"));
  const at::Tensor labels = at::tensor(g.at("labels").get<std::vector<int64_t>>(), at::kLong);
  const at::Tensor soft = tensor_of(g.at("soft"));
  for (const auto& c : g.at("cases")) {
    const double eps = c.at("label_smoothing").get<double>();
    const double hard = harness::cross_entropy(logits, labels, eps).item<double>();
    const double prob = harness::cross_entropy(logits, soft, eps).item<double>();
    EXPECT_NEAR(hard, c.at("hard").get<double>(), 1e-6 * std::abs(hard)) << "label_smoothing " << eps;
    EXPECT_NEAR(prob, c.at("soft").get<double>(), 1e-6 * std::abs(prob)) << "label_smoothing " << eps;
  }
  // A one-hot soft target is the class index.
  const at::Tensor one_hot = at::one_hot(labels, 5).to(at::kFloat);
  EXPECT_NEAR(harness::cross_entropy(logits, one_hot, 0.1).item<double>(),
              harness::cross_entropy(logits, labels, 0.1).item<double>(), 1e-6);
  EXPECT_THROW(harness::cross_entropy(logits, one_hot.to(at::kLong), 0.0), std::invalid_argument);
  // Top-1 of soft targets is their argmax (the references' accuracy with 2-D targets).
  EXPECT_TRUE(torch::equal(harness::top1_hits(logits, soft), logits.argmax(1).eq(soft.argmax(1))));
}

// torch.nn.utils.clip_grad_norm_: the norm before clipping and the clipped gradients.
TEST(Recipe, ClipGradNormEqualsTorchClipGradNorm) {
  const auto g = test::load_golden("recipe.json").at("clip_grad_norm");
  const auto shapes = g.at("shapes").get<std::vector<std::vector<int64_t>>>();
  for (const auto& c : g.at("cases")) {
    std::vector<at::Tensor> params;
    for (size_t i = 0; i < shapes.size(); ++i) {
      params.push_back(at::zeros(shapes[i]).requires_grad_(true));
      params.back().mutable_grad() = tensor_of(g.at("grads")[i], shapes[i]);
    }
    params.push_back(at::zeros({3}).requires_grad_(true));  // no gradient: ignored
    const double max_norm = c.at("max_norm").get<double>();
    const double total = harness::clip_grad_norm(params, max_norm);
    EXPECT_NEAR(total, c.at("total_norm").get<double>(), 1e-6 * total) << "max_norm " << max_norm;
    for (size_t i = 0; i < shapes.size(); ++i) {
      const at::Tensor want = tensor_of(c.at("grads")[i], shapes[i]);
      EXPECT_LE((params[i].grad() - want).abs().max().item<double>(), 1e-7) << "max_norm " << max_norm << " tensor " << i;
    }
    EXPECT_FALSE(params.back().grad().defined());
  }
}

// With clip_grad_norm the step's update is the unclipped update times max_norm / (norm + 1e-6)
// (plain SGD: no momentum or weight decay, so the update is -lr x gradient).
TEST(Trainer, ClipGradNormScalesTheStepsGradientToTheNorm) {
  test::TempDir dir("clip");
  const fs::path data = test::tiny_dataset(dir.path / "data");
  harness::TrainOptions o = small_run(data);
  o.max_steps_per_epoch = 1;
  o.momentum = 0;
  o.weight_decay = 0;
  o.lr = 256;  // lr 8 at batch 8: updates far above float32 rounding of the weights
  o.lr_schedule = harness::LrScheduleKind::kConstant;
  std::map<std::string, at::Tensor> init;
  std::map<std::string, at::Tensor> delta[2];
  for (int clipped = 0; clipped < 2; ++clipped) {
    harness::TrainOptions run = o;
    if (clipped) run.clip_grad_norm = 0.05;
    harness::Trainer t(run);
    for (const auto& p : t.model()->named_parameters()) init[p.key()] = p.value().detach().clone();
    t.fit();
    for (const auto& p : t.model()->named_parameters()) delta[clipped][p.key()] = p.value().detach() - init[p.key()];
  }
  double sq = 0;
  for (const auto& [k, d] : delta[0]) sq += d.pow(2).sum().item<double>();
  const double grad_norm = std::sqrt(sq) / 8.0;  // |update| / lr
  std::cout << "gradient norm " << grad_norm << ", clipped to 0.05\n";
  ASSERT_GT(grad_norm, 0.1) << "the test needs a gradient above the clipping norm";
  const double coef = 0.05 / (grad_norm + 1e-6);
  double worst = 0, clipped_sq = 0;
  for (const auto& [k, d] : delta[1]) {
    worst = std::max(worst, (d - delta[0][k] * coef).abs().max().item<double>());
    clipped_sq += d.pow(2).sum().item<double>();
  }
  EXPECT_NEAR(std::sqrt(clipped_sq) / 8.0, 0.05, 1e-4);
  EXPECT_LE(worst, 1e-5);
}

// --norm-weight-decay / --bias-weight-decay reach the optimizer as the references' groups: the
// training checkpoint's SGD param_groups (torch's layout) carry each group's decay and size.
TEST(Trainer, NormAndBiasWeightDecayAreSeparateOptimizerGroups) {
  test::TempDir dir("wd_groups");
  const fs::path data = test::tiny_dataset(dir.path / "data");
  struct Case {
    std::optional<double> norm, bias;
    bool shorthand;
    std::vector<std::pair<double, int64_t>> groups;  // (weight_decay, parameters)
  };
  // resnet18: 62 parameters; 40 in BatchNorm layers (20 weights, 20 biases); 21 biases (fc's).
  const std::vector<Case> cases = {{std::nullopt, std::nullopt, false, {{1e-4, 62}}},
                                   {0.0, std::nullopt, false, {{1e-4, 22}, {0.0, 40}}},
                                   {std::nullopt, 3e-5, false, {{1e-4, 41}, {3e-5, 21}}},
                                   {std::nullopt, std::nullopt, true, {{1e-4, 21}, {0.0, 20}, {0.0, 21}}},
                                   {2e-5, std::nullopt, true, {{1e-4, 21}, {2e-5, 20}, {0.0, 21}}}};
  for (const Case& c : cases) {
    harness::TrainOptions o = small_run(data);
    o.max_steps_per_epoch = 1;
    o.norm_weight_decay = c.norm;
    o.bias_weight_decay = c.bias;
    o.no_decay_norm_bias = c.shorthand;
    o.save_checkpoint = dir.path / "train.pt";
    harness::Trainer(o).fit();
    const auto ckpt = harness::load_train_checkpoint(*o.save_checkpoint);
    const auto groups = ckpt.optimizer.toGenericDict().at("param_groups").toList();
    ASSERT_EQ(groups.size(), c.groups.size());
    for (size_t i = 0; i < groups.size(); ++i) {
      const auto g = c10::IValue(groups.get(i)).toGenericDict();
      EXPECT_EQ(g.at("weight_decay").toDouble(), c.groups[i].first) << "group " << i;
      EXPECT_EQ(static_cast<int64_t>(g.at("params").toList().size()), c.groups[i].second) << "group " << i;
    }
  }
  harness::TrainOptions bad = small_run(data);
  bad.norm_weight_decay = -1;
  EXPECT_THROW(harness::Trainer{bad}, std::invalid_argument);
  bad = small_run(data);
  bad.clip_grad_norm = std::nan("");
  EXPECT_THROW(harness::Trainer{bad}, std::invalid_argument);
}

// --ra-sampler: the steps take the RASampler's indices (4 repetitions: each image 4 times in a
// row on one rank); a dataset below the references' 256 is refused at start-up naming the rule.
TEST(Trainer, RaSamplerFeedsTheRASamplersOrder) {
  test::TempDir dir("ra");
  loader::SyntheticOptions so;
  so.num_classes = 4;
  so.images_per_class = 65;  // 260 images: 256 samples per epoch
  so.min_size = 36;
  so.max_size = 40;
  loader::write_synthetic_image_folder(dir.path / "data", so);
  harness::TrainOptions o = small_run(dir.path / "data");
  o.max_steps_per_epoch = 2;
  o.ra_sampler = true;
  o.ra_reps = 4;
  o.seed = 5;
  std::vector<int64_t> seen;
  harness::Trainer t(o);
  t.set_step_callback([&](const harness::StepStats& s) { seen.insert(seen.end(), s.indices.begin(), s.indices.end()); });
  t.fit();
  sampler::RASamplerOptions ra;
  ra.seed = 5;
  ra.repetitions = 4;
  sampler::RASampler want(260, ra);
  ASSERT_EQ(want.size(), 256);
  const std::vector<int64_t> all = want.indices();
  EXPECT_EQ(seen, std::vector<int64_t>(all.begin(), all.begin() + 16));
  EXPECT_EQ(seen[0], seen[3]);
  harness::TrainOptions small = small_run(test::tiny_dataset(dir.path / "tiny"));
  small.ra_sampler = true;
  try {
    harness::Trainer{small};
    ADD_FAILURE() << "32 images with --ra-sampler must be refused";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("floor(n // 256 * 256 / world size)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("has 32 images"), std::string::npos) << e.what();
  }
}
