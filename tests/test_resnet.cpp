// gpufeed::harness ResNets against torchvision.models.resnet* (references:
// tests/goldens/gen_resnet.py).
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/utils.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "golden.h"
#include "gpufeed/harness/resnet.h"

using gpufeed::harness::make_resnet;
using gpufeed::harness::ResNet;
using gpufeed::harness::ResNetOptions;

namespace {

// What gen_resnet.py saved for one model: see its docstring.
struct Reference {
  int64_t seed = 0;
  std::map<std::string, at::Tensor> state;
  at::Tensor input;
  at::Tensor logits;
};

// Reads a torch.save() file (zip format, the default since PyTorch 1.6) of a plain dict with
// torch::jit::pickle_load.
Reference load_reference(const std::string& arch) {
  const auto path = gpufeed::test::golden_path(arch + "_c10.pt");
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw std::runtime_error("missing golden file " + path.string() +
                             ": run `ctest -R make_goldens` or " GPUFEED_PYTHON
                             " tests/goldens/make_goldens.py --out " GPUFEED_GOLDEN_DIR);
  }
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  const auto value = torch::jit::pickle_load(bytes);
  if (!value.isGenericDict()) {
    // An OrderedDict (e.g. a raw state_dict()) loads as None, silently: pytorch#100741.
    throw std::runtime_error(path.string() + ": expected a plain dict, got " + value.tagKind());
  }
  const auto dict = value.toGenericDict();
  Reference r;
  r.seed = dict.at("seed").toInt();
  for (const auto& e : dict.at("state").toGenericDict()) {
    r.state.emplace(e.key().toStringRef(), e.value().toTensor());
  }
  r.input = dict.at("input").toTensor();
  r.logits = dict.at("logits").toTensor();
  return r;
}

const Reference& reference(const std::string& arch) {
  static std::map<std::string, Reference> cache;
  auto it = cache.find(arch);
  if (it == cache.end()) it = cache.emplace(arch, load_reference(arch)).first;
  return it->second;
}

// Copies a torchvision state dict into `model`, by name; every parameter and buffer must be
// there with its shape and dtype, and nothing else.
void load_state(torch::nn::Module& model, const std::map<std::string, at::Tensor>& state) {
  const c10::NoGradGuard no_grad;
  size_t used = 0;
  auto copy = [&](const std::string& name, at::Tensor& dst) {
    const auto it = state.find(name);
    ASSERT_NE(it, state.end()) << name << " missing from the torchvision state dict";
    ASSERT_EQ(it->second.sizes(), dst.sizes()) << name;
    ASSERT_EQ(it->second.scalar_type(), dst.scalar_type()) << name;
    dst.copy_(it->second);
    ++used;
  };
  for (auto& p : model.named_parameters()) copy(p.key(), p.value());
  for (auto& b : model.named_buffers()) copy(b.key(), b.value());
  EXPECT_EQ(used, state.size()) << "the torchvision state dict has entries the model lacks";
}

// max |a - b| <= 1e-5 * max(1, max |expected|).
void expect_close(const at::Tensor& actual, const at::Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const double scale = std::max(1.0, expected.abs().max().item<double>());
  const double diff = (actual - expected).abs().max().item<double>();
  EXPECT_LE(diff, 1e-5 * scale) << what << ": max abs diff " << diff << " at scale " << scale;
}

ResNet reference_model(const std::string& arch) {
  ResNet model = make_resnet({.arch = arch, .num_classes = 10});
  load_state(*model, reference(arch).state);
  model->eval();
  return model;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> names_and_shapes(
    const torch::OrderedDict<std::string, at::Tensor>& named) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& e : named) out.emplace_back(e.key(), e.value().sizes().vec());
  return out;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> names_and_shapes(
    const nlohmann::json& j) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& e : j)
    out.emplace_back(e[0].get<std::string>(), e[1].get<std::vector<int64_t>>());
  return out;
}

// "gpufeed::harness::BottleneckImpl" / "torch::nn::Conv2dImpl" -> Python's class name.
std::string python_class_name(std::string cpp) {
  cpp = cpp.substr(cpp.rfind(':') == std::string::npos ? 0 : cpp.rfind(':') + 1);
  if (cpp.ends_with("Impl")) cpp.resize(cpp.size() - 4);
  return cpp;
}

}  // namespace

class ResNetNaming : public ::testing::TestWithParam<std::string> {};

TEST_P(ResNetNaming, ParametersBuffersAndModulesMatchTorchvisionInNameShapeAndOrder) {
  const auto g = gpufeed::test::load_golden("resnet_names.json").at(GetParam());
  const ResNet model = make_resnet({.arch = GetParam()});
  EXPECT_EQ(names_and_shapes(model->named_parameters()), names_and_shapes(g["parameters"]));
  EXPECT_EQ(names_and_shapes(model->named_buffers()), names_and_shapes(g["buffers"]));
  std::vector<std::pair<std::string, std::string>> modules;
  for (const auto& m : model->named_modules())
    modules.emplace_back(m.key(), python_class_name(m.value()->name()));
  EXPECT_EQ(modules, (g["modules"].get<std::vector<std::pair<std::string, std::string>>>()));
  int64_t count = 0;
  for (const auto& p : model->parameters()) count += p.numel();
  EXPECT_EQ(count, g["num_parameters"].get<int64_t>());
}

INSTANTIATE_TEST_SUITE_P(TorchvisionArchs, ResNetNaming,
                         ::testing::Values("resnet18", "resnet34", "resnet50", "resnet101",
                                           "resnet152"),
                         [](const auto& info) { return info.param; });

TEST(ResNet, ParameterCountsMatchTorchvisionsPublishedOnes) {
  // torchvision's model docs: 11,689,512 / 21,797,672 / 25,557,032 parameters.
  const std::map<std::string, int64_t> expected{
      {"resnet18", 11'689'512}, {"resnet34", 21'797'672}, {"resnet50", 25'557'032}};
  for (const auto& [arch, n] : expected) {
    int64_t count = 0;
    for (const auto& p : make_resnet({.arch = arch})->parameters()) count += p.numel();
    EXPECT_EQ(count, n) << arch;
  }
}

class ResNetReference : public ::testing::TestWithParam<std::string> {};

TEST_P(ResNetReference, LogitsMatchTorchvisionWithTheSameWeightsInEvalMode) {
  const auto& ref = reference(GetParam());
  ResNet model = reference_model(GetParam());
  const c10::NoGradGuard no_grad;
  expect_close(model->forward(ref.input), ref.logits, GetParam());
}

TEST_P(ResNetReference, ChannelsLastInputGivesTheSameLogits) {
  const auto& ref = reference(GetParam());
  ResNet model = reference_model(GetParam());
  const c10::NoGradGuard no_grad;
  const auto x = ref.input.contiguous(c10::MemoryFormat::ChannelsLast);
  ASSERT_TRUE(x.is_contiguous(c10::MemoryFormat::ChannelsLast));
  expect_close(model->forward(x), ref.logits, GetParam() + " channels_last input");
}

TEST_P(ResNetReference, ChannelsLastModelAndInputGiveTheSameLogits) {
  const auto& ref = reference(GetParam());
  ResNet model = reference_model(GetParam());
  gpufeed::harness::to_channels_last(*model);
  EXPECT_TRUE(model->conv1->weight.is_contiguous(c10::MemoryFormat::ChannelsLast));
  EXPECT_EQ(model->bn1->running_mean.dim(), 1);
  const c10::NoGradGuard no_grad;
  const auto y = model->forward(ref.input.contiguous(c10::MemoryFormat::ChannelsLast));
  expect_close(y, ref.logits, GetParam() + " channels_last model");
}

TEST_P(ResNetReference, SameSeedGivesTorchvisionsInitialWeights) {
  // gen_resnet.py changed only BatchNorm after building the model under this seed.
  const auto& ref = reference(GetParam());
  torch::manual_seed(static_cast<uint64_t>(ref.seed));
  const ResNet model = make_resnet({.arch = GetParam(), .num_classes = 10});
  size_t compared = 0;
  for (const auto& m : model->named_modules()) {
    if (const auto* conv = m.value()->as<torch::nn::Conv2d>()) {
      EXPECT_TRUE(at::equal(conv->weight, ref.state.at(m.key() + ".weight"))) << m.key();
      ++compared;
    } else if (const auto* bn = m.value()->as<torch::nn::BatchNorm2d>()) {
      EXPECT_TRUE(at::equal(bn->weight, at::ones_like(bn->weight))) << m.key();
      EXPECT_TRUE(at::equal(bn->bias, at::zeros_like(bn->bias))) << m.key();
      EXPECT_TRUE(at::equal(bn->running_mean, at::zeros_like(bn->running_mean))) << m.key();
      EXPECT_TRUE(at::equal(bn->running_var, at::ones_like(bn->running_var))) << m.key();
      EXPECT_EQ(bn->num_batches_tracked.item<int64_t>(), 0) << m.key();
    }
  }
  EXPECT_EQ(compared, GetParam() == "resnet18" ? 20u : 53u);
  EXPECT_TRUE(at::equal(model->fc->weight, ref.state.at("fc.weight")));
  EXPECT_TRUE(at::equal(model->fc->bias, ref.state.at("fc.bias")));
}

INSTANTIATE_TEST_SUITE_P(Torchvision, ResNetReference, ::testing::Values("resnet18", "resnet50"),
                         [](const auto& info) { return info.param; });

TEST(ResNet, UnknownArchThrowsNamingItAndTheKnownOnes) {
  try {
    make_resnet({.arch = "resnet19"});
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'resnet19'"), std::string::npos) << what;
    for (const auto& known : gpufeed::harness::known_resnet_archs()) {
      EXPECT_NE(what.find(known), std::string::npos) << what;
    }
  }
  EXPECT_THROW(make_resnet({.arch = "resnet18", .num_classes = 0}), std::invalid_argument);
}

TEST(ResNet, ZeroInitResidualZeroesOnlyEachBlocksLastNormAndDrawsNothingElse) {
  torch::manual_seed(7);
  const ResNet plain = make_resnet({.arch = "resnet50", .num_classes = 10});
  torch::manual_seed(7);
  const ResNet zeroed =
      make_resnet({.arch = "resnet50", .num_classes = 10, .zero_init_residual = true});
  const auto a = plain->named_parameters();
  const auto b = zeroed->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  int zeroed_count = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto& name = a[i].key();
    if (name.starts_with("layer") && name.ends_with(".bn3.weight")) {
      EXPECT_EQ(b[i].value().count_nonzero().item<int64_t>(), 0) << name;
      ++zeroed_count;
    } else {
      EXPECT_TRUE(at::equal(a[i].value(), b[i].value())) << name;
    }
  }
  EXPECT_EQ(zeroed_count, 3 + 4 + 6 + 3);

  const ResNet basic = make_resnet({.arch = "resnet18", .zero_init_residual = true});
  EXPECT_EQ(basic->named_parameters()["layer3.1.bn2.weight"].count_nonzero().item<int64_t>(), 0);
  EXPECT_GT(basic->named_parameters()["layer3.1.bn1.weight"].count_nonzero().item<int64_t>(), 0);
}

TEST(ResNet, AnyInputSizeFromThirtyTwoUpGivesOneRowOfLogitsPerImage) {
  ResNet model = make_resnet({.arch = "resnet18", .num_classes = 7});
  model->eval();
  const c10::NoGradGuard no_grad;
  for (const auto& [h, w] :
       std::vector<std::pair<int64_t, int64_t>>{{32, 32}, {33, 47}, {97, 64}}) {
    const auto y = model->forward(at::randn({3, 3, h, w}));
    EXPECT_EQ(y.sizes(), (std::vector<int64_t>{3, 7})) << h << "x" << w;
    EXPECT_TRUE(y.isfinite().all().item<bool>()) << h << "x" << w;
  }
}

TEST(ResNet, InputWithoutThreeChannelsThrows) {
  ResNet model = make_resnet({.arch = "resnet18", .num_classes = 2});
  EXPECT_THROW(model->forward(at::randn({1, 1, 32, 32})), c10::Error);
  EXPECT_THROW(model->forward(at::randn({3, 32, 32})), c10::Error);
}

TEST(ResNet, TrainStepGivesEveryParameterAGradientAndCountsTheBatch) {
  ResNet model = make_resnet({.arch = "resnet18", .num_classes = 5});
  model->train();
  const auto y = model->forward(at::randn({4, 3, 32, 32}));
  at::cross_entropy_loss(y, at::tensor(std::vector<int64_t>{0, 1, 2, 3})).backward();
  for (const auto& p : model->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_TRUE(p.value().grad().isfinite().all().item<bool>()) << p.key();
  }
  EXPECT_EQ(model->bn1->num_batches_tracked.item<int64_t>(), 1);
  EXPECT_EQ(model->named_buffers()["layer4.0.downsample.1.num_batches_tracked"].item<int64_t>(), 1);
}
