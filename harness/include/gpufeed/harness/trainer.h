#pragma once
// Single-process training: a ResNet fed by a gpufeed Prefetcher, SGD with momentum and weight
// decay, cosine LR with linear warmup stepped per optimizer step, cross-entropy, top-1/top-5
// evaluation, a state_dict checkpoint at the end. Every epoch reports loss, top-1, images/s and
// the fraction of step time spent waiting for data.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "gpufeed/harness/resnet.h"

namespace gpufeed::harness {

/// What `gpufeed train` takes; defaults follow torchvision's ImageNet reference recipe where it
/// has one (SGD momentum 0.9, weight decay 1e-4, lr 0.1 per 256 images, cosine schedule).
struct TrainOptions {
  std::filesystem::path data;              ///< ImageFolder root of the training set
  std::optional<std::filesystem::path> val_data;  ///< ImageFolder root evaluated after each epoch
  std::string arch = "resnet18";           ///< any of known_resnet_archs()
  int64_t epochs = 1;
  int64_t batch_size = 64;                 ///< per step
  double lr = 0.1;                         ///< per 256 images; scaled by batch_size / 256
  double momentum = 0.9;
  double weight_decay = 1e-4;
  double warmup_epochs = 0;                ///< linear warmup from lr * 0.1, in epochs (fractions ok)
  int workers = 0;                         ///< loader threads; 0 = all hardware threads
  int image_size = 224;                    ///< train crop; eval resizes to size * 256/224, crops size
  std::string device = "cpu";              ///< "cpu" or "cuda:N"
  bool channels_last = false;              ///< model and inputs in channels_last
  uint64_t seed = 0;                       ///< model init, sampler order and augmentation
  int prefetch_depth = 3;                  ///< loader batch slots
  std::optional<std::filesystem::path> checkpoint;  ///< state_dict written here at the end
  int64_t max_steps_per_epoch = 0;         ///< stop an epoch early after this many steps (0 = all)
};

/// One epoch's report.
struct EpochStats {
  int64_t epoch = 0;            ///< 0-based
  int64_t steps = 0;
  int64_t samples = 0;
  double loss = 0;              ///< mean training cross-entropy over the epoch
  double top1 = 0;              ///< training top-1 accuracy (augmented inputs), fraction
  double seconds = 0;           ///< wall time of the epoch's training steps
  double images_per_s = 0;      ///< samples / seconds
  double data_wait_fraction = 0;  ///< time blocked in Prefetcher::next() / seconds
  double lr = 0;                ///< learning rate at the epoch's last step
  std::optional<double> val_loss, val_top1, val_top5;  ///< when val_data is set
};

/// Evaluation result on a dataset (eval transform, model in eval mode).
struct EvalStats {
  int64_t samples = 0;
  double loss = 0;
  double top1 = 0;  ///< fraction
  double top5 = 0;  ///< fraction (equals 1 when there are <= 5 classes)
};

/// Trains one model. Not thread-safe.
class Trainer {
 public:
  /// Builds the dataset(s), loader, prefetcher and model. Throws std::runtime_error for a
  /// missing dataset folder or an unusable device, std::invalid_argument for bad options.
  explicit Trainer(TrainOptions options);
  ~Trainer();

  /// Runs options.epochs epochs, calling on_epoch after each (and after its evaluation), then
  /// writes the checkpoint if one was asked for. Returns every epoch's stats.
  std::vector<EpochStats> fit(const std::function<void(const EpochStats&)>& on_epoch = {});

  /// Top-1/top-5 of the current model on `root` (an ImageFolder with the training set's classes).
  EvalStats evaluate(const std::filesystem::path& root);

  /// The model being trained.
  ResNet& model();
  /// Learning rate after batch scaling: lr * batch_size / 256.
  double scaled_lr() const;
  /// Number of classes found in the training folder.
  int64_t num_classes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpufeed::harness
