// One training step and one training epoch (see trainer_impl.h for where the rest lives).
//
// A step is accum_steps micro-batches (fewer at the end of an epoch), each one:
//   data wait -> [MixUp/CutMix] -> [batch transform hook] -> forward + loss + backward (DDP's buckets all-reduce
//   during the last micro-batch's backward; no_sync before) -> all-reduce wait (last) ->
//   optimizer (last): loss check or GradScaler, [clip_grad_norm], [gradient transform hook],
//   optimizer.step(),
//   zero_grad, [post-step hook]
// then [the EMA update], with the profiler's phases around each part, then the stop vote and checkpoints between steps.
#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <chrono>
#include <cmath>
#include <stdexcept>

#include "gpufeed/harness/recipe.h"
#include "gpufeed/log_text.h"
#include "trainer_impl.h"

namespace gpufeed::harness {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

// ---- the stop vote ---------------------------------------------------------------------------

int StopVote::after_step(int local) {
  if (!group_) return local;
  int agreed = 0;
  if (pending_) {
    if (event_) {
      event_->synchronize();
      agreed = host_.item<int>();
    } else {
      pending_->wait();
      agreed = static_cast<int>(host_.item<int>());
    }
    pending_.reset();
    event_.reset();
  }
  if (agreed == 0) launch(local);
  return agreed == 0 ? 0 : (local != 0 ? local : agreed);
}

void StopVote::launch(int local) {
  std::vector<at::Tensor> t{at::full({1}, local, at::TensorOptions().dtype(at::kInt).device(device_))};
  pending_ = group_->all_reduce_sum_async(t);
  if (device_.is_cuda()) {
    pending_->wait();  // the current stream waits for the all-reduce; the host does not
    host_ = at::empty({1}, at::TensorOptions().dtype(at::kInt).pinned_memory(true));
    host_.copy_(t[0], /*non_blocking=*/true);
    event_ = std::make_unique<c10::Event>(c10::kCUDA);
    event_->record(c10::impl::getDeviceGuardImpl(c10::kCUDA)->getStream(device_));
  } else {
    host_ = t[0];  // Gloo writes the result here; wait() before reading
  }
}

// ---- the non-finite loss check ----------------------------------------------------------------

void NonFiniteCheck::record(const at::Tensor& nonfinite, const at::Tensor& loss, const Where& where,
                            const std::filesystem::path& last_checkpoint) {
  check(last_checkpoint);
  const at::Tensor both = at::stack({nonfinite.reshape({}).to(at::kDouble), loss.detach().reshape({}).to(at::kDouble)});
  where_ = where;
  pending_ = true;
  if (!both.is_cuda()) {
    host_ = both;
    check(last_checkpoint);
    return;
  }
  if (!host_.defined() || !host_.is_pinned()) {
    host_ = at::empty({2}, at::TensorOptions().dtype(at::kDouble).pinned_memory(true));
  }
  host_.copy_(both, /*non_blocking=*/true);  // read by check() after the event: never before the copy ends
  event_ = std::make_unique<c10::Event>(c10::kCUDA);
  event_->record(c10::impl::getDeviceGuardImpl(c10::kCUDA)->getStream(both.device()));
}

void NonFiniteCheck::check(const std::filesystem::path& last_checkpoint) {
  if (!pending_) return;
  const bool deferred = event_ != nullptr;
  if (event_) event_->synchronize();
  event_.reset();
  pending_ = false;
  const double flag = host_[0].item<double>(), shown = host_[1].item<double>();
  if (flag == 0) return;
  const Where& w = where_;
  throw std::runtime_error(
      "train: the loss is not finite (" +
      (std::isnan(shown) ? std::string("nan") : std::isfinite(shown) ? std::string("an earlier micro-batch's") : c10::str(shown)) +
      ") in epoch " + std::to_string(w.epoch + 1) + "/" + std::to_string(w.epochs) + ", step " +
      std::to_string(w.step_in_epoch + 1) + " of the epoch (optimizer step " + std::to_string(w.global_step + 1) +
      " of the run, lr " + c10::str(w.lr) + "): " +
      (deferred ? "stopped one step later (the check is read one step late, so the host never waits for the "
                  "device), before anything was saved with that update"
                : "stopped before that step's update") +
      "; no checkpoint was written" +
      (last_checkpoint.empty() ? std::string() : " (the last one, " + last_checkpoint.string() + ", is intact)") +
      ". Lower `lr` or check the data; `precision` fp16 skips such steps instead");
}

// ---- one epoch -------------------------------------------------------------------------------

EpochStats Trainer::Impl::train_epoch(int64_t epoch_index, profiler::Profiler& profiler, StopVote& vote) {
  const TrainOptions& o = options;
  const auto stat_options = at::TensorOptions().device(device);
  EpochState ep;
  ep.epoch = epoch_index;
  ep.batch_index = epoch_index == epoch ? batches_done : 0;  // micro-batches done in this epoch
  set_train_mode();
  train_sampler->set_epoch(epoch_index);  // DistributedSampler/RASampler.set_epoch, every epoch
  ep.lockstep_batches = lockstep_micro_batches();
  // A share of an epoch resumed on another world size ends the epoch at its step count.
  ep.step_in_epoch = resumed_step_offset(ep.lockstep_batches) + (ep.batch_index + o.accum_steps - 1) / o.accum_steps;
  // The epoch's crop side (progressive resizing), a resumed epoch's included, before its first batch.
  ep.stats.image_size = train_image_size(epoch_index);
  train_loader->set_image_size(ep.stats.image_size);
  // The profiler's epoch snapshot of the loader's counters first: start_epoch sets the workers
  // going at once, and a sample they finish before the snapshot would drop out of the epoch's count.
  profiler.begin_epoch(epoch_index);
  prefetcher->start_epoch(epoch_index, ep.batch_index);
  // The next epoch's side now: the loader plans that epoch ahead at the size set last, so it
  // starts decoded (progressive resizing changes the size at epoch starts).
  if (epoch_index + 1 < o.epochs) train_loader->set_image_size(train_image_size(epoch_index + 1));
  ep.stats.epoch = epoch_index;
  ep.loss_sum = at::zeros({1}, stat_options.dtype(at::kDouble));
  ep.correct = at::zeros({1}, stat_options.dtype(at::kLong));
  const int64_t steps = steps_per_epoch(), micro_per_epoch = ep.lockstep_batches;
  const auto t0 = Clock::now();
  while (ep.step_in_epoch < steps && ep.batch_index < micro_per_epoch) {
    train_step(ep, profiler);
    int local = stop_request.load();
    if (local == 0 && o.stop_flag) local = o.stop_flag->load();
    if (const int stop = vote.after_step(local); stop != 0) stopped = stop;
    const bool epoch_over = ep.step_in_epoch >= steps || ep.batch_index >= micro_per_epoch;
    if (stopped != 0) {
      write_checkpoint(epoch_over ? epoch_index + 1 : epoch_index, epoch_over ? 0 : ep.batch_index, /*on_stop=*/true);
      gpufeed::log_text(LogLevel::kWarn, "train: stop requested (" + std::to_string(stopped) +
                                             "): stopped after step " + std::to_string(global_step));
      break;
    }
    if (o.checkpoint_every_steps > 0 && global_step % o.checkpoint_every_steps == 0 && !epoch_over) {
      write_checkpoint(epoch_index, ep.batch_index);
    }
  }
  if (ep.stats.steps == 0 && stopped == 0) {
    throw std::runtime_error("train: epoch " + std::to_string(epoch_index + 1) + " took no optimizer step (" +
                             std::to_string(micro_per_epoch) + " micro-batches per epoch on this rank, " +
                             std::to_string(ep.batch_index) + " already consumed when it started)");
  }
  nonfinite_check.check(last_checkpoint);  // the epoch's last step, before its totals are read
  ep.stats.seconds = seconds_since(t0);
  profiler.end_epoch();
  finish_epoch(ep);
  return ep.stats;
}

// Loss, top-1, samples and skipped samples summed over all ranks.
void Trainer::Impl::finish_epoch(EpochState& ep) {
  EpochStats& st = ep.stats;
  const auto stat_options = at::TensorOptions().device(device);
  const auto skipped_here = static_cast<double>(train_loader->epoch_summary().skipped);
  at::Tensor totals = at::cat({ep.loss_sum, ep.correct.to(at::kDouble),
                               at::full({1}, static_cast<double>(st.samples), stat_options.dtype(at::kDouble)),
                               at::full({1}, skipped_here, stat_options.dtype(at::kDouble))});
  if (group) {
    std::vector<at::Tensor> t{totals};
    group->all_reduce_sum(t);
  }
  const at::Tensor tot = totals.cpu();
  const double samples = tot[2].item<double>();
  st.samples = static_cast<int64_t>(samples);
  st.skipped_samples = static_cast<int64_t>(tot[3].item<double>());
  st.loss = samples > 0 ? tot[0].item<double>() / samples : 0;
  st.top1 = samples > 0 ? tot[1].item<double>() / samples : 0;
  st.images_per_s = st.seconds > 0 ? samples / st.seconds : 0;
  st.data_wait_fraction = st.seconds > 0 ? ep.wait_s / st.seconds : 0;
  st.first_batch_wait_s = train_loader->epoch_summary().first_wait_s;
  st.loader_threads = train_loader->num_threads();
  st.auto_threads = train_loader->options().num_workers == loader::kAutoNumWorkers;
  const auto decisions = train_loader->thread_decisions();
  st.thread_decisions = decisions.empty() ? 0 : decisions.back().number + 1;
}

// The references' train_one_epoch: `if model_ema and i % args.model_ema_steps == 0:
// update_parameters(model); if epoch < args.lr_warmup_epochs: n_averaged.fill_(0)`, with i the
// step of the epoch (here optimizer steps; the references have no accumulation).
void Trainer::Impl::update_ema(int64_t epoch_index, int64_t step_in_epoch) {
  if (step_in_epoch % options.model_ema_steps != 0) return;
  ema->update(*model);
  if (static_cast<double>(epoch_index) < options.schedule.warmup_epochs) ema->reset();
}

// ---- one step ----------------------------------------------------------------------------------

// One optimizer step: accum_steps micro-batches (fewer at the end of an epoch), each loss
// weighted by its share of the step's samples, so the gradient is the whole step's mean.
void Trainer::Impl::train_step(EpochState& ep, profiler::Profiler& profiler) {
  StepState step;
  step.micro = std::min(options.accum_steps, ep.lockstep_batches - ep.batch_index);
  const int64_t mine = micro_batches();  // fewer than lockstep_batches: a resumed share ran out
  for (int64_t j = 0; j < step.micro && ep.batch_index + j < mine; ++j) step.samples += micro_batch_size(ep.batch_index + j);
  ep.stats.lr = schedule->lr(global_step);
  const std::optional<double> momentum = schedule->momentum(global_step);
  for (auto& g : optimizer->param_groups()) {
    auto& so = static_cast<torch::optim::SGDOptions&>(g.options());
    so.lr(ep.stats.lr);
    if (momentum) so.momentum(*momentum);
  }
  // The scale is read for on_step only: reading it is a host sync on CUDA.
  step.loss_scale = scaler && on_step ? scaler->get_scale() : 1.0;
  step.loss = at::zeros({1}, at::TensorOptions().device(device).dtype(at::kDouble));
  for (int64_t j = 0; j < step.micro; ++j) {
    if (ep.batch_index < mine) {
      train_micro_batch(ep, step, /*last=*/j + 1 == step.micro, profiler);
    } else {
      shadow_micro_batch(ep, step, /*last=*/j + 1 == step.micro);
    }
  }
  if (ema) update_ema(ep.epoch, ep.step_in_epoch);
  ++ep.stats.steps;
  ++ep.step_in_epoch;
  if (on_step) {
    StepStats& ss = step.stats;
    ss.epoch = ep.epoch;
    ss.step = global_step;
    ss.samples = step.samples;
    ss.loss = step.samples > 0 ? step.loss.item<double>() / static_cast<double>(step.samples) : 0;
    ss.lr = ep.stats.lr;
    ss.skipped = step.skipped;
    ss.loss_scale = step.loss_scale;
    on_step(ss);
  }
  ++global_step;
}

void Trainer::Impl::train_micro_batch(EpochState& ep, StepState& step, bool last, profiler::Profiler& profiler) {
  // Phase 1: data wait.
  profiler.step_begin();
  auto batch = prefetcher->next();
  if (!batch) throw std::runtime_error("train: the loader ended the epoch early");
  profiler.batch_ready({batch->wait_ms, batch->batch_index, static_cast<int64_t>(batch->skipped.size()),
                        batch->copy_begin, batch->copy_end});
  ep.wait_s += batch->wait_ms / 1000.0;
  const int64_t n = batch->labels.size(0);
  // MixUp/CutMix (keyed by seed, epoch, micro-batch, rank), then the batch transform hook.
  if (mixer) (*mixer)(batch->images, batch->labels, mix_key(options.loader.seed, ep.epoch, ep.batch_index, rank));
  if (hooks.batch_transform) hooks.batch_transform(batch->images, batch->labels);
  // Phase 2: forward + backward.
  auto [logits, loss] = forward_backward(*batch, step, last);
  profiler.phase_done(profiler::Phase::kForwardBackward);
  // Phase 3: all-reduce wait (DDP, last micro-batch only).
  if (last && ddp) ddp->finish_gradient_sync();
  profiler.phase_done(profiler::Phase::kAllReduce);
  // Phase 4: optimizer step (last micro-batch only).
  if (last) optimizer_step(ep, step, loss);
  profiler.phase_done(profiler::Phase::kOptimizer);
  {
    torch::NoGradGuard no_grad;
    const at::Tensor l = loss.detach().to(at::kDouble) * static_cast<double>(n);
    ep.loss_sum += l;
    step.loss += l;
    ep.correct += top1_hits(logits.detach(), batch->labels).sum();
  }
  if (on_step) step.stats.indices.insert(step.stats.indices.end(), batch->indices.begin(), batch->indices.end());
  ep.stats.samples += n;
  ++ep.batch_index;
  profiler.step_end(n);
}

// An epoch resumed on another world size gives the ranks shares that may differ by a sample, so
// a rank may run out a micro-batch before rank 0. It joins rank 0's remaining steps without data,
// as torch.distributed.algorithms.Join's shadow all-reduce does: its gradient (zeros, or what its
// earlier micro-batches of the step accumulated) goes into DDP's average over the world size (so
// the step's gradient is the sum over the ranks' samples divided by the world size, torch's
// divide_by_initial_world_size), and it takes the same update, so the replicas stay equal.
void Trainer::Impl::shadow_micro_batch(EpochState& ep, StepState& step, bool last) {
  ++ep.batch_index;
  if (!last) return;
  if (ddp) ddp->sync_without_backward();
  optimizer_step(ep, step, at::Tensor());
}

// Forward, loss and backward of one micro-batch. Gradient all-reduces start inside backward as
// DDP's buckets fill (not for the micro-batches before the last: no_sync). Returns the logits
// and the (unweighted, unscaled) loss.
std::pair<at::Tensor, at::Tensor> Trainer::Impl::forward_backward(prefetch::DeviceBatch& batch, StepState& step,
                                                                   bool last) {
  const int64_t n = batch.labels.size(0);
  at::Tensor logits, loss;
  std::optional<DistributedDataParallel::NoSync> no_sync;
  if (ddp && !last) no_sync.emplace(*ddp);
  if (ddp) ddp->pre_forward();
  {
    std::optional<AutocastGuard> autocast;
    if (amp()) autocast.emplace(device.type(), amp_dtype());
    logits = forward(batch.images);
    loss = cross_entropy(logits, batch.labels, options.label_smoothing);
  }
  if (!scaler) {  // fp32/bf16: remember a non-finite loss for the check before the update
    const at::Tensor bad = at::isfinite(loss.detach()).logical_not();
    step.nonfinite = step.nonfinite.defined() ? step.nonfinite.logical_or(bad) : bad;
  }
  at::Tensor objective = loss * (static_cast<double>(n) / static_cast<double>(step.samples));
  if (scaler) objective = scaler->scale(objective);
  objective.backward();
  return {logits, loss};
}

// The update at the end of a step. fp16: GradScaler unscales and checks the gradients, and
// skips the step on inf/NaN (backing the scale off). fp32/bf16: a non-finite loss stops the run
// before the update, so neither the model nor any checkpoint takes NaNs.
void Trainer::Impl::optimizer_step(EpochState& ep, StepState& step, const at::Tensor& last_loss) {
  bool update = true;
  if (scaler) {
    update = scaler->step_ok(params);
    if (!update) {
      step.skipped = true;
      ++ep.stats.skipped_steps;
    }
  } else if (step.nonfinite.defined()) {  // undefined: no micro-batch of this rank (shadow_micro_batch)
    nonfinite_check.record(step.nonfinite, last_loss,
                           {ep.epoch, options.epochs, ep.step_in_epoch, global_step, ep.stats.lr}, last_checkpoint);
  }
  if (update) {
    // Gradient clipping, then the gradient transform hook, on complete, unscaled gradients.
    if (options.clip_grad_norm > 0) clip_grad_norm(params, options.clip_grad_norm);
    if (hooks.gradient_transform) hooks.gradient_transform(params);
    optimizer->step();
  }
  if (scaler) scaler->update();
  optimizer->zero_grad(/*set_to_none=*/true);
  // Hook point: post-step (EMA).
  if (update && hooks.post_step) hooks.post_step(global_step);
}

}  // namespace gpufeed::harness
