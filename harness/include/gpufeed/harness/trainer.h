#pragma once
// Training: a ResNet fed by a gpufeed Prefetcher on one device, several devices of one process
// (DataParallel) or one device per process (DistributedDataParallel, started by
// `gpufeed launch`, torchrun or srun); SGD (momentum, optional Nesterov, separate weight decay
// for norm layers and biases), a per-step learning-rate schedule (lr_schedule.h) with the
// linear scaling rule, label smoothing, gradient clipping by norm, gradient accumulation, bf16/fp16 autocast with a
// GradScaler for fp16, channels_last, top-1/top-5 evaluation, and resumable training
// checkpoints. Every epoch reports loss, top-1, images/s and the fraction of step time spent
// waiting for data.
//
// A training checkpoint (TrainOptions::save_checkpoint) is one torch.save-format file that Python
// reads with torch.load(path, weights_only=True); its layout is documented in train_checkpoint.h.

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpufeed/harness/amp.h"
#include "gpufeed/harness/lr_schedule.h"
#include "gpufeed/profiler/profiler.h"
#include "gpufeed/harness/recipe.h"
#include "gpufeed/harness/resnet.h"
#include "gpufeed/harness/schedule_options.h"
#include "gpufeed/loader/loader.h"

namespace gpufeed::harness {

/// Arithmetic of the forward pass.
enum class Precision {
  kFloat32,   ///< "fp32": no autocast
  kBFloat16,  ///< "bf16": autocast to bfloat16 (CUDA; CPU where LibTorch supports it)
  kFloat16,   ///< "fp16": autocast to float16 with dynamic loss scaling (GradScaler)
};
/// Parses "fp32", "bf16" or "fp16"; throws std::invalid_argument otherwise.
Precision parse_precision(const std::string& name);
/// The name parse_precision accepts for `precision`.
std::string precision_name(Precision precision);

/// Whether to join a distributed run (torchrun's RANK/WORLD_SIZE or Slurm's SLURM_PROCID/NTASKS).
enum class DistributedMode {
  kAuto,  ///< "auto": when torchrun's environment is set, or Slurm's with more than one task
  kOn,    ///< "on": always (an error without an environment)
  kOff,   ///< "off": never
};
/// Parses "auto", "on" or "off"; throws std::invalid_argument naming the value otherwise.
DistributedMode parse_distributed_mode(const std::string& name);

/// The collective backend of a distributed run.
enum class DistBackend {
  kAuto,  ///< "auto": NCCL on CUDA, else Gloo
  kNccl,  ///< "nccl"
  kGloo,  ///< "gloo"
};
/// Parses "auto", "nccl" or "gloo"; throws std::invalid_argument naming the value otherwise.
DistBackend parse_dist_backend(const std::string& name);
/// The name parse_dist_backend accepts for `backend` (ProcessGroupOptions::backend's spelling).
std::string dist_backend_name(DistBackend backend);

/// The file that a path option names for rank `rank` of a run, for the options with which every
/// rank may write its own file (TrainOptions::checkpoint, `gpufeed train --log-samples`). With
/// "{rank}" in the path, its first "{rank}" is replaced by the rank's number ("final-{rank}.pt"
/// is "final-3.pt" on rank 3): every rank gets a file. Without "{rank}", the path names one file,
/// which rank 0 alone writes: `path` itself on rank 0, std::nullopt on every other rank.
std::optional<std::filesystem::path> path_for_rank(const std::filesystem::path& path, int rank);

/// LoaderOptions as TrainOptions starts them: LoaderOptions' defaults, but 64 samples per
/// process and micro-batch (`gpufeed train --batch-size`'s default).
inline loader::LoaderOptions default_train_loader_options() {
  loader::LoaderOptions o;
  o.batch_size = 64;
  return o;
}

/// What `gpufeed train` takes; defaults follow torchvision's ImageNet reference recipe where it
/// has one (SGD momentum 0.9, weight decay 1e-4, lr 0.1 per 256 images, cosine schedule).
struct TrainOptions {
  // --- data ---
  std::filesystem::path data;                     ///< training set: ImageFolder, flat folder or file list
  std::optional<std::filesystem::path> val_data;  ///< evaluated after each epoch (same classes)
  /// The loader's options (gpufeed/loader/loader.h; `gpufeed train`'s loader flags, docs/OPTIONS.md):
  /// batch_size per process and micro-batch (64 by default here), num_workers (0 = the CPU
  /// budget), prefetch_depth, seed (also the model's initialisation and the sampler's order),
  /// drop_last (training only: each rank's last, shorter batch; also turned on, with a warning,
  /// when that batch would hold a single sample while BatchNorm trains: PyTorch cannot train
  /// BatchNorm on one sample), error_policy and max_skips (training and validation alike),
  /// decode.strict, and the train transform's crop side transform.rrc.size (the references'
  /// --train-crop-size, pixels: every epoch unless `resolution` is set; also the default
  /// validation crop) and per-sample augmentations transform.augment (augment.h). The trainer
  /// sets the transform's kind and max_image_size, and builds the validation transform itself.
  loader::LoaderOptions loader = default_train_loader_options();
  datasets::DataOptions index_cache;  ///< the datasets' index cache ("" the user's cache folder)
  /// Validation Resize (shorter side) and CenterCrop, pixels (the references' --val-resize-size,
  /// --val-crop-size). 0: val_crop_size = loader.transform.rrc.size, val_resize_size = round(crop x
  /// 256 / 224).
  int val_resize_size = 0;
  int val_crop_size = 0;
  /// Test-time flip averaging (FFCV's validation.lr_tta): validation logits are the mean of the
  /// model's logits on the image and on its horizontal flip (FFCV sums them: the same top-1 and
  /// top-5; the loss is that of the mean).
  bool val_flip_average = false;
  /// The repeated-augmentation sampler instead of DistributedSampler (the torchvision
  /// references' --ra-sampler; sampler/ra_sampler.h): each image ra_reps times per epoch, its
  /// copies on consecutive ranks, each rank's epoch floor(n // 256 * 256 / world) samples.
  bool ra_sampler = false;
  int64_t ra_reps = 3;              ///< --ra-reps: repetitions per image (the references' default 3)

  // --- model ---
  std::string arch = "resnet18";    ///< any of known_resnet_archs()
  bool zero_init_residual = false;  ///< torchvision's zero_init_residual
  /// BatchNorm layers stay in eval mode while training: they normalise with their running
  /// statistics and never update them (their weight and bias still train).
  bool freeze_bn = false;
  /// SyncBatchNorm (the torchvision references' --sync-bn; sync_batch_norm.h): in a distributed
  /// run every BatchNorm2d normalises with the batch statistics of all ranks' batches together
  /// (as one BatchNorm2d on their concatenation), running statistics included; state_dict keys
  /// are unchanged. One process: plain BatchNorm2d (a world of one). Not combinable with
  /// dp_devices or freeze_bn (std::invalid_argument at construction).
  bool sync_bn = false;
  /// Activation checkpointing of the ResNet's stages (layer1..layer4; ResNetImpl::
  /// set_activation_checkpointing, activation_checkpoint.h): their activations are recomputed in
  /// backward instead of kept, for about one more forward pass of compute. Gradients, losses and
  /// BatchNorm running statistics equal those without it; works with AMP, DDP and sync_bn.
  /// Not combinable with dp_devices (std::invalid_argument at construction).
  bool activation_checkpointing = false;
  bool channels_last = false;       ///< model and inputs in channels_last
  /// Load these weights (a state_dict file from Python or gpufeed, see checkpoint.h) after
  /// building the model, before training: fine-tuning.
  std::optional<std::filesystem::path> init_weights;
  /// init_weights: keys left at their fresh initialisation (LoadStateDictOptions::exclude:
  /// "fc" for a new head on another class count).
  std::vector<std::string> init_weights_exclude;
  /// init_weights: keys whose shape differs from the model's keep their fresh initialisation,
  /// with a warning naming them (LoadStateDictOptions::skip_mismatched_shapes).
  bool init_weights_skip_mismatched = false;

  // --- optimisation ---
  int64_t epochs = 1;
  /// Micro-batches per optimizer step (gradient accumulation): the step's gradient is that of
  /// the accum_steps micro-batches together (losses weighted by their sample counts).
  int64_t accum_steps = 1;
  /// Learning rate per 256 images: the rate used is lr * global_batch / 256 (the linear scaling
  /// rule, Goyal et al. 2017), global_batch = batch_size * accum_steps * world size.
  double lr = 0.1;
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 1e-4;
  /// Weight decay of the norm layers' parameters (torchvision references' --norm-weight-decay;
  /// unset: weight_decay). Parameter groups as the references build them: recipe.h,
  /// weight_decay_groups.
  std::optional<double> norm_weight_decay;
  /// Weight decay of every parameter named "bias", norm layers' included (the references'
  /// --bias-weight-decay; unset: by the rules above). Separate from norm_weight_decay.
  std::optional<double> bias_weight_decay;
  /// Shorthand for norm_weight_decay = bias_weight_decay = 0 (each unless set explicitly).
  bool no_decay_norm_bias = false;
  /// torch.nn.CrossEntropyLoss's label_smoothing, [0, 1); applies to MixUp/CutMix's soft targets
  /// as well, as in the references (recipe.h, cross_entropy).
  double label_smoothing = 0.0;
  /// Clip the gradients' total 2-norm to this (torch.nn.utils.clip_grad_norm_, the references'
  /// --clip-grad-norm) on the complete, all-reduced and, under fp16, unscaled gradients of each
  /// optimizer step; 0 = off.
  double clip_grad_norm = 0.0;
  /// MixUp on the training device after the prefetcher (torchvision.transforms.v2.MixUp, the
  /// references' --mixup-alpha): images and labels mixed with the batch rolled by one, lam ~
  /// Beta(alpha, alpha); labels become soft targets [N, classes] (float32) and go through the
  /// label-smoothing cross-entropy, as in the references. 0 = off.
  double mixup_alpha = 0.0;
  /// CutMix likewise (v2.CutMix, --cutmix-alpha): the rolled batch's box pasted, lam = 1 - box
  /// area / image area. With both on, one of the two per micro-batch with equal probability
  /// (v2.RandomChoice). Drawn from a generator keyed by recipe.h's mix_key(seed, epoch,
  /// micro-batch of the epoch, rank). Training top-1 counts against the soft target's argmax.
  double cutmix_alpha = 0.0;
  /// Keep an exponential moving average of the parameters and buffers (the references'
  /// --model-ema; recipe.h, ModelEma): updated after every model_ema_steps-th optimizer step of an
  /// epoch (steps 0, N, 2N, ...), copying the model instead during the first warmup_epochs epochs;
  /// validated after each epoch beside the model (EpochStats::ema_val_*) and saved in the
  /// training checkpoint ("model_ema", AveragedModel.state_dict()'s layout).
  bool model_ema = false;
  int64_t model_ema_steps = 32;     ///< --model-ema-steps: optimizer steps between updates
  /// --model-ema-decay, per update before the references' adjustment: the decay used is
  /// adjusted_ema_decay(this, world size, batch_size x accum_steps, model_ema_steps, epochs).
  double model_ema_decay = 0.99998;
  /// Stop an epoch after this many optimizer steps (0 = the whole epoch).
  int64_t max_steps_per_epoch = 0;

  // --- schedule ---
  /// The learning-rate schedule in epochs (stepped per optimizer step; lr_schedule.h) and
  /// progressive resizing (schedule_options.h; `gpufeed train`'s --lr-schedule, --warmup-epochs,
  /// --min-res, ... flags come from its schema). With schedule.resolution set, epoch e (0-based)
  /// trains at get_resolution(*schedule.resolution, e) instead of loader.transform.rrc.size; every
  /// side must be >= 8. The loader's slots are sized once for the largest side of the run's
  /// epochs; the size changes at epoch starts only, a resumed epoch gets its own epoch's side,
  /// and validation keeps its own size (val_crop_size / val_resize_size, or the crop side).
  ScheduleOptions schedule;

  // --- precision ---
  Precision precision = Precision::kFloat32;
  GradScalerOptions grad_scaler{};  ///< fp16 only

  // --- devices and parallelism ---
  /// "cpu", "cuda" or "cuda:N". In a distributed run "cuda" means cuda:LOCAL_RANK.
  std::string device = "cpu";
  /// DataParallel over these devices (the first holds the model and replaces `device`), e.g.
  /// {"cuda:0", "cuda:1"}; one device runs the module itself through the DataParallel wrapper.
  /// Empty: no DataParallel. Not combinable with a distributed run.
  std::vector<std::string> dp_devices;
  DistributedMode distributed = DistributedMode::kAuto;
  DistBackend dist_backend = DistBackend::kAuto;
  double dist_timeout_s = 1800;        ///< rendezvous and collective timeout
  int64_t ddp_bucket_mb = 25;          ///< gradient bucket size, MiB
  bool cudnn_benchmark = true;         ///< cudnn.benchmark on CUDA

  // --- checkpoints ---
  /// The final model state_dict (Python-loadable). With "{rank}" in the path every rank writes
  /// its own copy (rank substituted); otherwise rank 0 writes it (path_for_rank).
  std::optional<std::filesystem::path> checkpoint;
  /// The training checkpoint (layout above), written atomically by rank 0 at every epoch end,
  /// every checkpoint_every_steps optimizer steps, and when a stop is requested.
  std::optional<std::filesystem::path> save_checkpoint;
  int64_t checkpoint_every_steps = 0;  ///< 0 = only at epoch ends and on stop
  /// Write save_checkpoint only when a stop is requested (not at epoch ends or every N steps).
  bool save_checkpoint_only_on_stop = false;
  /// Resume from this training checkpoint. Throws at construction when its run differs in
  /// architecture, classes, dataset size, batch size, accumulation or seed, or in the
  /// learning-rate schedule's plan (epochs, steps per epoch, kind, lr, warmup, ... -- listing
  /// what changed and the learning rate the next step would get) unless resume_replan_schedule.
  /// Another world size resumes the epoch by docs/SCALING.md's rule ("Resuming on another
  /// number of ranks": the positions the saved run had not consumed are dealt to the new ranks
  /// without padding, each trained once; a rank whose share runs out a batch early joins the
  /// remaining steps without data; the next epoch is DistributedSampler's for the new world
  /// size) on this world size's schedule, the plan compared with the one these options give at
  /// the saved world size. Refused, naming why: with `ra_sampler`, with `sync_bn` when the
  /// shares' batch counts differ, and for checkpoints without "dataset_size" and "drop_last".
  std::optional<std::filesystem::path> resume;
  /// resume: accept a different schedule plan (e.g. more --epochs): the schedule is re-planned
  /// over this run's options and continues at the saved step on the new plan (logged: what
  /// changed, the next step's learning rate on both plans).
  bool resume_replan_schedule = false;
  /// Polled after every optimizer step: nonzero asks the run to stop (e.g. set by a signal
  /// handler to the signal number). May be null.
  const std::atomic<int>* stop_flag = nullptr;
  /// Set to true by fit() just before its first training step (after the rendezvous, dataset
  /// listing, model and loader setup). A signal handler reads it to tell "nothing to save yet,
  /// exit now" from "finish the step and checkpoint" (tools/cli/cmd_train.cpp). May be null.
  std::atomic<bool>* steps_started = nullptr;

  profiler::ProfileOptions profile{};         ///< metrics file, trace, progress callback (profiler.h)

  /// The rules these options must keep on their own (no world size, device or dataset needed):
  /// epochs, batch_size and accum_steps >= 1, image_size >= 8 (and every progressive-resizing
  /// side), label_smoothing in [0, 1), finite non-negative lr, momentum, weight decays,
  /// clip_grad_norm and MixUp/CutMix alphas, model_ema's steps and decay, the validation sizes,
  /// ra_reps, max_steps_per_epoch, batch_size 1 only with freeze_bn, sync_bn and
  /// activation_checkpointing not with dp_devices, sync_bn not with freeze_bn, init_weights_*
  /// only with init_weights. Throws std::invalid_argument naming the rule ("Trainer: ...").
  /// Called by train_options_schema()'s finisher and by the Trainer's constructor.
  void validate() const;
};

/// TrainOptions' user-facing fields as option rows (gpufeed/option.h; harness/src/train_options.cpp),
/// the one declaration `gpufeed train`'s training flags (--arch, --epochs, --lr, ..., --resume),
/// their help, defaults and accepted values come from, and docs/OPTIONS.md's training table. The
/// loader's, index cache's and schedule's options are their own schemas (TrainOptions::loader,
/// index_cache, schedule); data, val_data, init_weights_exclude and the profile's paths and
/// callbacks are the command's own. Its finisher runs TrainOptions::validate().
const options::Schema<TrainOptions>& train_options_schema();

/// One epoch's report. In a distributed run the numbers are over all ranks.
struct EpochStats {
  int64_t epoch = 0;            ///< 0-based
  int image_size = 0;           ///< train crop side of the epoch, pixels (TrainOptions::resolution)
  int64_t steps = 0;            ///< optimizer steps
  int64_t samples = 0;
  double loss = 0;              ///< mean training cross-entropy over the epoch
  double top1 = 0;              ///< training top-1 accuracy (augmented inputs), fraction
  double seconds = 0;           ///< wall time of the epoch's training steps
  double images_per_s = 0;      ///< samples / seconds
  double data_wait_fraction = 0;  ///< time blocked in Prefetcher::next() / seconds (this rank)
  double first_batch_wait_s = 0;  ///< the loader's wait for the epoch's first batch, seconds (EpochSummary::first_wait_s, this rank)
  int loader_threads = 0;         ///< the train loader's decode threads at the epoch's end (num_workers auto: its choice)
  bool auto_threads = false;      ///< the train loader runs num_workers auto
  int64_t thread_decisions = 0;   ///< num_workers auto: the train loader's changes of thread count so far, all epochs (Loader::thread_decisions())
  double lr = 0;                ///< learning rate at the epoch's last step
  int64_t skipped_steps = 0;    ///< fp16: steps skipped for inf/NaN gradients
  int64_t skipped_samples = 0;  ///< --on-error skip: training samples replaced (loader's epoch_summary), all ranks
  std::optional<double> val_loss, val_top1, val_top5;  ///< when val_data is set
  std::optional<double> ema_val_loss, ema_val_top1, ema_val_top5;  ///< val_data and model_ema
};

/// One optimizer step, for on_step callbacks (tests, logging). Costs a device sync per step.
struct StepStats {
  int64_t epoch = 0;
  int64_t step = 0;             ///< optimizer steps taken before this one (0-based global step)
  int64_t samples = 0;          ///< this rank's samples in the step
  double loss = 0;              ///< this rank's mean loss over those samples
  double lr = 0;                ///< learning rate used
  bool skipped = false;         ///< fp16: the step was skipped (inf/NaN gradients)
  double loss_scale = 1;        ///< fp16: the scale used for this step
  std::vector<int64_t> indices; ///< dataset indices of this rank's samples, in order
};

/// Named places in the training step where a feature plugs in (each may be empty). They run on
/// every rank, in the training thread.
struct StepHooks {
  /// Batch transform: per micro-batch, after the batch arrives (and after the built-in
  /// MixUp/CutMix of TrainOptions::mixup_alpha/cutmix_alpha) and before the forward pass; may
  /// change images [N, 3, H, W] (normalised, on the device) and labels -- [N] int64 class
  /// indices, or [N, classes] float soft targets after mixing -- in place or replace them (soft
  /// targets are accepted by the loss and the top-1 count).
  std::function<void(at::Tensor& images, at::Tensor& labels)> batch_transform;
  /// Gradient transform: per optimizer step, when the gradients are complete -- accumulated over
  /// the micro-batches, all-reduced, unscaled and checked finite under fp16, clipped when
  /// TrainOptions::clip_grad_norm is set -- and before optimizer.step(). `params` in optimizer order. Not called for a step fp16 skips.
  std::function<void(const std::vector<at::Tensor>& params)> gradient_transform;
  /// Post-step hook (an EMA of the weights goes here): after each optimizer step that updated
  /// the parameters; `step` is the 0-based global step just taken.
  std::function<void(int64_t step)> post_step;
};

/// Evaluation result on a dataset (eval transform, model in eval mode).
struct EvalStats {
  int64_t samples = 0;
  double loss = 0;
  double top1 = 0;  ///< fraction
  double top5 = 0;  ///< fraction (equals 1 when there are <= 5 classes)
};

/// Trains one model. Not thread-safe (request_stop excepted).
class Trainer {
 public:
  /// Builds the process group (when distributed), dataset(s), loader, prefetcher, model and
  /// optimizer, plans the learning-rate schedule, and loads init_weights / resume. Logs the
  /// learning rate after linear scaling. Throws std::runtime_error for a missing dataset folder,
  /// an unusable device, an unreadable or mismatched checkpoint or a failed rendezvous;
  /// std::invalid_argument for bad options, among them an epoch that would take no optimizer
  /// step (dataset too small for the batch size and world size; the message names the dataset
  /// size, batch size, world size and drop_last) and a schedule LrSchedule refuses.
  explicit Trainer(TrainOptions options);
  ~Trainer();

  /// Runs the remaining epochs (all, or from the resume point), calling on_epoch after each
  /// (after its evaluation), then writes the final checkpoint if one was asked for. Stops early
  /// after the optimizer step during which a stop was requested (request_stop or stop_flag; in a
  /// distributed run all ranks agree to stop after the same step, one step later), writing the
  /// training checkpoint first. Returns the stats of the epochs it ran. Rethrows a failed
  /// collective as std::runtime_error naming this rank and the cause. In fp32 and bf16 a
  /// non-finite loss throws std::runtime_error naming the epoch and step, before that step's
  /// optimizer update and without writing any checkpoint (fp16 instead skips the step and
  /// backs the loss scale off, as torch.amp.GradScaler does).
  std::vector<EpochStats> fit(const std::function<void(const EpochStats&)>& on_epoch = {});

  /// Called after every optimizer step with its stats (set before fit()).
  void set_step_callback(std::function<void(const StepStats&)> on_step);
  /// The step's hook points (set before fit()).
  void set_step_hooks(StepHooks hooks);

  /// Asks fit() to stop after the current optimizer step. Async-signal-safe (sets an atomic).
  void request_stop(int reason = 1) noexcept;
  /// The reason the last fit() stopped early (the stop flag's value), or 0 if it ran to the end.
  int stopped() const;
  /// Where the training checkpoint was last written (empty if never).
  std::filesystem::path last_checkpoint() const;

  /// Loss, top-1 and top-5 of the current model (or, with `ema`, of its moving average) on `root` (same classes as the training set). In
  /// a distributed run every rank evaluates its shard (DistributedSampler order, without
  /// padding duplicates counted) and the totals are summed across ranks. The validation set of
  /// TrainOptions is listed once, at construction; another root is listed here. Throws
  /// std::invalid_argument naming both class lists when the classes differ.
  EvalStats evaluate(const std::filesystem::path& root, bool ema = false);

  /// The model being trained.
  ResNet& model();
  /// The moving average of the model (TrainOptions::model_ema), or null when off.
  const ModelEma* model_ema() const;
  /// Learning rate after batch scaling: lr * global_batch() / 256.
  double scaled_lr() const;
  /// batch_size * accum_steps * world_size(): samples per optimizer step, all ranks.
  int64_t global_batch() const;
  /// Number of classes found in the training set.
  int64_t num_classes() const;
  /// This process's rank and the number of processes (0 and 1 when not distributed).
  int rank() const;
  int world_size() const;
  /// The device this process trains on.
  std::string device() const;
  /// The profile of the last fit(): step breakdown, GPU busy fraction, loader counters and the
  /// input-bound / compute-bound verdict. Empty (no steps) before fit(). With gradient
  /// accumulation a profiled "step" is one micro-batch.
  const profiler::RunProfile& profile() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpufeed::harness
