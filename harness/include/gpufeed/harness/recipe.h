#pragma once
// Pieces of the published ImageNet training recipes -- torchvision's classification references
// (references/classification/train.py and utils.py, the recipe behind the V2 weights) and FFCV's
// ResNet recipe -- as functions the Trainer uses and an own training loop can call. Each one
// names the reference whose semantics it has; tests/test_recipe.cpp compares it with the venv's
// PyTorch/torchvision (tests/goldens/gen_recipe.py).

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpufeed/harness/checkpoint.h"
#include "gpufeed/harness/schedule_options.h"

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

/// The MixUp or CutMix of one batch (torchvision.transforms.v2.MixUp / CutMix parameters).
struct MixParams {
  enum class Kind { kMixUp, kCutMix };
  Kind kind = Kind::kMixUp;
  /// The weight of each sample's own image and label: MixUp's Beta(alpha, alpha) draw, or
  /// CutMix's 1 - box area / image area (torchvision's lam_adjusted).
  double lam = 1;
  /// CutMix: the pasted box, pixels: columns [x1, x2), rows [y1, y2).
  int64_t x1 = 0, y1 = 0, x2 = 0, y2 = 0;
};

/// CutMix's box for a draw lam ~ Beta(alpha, alpha) and a centre column r_x in [0, width), row
/// r_y in [0, height), with torchvision.transforms.v2.CutMix.make_params' arithmetic:
/// r = sqrt(1 - lam) / 2; half sizes int(r * width), int(r * height); the box clamped to the
/// image; lam = 1 - box area / (width * height).
MixParams cutmix_params(double lam, int64_t r_x, int64_t r_y, int64_t height, int64_t width);

/// Mixes a batch as torchvision.transforms.v2.MixUp / CutMix transform it, each sample i with
/// sample i - 1 (the batch rolled by one; sample 0 with the last): MixUp
/// images = lam * images + (1 - lam) * rolled; CutMix pastes the rolled batch's box. `images`
/// [N, C, H, W] (floating, any device and memory format) is replaced; `labels` [N] int64 class
/// indices become soft targets [N, num_classes] float32, lam * one_hot + (1 - lam) * rolled
/// one_hot. Throws std::invalid_argument for labels that are not [N] class indices.
void mix_batch(const MixParams& params, at::Tensor& images, at::Tensor& labels, int64_t num_classes);

/// MixUp and CutMix as the references use them (--mixup-alpha, --cutmix-alpha; train.py's
/// get_mixup_cutmix): each alpha > 0 turns its transform on; with both on, one of the two per
/// batch with equal probability (v2.RandomChoice). The soft targets then go through the same
/// label-smoothing cross-entropy (cross_entropy above).
struct MixUpCutMixOptions {
  double mixup_alpha = 0;   ///< > 0: MixUp with lam ~ Beta(mixup_alpha, mixup_alpha)
  double cutmix_alpha = 0;  ///< > 0: CutMix with lam ~ Beta(cutmix_alpha, cutmix_alpha)
  int64_t num_classes = 0;  ///< width of the soft targets; >= 1
};

class MixUpCutMix {
 public:
  /// Throws std::invalid_argument when both alphas are 0, one is negative or not finite, or
  /// num_classes < 1.
  explicit MixUpCutMix(MixUpCutMixOptions options);
  /// The parameters for one batch of height x width images, drawn from a CPU generator seeded
  /// `key`, in torchvision's order: the choice (torch.multinomial over [0.5, 0.5], only when both
  /// are on), lam (Beta through torch._sample_dirichlet, float32), then CutMix's centre column
  /// and row (torch.randint(width), torch.randint(height)). A pure function of its arguments.
  MixParams draw(uint64_t key, int64_t height, int64_t width) const;
  /// draw(key, H, W), then mix_batch.
  void operator()(at::Tensor& images, at::Tensor& labels, uint64_t key) const;
  const MixUpCutMixOptions& options() const { return options_; }

 private:
  MixUpCutMixOptions options_;
};

/// The key of micro-batch `batch` (0-based within the epoch) of `epoch` on `rank` for
/// MixUpCutMix::draw: a hash of the four, so the mixing is deterministic per (seed, epoch, step)
/// and differs between ranks, whatever the thread count or a resume.
uint64_t mix_key(uint64_t seed, int64_t epoch, int64_t batch, int64_t rank);

/// The torchvision references' ExponentialMovingAverage (utils.py): a
/// torch.optim.swa_utils.AveragedModel with use_buffers=True and
/// avg_fn(avg, value) = decay * avg + (1 - decay) * value, over the parameters and the buffers
/// (BatchNorm's running statistics and num_batches_tracked). The averaged copy lives on its
/// own module; validate it like the model.
class ModelEma {
 public:
  /// `averaged`: a module with the structure (names and shapes) of the model it will average;
  /// its values are replaced by the first update. decay in [0, 1]. Throws std::invalid_argument.
  ModelEma(std::shared_ptr<torch::nn::Module> averaged, double decay);
  /// AveragedModel.update_parameters(model): while n_averaged() == 0 every parameter and buffer
  /// is copied; after, avg = decay * avg + (1 - decay) * value, in torch's arithmetic (an integer
  /// buffer is computed in float32 and truncated back, as torch's copy_ does). Then n_averaged
  /// grows by one. Matched by name; throws std::invalid_argument naming a missing one.
  void update(const torch::nn::Module& model);
  /// n_averaged.fill_(0): the references call it after each update during the warmup epochs,
  /// so the average keeps copying the model until the warmup ends.
  void reset() { n_averaged_ = 0; }
  int64_t n_averaged() const { return n_averaged_; }
  double decay() const { return decay_; }
  torch::nn::Module& module() { return *module_; }
  /// AveragedModel.state_dict()'s layout: "n_averaged" (int64 scalar), then "module.<name>" for
  /// every parameter and buffer of the average (detached, same device).
  StateDict state_dict() const;
  /// Restores what state_dict() wrote (strictly, as checkpoint.h's load_state_dict). Throws
  /// std::runtime_error naming `name` and the missing, unexpected or mis-shaped keys.
  void load_state_dict(const StateDict& state, const std::string& name);

 private:
  std::shared_ptr<torch::nn::Module> module_;
  double decay_;
  int64_t n_averaged_ = 0;
};

// FFCV's progressive resizing (ResolutionSchedule, get_resolution) lives in schedule_options.h.

/// The decay the references' train.py gives ExponentialMovingAverage for --model-ema-decay D
/// with an update every `ema_steps` steps: adjust = world_size * batch_size * ema_steps / epochs,
/// alpha = min(1, (1 - D) * adjust), decay = 1 - alpha (after pycls; keeps the average's span
/// independent of those settings).
double adjusted_ema_decay(double decay, int64_t world_size, int64_t batch_size, int64_t ema_steps, int64_t epochs);

}  // namespace gpufeed::harness
