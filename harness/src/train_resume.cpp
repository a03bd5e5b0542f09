// The training checkpoint's writing and resuming (layout and entries: train_checkpoint.h), and
// an epoch's lockstep batches when it was resumed on another world size (docs/SCALING.md,
// "Resuming on another number of ranks").
#include <c10/util/StringUtil.h>

#include <stdexcept>

#include "gpufeed/harness/checkpoint.h"
#include "gpufeed/harness/train_checkpoint.h"
#include "gpufeed/log_text.h"
#include "trainer_impl.h"

namespace gpufeed::harness {
namespace fs = std::filesystem;
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// DistributedSampler's total_size for n samples over `replicas` ranks (padded: the trainer's
// sampler keeps its tail).
int64_t padded_total(int64_t n, int64_t replicas) {
  sampler::DistributedSamplerOptions so;
  so.num_replicas = replicas;
  return sampler::DistributedSampler(n, so).total_size();
}

}  // namespace

TrainRunIdentity Trainer::Impl::run_identity() const {
  const bool shards = shuffle_order == loader::ShuffleOrder::kShards;
  return {options.arch,
          resnet_options.num_classes,
          world,
          options.loader.batch_size,
          options.accum_steps,
          static_cast<int64_t>(options.loader.seed),
          options.ra_sampler ? options.ra_reps : 0,
          train_set->size(),
          options.loader.drop_last,  // as applied (a forced drop included)
          std::string(loader::to_string(shuffle_order)),
          shards ? options.loader.shard_window : 0,
          shards ? options.loader.shard_partitions : 0};
}

int64_t Trainer::Impl::batches_of(int64_t samples) const {
  const int64_t bs = options.loader.batch_size;
  return options.loader.drop_last ? samples / bs : ceil_div(samples, bs);
}

int64_t Trainer::Impl::lockstep_micro_batches() const {
  const auto& r = resumable ? resumable->resume() : std::nullopt;
  if (!r || r->consumed == 0 || r->epoch != train_sampler->epoch()) return micro_batches();
  // Rank 0's share is the longest (remaining_for_rank deals from rank 0 on).
  return batches_of(sampler::remaining_count(padded_total(train_set->size(), r->num_replicas), r->consumed, world, 0));
}

int64_t Trainer::Impl::resumed_step_offset(int64_t lockstep) const {
  return std::max<int64_t>(0, steps_per_epoch() - ceil_div(lockstep, options.accum_steps));
}

// Rank 0 writes the training checkpoint; `at_epoch`/`batches` is where a resumed run continues.
void Trainer::Impl::write_checkpoint(int64_t at_epoch, int64_t batches, bool on_stop) {
  nonfinite_check.check(last_checkpoint);  // never save a non-finite update
  if (!options.save_checkpoint || !main_rank()) return;
  if (options.save_checkpoint_only_on_stop && !on_stop) return;
  TrainCheckpoint c;
  c.run = run_identity();
  c.progress = {at_epoch, batches, global_step};
  if (const auto& r = resumable ? resumable->resume() : std::nullopt; r && r->epoch == at_epoch && r->consumed > 0) {
    c.progress.epoch_world_size = r->num_replicas;  // this epoch's list, and what its first ranks consumed
    c.progress.epoch_start = r->consumed;
  }
  c.model = state_dict_to_ivalue(module_state_dict(*model));
  c.optimizer = sgd_state_dict(*optimizer);
  c.scheduler = schedule_state_dict(*schedule, global_step, options.epochs, steps_per_epoch());
  c.scaler = grad_scaler_state_dict(scaler.get());
  c.rng = rng_state_dict(device);
  if (ema) c.model_ema = state_dict_to_ivalue(ema->state_dict());
  save_train_checkpoint(c, *options.save_checkpoint);
  last_checkpoint = *options.save_checkpoint;
  gpufeed::log_text(LogLevel::kInfo, "train: wrote training checkpoint " + last_checkpoint.string() +
                                         " (epoch " + std::to_string(at_epoch) + ", batch " +
                                         std::to_string(batches) + ", step " + std::to_string(global_step) + ")");
}

void Trainer::Impl::resume_from(const fs::path& path) {
  const std::string file = path.string();
  const TrainCheckpoint c = load_train_checkpoint(path);
  check_same_run(c.run, run_identity(), file);
  if (c.run.world_size != world) check_schedule_on_other_world(c, file);
  load_state_dict(*model, find_state_dict(c.model, file), file);
  load_sgd_state_dict(*optimizer, c.optimizer, file);
  load_grad_scaler_state_dict(scaler.get(), c.scaler, file);
  load_rng_state_dict(c.rng, device);
  if (ema && !c.model_ema.isNone()) {
    ema->load_state_dict(find_state_dict(c.model_ema, file + " (model_ema)"), file + " (model_ema)");
  } else if (ema) {
    ema->update(*model);
    ema->reset();
    gpufeed::log_text(LogLevel::kWarn, "train: " + file + " has no model_ema: the moving average restarts from the resumed model");
  }
  resume_position(c, file);
  if (c.run.world_size == world) {
    // Resuming onto another schedule plan (e.g. more --epochs) would move the learning rate from
    // where the saved run had it: refused unless resume_replan_schedule, else logged.
    const std::string change = schedule_change(
        c.scheduler, schedule_state_dict(*schedule, global_step, options.epochs, steps_per_epoch()), *schedule,
        global_step);
    if (!change.empty() && !options.resume_replan_schedule) {
      throw std::invalid_argument(file + ": cannot resume: " + change +
                                  ". Pass `resume_replan_schedule` (TrainOptions::resume_replan_schedule) "
                                  "to continue on the new plan, or resume with the saved run's options");
    }
    if (!change.empty()) gpufeed::log_text(LogLevel::kWarn, "train: " + file + ": " + change + " (`resume_replan_schedule`)");
  }
  gpufeed::log_text(LogLevel::kInfo, "train: resumed from " + file + " at epoch " + std::to_string(epoch) +
                                         ", batch " + std::to_string(batches_done) + ", step " +
                                         std::to_string(global_step));
}

// A plan is a function of the world size (the global batch scales the learning rate, the steps
// per epoch follow the ranks' shares): on another world size, the saved plan is compared with
// the one this run's options give at the saved world size, and this run's own plan is used.
void Trainer::Impl::check_schedule_on_other_world(const TrainCheckpoint& c, const std::string& file) const {
  const TrainOptions& o = options;
  if (!c.run.dataset_size || !c.run.drop_last) {
    throw std::invalid_argument(file + ": cannot resume on world size " + std::to_string(world) +
                                ": the checkpoint does not record the dataset size and drop_last, which resuming "
                                "on another world size needs; resume it on world size " +
                                std::to_string(c.run.world_size));
  }
  if (!resumable) {
    throw std::invalid_argument(file + ": cannot resume on world size " + std::to_string(world) + " (saved on " +
                                std::to_string(c.run.world_size) +
                                "): `ra_sampler`'s repeated samples have no rule for another number of ranks; "
                                "resume it on world size " + std::to_string(c.run.world_size));
  }
  const int64_t saved_world = c.run.world_size, bs = o.loader.batch_size, n = *c.run.dataset_size;
  const int64_t per_rank = padded_total(n, saved_world) / saved_world;
  int64_t spe = ceil_div(*c.run.drop_last ? per_rank / bs : ceil_div(per_rank, bs), o.accum_steps);
  if (o.max_steps_per_epoch > 0) spe = std::min(spe, o.max_steps_per_epoch);
  const double saved_lr = o.lr * static_cast<double>(bs * o.accum_steps * saved_world) / 256.0;
  const LrSchedule there(schedule_options(saved_lr, spe));
  const std::string change =
      schedule_change(c.scheduler, schedule_state_dict(there, c.progress.step, o.epochs, spe), there, c.progress.step);
  if (!change.empty() && !o.resume_replan_schedule) {
    throw std::invalid_argument(file + ": cannot resume: at the saved world size (" + std::to_string(saved_world) +
                                ") this run's options give another plan: " + change +
                                ". Pass `resume_replan_schedule` (TrainOptions::resume_replan_schedule) "
                                "to continue on the new plan, or resume with the saved run's options");
  }
  if (!change.empty()) gpufeed::log_text(LogLevel::kWarn, "train: " + file + ": " + change + " (`resume_replan_schedule`)");
}

void Trainer::Impl::resume_position(const TrainCheckpoint& c, const std::string& file) {
  epoch = c.progress.epoch;
  batches_done = c.progress.batches_consumed;
  global_step = c.progress.step;
  const int64_t list_world = c.progress.epoch_world_size > 0 ? c.progress.epoch_world_size : c.run.world_size;
  std::optional<sampler::EpochResume> r;
  if (c.progress.epoch_start > 0) r = sampler::EpochResume{epoch, list_world, c.progress.epoch_start};
  if (c.run.world_size == world) {
    if (r && !resumable) throw std::invalid_argument(file + ": a resumed epoch's checkpoint, and this run uses `ra_sampler`");
    if (resumable) resumable->set_resume(r);
    return;
  }
  const int64_t n = train_set->size(), total = padded_total(n, list_world);
  int64_t consumed = 0;
  try {  // the checkpoint is rank 0's (the longest share): the positions all ranks consumed
    consumed = sampler::consumed_after_batches(total, r ? r->consumed : 0, c.run.world_size, 0, batches_done,
                                               options.loader.batch_size, *c.run.drop_last);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(file + ": cannot resume on world size " + std::to_string(world) + ": " + e.what());
  }
  batches_done = 0;
  if (consumed >= total) {  // every rank had received all its batches: the next epoch follows
    ++epoch;
    consumed = 0;
  }
  resumable->set_resume(consumed > 0 ? std::optional(sampler::EpochResume{epoch, list_world, consumed}) : std::nullopt);
  train_sampler->set_epoch(epoch);
  const int64_t lockstep = lockstep_micro_batches(), mine = micro_batches();
  if (options.sync_bn && mine != lockstep) {
    throw std::invalid_argument(
        file + ": cannot resume on world size " + std::to_string(world) + " with `sync_bn`: the ranks' shares of epoch " +
        std::to_string(epoch) + "'s remaining samples differ by a batch (" + std::to_string(mine) + " here, " +
        std::to_string(lockstep) + " on rank 0) and SyncBatchNorm needs every rank in every forward; resume on "
        "a world size that gives every rank as many batches, or from a checkpoint at an epoch's end");
  }
  // The plan is this world size's: the epoch's remaining steps end it at its step count.
  global_step = epoch * steps_per_epoch() + resumed_step_offset(lockstep);
  gpufeed::log_text(
      LogLevel::kInfo,
      c10::str("train: resuming on world size ", world, " a checkpoint of world size ", c.run.world_size,
               " (docs/SCALING.md): ", total - consumed, " of epoch ", epoch, "'s ", total,
               " positions remain, dealt to the ", world, " ranks without padding (this rank: ",
               sampler::remaining_count(total, consumed, world, rank), " samples in ", mine, " batches, rank 0: ",
               lockstep, "); the schedule is this world size's (global batch ", global_batch(), ", lr ", scaled_lr(),
               "), continuing at its step ", global_step, " (the saved run was at step ", c.progress.step, ")"));
}

}  // namespace gpufeed::harness
