#include "gpufeed/harness/trainer.h"

#include <ATen/ATen.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <chrono>
#include <stdexcept>

#include "gpufeed/harness/checkpoint.h"
#include "gpufeed/harness/lr_schedule.h"
#include "gpufeed/log_text.h"
#include "gpufeed/prefetch/prefetcher.h"

namespace gpufeed::harness {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Correct predictions among the top k logits, for k = 1 and 5.
std::pair<int64_t, int64_t> topk_correct(const at::Tensor& logits, const at::Tensor& labels) {
  const int64_t k = std::min<int64_t>(5, logits.size(1));
  const at::Tensor top = std::get<1>(logits.topk(k, 1));
  const at::Tensor hits = top.eq(labels.view({-1, 1}));
  const int64_t top1 = hits.narrow(1, 0, 1).sum().item<int64_t>();
  const int64_t top5 = hits.any(1).sum().item<int64_t>();
  return {top1, top5};
}

}  // namespace

struct Trainer::Impl {
  TrainOptions options;
  c10::Device device{c10::kCPU};
  std::shared_ptr<loader::ImageFolder> train_set;
  std::shared_ptr<loader::Loader> train_loader;
  std::unique_ptr<prefetch::Prefetcher> prefetcher;
  ResNet model{nullptr};
  std::unique_ptr<torch::optim::SGD> optimizer;
  prefetch::PrefetchOptions prefetch_options;

  loader::LoaderOptions loader_options(bool train) const {
    loader::LoaderOptions lo;
    lo.batch_size = options.batch_size;
    lo.num_workers = options.workers;
    lo.prefetch_depth = options.prefetch_depth;
    lo.seed = options.seed;
    lo.drop_last = false;
    if (train) {
      lo.transform.kind = loader::TransformOptions::Kind::kTrain;
      lo.transform.rrc.size = options.image_size;
    } else {
      lo.transform.kind = loader::TransformOptions::Kind::kEval;
      lo.transform.eval.crop = options.image_size;
      lo.transform.eval.resize = static_cast<int>(std::lround(options.image_size * 256.0 / 224.0));
    }
    return lo;
  }
};

Trainer::Trainer(TrainOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.options = std::move(options);
  const TrainOptions& o = m.options;
  if (o.epochs < 1 || o.batch_size < 1 || o.image_size < 8) {
    throw std::invalid_argument("Trainer: epochs and batch_size must be >= 1, image_size >= 8");
  }
  m.device = c10::Device(o.device);
  m.train_set = std::make_shared<loader::ImageFolder>(o.data);

  sampler::DistributedSamplerOptions so;  // one replica: shuffled, seeded seed + epoch
  so.seed = o.seed;
  auto sampler = std::make_shared<sampler::DistributedSampler>(m.train_set->size(), so);
  m.train_loader = std::make_shared<loader::Loader>(m.train_set, sampler, m.loader_options(true),
                                                    prefetch::host_allocator_for(m.device));
  m.prefetch_options.device = m.device;
  m.prefetch_options.channels_last = o.channels_last;
  m.prefetcher = prefetch::make_prefetcher(m.train_loader, m.prefetch_options);

  torch::manual_seed(o.seed);
  ResNetOptions ro;
  ro.arch = o.arch;
  ro.num_classes = static_cast<int64_t>(m.train_set->classes().size());
  m.model = make_resnet(ro);
  m.model->to(m.device);
  if (o.channels_last) to_channels_last(*m.model);
  m.optimizer = std::make_unique<torch::optim::SGD>(
      m.model->parameters(),
      torch::optim::SGDOptions(scaled_lr()).momentum(o.momentum).weight_decay(o.weight_decay));
  gpufeed::log_text(LogLevel::kInfo,
                    c10::str("train: ", o.arch, " on ", m.device.str(), " (", m.train_set->size(),
                             " images, ", ro.num_classes, " classes), lr ", o.lr, " per 256 -> ",
                             scaled_lr(), " at batch ", o.batch_size));
}

Trainer::~Trainer() = default;

ResNet& Trainer::model() { return impl_->model; }
double Trainer::scaled_lr() const {
  return impl_->options.lr * static_cast<double>(impl_->options.batch_size) / 256.0;
}
int64_t Trainer::num_classes() const {
  return static_cast<int64_t>(impl_->train_set->classes().size());
}

std::vector<EpochStats> Trainer::fit(const std::function<void(const EpochStats&)>& on_epoch) {
  Impl& m = *impl_;
  const TrainOptions& o = m.options;
  int64_t steps_per_epoch = m.train_loader->num_batches();
  if (o.max_steps_per_epoch > 0) steps_per_epoch = std::min(steps_per_epoch, o.max_steps_per_epoch);
  WarmupCosineSchedule schedule;
  schedule.base_lr = scaled_lr();
  schedule.warmup_steps = static_cast<int64_t>(std::lround(o.warmup_epochs * steps_per_epoch));
  schedule.total_steps = std::max<int64_t>(schedule.warmup_steps + 1, o.epochs * steps_per_epoch);

  std::vector<EpochStats> history;
  int64_t global_step = 0;
  for (int64_t epoch = 0; epoch < o.epochs; ++epoch) {
    m.model->train();
    m.prefetcher->start_epoch(epoch);
    EpochStats st;
    st.epoch = epoch;
    double loss_sum = 0, wait_s = 0;
    int64_t correct = 0;
    const auto t0 = Clock::now();
    while (st.steps < steps_per_epoch) {
      auto batch = m.prefetcher->next();
      if (!batch) break;
      wait_s += batch->wait_ms / 1000.0;
      st.lr = schedule.lr(global_step);
      for (auto& group : m.optimizer->param_groups()) {
        static_cast<torch::optim::SGDOptions&>(group.options()).lr(st.lr);
      }
      m.optimizer->zero_grad(/*set_to_none=*/true);
      const at::Tensor logits = m.model->forward(batch->images);
      const at::Tensor loss = torch::nn::functional::cross_entropy(logits, batch->labels);
      loss.backward();
      m.optimizer->step();
      const int64_t n = batch->labels.size(0);
      loss_sum += loss.item<double>() * static_cast<double>(n);
      correct += logits.argmax(1).eq(batch->labels).sum().item<int64_t>();
      st.samples += n;
      ++st.steps;
      ++global_step;
    }
    st.seconds = seconds_since(t0);
    st.loss = st.samples ? loss_sum / static_cast<double>(st.samples) : 0;
    st.top1 = st.samples ? static_cast<double>(correct) / static_cast<double>(st.samples) : 0;
    st.images_per_s = st.seconds > 0 ? static_cast<double>(st.samples) / st.seconds : 0;
    st.data_wait_fraction = st.seconds > 0 ? wait_s / st.seconds : 0;
    if (o.val_data) {
      const EvalStats ev = evaluate(*o.val_data);
      st.val_loss = ev.loss;
      st.val_top1 = ev.top1;
      st.val_top5 = ev.top5;
    }
    history.push_back(st);
    if (on_epoch) on_epoch(st);
  }
  if (o.checkpoint) {
    save_state_dict(*m.model, *o.checkpoint);
    gpufeed::log_text(LogLevel::kInfo, "train: wrote state_dict to " + o.checkpoint->string());
  }
  return history;
}

EvalStats Trainer::evaluate(const std::filesystem::path& root) {
  Impl& m = *impl_;
  auto dataset = std::make_shared<loader::ImageFolder>(root);
  if (dataset->classes() != m.train_set->classes()) {
    throw std::runtime_error("evaluate: classes of " + root.string() +
                             " differ from the training set's");
  }
  auto lo = m.loader_options(false);
  auto sampler = std::make_shared<sampler::SequentialSampler>(dataset->size());
  auto loader = std::make_shared<loader::Loader>(dataset, sampler, lo,
                                                 prefetch::host_allocator_for(m.device));
  auto prefetcher = prefetch::make_prefetcher(loader, m.prefetch_options);
  m.model->eval();
  torch::NoGradGuard no_grad;
  EvalStats ev;
  double loss_sum = 0;
  int64_t top1 = 0, top5 = 0;
  prefetcher->start_epoch(0);
  while (auto batch = prefetcher->next()) {
    const at::Tensor logits = m.model->forward(batch->images);
    loss_sum += torch::nn::functional::cross_entropy(logits, batch->labels).item<double>() *
                static_cast<double>(batch->labels.size(0));
    auto [c1, c5] = topk_correct(logits, batch->labels);
    top1 += c1;
    top5 += c5;
    ev.samples += batch->labels.size(0);
  }
  if (ev.samples > 0) {
    ev.loss = loss_sum / static_cast<double>(ev.samples);
    ev.top1 = static_cast<double>(top1) / static_cast<double>(ev.samples);
    ev.top5 = static_cast<double>(top5) / static_cast<double>(ev.samples);
  }
  return ev;
}

}  // namespace gpufeed::harness
