// The recipe pieces (gpufeed/harness/recipe.h) against the venv's PyTorch/torchvision
// (tests/goldens/gen_recipe.py), and the Trainer options that use them. Part of test_harness.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "golden.h"
#include "gpufeed/harness/recipe.h"
#include "gpufeed/harness/resnet.h"
#include "gpufeed/harness/schedule_options.h"
#include "gpufeed/harness/train_checkpoint.h"
#include "gpufeed/harness/trainer.h"
#include "gpufeed/datasets/synthetic.h"
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
  o.loader.batch_size = 8;
  o.loader.transform.rrc.size = 32;
  o.loader.num_workers = 1;
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
  o.schedule.lr_schedule = harness::LrScheduleKind::kConstant;
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
  datasets::SyntheticOptions so;
  so.num_classes = 4;
  so.images_per_class = 65;  // 260 images: 256 samples per epoch
  so.min_size = 36;
  so.max_size = 40;
  datasets::write_synthetic_image_folder(dir.path / "data", so);
  harness::TrainOptions o = small_run(dir.path / "data");
  o.max_steps_per_epoch = 2;
  o.ra_sampler = true;
  o.ra_reps = 4;
  o.loader.seed = 5;
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

// torchvision.transforms.v2.MixUp / CutMix with the same lam and box: the same images and soft
// targets, float for float (the same tensor operations on the CPU).
TEST(Recipe, MixUpAndCutMixEqualTorchvisionV2GivenTheSameLamAndBox) {
  const auto g = test::load_golden("recipe.json").at("mix");
  const auto shape = g.at("shape").get<std::vector<int64_t>>();
  const at::Tensor images = tensor_of(g.at("images"), shape);
  const at::Tensor labels = at::tensor(g.at("labels").get<std::vector<int64_t>>(), at::kLong);
  const int64_t classes = g.at("num_classes").get<int64_t>();
  const auto check = [&](const harness::MixParams& p, const nlohmann::json& want, const std::string& what) {
    at::Tensor im = images.clone(), lb = labels.clone();
    harness::mix_batch(p, im, lb, classes);
    EXPECT_EQ((im - tensor_of(want.at("images"), shape)).abs().max().item<double>(), 0.0) << what;
    EXPECT_EQ((lb - tensor_of(want.at("labels"))).abs().max().item<double>(), 0.0) << what;
    EXPECT_EQ(lb.sizes(), (std::vector<int64_t>{shape[0], classes})) << what;
  };
  for (const auto& c : g.at("mixup")) {
    harness::MixParams p;
    p.lam = c.at("lam").get<double>();
    check(p, c, "mixup lam " + std::to_string(p.lam));
  }
  for (const auto& c : g.at("cutmix")) {
    const auto box = c.at("box").get<std::vector<int64_t>>();
    harness::MixParams p;
    p.kind = harness::MixParams::Kind::kCutMix;
    p.lam = c.at("lam").get<double>();
    p.x1 = box[0], p.y1 = box[1], p.x2 = box[2], p.y2 = box[3];
    check(p, c, "cutmix box " + c.at("box").dump());
  }
  // CutMix.make_params' box and lam_adjusted from its draws (lam, centre column, centre row).
  for (const auto& c : g.at("cutmix_draws")) {
    const auto p = harness::cutmix_params(c.at("lam").get<double>(), c.at("r_x").get<int64_t>(), c.at("r_y").get<int64_t>(),
                                          c.at("height").get<int64_t>(), c.at("width").get<int64_t>());
    EXPECT_EQ((std::vector<int64_t>{p.x1, p.y1, p.x2, p.y2}), c.at("box").get<std::vector<int64_t>>()) << c.dump();
    EXPECT_EQ(p.lam, c.at("lam_adjusted").get<double>()) << c.dump();
  }
  at::Tensor bad = labels.to(at::kFloat), im = images.clone();
  EXPECT_THROW(harness::mix_batch(harness::MixParams{}, im, bad, classes), std::invalid_argument);
}

// The draws: a pure function of the key; with both alphas on, both kinds are chosen about
// equally; lam within (0, 1) and CutMix's box inside the image.
TEST(Recipe, MixUpCutMixDrawsArePureFunctionsOfTheKey) {
  const harness::MixUpCutMix both({0.2, 1.0, 10});
  int cutmix = 0;
  for (uint64_t key = 0; key < 400; ++key) {
    const harness::MixParams a = both.draw(key, 32, 48), b = both.draw(key, 32, 48);
    EXPECT_EQ(a.kind, b.kind);
    EXPECT_EQ(a.lam, b.lam);
    EXPECT_EQ(a.x1, b.x1);
    EXPECT_EQ(a.y2, b.y2);
    EXPECT_TRUE(a.lam >= 0 && a.lam <= 1) << a.lam;
    if (a.kind == harness::MixParams::Kind::kCutMix) {
      ++cutmix;
      EXPECT_TRUE(0 <= a.x1 && a.x1 <= a.x2 && a.x2 <= 48 && 0 <= a.y1 && a.y1 <= a.y2 && a.y2 <= 32);
    }
  }
  EXPECT_GT(cutmix, 150);
  EXPECT_LT(cutmix, 250);
  const harness::MixUpCutMix mixup_only({0.2, 0.0, 10});
  EXPECT_EQ(mixup_only.draw(7, 8, 8).kind, harness::MixParams::Kind::kMixUp);
  EXPECT_THROW(harness::MixUpCutMix({0.0, 0.0, 10}), std::invalid_argument);
  EXPECT_THROW(harness::MixUpCutMix({-1.0, 0.0, 10}), std::invalid_argument);
}

// The training step mixes each micro-batch with MixUpCutMix keyed by mix_key(seed, epoch,
// micro-batch, rank): a run with --mixup-alpha/--cutmix-alpha ends with the weights of a run
// that applies the same draws in its own batch transform, bit for bit, and two runs agree.
TEST(Trainer, MixUpCutMixIsTheDocumentedDrawPerMicroBatch) {
  test::TempDir dir("mix");
  const fs::path data = test::tiny_dataset(dir.path / "data");
  harness::TrainOptions o = small_run(data);
  o.max_steps_per_epoch = 3;
  o.epochs = 2;
  o.label_smoothing = 0.1;
  harness::TrainOptions mixed = o;
  mixed.mixup_alpha = 0.2;
  mixed.cutmix_alpha = 1.0;
  harness::Trainer a(mixed), b(mixed), c(o);
  a.fit();
  b.fit();
  const harness::MixUpCutMix mix({0.2, 1.0, 4});
  int64_t calls = 0;
  harness::StepHooks hooks;
  hooks.batch_transform = [&](at::Tensor& images, at::Tensor& labels) {
    const int64_t epoch = calls / 3, batch = calls % 3;
    ++calls;
    mix(images, labels, harness::mix_key(o.loader.seed, epoch, batch, 0));
  };
  c.set_step_hooks(hooks);
  c.fit();
  EXPECT_EQ(calls, 6);
  for (auto* other : {&b, &c}) {
    auto theirs = other->model()->named_parameters();
    for (const auto& p : a.model()->named_parameters()) {
      EXPECT_TRUE(torch::equal(p.value(), theirs[p.key()])) << p.key();
    }
  }
}

namespace {

torch::nn::Sequential tiny_ema_model() {  // tests/goldens/gen_recipe.py's _tiny_model
  return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3)), torch::nn::BatchNorm2d(4),
                               torch::nn::Flatten(), torch::nn::Linear(64, 5));
}

void load_state(torch::nn::Module& m, const nlohmann::json& state) {
  torch::NoGradGuard no_grad;
  auto assign = [&](const std::string& name, at::Tensor& t) {
    const auto& s = state.at(name);
    t.copy_(tensor_of(s.at("values")).to(at::kDouble).reshape(s.at("shape").get<std::vector<int64_t>>()));
  };
  for (auto& p : m.named_parameters()) assign(p.key(), p.value());
  for (auto& b : m.named_buffers()) assign(b.key(), b.value());
}

}  // namespace

// The references' ExponentialMovingAverage (AveragedModel, use_buffers) over six model states
// with the warmup's resets after the first two updates: every parameter and buffer, BatchNorm's
// integer counter truncated as torch truncates it; and the references' decay adjustment.
TEST(Recipe, ModelEmaEqualsTorchAveragedModelWithTheReferencesWarmup) {
  const auto g = test::load_golden("recipe.json").at("ema");
  auto model = tiny_ema_model();
  auto averaged = tiny_ema_model();
  harness::ModelEma ema(averaged.ptr(), 0.9);
  int64_t k = 0;
  for (const auto& state : g.at("states")) {
    load_state(*model, state);
    ema.update(*model);
    if (k++ < 2) ema.reset();
  }
  EXPECT_EQ(ema.n_averaged(), g.at("n_averaged").get<int64_t>());
  std::vector<std::string> keys;
  for (const auto& kv : ema.state_dict()) {
    const std::string& key = kv.key();
    const at::Tensor& t = kv.value();
    keys.push_back(key);
    if (key == "n_averaged") continue;
    const auto& want = g.at("averaged").at(key.substr(7));
    const at::Tensor w = tensor_of(want.at("values")).reshape(want.at("shape").get<std::vector<int64_t>>());
    EXPECT_LE((t.to(at::kDouble) - w.to(at::kDouble)).abs().max().item<double>(), 1e-7) << key;
  }
  auto want_keys = g.at("keys").get<std::vector<std::string>>();
  std::sort(keys.begin(), keys.end());
  std::sort(want_keys.begin(), want_keys.end());
  EXPECT_EQ(keys, want_keys);
  EXPECT_EQ(averaged->named_buffers()["1.num_batches_tracked"].item<int64_t>(), 3);
  for (const auto& c : g.at("adjusted")) {
    EXPECT_NEAR(harness::adjusted_ema_decay(c.at("decay"), c.at("world_size"), c.at("batch_size"), c.at("ema_steps"),
                                            c.at("epochs")),
                c.at("adjusted").get<double>(), 1e-15)
        << c.dump();
  }
  // A saved average restores into a fresh one.
  auto again = tiny_ema_model();
  harness::ModelEma restored(again.ptr(), 0.9);
  restored.load_state_dict(ema.state_dict(), "test");
  EXPECT_EQ(restored.n_averaged(), ema.n_averaged());
  EXPECT_TRUE(torch::equal(again->named_parameters()["3.weight"], averaged->named_parameters()["3.weight"]));
}

// --model-ema: the trainer's average is a ModelEma fed the model after steps 0, N, 2N, ... of
// every epoch, copying during the warmup epoch (the references' schedule), with the references'
// adjusted decay; it is validated beside the model, saved in the training checkpoint as
// AveragedModel.state_dict() and restored by a resume.
TEST(Trainer, ModelEmaFollowsTheReferencesScheduleIsValidatedSavedAndResumed) {
  test::TempDir dir("ema");
  const fs::path data = test::tiny_dataset(dir.path / "data");
  harness::TrainOptions o = small_run(data);
  o.epochs = 3;
  o.max_steps_per_epoch = 3;
  o.schedule.warmup_epochs = 1;
  o.model_ema = true;
  o.model_ema_steps = 2;
  o.model_ema_decay = 0.999;
  o.val_data = data;
  o.save_checkpoint = dir.path / "train.pt";
  harness::Trainer t(o);
  ASSERT_NE(t.model_ema(), nullptr);
  EXPECT_EQ(t.model_ema()->decay(), harness::adjusted_ema_decay(0.999, 1, 8, 2, 3));
  EXPECT_NEAR(t.model_ema()->decay(), 1 - 0.001 * 8 * 2 / 3.0, 1e-12);
  auto mirror_model = harness::make_resnet({"resnet18", 4, true});
  harness::ModelEma mirror(mirror_model.ptr(), t.model_ema()->decay());
  harness::StepHooks hooks;
  hooks.post_step = [&](int64_t step) {
    const int64_t epoch = step / 3, i = step % 3;
    if (i % 2 != 0) return;
    mirror.update(*t.model());
    if (epoch < 1) mirror.reset();
  };
  t.set_step_hooks(hooks);
  const auto history = t.fit();
  ASSERT_EQ(history.size(), 3u);
  EXPECT_EQ(t.model_ema()->n_averaged(), 4);  // epoch 0 resets; epochs 1 and 2 update twice each
  const harness::StateDict got = t.model_ema()->state_dict(), want = mirror.state_dict();
  ASSERT_EQ(got.size(), want.size());
  for (const auto& kv : want) {
    EXPECT_TRUE(torch::equal(got.at(kv.key()), kv.value())) << kv.key();
  }
  for (const auto& st : history) {
    ASSERT_TRUE(st.ema_val_top1 && st.ema_val_loss && st.val_loss);
    std::cout << "epoch " << st.epoch << " val_loss " << *st.val_loss << " EMA val_loss " << *st.ema_val_loss << "\n";
  }
  EXPECT_NE(*history[2].val_loss, *history[2].ema_val_loss);
  const harness::EvalStats ema_eval = t.evaluate(data, /*ema=*/true);
  EXPECT_EQ(ema_eval.loss, *history[2].ema_val_loss);
  // The checkpoint's "model_ema" and a resume.
  const auto ckpt = harness::load_train_checkpoint(*o.save_checkpoint);
  ASSERT_FALSE(ckpt.model_ema.isNone());
  const harness::StateDict saved = harness::find_state_dict(ckpt.model_ema, "model_ema");
  EXPECT_EQ(saved.at("n_averaged").item<int64_t>(), 4);
  EXPECT_TRUE(torch::equal(saved.at("module.fc.weight"), got.at("module.fc.weight")));
  harness::TrainOptions more = o;
  more.resume = o.save_checkpoint;
  more.resume_replan_schedule = true;
  more.epochs = 4;
  harness::Trainer r(more);
  EXPECT_EQ(r.model_ema()->n_averaged(), 4);
  EXPECT_TRUE(torch::equal(r.model_ema()->state_dict().at("module.layer1.0.bn1.running_mean"),
                           got.at("module.layer1.0.bn1.running_mean")));
  harness::TrainOptions plain = small_run(data);
  EXPECT_THROW(harness::Trainer(plain).evaluate(data, /*ema=*/true), std::invalid_argument);
}

// FFCV's progressive resizing, get_resolution, per epoch for 11 configurations (golden: its
// formula in numpy: np.interp, then np.round(res / 32) * 32).
TEST(Recipe, GetResolutionEqualsFfcvsProgressiveResizingEpochByEpoch) {
  const auto cases = test::load_golden("recipe.json").at("resolution");
  ASSERT_EQ(cases.size(), 11u);
  for (const auto& c : cases) {
    harness::ResolutionSchedule r;
    r.min_res = c.at("min_res");
    r.max_res = c.at("max_res");
    r.start_ramp = c.at("start_ramp");
    r.end_ramp = c.at("end_ramp");
    EXPECT_NO_THROW(r.validate());
    const auto sizes = c.at("sizes").get<std::vector<int>>();
    std::vector<int> got;
    for (size_t e = 0; e < sizes.size(); ++e) got.push_back(harness::get_resolution(r, static_cast<int64_t>(e)));
    EXPECT_EQ(got, sizes) << c.dump().substr(0, 90);
  }
  // The 88-epoch rn50 config's ramp, spelled out: 160 through epoch 65, 192 from 76, between
  // them 160 + 32 (e - 65) / 11 to the nearest multiple of 32 (176 at e = 70.5: 192 from 71).
  const harness::ResolutionSchedule rn50{.min_res = 160, .max_res = 192, .start_ramp = 65, .end_ramp = 76};
  EXPECT_EQ(harness::get_resolution(rn50, 0), 160);
  EXPECT_EQ(harness::get_resolution(rn50, 70), 160);
  EXPECT_EQ(harness::get_resolution(rn50, 71), 192);
  EXPECT_EQ(harness::get_resolution(rn50, 87), 192);
  // FFCV asserts min_res <= max_res; the other bounds keep the formula meaningful.
  for (const harness::ResolutionSchedule bad : {harness::ResolutionSchedule{.min_res = 200, .max_res = 192},
                                                harness::ResolutionSchedule{.min_res = 0, .max_res = 192},
                                                harness::ResolutionSchedule{.start_ramp = -1},
                                                harness::ResolutionSchedule{.start_ramp = 5, .end_ramp = 4}}) {
    EXPECT_THROW(bad.validate(), std::invalid_argument);
  }
}

// The schedule's option rows (schedule_options.h), `gpufeed train`'s --lr-schedule ... --end-ramp:
// defaults read off ScheduleOptions{}, values set by name, and the progressive-resizing group
// given whole or refused naming the option.
TEST(ScheduleOptions, RowsSetTheFieldsAndTheRampIsGivenWhole) {
  namespace opt = gpufeed::options;
  const auto& schema = harness::schedule_options_schema();
  EXPECT_EQ(schema.names(), (std::set<std::string>{"lr_schedule", "lr_peak_epoch", "warmup_epochs",
                                                   "warmup_start_factor", "lr_step_epochs", "lr_milestones",
                                                   "lr_gamma", "min_lr", "onecycle_pct_start", "onecycle_div_factor",
                                                   "onecycle_final_div_factor", "min_res", "max_res", "start_ramp",
                                                   "end_ramp"}));
  const auto default_of = [&](const char* name) { return schema.default_value(*schema.find(name)); };
  EXPECT_EQ(std::get<std::string>(*default_of("lr_schedule")), "cosine");
  EXPECT_EQ(std::get<double>(*default_of("warmup_start_factor")), 0.1);
  EXPECT_EQ(std::get<double>(*default_of("onecycle_final_div_factor")), 1e4);
  EXPECT_EQ(std::get<int64_t>(*default_of("start_ramp")), 0);
  EXPECT_FALSE(default_of("min_res").has_value());  // unset: no progressive resizing

  harness::ScheduleOptions o;
  schema.apply(o, {{"lr_schedule", std::string("multistep")}, {"lr_milestones", std::vector<double>{30, 60, 80}},
                   {"lr_gamma", 0.2}, {"min_res", int64_t{160}}, {"max_res", int64_t{192}},
                   {"start_ramp", int64_t{65}}, {"end_ramp", int64_t{76}}});
  EXPECT_EQ(o.lr_schedule, harness::LrScheduleKind::kMultiStep);
  EXPECT_EQ(o.lr_milestones, (std::vector<double>{30, 60, 80}));
  EXPECT_EQ(o.lr_gamma, 0.2);
  ASSERT_TRUE(o.resolution.has_value());
  EXPECT_EQ(harness::get_resolution(*o.resolution, 71), 192);
  EXPECT_EQ(opt::format_value(opt::parse(schema.find("lr_milestones")->spec, "30,60,80")), "30,60,80");

  const auto refusal = [&](const std::map<std::string, opt::Value>& given) -> std::string {
    harness::ScheduleOptions fresh;
    try {
      schema.apply(fresh, given);
    } catch (const opt::OptionError& e) {
      return e.what();
    }
    return "";
  };
  // Part of the ramp: refused, naming the first given option and what is missing.
  EXPECT_EQ(refusal({{"min_res", int64_t{160}}, {"end_ramp", int64_t{4}}}),
            "`min_res` is one of progressive resizing's options, which needs `min_res`, `max_res` and `end_ramp` "
            "together (`start_ramp` defaults to 0); missing: `max_res`");
  EXPECT_NE(refusal({{"start_ramp", int64_t{3}}}).find("`start_ramp` is one of"), std::string::npos);
  // The whole ramp, but backwards: the schedule's own check, naming the option.
  EXPECT_EQ(refusal({{"min_res", int64_t{200}}, {"max_res", int64_t{192}}, {"end_ramp", int64_t{4}}}),
            "`max_res` must be >= `min_res`, not 192 < 200 (progressive resizing, FFCV's resolution schedule)");
  EXPECT_EQ(refusal({{"lr_schedule", std::string("linear")}}),
            "`lr_schedule` must be constant, step, multistep, cosine, onecycle or triangular, not 'linear'");
  EXPECT_EQ(refusal({{"onecycle_pct_start", 1.5}}), "`onecycle_pct_start` must be a number in [0, 1], not 1.5");
  EXPECT_EQ(refusal({{"lr_milestones", std::vector<double>{30, -1}}}),
            "`lr_milestones` must be a list of numbers >= 0, not 30,-1");
}

// FFCV's triangular ("cyclic") schedule per optimizer step (golden: its own numpy formulas).
TEST(LrSchedule, TriangularEqualsFfcvsCyclicScheduleStepByStep) {
  const auto cases = test::load_golden("recipe.json").at("triangular");
  ASSERT_EQ(cases.size(), 5u);
  for (const auto& c : cases) {
    harness::LrScheduleOptions so;
    so.kind = harness::LrScheduleKind::kTriangular;
    so.base_lr = c.at("base_lr");
    so.steps_per_epoch = c.at("steps_per_epoch");
    so.total_steps = c.at("epochs").get<int64_t>() * so.steps_per_epoch;
    so.peak_epoch = c.at("peak_epoch");
    const harness::LrSchedule s(so);
    const auto lrs = c.at("lrs").get<std::vector<double>>();
    ASSERT_EQ(lrs.size(), static_cast<size_t>(so.total_steps));
    for (size_t k = 0; k < lrs.size(); ++k) {
      EXPECT_NEAR(s.lr(static_cast<int64_t>(k)), lrs[k], 1e-12 * std::max(1.0, lrs[k])) << "step " << k << " of " << c.dump().substr(0, 90);
    }
    EXPECT_FALSE(s.momentum(0).has_value());
  }
  harness::LrScheduleOptions bad;
  bad.kind = harness::LrScheduleKind::kTriangular;
  bad.total_steps = 12;
  bad.steps_per_epoch = 4;  // 3 epochs
  for (const double peak : {0.0, 3.5}) {
    bad.peak_epoch = peak;
    EXPECT_THROW(harness::LrSchedule{bad}, std::invalid_argument) << "peak " << peak;
  }
  bad.peak_epoch = 2;
  bad.steps_per_epoch = 5;
  EXPECT_THROW(harness::LrSchedule{bad}, std::invalid_argument);
  bad.steps_per_epoch = 4;
  bad.warmup_steps = 2;
  EXPECT_THROW(harness::LrSchedule{bad}, std::invalid_argument);
  EXPECT_EQ(harness::parse_lr_schedule_kind("triangular"), harness::LrScheduleKind::kTriangular);
}

// --lr-schedule triangular in a run: the rates of its steps are the schedule's over the run's
// steps per epoch and --lr-peak-epoch.
TEST(Trainer, TriangularScheduleUsesTheRunsStepsPerEpochAndPeak) {
  test::TempDir dir("triangular");
  const fs::path data = test::tiny_dataset(dir.path / "data");
  harness::TrainOptions o = small_run(data);
  o.epochs = 3;
  o.max_steps_per_epoch = 2;
  o.schedule.lr_schedule = harness::LrScheduleKind::kTriangular;
  o.schedule.lr_peak_epoch = 1;
  o.save_checkpoint = dir.path / "train.pt";
  o.save_checkpoint_only_on_stop = false;
  harness::Trainer t(o);
  std::vector<double> lrs;
  t.set_step_callback([&](const harness::StepStats& s) { lrs.push_back(s.lr); });
  t.fit();
  const double peak = t.scaled_lr();
  // epochs 0..3 -> L = [1e-4 peak, peak, peak / 2, 0]; two steps per epoch, halfway between.
  const std::vector<double> want = {1e-4 * peak, (1e-4 * peak + peak) / 2, peak, 0.75 * peak, peak / 2, peak / 4};
  ASSERT_EQ(lrs.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) EXPECT_NEAR(lrs[k], want[k], 1e-12) << "step " << k;
  // The peak is part of the saved plan: resuming with another one is refused, naming it.
  harness::TrainOptions resumed = o;
  resumed.resume = t.last_checkpoint();
  resumed.schedule.lr_peak_epoch = 2;
  try {
    harness::Trainer{resumed};
    ADD_FAILURE() << "a resume with another --lr-peak-epoch must be refused";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("peak_epoch 1 -> 2"), std::string::npos) << e.what();
  }
}

// --val-flip-average: validation on the mean logits of each image and its mirror. A folder and
// its mirrored copy (lossless PNGs) then give the same loss and accuracy, which they do not
// without it; the loss differs from the plain one.
TEST(Trainer, ValFlipAverageValidatesOnTheMeanOfTheImageAndItsMirror) {
  test::TempDir dir("flip");
  const fs::path data = test::tiny_dataset(dir.path / "data");
  const fs::path orig = test::golden_path("flip_val/orig"), mirror = test::golden_path("flip_val/mirror");
  harness::TrainOptions o = small_run(data);
  o.val_resize_size = 32;  // 32 x 32 images: Resize and CenterCrop keep them as they are
  o.val_crop_size = 32;
  o.freeze_bn = false;
  o.zero_init_residual = false;
  harness::TrainOptions flip = o;
  flip.val_flip_average = true;
  harness::Trainer plain_run(o), flip_run(flip);
  const harness::EvalStats p_orig = plain_run.evaluate(orig), p_mirror = plain_run.evaluate(mirror);
  const harness::EvalStats f_orig = flip_run.evaluate(orig), f_mirror = flip_run.evaluate(mirror);
  std::cout << "plain: " << p_orig.loss << " / mirrored " << p_mirror.loss << "; flip-averaged: " << f_orig.loss << " / "
            << f_mirror.loss << "\n";
  EXPECT_EQ(p_orig.samples, 4);
  EXPECT_NE(p_orig.loss, p_mirror.loss);
  EXPECT_EQ(f_orig.loss, f_mirror.loss);
  EXPECT_EQ(f_orig.top1, f_mirror.top1);
  EXPECT_NE(f_orig.loss, p_orig.loss);
  EXPECT_NE(f_orig.loss, p_mirror.loss);
}
