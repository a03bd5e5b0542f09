// Recipe pieces from torchvision's references and FFCV (see gpufeed/harness/recipe.h). Our own
// code where LibTorch has none: MixUp/CutMix (torchvision's are Python) and the EMA
// (torch.optim.swa_utils.AveragedModel is Python); both follow torch's arithmetic op for op.
#include "gpufeed/harness/recipe.h"

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/instancenorm.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/utils/clip_grad.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorIndexing.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
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

MixParams cutmix_params(double lam, int64_t r_x, int64_t r_y, int64_t height, int64_t width) {
  const double r = 0.5 * std::sqrt(1.0 - lam);
  const auto w_half = static_cast<int64_t>(r * static_cast<double>(width));   // int() truncates
  const auto h_half = static_cast<int64_t>(r * static_cast<double>(height));
  MixParams p;
  p.kind = MixParams::Kind::kCutMix;
  p.x1 = std::max<int64_t>(r_x - w_half, 0);
  p.y1 = std::max<int64_t>(r_y - h_half, 0);
  p.x2 = std::min<int64_t>(r_x + w_half, width);
  p.y2 = std::min<int64_t>(r_y + h_half, height);
  p.lam = 1.0 - static_cast<double>((p.x2 - p.x1) * (p.y2 - p.y1)) / static_cast<double>(width * height);
  return p;
}

void mix_batch(const MixParams& p, at::Tensor& images, at::Tensor& labels, int64_t num_classes) {
  if (labels.dim() != 1 || labels.scalar_type() != at::kLong || labels.size(0) != images.size(0)) {
    throw std::invalid_argument("mix_batch: labels must be [N] int64 class indices for the N images, got " +
                                c10::str(labels.sizes()) + " " + c10::toString(labels.scalar_type()));
  }
  torch::NoGradGuard no_grad;
  if (p.kind == MixParams::Kind::kMixUp) {
    images = images.roll(1, 0).mul_(1.0 - p.lam).add_(images.mul(p.lam));
  } else {
    const at::Tensor rolled = images.roll(1, 0);
    at::Tensor out = images.clone();
    using at::indexing::Slice;
    out.index_put_({"...", Slice(p.y1, p.y2), Slice(p.x1, p.x2)}, rolled.index({"...", Slice(p.y1, p.y2), Slice(p.x1, p.x2)}));
    images = out;
  }
  const at::Tensor one_hot = at::one_hot(labels, num_classes).to(at::kFloat);
  labels = one_hot.roll(1, 0).mul_(1.0 - p.lam).add_(one_hot.mul(p.lam));
}

MixUpCutMix::MixUpCutMix(MixUpCutMixOptions options) : options_(options) {
  const auto& o = options_;
  if (!std::isfinite(o.mixup_alpha) || !std::isfinite(o.cutmix_alpha) || o.mixup_alpha < 0 || o.cutmix_alpha < 0 ||
      (o.mixup_alpha == 0 && o.cutmix_alpha == 0)) {
    throw std::invalid_argument("MixUpCutMix: mixup_alpha and cutmix_alpha must be finite and >= 0, one of them > 0; got " +
                                c10::str(o.mixup_alpha, " and ", o.cutmix_alpha));
  }
  if (o.num_classes < 1) throw std::invalid_argument("MixUpCutMix: num_classes must be >= 1");
}

MixParams MixUpCutMix::draw(uint64_t key, int64_t height, int64_t width) const {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(key);
  const auto& o = options_;
  bool cutmix = o.mixup_alpha == 0;
  if (o.mixup_alpha > 0 && o.cutmix_alpha > 0) {  // v2.RandomChoice([MixUp, CutMix])
    cutmix = at::multinomial(at::tensor({0.5f, 0.5f}), 1, false, gen).item<int64_t>() == 1;
  }
  const double alpha = cutmix ? o.cutmix_alpha : o.mixup_alpha;
  // Beta(alpha, alpha) as torch.distributions.Beta samples it: a Dirichlet over (alpha, alpha),
  // first component, in float32.
  const double lam = at::_sample_dirichlet(at::full({1, 2}, alpha, at::kFloat), gen).select(-1, 0).item<double>();
  if (!cutmix) {
    MixParams p;
    p.lam = lam;
    return p;
  }
  const int64_t r_x = at::randint(width, {1}, gen, at::kLong).item<int64_t>();
  const int64_t r_y = at::randint(height, {1}, gen, at::kLong).item<int64_t>();
  return cutmix_params(lam, r_x, r_y, height, width);
}

void MixUpCutMix::operator()(at::Tensor& images, at::Tensor& labels, uint64_t key) const {
  mix_batch(draw(key, images.size(2), images.size(3)), images, labels, options_.num_classes);
}

uint64_t mix_key(uint64_t seed, int64_t epoch, int64_t batch, int64_t rank) {
  // splitmix64's finaliser over the four, one after another.
  uint64_t h = seed;
  for (const int64_t v : {epoch, batch, rank}) {
    h ^= static_cast<uint64_t>(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
    h ^= h >> 31;
  }
  return h;
}

ModelEma::ModelEma(std::shared_ptr<torch::nn::Module> averaged, double decay)
    : module_(std::move(averaged)), decay_(decay) {
  if (!module_) throw std::invalid_argument("ModelEma: the averaged module is null");
  if (!(decay >= 0 && decay <= 1)) throw std::invalid_argument("ModelEma: decay must be in [0, 1], got " + c10::str(decay));
}

void ModelEma::update(const torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  const auto params = model.named_parameters();
  const auto buffers = model.named_buffers();
  const bool copy = n_averaged_ == 0;
  const auto blend = [&](const std::string& name, at::Tensor& avg, const at::Tensor* value) {
    if (!value) throw std::invalid_argument("ModelEma: the model has no '" + name + "' to average");
    const at::Tensor v = value->detach().to(avg.device());
    if (copy) {
      avg.copy_(v);
    } else {
      avg.copy_(avg.mul(decay_).add(v.mul(1.0 - decay_)));  // decay * avg + (1 - decay) * value
    }
  };
  for (auto& p : module_->named_parameters()) blend(p.key(), p.value(), params.find(p.key()));
  for (auto& b : module_->named_buffers()) blend(b.key(), b.value(), buffers.find(b.key()));
  ++n_averaged_;
}

StateDict ModelEma::state_dict() const {
  StateDict out;
  out.insert("n_averaged", at::scalar_tensor(n_averaged_, at::kLong));
  for (const auto& kv : add_key_prefix(module_state_dict(*module_), "module.")) out.insert(kv.key(), kv.value());
  return out;
}

void ModelEma::load_state_dict(const StateDict& state, const std::string& name) {
  auto n = state.find("n_averaged");
  if (n == state.end()) throw std::runtime_error(name + ": the model average (EMA) has no 'n_averaged'");
  StateDict module_state;
  for (const auto& kv : state) {
    if (kv.key() != "n_averaged") module_state.insert(kv.key(), kv.value());
  }
  harness::load_state_dict(*module_, strip_key_prefix(module_state, "module."), name);
  n_averaged_ = n->value().item<int64_t>();
}

double adjusted_ema_decay(double decay, int64_t world_size, int64_t batch_size, int64_t ema_steps, int64_t epochs) {
  const double adjust = static_cast<double>(world_size * batch_size * ema_steps) / static_cast<double>(epochs);
  const double alpha = std::min(1.0, (1.0 - decay) * adjust);
  return 1.0 - alpha;
}

}  // namespace gpufeed::harness
