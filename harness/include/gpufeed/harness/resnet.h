#pragma once
// ResNet-18/34/50/101/152 as torchvision.models.resnet* builds them (torchvision 0.26), so that a
// state_dict moves between Python and C++ by name alone.
//
// Matches torchvision exactly in:
//  - architecture: "ResNet v1.5" — the stride-2 of a Bottleneck sits on its 3x3 conv (conv2), not
//    its first 1x1; the shortcut is downsample = Sequential(conv1x1(stride), BatchNorm2d) whenever
//    the stride or the width changes; stem conv 7x7/2 + BN + ReLU + maxpool 3x3/2; adaptive average
//    pool to 1x1; flatten; fc. Convs have no bias; BatchNorm2d uses eps 1e-5, momentum 0.1.
//  - names and order of named_parameters(), named_buffers() and named_modules(): conv1.weight,
//    bn1.{weight,bias,running_mean,running_var,num_batches_tracked}, layer1.0.conv1.weight, ...,
//    layer2.0.downsample.0.weight, layer2.0.downsample.1.running_mean, ..., fc.weight, fc.bias.
//  - initialisation, including its random stream: after torch::manual_seed(s), the conv and fc
//    weights equal those of torchvision.models.resnetXX() after torch.manual_seed(s) on the CPU,
//    bit for bit (same draws, in the same module order, from the same ATen kernels). Convs:
//    kaiming_normal_ (mode fan_out, nonlinearity relu); BatchNorm: weight 1, bias 0; Linear:
//    PyTorch's default (kaiming_uniform_ a=sqrt(5), bias U(-1/sqrt(fan_in), 1/sqrt(fan_in))).
//
// tests/test_resnet.cpp checks all three against the venv's torchvision
// (tests/goldens/gen_resnet.py).
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>
#include <torch/nn/pimpl.h>

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace gpufeed::harness {

/// How to build a ResNet; passed whole to make_resnet() or ResNet's constructor.
struct ResNetOptions {
  /// One of known_resnet_archs(): "resnet18", "resnet34", "resnet50", "resnet101", "resnet152".
  std::string arch = "resnet18";
  /// Width of fc and of the logits; torchvision's default (ImageNet-1k). Must be >= 1.
  int64_t num_classes = 1000;
  /// Start every residual branch's last BatchNorm (bn2 of a BasicBlock, bn3 of a Bottleneck) at
  /// weight 0, so each block begins as the identity (torchvision's `zero_init_residual`;
  /// Goyal et al. 2017). Changes no random draw: the weights are the same either way otherwise.
  bool zero_init_residual = false;
};

/// How a ResNet's BatchNorm2d layers compute their output in forward: given the layer and its
/// input [N, C, H, W], the normalised output (same shape, dtype and memory format). Empty: the
/// layer's own forward (torch::nn::BatchNorm2d). The layers stay BatchNorm2d modules either way, so
/// names, parameters, buffers and state_dict keys do not change; sync_batch_norm.h's
/// convert_sync_batchnorm installs SyncBatchNorm this way (torch swaps the module class instead,
/// which C++ modules' fixed member types do not allow).
using BatchNormForward =
    std::function<at::Tensor(torch::nn::BatchNorm2dImpl& bn, const at::Tensor& x)>;

/// The residual block family of an architecture.
enum class ResNetBlock {
  kBasic,       ///< Two 3x3 convs (expansion 1): resnet18, resnet34.
  kBottleneck,  ///< 1x1, 3x3 (strided), 1x1 convs (expansion 4): resnet50, 101, 152.
};

/// Block family and blocks per stage (layer1..layer4) of a torchvision ResNet.
struct ResNetSpec {
  /// Which block every stage is made of.
  ResNetBlock block = ResNetBlock::kBasic;
  /// Number of blocks in layer1, layer2, layer3, layer4, e.g. {3, 4, 6, 3} for resnet50.
  std::array<int64_t, 4> layers{};
};

/// The architecture names make_resnet() accepts, in increasing depth.
std::vector<std::string> known_resnet_archs();

/// The spec of `arch` (see known_resnet_archs()), as in torchvision.models.resnet.
/// Throws std::invalid_argument naming `arch` and listing the known names when it is unknown.
ResNetSpec resnet_spec(const std::string& arch);

/// torchvision.models.resnet.BasicBlock: conv1 (3x3, stride) - bn1 - relu - conv2 (3x3) - bn2,
/// plus the shortcut (identity, or `downsample` when given), then relu.
/// Submodules, in this order: conv1, bn1, relu, conv2, bn2[, downsample].
class BasicBlockImpl : public torch::nn::Module {
 public:
  /// Output width is `planes` (expansion 1).
  static constexpr int64_t kExpansion = 1;

  /// `inplanes` input channels, `planes` output channels, `stride` of conv1 (1 or 2).
  /// `downsample`: the shortcut projection, or an empty holder (nullptr) for the identity; it is
  /// registered last, as torchvision's attribute order has it.
  BasicBlockImpl(int64_t inplanes, int64_t planes, int64_t stride,
                 torch::nn::Sequential downsample);

  /// [N, inplanes, H, W] -> [N, planes, ceil(H/stride), ceil(W/stride)]; keeps the input's
  /// memory format (contiguous or channels_last).
  torch::Tensor forward(const torch::Tensor& x);

  /// The residual branch's last norm: the one zero_init_residual zeroes.
  torch::nn::BatchNorm2d& last_bn() { return bn2; }

  /// Routes bn1, bn2 and the shortcut's BatchNorm through `f` (BatchNormForward; empty: their own).
  void set_batch_norm_forward(BatchNormForward f) { norm_forward_ = std::move(f); }

  torch::nn::Conv2d conv1{nullptr};           ///< 3x3, stride, no bias.
  torch::nn::BatchNorm2d bn1{nullptr};        ///< After conv1.
  torch::nn::ReLU relu{nullptr};              ///< In place; shared by both activations.
  torch::nn::Conv2d conv2{nullptr};           ///< 3x3, stride 1, no bias.
  torch::nn::BatchNorm2d bn2{nullptr};        ///< After conv2.
  torch::nn::Sequential downsample{nullptr};  ///< Shortcut projection, or empty.

 private:
  BatchNormForward norm_forward_;
};
TORCH_MODULE(BasicBlock);

/// torchvision.models.resnet.Bottleneck (v1.5): conv1 (1x1) - bn1 - relu - conv2 (3x3, stride) -
/// bn2 - relu - conv3 (1x1, 4x wider) - bn3, plus the shortcut, then relu.
/// Submodules, in this order: conv1, bn1, conv2, bn2, conv3, bn3, relu[, downsample].
class BottleneckImpl : public torch::nn::Module {
 public:
  /// Output width is 4 * `planes`.
  static constexpr int64_t kExpansion = 4;

  /// `inplanes` input channels, inner width `planes`, output 4 * `planes`, `stride` of conv2.
  /// `downsample`: the shortcut projection, or an empty holder (nullptr) for the identity.
  BottleneckImpl(int64_t inplanes, int64_t planes, int64_t stride,
                 torch::nn::Sequential downsample);

  /// [N, inplanes, H, W] -> [N, 4*planes, ceil(H/stride), ceil(W/stride)]; keeps the input's
  /// memory format.
  torch::Tensor forward(const torch::Tensor& x);

  /// The residual branch's last norm: the one zero_init_residual zeroes.
  torch::nn::BatchNorm2d& last_bn() { return bn3; }

  /// Routes bn1..bn3 and the shortcut's BatchNorm through `f` (BatchNormForward; empty: their own).
  void set_batch_norm_forward(BatchNormForward f) { norm_forward_ = std::move(f); }

  torch::nn::Conv2d conv1{nullptr};           ///< 1x1 reduce, no bias.
  torch::nn::BatchNorm2d bn1{nullptr};        ///< After conv1.
  torch::nn::Conv2d conv2{nullptr};           ///< 3x3, stride, no bias.
  torch::nn::BatchNorm2d bn2{nullptr};        ///< After conv2.
  torch::nn::Conv2d conv3{nullptr};           ///< 1x1 expand (x4), no bias.
  torch::nn::BatchNorm2d bn3{nullptr};        ///< After conv3.
  torch::nn::ReLU relu{nullptr};              ///< In place; shared by all three activations.
  torch::nn::Sequential downsample{nullptr};  ///< Shortcut projection, or empty.

 private:
  BatchNormForward norm_forward_;
};
TORCH_MODULE(Bottleneck);

/// torchvision.models.resnet.ResNet. Submodules, in this order: conv1, bn1, relu, maxpool,
/// layer1, layer2, layer3, layer4 (Sequentials of blocks named "0", "1", ...), avgpool, fc.
class ResNetImpl : public torch::nn::Module {
 public:
  /// Builds and initialises the model on the CPU in float32 (move it with ->to(device, dtype)).
  /// Draws from the global CPU generator (torch::manual_seed) exactly as torchvision does.
  /// Throws std::invalid_argument for an unknown options.arch (naming it and the known ones) or
  /// num_classes < 1.
  explicit ResNetImpl(const ResNetOptions& options);

  /// Logits: x [N, 3, H, W] (the weights' floating dtype and device; contiguous or channels_last)
  /// -> [N, num_classes], pre-softmax. Any H, W >= 1 is accepted, as in torchvision (the pool is
  /// adaptive); from 32 up, layer4 still sees at least a 1x1 map of real pixels (stride 32 in all).
  /// Train mode normalises with batch statistics and updates the running ones, so it needs more
  /// than one value per channel at layer4 (N >= 2 when H, W <= 32: a 1x1 map there); eval mode uses
  /// the running ones.
  /// Throws c10::Error when x is not 4-D with 3 channels (or train mode lacks values, as above).
  torch::Tensor forward(const torch::Tensor& x);

  /// Routes every BatchNorm2d of the model (stem, blocks, shortcuts) through `f`
  /// (BatchNormForward; empty: back to their own forward). Parameters and buffers are untouched.
  void set_batch_norm_forward(const BatchNormForward& f);

  /// Activation checkpointing per stage (activation_checkpoint.h): while gradients are enabled,
  /// layer1..layer4 each keep only their input during forward and run their forward again in
  /// backward, trading one more forward of the four stages for their activations' memory (the
  /// stem, pool and fc keep theirs). Gradients and outputs equal those without it (the same ops
  /// on the same values); BatchNorm running statistics are updated once per forward, by the first
  /// pass (the recomputation normalises with the same batch statistics and its buffer updates are
  /// undone). Eval mode / no-grad forwards are unaffected. Off by default.
  void set_activation_checkpointing(bool on) { checkpoint_stages_ = on; }
  /// Whether set_activation_checkpointing(true) is in effect.
  bool activation_checkpointing() const { return checkpoint_stages_; }

  /// The options this model was built with.
  const ResNetOptions& options() const { return options_; }
  /// The spec of options().arch.
  const ResNetSpec& spec() const { return spec_; }

  torch::nn::Conv2d conv1{nullptr};       ///< Stem: 3 -> 64, 7x7, stride 2, padding 3, no bias.
  torch::nn::BatchNorm2d bn1{nullptr};    ///< After the stem conv.
  torch::nn::ReLU relu{nullptr};          ///< In place.
  torch::nn::MaxPool2d maxpool{nullptr};  ///< 3x3, stride 2, padding 1.
  torch::nn::Sequential layer1{nullptr};  ///< 64-wide blocks, stride 1.
  torch::nn::Sequential layer2{nullptr};  ///< 128-wide blocks, first with stride 2.
  torch::nn::Sequential layer3{nullptr};  ///< 256-wide blocks, first with stride 2.
  torch::nn::Sequential layer4{nullptr};  ///< 512-wide blocks, first with stride 2.
  torch::nn::AdaptiveAvgPool2d avgpool{nullptr};  ///< To 1x1.
  torch::nn::Linear fc{nullptr};                  ///< 512 * expansion -> num_classes.

 private:
  torch::nn::Sequential make_layer(int64_t planes, int64_t blocks, int64_t stride);

  ResNetOptions options_;
  ResNetSpec spec_;
  int64_t inplanes_ = 64;
  BatchNormForward norm_forward_;
  bool checkpoint_stages_ = false;
};
TORCH_MODULE(ResNet);

/// Builds options.arch (see ResNetImpl's constructor for what it draws, and its errors):
/// the C++ twin of torchvision.models.resnetXX(num_classes=..., zero_init_residual=...),
/// without pretrained weights.
ResNet make_resnet(const ResNetOptions& options);

/// Converts, in place, every 4-D parameter and buffer of `module` (recursively) to
/// channels_last, as Python's module.to(memory_format=torch.channels_last) does (gradients already
/// allocated too); others are left as they are. Values, names and autograd identity are kept:
/// an optimizer built before still holds the same parameters. Use with channels_last inputs.
void to_channels_last(torch::nn::Module& module);

}  // namespace gpufeed::harness
