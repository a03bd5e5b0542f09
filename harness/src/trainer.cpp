// The Trainer: building a run (options, devices and the process group, data, model, optimizer,
// schedule), resuming it, its accessors and fit(). One step and one epoch are in train_step.cpp,
// evaluation in validation.cpp, the checkpoint's entries in train_checkpoint.cpp.
#include "gpufeed/harness/trainer.h"

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <cmath>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "gpufeed/cpu_budget.h"
#include "gpufeed/harness/checkpoint.h"
#include "gpufeed/harness/recipe.h"
#include "gpufeed/harness/sync_batch_norm.h"
#include "gpufeed/harness/train_checkpoint.h"
#include "gpufeed/log_text.h"
#include "gpufeed/sampler/ra_sampler.h"
#include "gpufeed/loader/rank_sampler.h"
#include "trainer_impl.h"

namespace gpufeed::harness {
namespace fs = std::filesystem;
namespace {

// A ResNet of these options that leaves the global RNG where it was (structure only: its
// weights are overwritten by whatever it replicates or averages).
ResNet make_resnet_keeping_rng(const ResNetOptions& options, bool channels_last) {
  auto gen = at::globalContext().defaultGenerator(c10::Device(c10::kCPU));
  at::Tensor state;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    state = gen.get_state();
  }
  ResNet r = make_resnet(options);
  if (channels_last) to_channels_last(*r);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
  return r;
}

// An epoch without a single optimizer step trains nothing: refuse the run, naming why.
[[noreturn]] void refuse_stepless_epoch(const TrainOptions& o, int64_t images, int world, int64_t per_rank, bool forced_drop) {
  throw std::invalid_argument(
      "Trainer: an epoch would take no optimizer step: " + o.data.string() + " has " + std::to_string(images) +
      " images; world size " + std::to_string(world) + " gives each rank " + std::to_string(per_rank) +
      " (DistributedSampler pads to a multiple of the world size), and batch size " +
      std::to_string(o.loader.batch_size) + " with drop_last " +
      (forced_drop ? "(turned on because the only batch would hold 1 sample, which BatchNorm cannot train on)"
                   : (o.loader.drop_last ? "on" : "off")) +
      " leaves 0 batches. Use a smaller `batch_size`, fewer ranks or more images" +
      (forced_drop ? std::string(", or `freeze_bn`") : std::string()));
}

}  // namespace

std::optional<fs::path> path_for_rank(const fs::path& path, int rank) {
  std::string s = path.string();
  const auto pos = s.find("{rank}");
  if (pos == std::string::npos) return rank == 0 ? std::optional<fs::path>(path) : std::nullopt;
  s.replace(pos, 6, std::to_string(rank));
  return fs::path(s);
}

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::kFloat32;
  if (name == "bf16") return Precision::kBFloat16;
  if (name == "fp16") return Precision::kFloat16;
  throw std::invalid_argument("unknown precision '" + name + "' (fp32, bf16, fp16)");
}

std::string precision_name(Precision precision) {
  switch (precision) {
    case Precision::kFloat32:
      return "fp32";
    case Precision::kBFloat16:
      return "bf16";
    case Precision::kFloat16:
      return "fp16";
  }
  return "?";
}

DistributedMode parse_distributed_mode(const std::string& name) {
  if (name == "auto") return DistributedMode::kAuto;
  if (name == "on") return DistributedMode::kOn;
  if (name == "off") return DistributedMode::kOff;
  throw std::invalid_argument("unknown distributed mode '" + name + "' (auto, on, off)");
}

DistBackend parse_dist_backend(const std::string& name) {
  if (name == "auto") return DistBackend::kAuto;
  if (name == "nccl") return DistBackend::kNccl;
  if (name == "gloo") return DistBackend::kGloo;
  throw std::invalid_argument("unknown distributed backend '" + name + "' (auto, nccl, gloo)");
}

std::string dist_backend_name(DistBackend backend) {
  switch (backend) {
    case DistBackend::kAuto:
      return "auto";
    case DistBackend::kNccl:
      return "nccl";
    case DistBackend::kGloo:
      return "gloo";
  }
  return "?";
}

// ---- small helpers of the run ----------------------------------------------------------------

loader::LoaderOptions Trainer::Impl::loader_options(bool train) const {
  loader::LoaderOptions lo = options.loader;
  if (train) {
    // The first epoch's side; the slots hold the largest side of any epoch (progressive resizing:
    // train_epoch sets each epoch's before starting it).
    lo.transform.kind = transforms::TransformOptions::Kind::kTrain;
    lo.transform.rrc.size = train_image_size(0);
    for (int64_t e = 0; e < options.epochs; ++e) lo.max_image_size = std::max(lo.max_image_size, train_image_size(e));
  } else {
    // torchvision's eval transform at the validation sizes; no augmentation, every batch kept.
    const int crop = options.val_crop_size > 0 ? options.val_crop_size : options.loader.transform.rrc.size;
    lo.transform = transforms::TransformOptions::imagenet(transforms::TransformOptions::Kind::kEval, crop);
    if (options.val_resize_size > 0) lo.transform.eval.resize = options.val_resize_size;
    lo.drop_last = false;
    lo.max_image_size = 0;
    lo.prefetch_next_epoch = false;  // a validation loader runs one epoch
  }
  return lo;
}

int Trainer::Impl::train_image_size(int64_t e) const {
  return options.schedule.resolution ? get_resolution(*options.schedule.resolution, e) : options.loader.transform.rrc.size;
}

int64_t Trainer::Impl::steps_per_epoch() const {
  int64_t s = (full_micro_batches + options.accum_steps - 1) / options.accum_steps;
  if (options.max_steps_per_epoch > 0) s = std::min(s, options.max_steps_per_epoch);
  return s;
}

int64_t Trainer::Impl::micro_batch_size(int64_t b) const {
  return std::min<int64_t>(options.loader.batch_size, train_sampler->size() - b * options.loader.batch_size);
}

void Trainer::Impl::set_train_mode() {
  model->train();
  if (options.freeze_bn) {
    for (const auto& mod : model->modules(/*include_self=*/false)) {
      if (auto* bn = dynamic_cast<torch::nn::BatchNorm2dImpl*>(mod.get())) bn->eval();
    }
  }
}

// ---- building ----------------------------------------------------------------------------------

// Distributed? torchrun's or Slurm's environment, or neither; then the device, and the process
// group when distributed.
void Trainer::Impl::setup_devices() {
  const TrainOptions& o = options;
  std::optional<DistEnv> env;
  if (o.distributed != DistributedMode::kOff) {
    env = detect_dist_env();
    if (env && o.distributed == DistributedMode::kAuto && env->source == "slurm" && env->world_size == 1) env.reset();
    if (!env && o.distributed == DistributedMode::kOn) {
      throw std::invalid_argument("Trainer: `distributed` on, but neither torchrun's (RANK, WORLD_SIZE) "
                                  "nor Slurm's (SLURM_PROCID, SLURM_NTASKS) environment is set");
    }
  }
  std::string name = o.device;
  if (env) {
    if (!o.dp_devices.empty()) throw std::invalid_argument("Trainer: DataParallel (`devices`) and a distributed run do not combine");
    if (name == "cuda") name = "cuda:" + std::to_string(env->local_rank);
  } else if (name == "cuda") {
    name = "cuda:0";
  }
  if (!o.dp_devices.empty()) name = o.dp_devices.front();
  try {
    device = c10::Device(name);
  } catch (const c10::Error&) {
    throw std::invalid_argument("Trainer: device '" + name + "' is not cpu, cuda or cuda:N");
  }
  if (device.is_cuda()) {
    if (!prefetch::cuda_available()) throw std::runtime_error("Trainer: " + name + " asked for, but no CUDA device is available");
    c10::impl::getDeviceGuardImpl(c10::kCUDA)->setDevice(device);
    if (o.cudnn_benchmark) at::globalContext().setBenchmarkCuDNN(true);
  }
  if (env) {
    ProcessGroupOptions po;
    po.backend = dist_backend_name(o.dist_backend);
    po.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.dist_timeout_s * 1000));
    group = ProcessGroup::create(*env, device, po);
    rank = group->rank();
    world = group->size();
  }
}

void Trainer::Impl::build_data() {
  const TrainOptions& o = options;
  train_set = datasets::open_dataset(o.data, o.index_cache);
  if (o.ra_sampler) {
    sampler::RASamplerOptions ra;  // the references' RASampler: shuffled, seed + epoch
    ra.num_replicas = world;
    ra.rank = rank;
    ra.seed = o.loader.seed;
    ra.repetitions = o.ra_reps;
    train_sampler = std::make_shared<sampler::RASampler>(train_set->size(), ra);
    if (train_sampler->size() == 0) {
      throw std::invalid_argument("Trainer: `ra_sampler` keeps floor(n // 256 * 256 / world size) images per rank "
                                  "and epoch (the torchvision references' RASampler): " + o.data.string() + " has " +
                                  std::to_string(train_set->size()) + " images, world size " + std::to_string(world) +
                                  ", which gives 0. Use DistributedSampler (no `ra_sampler`) for fewer than 256 images");
    }
  } else {
    sampler::DistributedSamplerOptions so;  // torch's DistributedSampler: shuffled, seed + epoch
    so.num_replicas = world;
    so.rank = rank;
    so.seed = o.loader.seed;
    // DistributedSampler's order, or the shard-aware one (`shuffle_order`, rank_sampler.h).
    resumable = loader::make_rank_sampler(*train_set, o.loader, so, o.data.string());
    shuffle_order = loader::resolve_shuffle_order(*train_set, o.loader.shuffle_order, o.data.string());
    train_sampler = resumable;
  }
  if (o.val_data) {  // before any training, not after the first epoch
    val_set = datasets::open_dataset(*o.val_data, o.index_cache);
    check_same_classes(*val_set, *o.val_data, *train_set, o.data);
  }
  const bool forced_drop = !o.loader.drop_last && !o.freeze_bn && train_sampler->size() % o.loader.batch_size == 1;
  if (forced_drop) {
    options.loader.drop_last = true;
    gpufeed::log_text(LogLevel::kWarn,
                      "train: each rank's last batch would hold 1 sample (" +
                          std::to_string(train_sampler->size()) + " samples per rank, batch " +
                          std::to_string(o.loader.batch_size) +
                          "), which BatchNorm cannot train on: dropping it every epoch (drop_last)");
  }
  train_loader = std::make_shared<loader::Loader>(train_set, train_sampler, loader_options(true),
                                                  prefetch::host_allocator_for(device));
  full_micro_batches = train_loader->num_batches();
  if (steps_per_epoch() == 0) {
    TrainOptions asked = o;
    asked.loader.drop_last = o.loader.drop_last && !forced_drop;
    refuse_stepless_epoch(asked, train_set->size(), world, train_sampler->size(), forced_drop);
  }
  prefetch_options.device = device;
  prefetch_options.channels_last = o.channels_last;
  if (amp() && device.is_cuda()) prefetch_options.dtype = amp_dtype();  // half the H2D traffic
  prefetcher = prefetch::make_prefetcher(train_loader, prefetch_options);
}

void Trainer::Impl::build_model() {
  const TrainOptions& o = options;
  torch::manual_seed(o.loader.seed);
  resnet_options.arch = o.arch;
  resnet_options.num_classes = static_cast<int64_t>(train_set->classes().size());
  resnet_options.zero_init_residual = o.zero_init_residual;
  model = make_resnet(resnet_options);
  if (o.init_weights) {
    LoadStateDictOptions lo;
    lo.exclude = o.init_weights_exclude;
    lo.skip_mismatched_shapes = o.init_weights_skip_mismatched;
    load_state_dict(*model, *o.init_weights, lo);
  }
  model->to(device);
  if (o.channels_last) to_channels_last(*model);
  if (o.activation_checkpointing) {
    model->set_activation_checkpointing(true);
    gpufeed::log_text(LogLevel::kInfo, "activation checkpointing: layer1..layer4 recompute their activations in backward");
  }
  if (o.sync_bn) {
    const int64_t layers = convert_sync_batchnorm(*model, world > 1 ? group : nullptr);
    gpufeed::log_text(LogLevel::kInfo, "SyncBatchNorm: " + std::to_string(layers) + " layers" +
                                           (world > 1 ? " synchronised over " + std::to_string(world) + " ranks"
                                                      : " (one process: plain BatchNorm2d statistics)"));
  }
  if (o.model_ema) {
    ema_model = make_resnet_keeping_rng(resnet_options, o.channels_last);
    ema_model->to(device);
    ema_model->eval();
    ema = std::make_unique<ModelEma>(
        ema_model.ptr(), adjusted_ema_decay(o.model_ema_decay, world, o.loader.batch_size * o.accum_steps, o.model_ema_steps, o.epochs));
    ema->update(*model);  // AveragedModel starts as a copy of the model, n_averaged 0
    ema->reset();
  }
  if (o.mixup_alpha > 0 || o.cutmix_alpha > 0) mixer.emplace(MixUpCutMixOptions{o.mixup_alpha, o.cutmix_alpha, resnet_options.num_classes});
}

// SGD over the references' parameter groups (recipe.h, weight_decay_groups: other, norm, bias).
// fp16 adds the GradScaler.
void Trainer::Impl::build_optimizer() {
  const TrainOptions& o = options;
  std::optional<double> norm_wd = o.norm_weight_decay, bias_wd = o.bias_weight_decay;
  if (o.no_decay_norm_bias) {
    norm_wd = norm_wd.value_or(0.0);
    bias_wd = bias_wd.value_or(0.0);
  }
  const double lr = scaled_lr();
  std::vector<torch::optim::OptimizerParamGroup> groups;
  params.clear();
  for (WeightDecayGroup& g : weight_decay_groups(*model, o.weight_decay, norm_wd, bias_wd)) {
    groups.emplace_back(g.params, std::make_unique<torch::optim::SGDOptions>(
                                      torch::optim::SGDOptions(lr).momentum(o.momentum).nesterov(o.nesterov).weight_decay(
                                          g.weight_decay)));
    params.insert(params.end(), g.params.begin(), g.params.end());
  }
  optimizer = std::make_unique<torch::optim::SGD>(groups, torch::optim::SGDOptions(lr).momentum(o.momentum));
  if (o.precision == Precision::kFloat16) scaler = std::make_unique<GradScaler>(device, o.grad_scaler);
}

// The schedule's plan for this run's options: per optimizer step, over epochs x `spe` steps
// (steps_per_epoch(); another world size's when checking a checkpoint's plan).
LrScheduleOptions Trainer::Impl::schedule_options(double base_lr, int64_t spe) const {
  const TrainOptions& o = options;
  LrScheduleOptions so;
  so.kind = o.schedule.lr_schedule;
  so.base_lr = base_lr;
  so.warmup_steps = static_cast<int64_t>(std::lround(o.schedule.warmup_epochs * static_cast<double>(spe)));
  so.total_steps = o.epochs * spe;
  so.warmup_start_factor = o.schedule.warmup_start_factor;
  so.step_size = std::max<int64_t>(1, std::lround(o.schedule.lr_step_epochs * static_cast<double>(spe)));
  for (double e : o.schedule.lr_milestones) so.milestones.push_back(std::lround(e * static_cast<double>(spe)));
  so.gamma = o.schedule.lr_gamma;
  so.min_lr = o.schedule.min_lr;
  so.pct_start = o.schedule.onecycle_pct_start;
  so.div_factor = o.schedule.onecycle_div_factor;
  so.final_div_factor = o.schedule.onecycle_final_div_factor;
  so.cycle_momentum = o.momentum > 0;
  so.steps_per_epoch = spe;
  so.peak_epoch = o.schedule.lr_peak_epoch;
  return so;
}

// Validates the plan at start-up (LrSchedule's checks), naming the run's size in steps.
void Trainer::Impl::plan_schedule(double base_lr) {
  const LrScheduleOptions so = schedule_options(base_lr, steps_per_epoch());
  try {
    schedule.emplace(so);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument("Trainer: learning-rate schedule for " + std::to_string(options.epochs) +
                                " epochs x " + std::to_string(steps_per_epoch()) +
                                " optimizer steps per epoch = " + std::to_string(so.total_steps) +
                                " steps (warmup " + std::to_string(so.warmup_steps) + "): " + e.what());
  }
}

void Trainer::Impl::wrap_parallel() {
  const TrainOptions& o = options;
  if (group) {
    DdpOptions ddp_options;
    ddp_options.bucket_cap_bytes = o.ddp_bucket_mb << 20;
    ddp = std::make_unique<DistributedDataParallel>(model.ptr(), group, ddp_options);
    return;
  }
  if (o.dp_devices.empty()) return;
  std::vector<c10::Device> devices;
  for (const auto& d : o.dp_devices) devices.emplace_back(d);
  ResNetOptions ro = resnet_options;
  const bool cl = o.channels_last;
  dp = std::make_unique<DataParallel>(
      model.ptr(), [ro, cl]() -> std::shared_ptr<torch::nn::Module> { return make_resnet_keeping_rng(ro, cl).ptr(); },
      devices,
      [](torch::nn::Module& mod, const at::Tensor& x) { return static_cast<ResNetImpl&>(mod).forward(x); });
}

void Trainer::Impl::log_setup(double lr) const {
  const TrainOptions& o = options;
  std::string parallel = "1 process";
  if (group) parallel = "DDP world " + std::to_string(world) + " (" + group->backend() + ")";
  if (dp) parallel = "DataParallel over " + std::to_string(o.dp_devices.size()) + " devices";
  gpufeed::log_text(
      LogLevel::kInfo,
      c10::str("train: ", o.arch, " on ", device.str(), ", ", parallel, " (", train_set->size(),
               " images, ", resnet_options.num_classes, " classes); lr ", o.lr, " per 256 x global batch ",
               global_batch(), " (", o.loader.batch_size, " x ", o.accum_steps, " accum x ", world,
               " ranks) = ", lr, "; schedule ", lr_schedule_kind_name(o.schedule.lr_schedule), ", warmup ",
               o.schedule.warmup_epochs, " epochs; precision ", precision_name(o.precision),
               o.channels_last ? ", channels_last" : "", o.val_flip_average ? ", validation flip-averaged" : "",
               o.ra_sampler ? c10::str(", RASampler x", o.ra_reps, " (", train_sampler->size(), " samples per rank)") : "",
               mixer ? c10::str(", mixup_alpha ", o.mixup_alpha, " cutmix_alpha ", o.cutmix_alpha) : "",
               ema ? c10::str(", EMA every ", o.model_ema_steps, " steps, decay ", ema->decay()) : "",
               device.is_cuda() && o.cudnn_benchmark ? ", cudnn.benchmark" : ""));
  if (o.loader.transform.augment.enabled()) gpufeed::log_text(LogLevel::kInfo, "train: augment " + transforms::to_string(o.loader.transform.augment));
  if (o.schedule.resolution) {
    // "image size 160 (epochs 1-71), 192 (epochs 72-88)": 1-based, as the epoch lines.
    std::string sizes;
    for (int64_t e = 0; e < o.epochs;) {
      const int side = train_image_size(e);
      int64_t last = e;
      while (last + 1 < o.epochs && train_image_size(last + 1) == side) ++last;
      sizes += c10::str(sizes.empty() ? "" : ", ", side, " (epoch", last > e ? "s " : " ", e + 1,
                        last > e ? c10::str("-", last + 1) : "", ")");
      e = last + 1;
    }
    gpufeed::log_text(LogLevel::kInfo,
                      c10::str("train: progressive resizing (FFCV's get_resolution: min_res ", o.schedule.resolution->min_res,
                               ", max_res ", o.schedule.resolution->max_res, ", start_ramp ", o.schedule.resolution->start_ramp,
                               ", end_ramp ", o.schedule.resolution->end_ramp, "): image size ", sizes));
  }
}

Trainer::Trainer(TrainOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.options = std::move(options);
  m.options.validate();  // the schema's rules (train_options.cpp); the rest need the run
  m.setup_devices();
  m.build_data();
  m.build_model();
  m.build_optimizer();
  m.plan_schedule(m.scaled_lr());
  if (m.options.resume) m.resume_from(*m.options.resume);
  m.wrap_parallel();
  m.log_setup(m.scaled_lr());
}

// ---- the public interface ------------------------------------------------------------------------

Trainer::~Trainer() = default;

double Trainer::Impl::scaled_lr() const { return options.lr * static_cast<double>(global_batch()) / 256.0; }
int64_t Trainer::Impl::global_batch() const { return options.loader.batch_size * options.accum_steps * world; }

ResNet& Trainer::model() { return impl_->model; }
const ModelEma* Trainer::model_ema() const { return impl_->ema.get(); }
double Trainer::scaled_lr() const { return impl_->scaled_lr(); }
int64_t Trainer::global_batch() const { return impl_->global_batch(); }
int64_t Trainer::num_classes() const {
  return static_cast<int64_t>(impl_->train_set->classes().size());
}
int Trainer::rank() const { return impl_->rank; }
int Trainer::world_size() const { return impl_->world; }
std::string Trainer::device() const { return impl_->device.str(); }
const profiler::RunProfile& Trainer::profile() const { return impl_->profile; }
void Trainer::set_step_callback(std::function<void(const StepStats&)> on_step) {
  impl_->on_step = std::move(on_step);
}
void Trainer::set_step_hooks(StepHooks hooks) { impl_->hooks = std::move(hooks); }
void Trainer::request_stop(int reason) noexcept { impl_->stop_request.store(reason == 0 ? 1 : reason); }
int Trainer::stopped() const { return impl_->stopped; }
fs::path Trainer::last_checkpoint() const { return impl_->last_checkpoint; }

// What the profiler needs to know about the run (profiler.h).
profiler::RunInfo Trainer::Impl::run_info() const {
  const TrainOptions& o = options;
  profiler::RunInfo run;
  run.device = device.str();
  run.model = o.arch;
  run.epochs = o.epochs;
  run.steps_per_epoch = steps_per_epoch() * o.accum_steps;  // the profiler counts micro-batches
  run.batch_size = o.loader.batch_size;
  run.hardware_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  run.cpu_budget = gpufeed::cpu_budget();
  run.num_workers = o.loader.num_workers > 0 ? o.loader.num_workers : run.cpu_budget;
  run.prefetch_depth = o.loader.prefetch_depth == loader::kAutoPrefetchDepth ? loader::kAutoPrefetchStart
                                                                             : o.loader.prefetch_depth;
  run.image_size = train_image_size(epoch);  // the first epoch this fit() trains
  run.allreduce = ddp != nullptr;  // else the all-reduce phase is recorded as zero-length
  return run;
}

std::vector<EpochStats> Trainer::fit(const std::function<void(const EpochStats&)>& on_epoch) {
  Impl& m = *impl_;
  const TrainOptions& o = m.options;
  StopVote vote(m.group.get(), m.device);
  m.stopped = 0;
  std::vector<EpochStats> history;
  profiler::ProfileOptions profile = o.profile;
  if (m.device.is_cuda()) profile.current_stream = [d = m.device] { return prefetch::current_stream(d); };
  profiler::Profiler profiler(std::move(profile), m.run_info(), m.train_loader.get());
  if (o.steps_started) o.steps_started->store(true);
  for (int64_t epoch = m.epoch; epoch < o.epochs && m.stopped == 0; ++epoch) {
    EpochStats st = m.train_epoch(epoch, profiler, vote);
    if (m.stopped == 0) {
      if (o.val_data) {
        const EvalStats ev = evaluate(*o.val_data);
        st.val_loss = ev.loss;
        st.val_top1 = ev.top1;
        st.val_top5 = ev.top5;
        if (m.ema) {
          const EvalStats ee = m.evaluate(*o.val_data, /*use_ema=*/true);
          st.ema_val_loss = ee.loss;
          st.ema_val_top1 = ee.top1;
          st.ema_val_top5 = ee.top5;
        }
      }
      m.epoch = epoch + 1;
      m.batches_done = 0;
      m.write_checkpoint(epoch + 1, 0);
    }
    history.push_back(st);
    if (on_epoch) on_epoch(st);
  }
  m.profile = profiler.finish();
  m.nonfinite_check.check(m.last_checkpoint);
  if (o.checkpoint && m.stopped == 0) {
    if (const std::optional<fs::path> path = path_for_rank(*o.checkpoint, m.rank)) {
      save_state_dict(*m.model, *path);
      gpufeed::log_text(LogLevel::kInfo, "train: wrote state_dict to " + path->string());
    }
  }
  return history;
}

}  // namespace gpufeed::harness
