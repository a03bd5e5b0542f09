#pragma once
// The training checkpoint: everything a stopped run needs to continue as if it had never stopped.
//
// One torch.save-format file (written with save_torch_file, atomically) that Python reads with
// torch.load(path, weights_only=True):
//   {"format": "gpufeed.train_checkpoint", "version": 1,
//    "model": state_dict (torchvision's names, no "module." prefix),
//    "optimizer": torch.optim.SGD.state_dict()'s layout: {"state": {i: {"momentum_buffer": t}},
//                 "param_groups": [{"lr", "momentum", "dampening", "weight_decay", "nesterov",
//                 "params": [i, ...]}]},
//    "scheduler": {"kind": "cosine", "last_step": optimizer steps taken, "total_steps": ...,
//                  the plan (LrScheduleOptions): "base_lr", "warmup_steps", "warmup_start_factor",
//                  "step_size", "milestones", "gamma", "min_lr", "pct_start", "div_factor",
//                  "final_div_factor", "cycle_momentum", "peak_epoch"; and "epochs", "steps_per_epoch"},
//    "scaler": torch.amp.GradScaler.state_dict()'s keys ("scale", "growth_factor",
//              "backoff_factor", "growth_interval", "_growth_tracker"), or {} when not fp16,
//    "sampler": {"epoch", "batches_consumed" (micro-batches of that epoch already trained on),
//                "seed", "num_replicas", "batch_size", "accum_steps", "ra_reps" (0: no RASampler),
//                "dataset_size", "drop_last" (the loader's, as the run applied it),
//                "shuffle_order" ("exact" or "shards": the order dealt, as `shuffle_order` resolved;
//                absent: "exact") and with "shards" its "shard_window" and "shard_partitions",
//                "sampler_drop_last" (DistributedSampler's: false), "epoch_world_size" and
//                "epoch_start" (the epoch's list is DistributedSampler's for epoch_world_size
//                ranks, of which epoch_start positions were consumed before this run's ranks were
//                dealt the rest: num_replicas and 0 unless the epoch was resumed on another
//                world size; the names and rule of gpufeed.DataLoader.state_dict)},
//    "rng": {"cpu": uint8 tensor, "cuda": uint8 tensor (when training on CUDA)},
//    "model_ema": with --model-ema only: AveragedModel.state_dict()'s layout, {"n_averaged":
//                 int64, "module.<name>": tensor} (the references save model_ema.state_dict()),
//    "epoch": epoch in progress, "step": optimizer steps taken,
//    "arch": ..., "num_classes": ...}
// Resuming restores all of it: the next batches, learning rates and losses are those of an
// uninterrupted run (bit for bit on the CPU). Checkpoints written before the schedule's plan was
// saved (only "kind", "last_step", "total_steps") still load; their plan is compared on what they
// have. The Trainer writes and reads it (TrainOptions::save_checkpoint, resume).
//
// On another world size (a job restarted on fewer or more ranks), the Trainer resumes the epoch
// by docs/SCALING.md's rule, "Resuming on another number of ranks": the positions of the epoch's
// DistributedSampler list the saved run had not consumed are dealt to the new ranks without
// padding, each delivered once, and the next epoch is DistributedSampler's for the new world
// size. Checkpoints without "dataset_size" and "drop_last" resume only on their own world size.

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/optim/sgd.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "gpufeed/harness/amp.h"
#include "gpufeed/harness/lr_schedule.h"

namespace gpufeed::harness {

/// The "format" entry of a training checkpoint.
inline constexpr const char* kTrainCheckpointFormat = "gpufeed.train_checkpoint";

/// What a resumed run must share with the saved one ("arch", "num_classes" and the "sampler"
/// entry): the same samples in the same batches, the same model.
struct TrainRunIdentity {
  std::string arch;
  int64_t num_classes = 0;
  int64_t world_size = 1;  ///< "num_replicas"
  int64_t batch_size = 0;
  int64_t accum_steps = 1;
  int64_t seed = 0;
  int64_t ra_reps = 0;     ///< "ra_reps": RASampler's repetitions, 0 = DistributedSampler (absent: 0)
  std::optional<int64_t> dataset_size;  ///< "dataset_size" (absent in older checkpoints)
  std::optional<bool> drop_last;        ///< "drop_last": the loader's, as applied (absent in older ones)
  /// "shuffle_order": the order the sampler dealt, "exact" or "shards" (resolved; absent in older
  /// checkpoints: "exact"); "shard_window", "shard_partitions" with "shards" only (else 0).
  std::string shuffle_order = "exact";
  int64_t shard_window = 0, shard_partitions = 0;
};

/// Where a run stands.
struct TrainProgress {
  int64_t epoch = 0;             ///< the epoch in progress, 0-based
  int64_t batches_consumed = 0;  ///< micro-batches of that epoch already trained on
  int64_t step = 0;              ///< optimizer steps taken
  /// "epoch_world_size", "epoch_start": the epoch's list is DistributedSampler's for
  /// epoch_world_size ranks (0: the run's world size), and its first epoch_start positions were
  /// consumed before this run's ranks were dealt the rest (0: a plain epoch).
  int64_t epoch_world_size = 0;
  int64_t epoch_start = 0;
};

/// The file's entries (layout above).
struct TrainCheckpoint {
  TrainRunIdentity run;
  TrainProgress progress;
  c10::IValue model;      ///< {name: tensor} (state_dict_to_ivalue)
  c10::IValue optimizer;  ///< sgd_state_dict
  c10::impl::GenericDict scheduler{c10::StringType::get(), c10::AnyType::get()};  ///< schedule_state_dict
  c10::impl::GenericDict scaler{c10::StringType::get(), c10::AnyType::get()};     ///< {} when not fp16
  c10::impl::GenericDict rng{c10::StringType::get(), c10::AnyType::get()};        ///< rng_state_dict
  c10::IValue model_ema;  ///< "model_ema" (ModelEma::state_dict) with TrainOptions::model_ema; else None, not written
};

/// Writes `ckpt` to `path` atomically (save_torch_file). Throws std::runtime_error naming the
/// path on I/O failure.
void save_train_checkpoint(const TrainCheckpoint& ckpt, const std::filesystem::path& path);

/// Reads a training checkpoint. Throws std::runtime_error naming the file when it is unreadable,
/// not a gpufeed training checkpoint (e.g. a plain state_dict: use init_weights) or lacks an entry.
TrainCheckpoint load_train_checkpoint(const std::filesystem::path& path);

/// Throws std::runtime_error "FILE: cannot resume: WHAT was X, this run has Y" for the first
/// difference between the saved run and this one that would give other batches (arch,
/// num_classes, dataset size when recorded, batch size, accum steps, seed, ra_reps). The world
/// size may differ: the Trainer then resumes the epoch by the rule above (and refuses a
/// checkpoint that cannot tell, naming what it lacks).
void check_same_run(const TrainRunIdentity& saved, const TrainRunIdentity& now, const std::string& file);

/// torch.optim.SGD.state_dict()'s layout for `optimizer` (parameters numbered in group order;
/// momentum buffers copied to the CPU).
c10::IValue sgd_state_dict(const torch::optim::SGD& optimizer);
/// Restores what sgd_state_dict wrote into an optimizer with the same parameter groups. Throws
/// std::runtime_error naming `file` when the groups or a buffer's shape differ.
void load_sgd_state_dict(torch::optim::SGD& optimizer, const c10::IValue& state, const std::string& file);

/// torch.amp.GradScaler.state_dict()'s keys, or {} for no scaler.
c10::impl::GenericDict grad_scaler_state_dict(const GradScaler* scaler);
/// Restores the scale and growth tracker (nothing when `scaler` is null or `state` is empty).
void load_grad_scaler_state_dict(GradScaler* scaler, const c10::impl::GenericDict& state, const std::string& file);

/// The default generators' states: "cpu", and "cuda" when `device` is a CUDA device.
c10::impl::GenericDict rng_state_dict(c10::Device device);
/// Restores what rng_state_dict wrote ("cuda" only when `device` is a CUDA device).
void load_rng_state_dict(const c10::impl::GenericDict& state, c10::Device device);

/// The "scheduler" entry: progress (`step`) and the whole plan of `schedule`, with the run's
/// epochs and optimizer steps per epoch.
c10::impl::GenericDict schedule_state_dict(const LrSchedule& schedule, int64_t step, int64_t epochs,
                                           int64_t steps_per_epoch);

/// How resuming at `step` on `now` (this run's plan, `now_state` = its schedule_state_dict)
/// differs from the `saved` entry: "" when the plans agree on every field both have; otherwise
/// "the learning-rate schedule differs from the saved run's: epochs 2 -> 4, ... Re-planned, ...
/// step 8 continues at lr X (the saved plan: Y)".
std::string schedule_change(const c10::impl::GenericDict& saved, const c10::impl::GenericDict& now_state,
                            const LrSchedule& now, int64_t step);

}  // namespace gpufeed::harness
