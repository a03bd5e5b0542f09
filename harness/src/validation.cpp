// Validation: evaluate() and the class check between the training and validation sets.
#include <ATen/ATen.h>
#include <torch/nn/functional/loss.h>
#include <torch/utils.h>

#include <stdexcept>

#include "trainer_impl.h"

namespace gpufeed::harness {
namespace fs = std::filesystem;
namespace {

// Correct predictions among the top k logits, for k = 1 and 5, per sample (bool [N] each).
std::pair<at::Tensor, at::Tensor> topk_hits(const at::Tensor& logits, const at::Tensor& labels) {
  const int64_t k = std::min<int64_t>(5, logits.size(1));
  const at::Tensor top = std::get<1>(logits.topk(k, 1));
  const at::Tensor hits = top.eq(labels.view({-1, 1}));
  return {hits.select(1, 0), hits.any(1)};
}

}  // namespace

void check_same_classes(const datasets::Dataset& val, const fs::path& val_root, const datasets::Dataset& train,
                        const fs::path& train_root) {
  const auto& a = train.classes();
  const auto& b = val.classes();
  if (a == b) return;
  const auto list = [](const std::vector<std::string>& c) {
    std::string s;
    for (size_t i = 0; i < c.size() && i < 8; ++i) s += (i ? ", " : "") + c[i];
    if (c.size() > 8) s += ", ... (" + std::to_string(c.size()) + " in all)";
    return s;
  };
  size_t k = 0;
  while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
  std::string first = "class " + std::to_string(k) + " is " +
                      (k < b.size() ? "'" + b[k] + "'" : "missing") + " in the validation set, " +
                      (k < a.size() ? "'" + a[k] + "'" : "missing") + " in the training set";
  throw std::invalid_argument("Trainer: the classes of the validation set " + val_root.string() + " [" +
                              list(b) + "] differ from the training set " + train_root.string() + " [" +
                              list(a) + "]: " + first);
}

EvalStats Trainer::evaluate(const fs::path& root, bool ema) {
  if (ema && !impl_->ema) throw std::invalid_argument("Trainer::evaluate: no moving average (TrainOptions::model_ema is off)");
  return impl_->evaluate(root, ema);
}

EvalStats Trainer::Impl::evaluate(const fs::path& root, bool use_ema) {
  Impl& m = *this;
  std::shared_ptr<datasets::Dataset> dataset = m.val_set;
  if (!dataset || root != *m.options.val_data) {
    dataset = datasets::open_dataset(root, m.options.index_cache);
    check_same_classes(*dataset, root, *m.train_set, m.options.data);
  }
  const int64_t n_total = dataset->size();
  sampler::DistributedSamplerOptions so;
  so.num_replicas = m.world;
  so.rank = m.rank;
  so.shuffle = false;
  auto sampler = std::make_shared<sampler::DistributedSampler>(n_total, so);
  auto loader = std::make_shared<loader::Loader>(dataset, sampler, m.loader_options(false),
                                                 prefetch::host_allocator_for(m.device));
  auto prefetcher = prefetch::make_prefetcher(loader, m.prefetch_options);
  (use_ema ? m.ema_model : m.model)->eval();
  torch::NoGradGuard no_grad;
  const auto opts = at::TensorOptions().device(m.device).dtype(at::kDouble);
  at::Tensor sums = at::zeros({4}, opts);  // loss, top1, top5, samples
  int64_t position = 0;                    // this rank's sample number in its shard
  prefetcher->start_epoch(0);
  while (auto batch = prefetcher->next()) {
    at::Tensor logits;
    {
      std::optional<AutocastGuard> autocast;
      if (m.amp()) autocast.emplace(m.device.type(), m.amp_dtype());
      const auto forward = [&](const at::Tensor& x) {
        return (use_ema ? m.ema_model->forward(x) : m.forward(x)).to(at::kFloat);
      };
      logits = forward(batch->images);
      // FFCV's lr_tta: the horizontal flip's logits too (averaged here, summed there).
      if (m.options.val_flip_average) logits = (logits + forward(batch->images.flip({3}))) / 2;
    }
    const int64_t n = batch->labels.size(0);
    // Sample i of this rank is position rank + i * world of the padded list: count real ones.
    std::vector<double> keep(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) keep[static_cast<size_t>(i)] = m.rank + (position + i) * m.world < n_total ? 1.0 : 0.0;
    position += n;
    const at::Tensor mask = at::tensor(keep, at::TensorOptions().dtype(at::kDouble)).to(m.device);
    const at::Tensor losses = torch::nn::functional::cross_entropy(
        logits, batch->labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
    auto [h1, h5] = topk_hits(logits, batch->labels);
    sums += at::stack({(losses.to(at::kDouble) * mask).sum(), (h1.to(at::kDouble) * mask).sum(),
                       (h5.to(at::kDouble) * mask).sum(), mask.sum()});
  }
  if (m.group) {
    std::vector<at::Tensor> t{sums};
    m.group->all_reduce_sum(t);
  }
  const at::Tensor s = sums.cpu();
  EvalStats ev;
  ev.samples = static_cast<int64_t>(s[3].item<double>());
  if (ev.samples > 0) {
    const double k = static_cast<double>(ev.samples);
    ev.loss = s[0].item<double>() / k;
    ev.top1 = s[1].item<double>() / k;
    ev.top5 = s[2].item<double>() / k;
  }
  return ev;
}

}  // namespace gpufeed::harness
