#pragma once
// Pieces of the published ImageNet training recipes -- torchvision's classification references
// (references/classification/train.py and utils.py, the recipe behind the V2 weights) and FFCV's
// ResNet recipe -- as functions the Trainer uses and an own training loop can call. Each one
// names the reference whose semantics it has; tests/test_recipe.cpp compares it with the venv's
// PyTorch/torchvision (tests/goldens/gen_recipe.py).

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <optional>
#include <string>
#include <vector>

namespace gpufeed::harness {

/// One optimizer parameter group of weight_decay_groups().
struct WeightDecayGroup {
  std::string key;                ///< "other", "norm" or "bias" (the references' group keys)
  double weight_decay = 0;        ///< the group's SGD weight_decay
  std::vector<std::string> names; ///< the parameters' state_dict names, in group order
  std::vector<at::Tensor> params; ///< the parameters themselves, same order
};

/// The parameter groups of torchvision's references (utils.set_weight_decay with
/// custom_keys_weight_decay [("bias", bias_weight_decay)] when bias_weight_decay is set, as
/// train.py builds them from --weight-decay, --norm-weight-decay and --bias-weight-decay).
/// Modules are walked depth first, each module's own parameters before its children's, skipping
/// parameters that do not require grad. A parameter named "bias" (its name inside its module)
/// goes to "bias" when bias_weight_decay is set -- a norm layer's bias included, the key being
/// checked first; otherwise a parameter of a norm layer (BatchNorm1d/2d/3d, LayerNorm,
/// GroupNorm, InstanceNorm1d/2d/3d, LocalResponseNorm) goes to "norm" when norm_weight_decay is
/// set; everything else to "other" (weight_decay). Groups come in the order other, norm, bias;
/// empty ones are left out.
std::vector<WeightDecayGroup> weight_decay_groups(const torch::nn::Module& model, double weight_decay,
                                                  std::optional<double> norm_weight_decay,
                                                  std::optional<double> bias_weight_decay);

/// The mean cross-entropy of logits [N, C] against `target`: class indices [N] (int64) or class
/// probabilities [N, C] (floating: the soft targets of MixUp/CutMix), with label smoothing
/// epsilon in [0, 1): torch.nn.CrossEntropyLoss(label_smoothing=epsilon)(logits, target), which
/// for probabilities uses target * (1 - epsilon) + epsilon / C (the references pass MixUp/CutMix
/// targets through the same smoothing criterion). Computed in float32 whatever the logits' dtype.
at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& target, double label_smoothing);

/// Top-1 hits per sample (bool [N]): argmax of the logits equals the class index, or, for soft
/// targets [N, C], the target's argmax (the references' utils.accuracy with 2-D targets).
at::Tensor top1_hits(const at::Tensor& logits, const at::Tensor& target);

/// torch.nn.utils.clip_grad_norm_(params, max_norm) with norm_type 2: the 2-norm of all the
/// gradients together is computed; when it exceeds max_norm every gradient is multiplied by
/// max_norm / (norm + 1e-6) (torch's clamped coefficient). Parameters without a gradient are
/// ignored. Returns the norm before clipping (a device sync). Under fp16 call it on unscaled
/// gradients (the references unscale with GradScaler.unscale_ first; the Trainer does).
double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm);

}  // namespace gpufeed::harness
