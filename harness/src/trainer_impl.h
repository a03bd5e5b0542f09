#pragma once
// The Trainer's state and its parts, shared by the files that implement them:
//   trainer.cpp        building: options, devices and the process group, data, model,
//                      optimizer, schedule; resuming; the public accessors; fit()
//   train_step.cpp     one training step (micro-batches: data wait, batch transform,
//                      forward/backward with accumulation and loss scaling, all-reduce wait,
//                      gradient transform, optimizer, post-step; profiler phases) and one epoch
//   validation.cpp     evaluate()
//   train_checkpoint.cpp  the training checkpoint's entries (gpufeed/harness/train_checkpoint.h)
// Not installed: the public interface is gpufeed/harness/trainer.h.

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <torch/optim/sgd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpufeed/harness/amp.h"
#include "gpufeed/harness/data_parallel.h"
#include "gpufeed/harness/distributed.h"
#include "gpufeed/harness/lr_schedule.h"
#include "gpufeed/profiler/profiler.h"
#include "gpufeed/harness/recipe.h"
#include "gpufeed/harness/resnet.h"
#include "gpufeed/harness/train_checkpoint.h"
#include "gpufeed/harness/trainer.h"
#include "gpufeed/prefetch/prefetcher.h"
#include "gpufeed/sampler/resume.h"

namespace gpufeed::harness {

// The training loop's stop decision. Without a process group a stop requested during step k
// ends the run after step k. With one, every rank contributes its flag to an all-reduce launched
// after step k and read after step k + 1, so all ranks stop after the same step without the
// host ever waiting for the device (on CUDA the result is copied to pinned memory behind an
// event that has long completed when it is read).
class StopVote {
 public:
  StopVote(ProcessGroup* group, c10::Device device) : group_(group), device_(device) {}
  // Called after every optimizer step with this rank's flag; returns the agreed reason to stop
  // now (0: continue).
  int after_step(int local);

 private:
  void launch(int local);

  ProcessGroup* group_;
  c10::Device device_;
  std::unique_ptr<ProcessGroup::Pending> pending_;
  std::unique_ptr<c10::Event> event_;
  at::Tensor host_;
};

// fp32/bf16: a non-finite loss stops the run, without a host sync per step. Each optimizer step
// records its flag (some micro-batch's loss was not finite) and its last loss. On the CPU they
// are read at once, before the step's update. On CUDA they are copied to pinned memory behind an
// event and read one step late (at the next step's update, as the stop vote is) or before
// anything is saved (check(): a checkpoint, the epoch's end, the final state_dict), so the run
// stops after at most one non-finite update and no saved file ever holds it.
class NonFiniteCheck {
 public:
  // Where the recorded step stands, for the error message.
  struct Where {
    int64_t epoch = 0, epochs = 0, step_in_epoch = 0, global_step = 0;
    double lr = 0;
  };
  // Records a step's flag (bool) and last loss; reads a pending record first. Throws
  // std::runtime_error naming the step when a read flag is set.
  void record(const at::Tensor& nonfinite, const at::Tensor& loss, const Where& where,
              const std::filesystem::path& last_checkpoint);
  // Reads the pending record, if any (on CUDA waiting for its event); throws as record() does.
  void check(const std::filesystem::path& last_checkpoint);

 private:
  at::Tensor host_;  // [flag, loss] as double; pinned on CUDA
  std::unique_ptr<c10::Event> event_;
  bool pending_ = false;
  Where where_;
};

// One epoch in progress on this rank.
struct EpochState {
  int64_t epoch = 0;
  int64_t batch_index = 0;    // micro-batches of the epoch consumed (with shadow ones, below)
  // Micro-batches of the epoch on its longest rank, which every rank steps through in lockstep:
  // this rank's own count, except in an epoch resumed on another world size, where the ranks'
  // shares may differ by one sample; a rank whose share ran out joins the remaining steps
  // without data (shadow_micro_batch).
  int64_t lockstep_batches = 0;
  int64_t step_in_epoch = 0;  // optimizer steps of the epoch taken
  double wait_s = 0;          // time blocked on the prefetcher
  at::Tensor loss_sum;        // sum of per-sample losses (double, on the device)
  at::Tensor correct;         // top-1 hits (long, on the device)
  EpochStats stats;
};

// One optimizer step in progress: its micro-batches' shared numbers.
struct StepState {
  int64_t micro = 1;         // micro-batches in this step (fewer at the end of an epoch)
  int64_t samples = 0;       // this rank's samples in the step
  double loss_scale = 1;     // fp16: the scale used
  at::Tensor loss;           // sum of per-sample losses (double, on the device)
  at::Tensor nonfinite;      // fp32/bf16: some micro-batch's loss was not finite (bool)
  bool skipped = false;      // fp16: GradScaler skipped the update
  StepStats stats;           // for on_step (indices collected only when it is set)
};

// Validation labels index the training set's classes, so both must list the same classes in the
// same order. Throws std::invalid_argument naming both sets and the first difference.
void check_same_classes(const datasets::Dataset& val, const std::filesystem::path& val_root,
                        const datasets::Dataset& train, const std::filesystem::path& train_root);

struct Trainer::Impl {
  TrainOptions options;
  c10::Device device{c10::kCPU};
  std::shared_ptr<ProcessGroup> group;  // distributed runs only
  int rank = 0, world = 1;
  std::shared_ptr<datasets::Dataset> train_set;
  std::shared_ptr<datasets::Dataset> val_set;  // options.val_data, listed and checked once at start
  std::shared_ptr<sampler::Sampler> train_sampler;  // DistributedSampler (resumable, below) or RASampler
  // The DistributedSampler (a ResumedDistributedSampler) or the shard-aware order
  // (`shuffle_order`), null with RASampler: an epoch resumed on another world size deals the
  // saved run's remaining positions (resume_position).
  std::shared_ptr<sampler::ResumableSampler> resumable;
  loader::ShuffleOrder shuffle_order = loader::ShuffleOrder::kExact;  // resumable's, as resolved
  int64_t full_micro_batches = 0;  // micro-batches of a whole (not resumed) epoch on this rank
  std::shared_ptr<loader::Loader> train_loader;
  std::unique_ptr<prefetch::Prefetcher> prefetcher;
  prefetch::PrefetchOptions prefetch_options;
  ResNetOptions resnet_options;
  ResNet model{nullptr};
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<DataParallel> dp;
  std::unique_ptr<torch::optim::SGD> optimizer;
  std::vector<at::Tensor> params;  // optimizer order: group 0's, then group 1's
  std::unique_ptr<GradScaler> scaler;
  NonFiniteCheck nonfinite_check;  // fp32/bf16
  std::optional<MixUpCutMix> mixer;  // mixup_alpha / cutmix_alpha
  ResNet ema_model{nullptr};         // model_ema: the average's module (eval mode)
  std::unique_ptr<ModelEma> ema;
  std::optional<LrSchedule> schedule;  // planned at construction
  // Where training resumes: epoch, micro-batches of it already trained on, optimizer steps.
  int64_t epoch = 0, batches_done = 0, global_step = 0;
  std::function<void(const StepStats&)> on_step;
  StepHooks hooks;
  std::atomic<int> stop_request{0};
  int stopped = 0;
  std::filesystem::path last_checkpoint;
  profiler::RunProfile profile;  // of the last fit()

  bool amp() const { return options.precision != Precision::kFloat32; }
  c10::ScalarType amp_dtype() const {
    return options.precision == Precision::kFloat16 ? c10::kHalf : c10::kBFloat16;
  }
  bool main_rank() const { return rank == 0; }
  double scaled_lr() const;       // lr * global_batch() / 256
  int64_t global_batch() const;   // batch_size * accum_steps * world
  loader::LoaderOptions loader_options(bool train) const;
  // The train crop side of epoch `e` (0-based): get_resolution(options.resolution, e), or
  // options.loader.transform.rrc.size without a schedule.
  int train_image_size(int64_t e) const;
  // Micro-batches of the current epoch on this rank (a resumed one's share included), optimizer
  // steps of a whole epoch, samples in micro-batch b.
  int64_t micro_batches() const { return train_loader->num_batches(); }
  int64_t steps_per_epoch() const;
  // The loader's batches for `samples` samples (BatchSampler with the run's drop_last).
  int64_t batches_of(int64_t samples) const;
  // Micro-batches of the current epoch on the longest rank (EpochState::lockstep_batches).
  int64_t lockstep_micro_batches() const;
  // The steps of a whole epoch before a resumed share's first: steps minus the share's steps.
  int64_t resumed_step_offset(int64_t lockstep) const;
  int64_t micro_batch_size(int64_t b) const;
  void set_train_mode();
  at::Tensor forward(const at::Tensor& x) { return dp ? dp->forward(x) : model->forward(x); }

  // --- building (trainer.cpp), in the order the constructor runs them (after options.validate()) ---
  void setup_devices();  // device, process group, rank, world
  void build_data();     // datasets, sampler, loader, prefetcher
  void build_model();    // ResNet, init_weights, device, layout; its EMA; the batch mixer
  void build_optimizer();
  void plan_schedule(double base_lr);
  LrScheduleOptions schedule_options(double base_lr, int64_t steps_per_epoch) const;
  void wrap_parallel();  // DDP or DataParallel around the model
  void log_setup(double lr) const;
  profiler::RunInfo run_info() const;  // for the profiler

  // --- the training checkpoint (trainer.cpp; entries in train_checkpoint.cpp) ---
  TrainRunIdentity run_identity() const;
  void write_checkpoint(int64_t at_epoch, int64_t batches, bool on_stop = false);
  void resume_from(const std::filesystem::path& path);
  // Where the saved run stood, on this world size: epoch, batches_done, global_step, and the
  // sampler's resume (another world size: docs/SCALING.md, "Resuming on another number of ranks").
  void resume_position(const TrainCheckpoint& c, const std::string& file);
  // Whether the saved plan is the one this run's options give at the saved world size; throws
  // unless resume_replan_schedule when it is not.
  void check_schedule_on_other_world(const TrainCheckpoint& c, const std::string& file) const;

  // --- one step and one epoch (train_step.cpp) ---
  // The epoch `epoch_index` from where it stands (batches_done when resuming), with the stop
  // vote and checkpoints between steps; its stats over all ranks.
  EpochStats train_epoch(int64_t epoch_index, profiler::Profiler& profiler, StopVote& vote);
  void train_step(EpochState& ep, profiler::Profiler& profiler);  // one optimizer step
  void train_micro_batch(EpochState& ep, StepState& step, bool last, profiler::Profiler& profiler);
  // A micro-batch this rank has no data for (its resumed share ran out): the last of the step
  // joins DDP's all-reduce with the gradient it has (zeros without one) and takes the update.
  void shadow_micro_batch(EpochState& ep, StepState& step, bool last);
  // Forward, loss and backward of one micro-batch (DDP's no_sync before the last): logits, loss.
  std::pair<at::Tensor, at::Tensor> forward_backward(prefetch::DeviceBatch& batch, StepState& step, bool last);
  // The update at the end of a step: loss check or GradScaler, [gradient transform],
  // optimizer.step(), zero_grad, [post-step].
  void optimizer_step(EpochState& ep, StepState& step, const at::Tensor& last_loss);
  void finish_epoch(EpochState& ep);  // totals over all ranks
  // The references' EMA update after optimizer step `step_in_epoch` of `epoch` (every
  // model_ema_steps-th; copying during the warmup epochs).
  void update_ema(int64_t epoch, int64_t step_in_epoch);

  // --- validation (validation.cpp) ---
  EvalStats evaluate(const std::filesystem::path& root, bool use_ema);
};

}  // namespace gpufeed::harness
