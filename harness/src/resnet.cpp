#include "gpufeed/harness/resnet.h"

#include "gpufeed/harness/activation_checkpoint.h"

#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/nn/init.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace gpufeed::harness {
namespace {

namespace nn = torch::nn;

struct NamedSpec {
  const char* name;
  ResNetSpec spec;
};

// torchvision.models.resnet: resnet18 ... resnet152.
constexpr NamedSpec kSpecs[] = {
    {"resnet18", {ResNetBlock::kBasic, {2, 2, 2, 2}}},
    {"resnet34", {ResNetBlock::kBasic, {3, 4, 6, 3}}},
    {"resnet50", {ResNetBlock::kBottleneck, {3, 4, 6, 3}}},
    {"resnet101", {ResNetBlock::kBottleneck, {3, 4, 23, 3}}},
    {"resnet152", {ResNetBlock::kBottleneck, {3, 8, 36, 3}}},
};

// torchvision's conv3x3 / conv1x1 helpers (groups 1, dilation 1): never a bias, BN follows.
nn::Conv2d conv3x3(int64_t in, int64_t out, int64_t stride) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false));
}

nn::Conv2d conv1x1(int64_t in, int64_t out, int64_t stride) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, 1).stride(stride).bias(false));
}

nn::BatchNorm2d batch_norm(int64_t features) {
  // PyTorch's defaults (eps 1e-5, momentum 0.1, affine, tracking running stats), spelled out
  // because they are part of the torchvision contract.
  auto options = nn::BatchNormOptions(features).eps(1e-5).momentum(0.1);
  return nn::BatchNorm2d(options.affine(true).track_running_stats(true));
}

nn::ReLU relu_inplace() { return nn::ReLU(nn::ReLUOptions(/*inplace=*/true)); }

// A BatchNorm2d's forward, through the model's BatchNormForward when one is set.
at::Tensor norm(const BatchNormForward& f, nn::BatchNorm2dImpl& bn, const at::Tensor& x) {
  return f ? f(bn, x) : bn.forward(x);
}

// The shortcut: downsample = Sequential(conv1x1, BatchNorm2d), or the identity.
at::Tensor shortcut(const BatchNormForward& f, nn::Sequential& downsample, const at::Tensor& x) {
  if (!downsample) return x;
  return norm(f, *downsample->ptr(1)->as<nn::BatchNorm2dImpl>(), downsample->ptr(0)->as<nn::Conv2dImpl>()->forward(x));
}

template <typename Block>
nn::Sequential build_layer(int64_t& inplanes, int64_t planes, int64_t blocks, int64_t stride) {
  constexpr int64_t expansion = Block::Impl::kExpansion;
  // torchvision creates the shortcut before the block. (The reset_parameters draws this makes are
  // all overwritten by the init loop, so only their count matters for the random stream; the
  // order is kept anyway so that the two construction sequences read the same.)
  nn::Sequential downsample{nullptr};
  if (stride != 1 || inplanes != planes * expansion) {
    downsample = nn::Sequential(conv1x1(inplanes, planes * expansion, stride),
                                batch_norm(planes * expansion));
  }
  nn::Sequential layer;
  layer->push_back(Block(inplanes, planes, stride, std::move(downsample)));
  inplanes = planes * expansion;
  for (int64_t i = 1; i < blocks; ++i) {
    layer->push_back(Block(inplanes, planes, 1, nn::Sequential{nullptr}));
  }
  return layer;
}

}  // namespace

std::vector<std::string> known_resnet_archs() {
  std::vector<std::string> names;
  for (const auto& s : kSpecs) names.emplace_back(s.name);
  return names;
}

ResNetSpec resnet_spec(const std::string& arch) {
  for (const auto& s : kSpecs) {
    if (arch == s.name) return s.spec;
  }
  std::string known;
  for (const auto& s : kSpecs) known += (known.empty() ? "" : ", ") + std::string(s.name);
  throw std::invalid_argument("unknown ResNet arch '" + arch + "' (known: " + known + ")");
}

BasicBlockImpl::BasicBlockImpl(int64_t inplanes, int64_t planes, int64_t stride,
                               nn::Sequential downsample_) {
  // Registration order = torchvision's attribute order = named_parameters() order.
  conv1 = register_module("conv1", conv3x3(inplanes, planes, stride));
  bn1 = register_module("bn1", batch_norm(planes));
  relu = register_module("relu", relu_inplace());
  conv2 = register_module("conv2", conv3x3(planes, planes, 1));
  bn2 = register_module("bn2", batch_norm(planes));
  if (downsample_) downsample = register_module("downsample", std::move(downsample_));
}

torch::Tensor BasicBlockImpl::forward(const torch::Tensor& x) {
  auto out = relu(norm(norm_forward_, *bn1, conv1(x)));
  out = norm(norm_forward_, *bn2, conv2(out));
  out += shortcut(norm_forward_, downsample, x);
  return relu(out);
}

BottleneckImpl::BottleneckImpl(int64_t inplanes, int64_t planes, int64_t stride,
                               nn::Sequential downsample_) {
  const int64_t width = planes;  // groups 1, base width 64
  conv1 = register_module("conv1", conv1x1(inplanes, width, 1));
  bn1 = register_module("bn1", batch_norm(width));
  conv2 = register_module("conv2", conv3x3(width, width, stride));
  bn2 = register_module("bn2", batch_norm(width));
  conv3 = register_module("conv3", conv1x1(width, planes * kExpansion, 1));
  bn3 = register_module("bn3", batch_norm(planes * kExpansion));
  relu = register_module("relu", relu_inplace());
  if (downsample_) downsample = register_module("downsample", std::move(downsample_));
}

torch::Tensor BottleneckImpl::forward(const torch::Tensor& x) {
  auto out = relu(norm(norm_forward_, *bn1, conv1(x)));
  out = relu(norm(norm_forward_, *bn2, conv2(out)));
  out = norm(norm_forward_, *bn3, conv3(out));
  out += shortcut(norm_forward_, downsample, x);
  return relu(out);
}

ResNetImpl::ResNetImpl(const ResNetOptions& options)
    : options_(options), spec_(resnet_spec(options.arch)) {
  if (options.num_classes < 1) {
    throw std::invalid_argument("ResNet num_classes must be >= 1, got " +
                                std::to_string(options.num_classes));
  }
  conv1 = register_module(
      "conv1", nn::Conv2d(nn::Conv2dOptions(3, inplanes_, 7).stride(2).padding(3).bias(false)));
  bn1 = register_module("bn1", batch_norm(inplanes_));
  relu = register_module("relu", relu_inplace());
  maxpool = register_module("maxpool", nn::MaxPool2d(nn::MaxPool2dOptions(3).stride(2).padding(1)));
  layer1 = register_module("layer1", make_layer(64, spec_.layers[0], 1));
  layer2 = register_module("layer2", make_layer(128, spec_.layers[1], 2));
  layer3 = register_module("layer3", make_layer(256, spec_.layers[2], 2));
  layer4 = register_module("layer4", make_layer(512, spec_.layers[3], 2));
  avgpool = register_module("avgpool", nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions({1, 1})));
  fc = register_module("fc", nn::Linear(inplanes_, options.num_classes));

  // Same loop as torchvision, over modules in the same pre-order (registration order), so the
  // kaiming_normal_ draws land on the same convs: this order is what makes the weights equal
  // Python's under the same seed.
  const c10::NoGradGuard no_grad;
  for (const auto& m : modules(/*include_self=*/false)) {
    if (auto* conv = m->as<nn::Conv2d>()) {
      nn::init::kaiming_normal_(conv->weight, /*a=*/0, torch::kFanOut, torch::kReLU);
    } else if (auto* bn = m->as<nn::BatchNorm2d>()) {
      nn::init::ones_(bn->weight);
      nn::init::zeros_(bn->bias);
    }
  }
  if (options.zero_init_residual) {
    for (const auto& m : modules(/*include_self=*/false)) {
      if (auto* b = m->as<Bottleneck>()) {
        nn::init::zeros_(b->last_bn()->weight);
      } else if (auto* b = m->as<BasicBlock>()) {
        nn::init::zeros_(b->last_bn()->weight);
      }
    }
  }
}

nn::Sequential ResNetImpl::make_layer(int64_t planes, int64_t blocks, int64_t stride) {
  return spec_.block == ResNetBlock::kBasic
             ? build_layer<BasicBlock>(inplanes_, planes, blocks, stride)
             : build_layer<Bottleneck>(inplanes_, planes, blocks, stride);
}

torch::Tensor ResNetImpl::forward(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() == 4 && x.size(1) == 3, "ResNet expects input [N, 3, H, W], got ", x.sizes());
  auto y = maxpool(relu(norm(norm_forward_, *bn1, conv1(x))));
  for (nn::Sequential* stage : {&layer1, &layer2, &layer3, &layer4}) {
    nn::SequentialImpl& layer = **stage;
    if (checkpoint_stages_) {
      y = checkpoint_module(layer, [&layer](const at::Tensor& in) { return layer.forward(in); }, y);
    } else {
      y = layer.forward(y);
    }
  }
  return fc(avgpool(y).flatten(1));
}

void ResNetImpl::set_batch_norm_forward(const BatchNormForward& f) {
  norm_forward_ = f;
  for (const auto& m : modules(/*include_self=*/false)) {
    if (auto* b = m->as<BasicBlock>()) {
      b->set_batch_norm_forward(f);
    } else if (auto* b = m->as<Bottleneck>()) {
      b->set_batch_norm_forward(f);
    }
  }
}

ResNet make_resnet(const ResNetOptions& options) { return ResNet(options); }

void to_channels_last(nn::Module& module) {
  const c10::NoGradGuard no_grad;
  auto convert = [](torch::Tensor& t) {
    if (!t.defined() || t.dim() != 4) return;
    // set_data keeps the tensor's identity (optimizers, autograd) and swaps its storage.
    t.set_data(t.contiguous(c10::MemoryFormat::ChannelsLast));
    if (t.grad().defined()) t.mutable_grad() = t.grad().contiguous(c10::MemoryFormat::ChannelsLast);
  };
  for (auto& p : module.parameters(/*recurse=*/true)) convert(p);
  for (auto& b : module.buffers(/*recurse=*/true)) convert(b);
}

}  // namespace gpufeed::harness
