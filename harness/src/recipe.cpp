// Recipe pieces from torchvision's references and FFCV (see gpufeed/harness/recipe.h).
#include "gpufeed/harness/recipe.h"

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/instancenorm.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/utils/clip_grad.h>

#include <stdexcept>

namespace gpufeed::harness {
namespace {

// The references' default norm_classes: _BatchNorm, LayerNorm, GroupNorm, _InstanceNorm,
// LocalResponseNorm.
bool is_norm_layer(const torch::nn::Module& m) {
  return dynamic_cast<const torch::nn::BatchNorm1dImpl*>(&m) || dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&m) ||
         dynamic_cast<const torch::nn::BatchNorm3dImpl*>(&m) || dynamic_cast<const torch::nn::LayerNormImpl*>(&m) ||
         dynamic_cast<const torch::nn::GroupNormImpl*>(&m) || dynamic_cast<const torch::nn::InstanceNorm1dImpl*>(&m) ||
         dynamic_cast<const torch::nn::InstanceNorm2dImpl*>(&m) ||
         dynamic_cast<const torch::nn::InstanceNorm3dImpl*>(&m) ||
         dynamic_cast<const torch::nn::LocalResponseNormImpl*>(&m);
}

struct GroupWalk {
  GroupWalk(double wd, std::optional<double> norm_weight_decay, std::optional<double> bias_weight_decay)
      : norm_wd(norm_weight_decay), bias_wd(bias_weight_decay) {
    other.weight_decay = wd;
    norm.weight_decay = norm_wd.value_or(0);
    bias.weight_decay = bias_wd.value_or(0);
  }
  std::optional<double> norm_wd, bias_wd;
  WeightDecayGroup other{"other", 0, {}, {}}, norm{"norm", 0, {}, {}}, bias{"bias", 0, {}, {}};

  void add(const torch::nn::Module& m, const std::string& prefix) {
    const bool norm_layer = is_norm_layer(m);
    for (const auto& p : m.named_parameters(/*recurse=*/false)) {
      if (!p.value().requires_grad()) continue;
      WeightDecayGroup& g = bias_wd && p.key() == "bias" ? bias : norm_wd && norm_layer ? norm : other;
      g.names.push_back(prefix.empty() ? p.key() : prefix + "." + p.key());
      g.params.push_back(p.value());
    }
    for (const auto& c : m.named_children()) add(*c.value(), prefix.empty() ? c.key() : prefix + "." + c.key());
  }
};

}  // namespace

std::vector<WeightDecayGroup> weight_decay_groups(const torch::nn::Module& model, double weight_decay,
                                                  std::optional<double> norm_weight_decay,
                                                  std::optional<double> bias_weight_decay) {
  GroupWalk w(weight_decay, norm_weight_decay, bias_weight_decay);
  w.add(model, "");
  std::vector<WeightDecayGroup> groups;
  for (WeightDecayGroup* g : {&w.other, &w.norm, &w.bias}) {
    if (!g->params.empty()) groups.push_back(std::move(*g));
  }
  return groups;
}

at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& target, double label_smoothing) {
  if (target.dim() == 2 && !target.is_floating_point()) {
    throw std::invalid_argument("cross_entropy: [N, C] targets must be probabilities (floating), got " +
                                std::string(c10::toString(target.scalar_type())));
  }
  return torch::nn::functional::cross_entropy(
      logits.to(at::kFloat), target.dim() == 2 ? target.to(at::kFloat) : target,
      torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(label_smoothing));
}

at::Tensor top1_hits(const at::Tensor& logits, const at::Tensor& target) {
  const at::Tensor classes = target.dim() == 2 ? target.argmax(1) : target;
  return logits.argmax(1).eq(classes);
}

double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm) {
  return torch::nn::utils::clip_grad_norm_(params, max_norm, /*norm_type=*/2.0);
}

}  // namespace gpufeed::harness
