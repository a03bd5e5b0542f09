#include "gpufeed/harness/trainer.h"

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <unordered_set>

#include "gpufeed/harness/checkpoint.h"
#include "gpufeed/harness/data_parallel.h"
#include "gpufeed/harness/distributed.h"
#include "gpufeed/harness/torch_file.h"
#include "gpufeed/log_text.h"
#include "gpufeed/prefetch/prefetcher.h"

namespace gpufeed::harness {
namespace fs = std::filesystem;
namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kCheckpointFormat = "gpufeed.train_checkpoint";

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Correct predictions among the top k logits, for k = 1 and 5, per sample (bool [N] each).
std::pair<at::Tensor, at::Tensor> topk_hits(const at::Tensor& logits, const at::Tensor& labels) {
  const int64_t k = std::min<int64_t>(5, logits.size(1));
  const at::Tensor top = std::get<1>(logits.topk(k, 1));
  const at::Tensor hits = top.eq(labels.view({-1, 1}));
  return {hits.select(1, 0), hits.any(1)};
}

std::string replace_rank(const fs::path& p, int rank) {
  std::string s = p.string();
  const auto pos = s.find("{rank}");
  if (pos != std::string::npos) s.replace(pos, 6, std::to_string(rank));
  return s;
}

const c10::IValue& at_key(const c10::impl::GenericDict& d, const std::string& key, const std::string& file) {
  auto it = d.find(key);
  if (it == d.end()) throw std::runtime_error(file + ": training checkpoint has no '" + key + "' entry");
  return it->value();
}

c10::impl::GenericDict new_dict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
}

// A value of the checkpoint's "scheduler" entry as text, for comparing plans and naming changes.
std::string field_text(const c10::IValue& v) {
  if (v.isDouble()) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", v.toDouble());
    return buf;
  }
  if (v.isInt()) return std::to_string(v.toInt());
  if (v.isBool()) return v.toBool() ? "true" : "false";
  if (v.isString()) return v.toStringRef();
  if (v.isList()) {
    std::string s = "[";
    for (const auto& e : v.toList()) s += (s.size() > 1 ? ", " : "") + field_text(c10::IValue(e));
    return s + "]";
  }
  std::ostringstream os;
  os << v;
  return os.str();
}

std::string short_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

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
  int after_step(int local) {
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

 private:
  void launch(int local) {
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

  ProcessGroup* group_;
  c10::Device device_;
  std::unique_ptr<ProcessGroup::Pending> pending_;
  std::unique_ptr<c10::Event> event_;
  at::Tensor host_;
};

}  // namespace

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::kFloat32;
  if (name == "bf16") return Precision::kBFloat16;
  if (name == "fp16") return Precision::kFloat16;
  throw std::invalid_argument("unknown precision '" + name + "' (fp32, bf16, fp16)");
}

struct Trainer::Impl {
  TrainOptions options;
  c10::Device device{c10::kCPU};
  std::shared_ptr<ProcessGroup> group;  // distributed runs only
  int rank = 0, world = 1;
  std::shared_ptr<loader::Dataset> train_set;
  std::shared_ptr<loader::Dataset> val_set;  // options.val_data, listed and checked once at start
  std::shared_ptr<sampler::DistributedSampler> train_sampler;
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
  std::optional<LrSchedule> schedule;  // planned at construction
  // Where training resumes: epoch, micro-batches of it already trained on, optimizer steps.
  int64_t epoch = 0, batches_done = 0, global_step = 0;
  std::function<void(const StepStats&)> on_step;
  std::atomic<int> stop_request{0};
  int stopped = 0;
  fs::path last_checkpoint;
  RunProfile profile;  // of the last fit()

  bool amp() const { return options.precision != Precision::kFloat32; }
  c10::ScalarType amp_dtype() const {
    return options.precision == Precision::kFloat16 ? c10::kHalf : c10::kBFloat16;
  }
  bool main_rank() const { return rank == 0; }

  loader::LoaderOptions loader_options(bool train) const {
    loader::LoaderOptions lo;
    lo.batch_size = options.batch_size;
    lo.num_workers = options.workers;
    lo.prefetch_depth = options.prefetch_depth;
    lo.seed = options.seed;
    lo.drop_last = train && options.drop_last;
    lo.error_policy = options.error_policy;
    lo.max_skips = options.max_skips;
    lo.transform = loader::TransformOptions::imagenet(
        train ? loader::TransformOptions::Kind::kTrain : loader::TransformOptions::Kind::kEval,
        options.image_size);
    return lo;
  }

  // Micro-batches per epoch on this rank, optimizer steps per epoch, samples in micro-batch b.
  int64_t micro_batches() const { return train_loader->num_batches(); }
  int64_t steps_per_epoch() const {
    int64_t s = (micro_batches() + options.accum_steps - 1) / options.accum_steps;
    if (options.max_steps_per_epoch > 0) s = std::min(s, options.max_steps_per_epoch);
    return s;
  }
  int64_t micro_batch_size(int64_t b) const {
    return std::min<int64_t>(options.batch_size, train_sampler->size() - b * options.batch_size);
  }

  // The schedule's plan for this run: per optimizer step, over epochs x steps_per_epoch().
  LrScheduleOptions schedule_options(double base_lr) const {
    const TrainOptions& o = options;
    const int64_t spe = steps_per_epoch();
    LrScheduleOptions so;
    so.kind = o.lr_schedule;
    so.base_lr = base_lr;
    so.warmup_steps = static_cast<int64_t>(std::lround(o.warmup_epochs * static_cast<double>(spe)));
    so.total_steps = o.epochs * spe;
    so.warmup_start_factor = o.warmup_start_factor;
    so.step_size = std::max<int64_t>(1, std::lround(o.lr_step_epochs * static_cast<double>(spe)));
    for (double e : o.lr_milestones) so.milestones.push_back(std::lround(e * static_cast<double>(spe)));
    so.gamma = o.lr_gamma;
    so.min_lr = o.min_lr;
    so.pct_start = o.onecycle_pct_start;
    so.div_factor = o.onecycle_div_factor;
    so.final_div_factor = o.onecycle_final_div_factor;
    so.cycle_momentum = o.momentum > 0;
    return so;
  }

  // Validates the plan at start-up (LrSchedule's checks), naming the run's size in steps.
  void plan_schedule(double base_lr) {
    const LrScheduleOptions so = schedule_options(base_lr);
    try {
      schedule.emplace(so);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument("Trainer: learning-rate schedule for " + std::to_string(options.epochs) +
                                  " epochs x " + std::to_string(steps_per_epoch()) +
                                  " optimizer steps per epoch = " + std::to_string(so.total_steps) +
                                  " steps (warmup " + std::to_string(so.warmup_steps) + "): " + e.what());
    }
  }

  // The "scheduler" entry of the training checkpoint: progress and the whole plan.
  c10::impl::GenericDict schedule_state() const {
    const LrScheduleOptions& so = schedule->options();
    auto d = new_dict();
    d.insert("kind", lr_schedule_kind_name(so.kind));
    d.insert("last_step", global_step);
    d.insert("total_steps", so.total_steps);
    d.insert("epochs", options.epochs);
    d.insert("steps_per_epoch", steps_per_epoch());
    d.insert("base_lr", so.base_lr);
    d.insert("warmup_steps", so.warmup_steps);
    d.insert("warmup_start_factor", so.warmup_start_factor);
    d.insert("step_size", so.step_size);
    auto milestones = c10::impl::GenericList(c10::AnyType::get());
    for (int64_t m : so.milestones) milestones.push_back(m);
    d.insert("milestones", milestones);
    d.insert("gamma", so.gamma);
    d.insert("min_lr", so.min_lr);
    d.insert("pct_start", so.pct_start);
    d.insert("div_factor", so.div_factor);
    d.insert("final_div_factor", so.final_div_factor);
    d.insert("cycle_momentum", so.cycle_momentum);
    return d;
  }

  // Resuming onto another schedule plan (e.g. more --epochs) would move the learning rate from
  // where the saved run had it. Names what changed and the next step's rate on both plans;
  // refuses unless resume_replan_schedule, else logs it and continues on this run's plan.
  void check_resumed_schedule(const c10::impl::GenericDict& saved, int64_t step, const std::string& file) const {
    const c10::impl::GenericDict now = schedule_state();
    std::string changed;
    for (const auto& kv : now) {
      const std::string& key = kv.key().toStringRef();
      auto it = saved.find(key);
      if (key == "last_step" || it == saved.end()) continue;  // older checkpoints have fewer fields
      const std::string was = field_text(it->value()), is = field_text(kv.value());
      if (was != is) changed += (changed.empty() ? "" : ", ") + key + " " + was + " -> " + is;
    }
    if (changed.empty()) return;
    // The saved run's rate for `step`, when the file has its whole plan.
    std::string before;
    try {
      LrScheduleOptions so = schedule->options();
      so.kind = parse_lr_schedule_kind(saved.at("kind").toStringRef());
      so.total_steps = saved.at("total_steps").toInt();
      so.base_lr = saved.at("base_lr").toDouble();
      so.warmup_steps = saved.at("warmup_steps").toInt();
      so.warmup_start_factor = saved.at("warmup_start_factor").toDouble();
      so.step_size = saved.at("step_size").toInt();
      so.milestones.clear();
      for (const auto& m : saved.at("milestones").toList()) so.milestones.push_back(c10::IValue(m).toInt());
      so.gamma = saved.at("gamma").toDouble();
      so.min_lr = saved.at("min_lr").toDouble();
      so.pct_start = saved.at("pct_start").toDouble();
      so.div_factor = saved.at("div_factor").toDouble();
      so.final_div_factor = saved.at("final_div_factor").toDouble();
      so.cycle_momentum = saved.at("cycle_momentum").toBool();
      before = " (the saved plan: " + short_number(LrSchedule(so).lr(step)) + ")";
    } catch (const std::exception&) {
      before = "";  // a checkpoint from before the plan was saved
    }
    const LrScheduleOptions& so = schedule->options();
    const std::string what = "the learning-rate schedule differs from the saved run's: " + changed +
                             ". Re-planned, the " + lr_schedule_kind_name(so.kind) + " schedule runs over " +
                             std::to_string(so.total_steps) + " steps (warmup " +
                             std::to_string(so.warmup_steps) + ") and step " + std::to_string(step) +
                             " continues at lr " + short_number(schedule->lr(step)) + before;
    if (!options.resume_replan_schedule) {
      throw std::invalid_argument(file + ": cannot resume: " + what +
                                  ". Pass --resume-replan-schedule (TrainOptions::resume_replan_schedule) "
                                  "to continue on the new plan, or resume with the saved run's options");
    }
    gpufeed::log_text(LogLevel::kWarn, "train: " + file + ": " + what + " (--resume-replan-schedule)");
  }

  void set_train_mode() {
    model->train();
    if (options.freeze_bn) {
      for (const auto& mod : model->modules(/*include_self=*/false)) {
        if (auto* bn = dynamic_cast<torch::nn::BatchNorm2dImpl*>(mod.get())) bn->eval();
      }
    }
  }

  at::Tensor forward(const at::Tensor& x) { return dp ? dp->forward(x) : model->forward(x); }

  c10::IValue optimizer_state() const {
    auto state = c10::impl::GenericDict(c10::IntType::get(), c10::AnyType::get());
    auto groups = c10::impl::GenericList(c10::AnyType::get());
    int64_t index = 0;
    for (const auto& g : optimizer->param_groups()) {
      const auto& so = static_cast<const torch::optim::SGDOptions&>(g.options());
      auto gd = new_dict();
      gd.insert("lr", so.lr());
      gd.insert("momentum", so.momentum());
      gd.insert("dampening", so.dampening());
      gd.insert("weight_decay", so.weight_decay());
      gd.insert("nesterov", so.nesterov());
      auto ids = c10::impl::GenericList(c10::AnyType::get());  // Any: an int list would pickle as torch.jit._pickle.build_intlist
      for (const auto& p : g.params()) {
        auto it = optimizer->state().find(p.unsafeGetTensorImpl());
        if (it != optimizer->state().end()) {
          const auto& ps = static_cast<const torch::optim::SGDParamState&>(*it->second);
          if (ps.momentum_buffer().defined()) {
            auto pd = new_dict();
            pd.insert("momentum_buffer", ps.momentum_buffer().detach().to(at::kCPU).contiguous());
            state.insert(index, pd);
          }
        }
        ids.push_back(index++);
      }
      gd.insert("params", ids);
      groups.push_back(gd);
    }
    auto d = new_dict();
    d.insert("state", state);
    d.insert("param_groups", groups);
    return d;
  }

  void load_optimizer_state(const c10::IValue& v, const std::string& file) {
    const auto d = v.toGenericDict();
    const auto groups = at_key(d, "param_groups", file).toList();
    if (groups.size() != optimizer->param_groups().size()) {
      throw std::runtime_error(file + ": optimizer has " + std::to_string(groups.size()) +
                               " parameter groups, this run " +
                               std::to_string(optimizer->param_groups().size()) +
                               " (--no-decay-norm-bias differs?)");
    }
    for (size_t g = 0; g < groups.size(); ++g) {
      const auto ids = at_key(c10::IValue(groups.get(g)).toGenericDict(), "params", file).toList();
      if (ids.size() != optimizer->param_groups()[g].params().size()) {
        throw std::runtime_error(file + ": optimizer parameter group " + std::to_string(g) +
                                 " differs in size from this run's");
      }
    }
    const auto state = at_key(d, "state", file).toGenericDict();
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      auto it = state.find(static_cast<int64_t>(i));
      if (it == state.end()) continue;
      const auto ps = it->value().toGenericDict();
      auto buf = ps.find("momentum_buffer");
      if (buf == ps.end()) continue;
      const at::Tensor saved = buf->value().toTensor();
      if (saved.sizes() != params[i].sizes()) {
        throw std::runtime_error(file + ": momentum buffer " + std::to_string(i) + " has shape " +
                                 c10::str(saved.sizes()) + ", parameter has " +
                                 c10::str(params[i].sizes()));
      }
      auto s = std::make_unique<torch::optim::SGDParamState>();
      s->momentum_buffer(at::empty_like(params[i]).copy_(saved));
      optimizer->state()[params[i].unsafeGetTensorImpl()] = std::move(s);
    }
  }

  c10::IValue rng_state() const {
    auto d = new_dict();
    {
      auto gen = at::globalContext().defaultGenerator(c10::Device(c10::kCPU));
      std::lock_guard<std::mutex> lock(gen.mutex());
      d.insert("cpu", gen.get_state());
    }
    if (device.is_cuda()) {
      auto gen = at::globalContext().defaultGenerator(device);
      std::lock_guard<std::mutex> lock(gen.mutex());
      d.insert("cuda", gen.get_state());
    }
    return d;
  }

  void load_rng_state(const c10::impl::GenericDict& d) {
    if (auto it = d.find("cpu"); it != d.end()) {
      auto gen = at::globalContext().defaultGenerator(c10::Device(c10::kCPU));
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(it->value().toTensor());
    }
    if (auto it = d.find("cuda"); it != d.end() && device.is_cuda()) {
      auto gen = at::globalContext().defaultGenerator(device);
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(it->value().toTensor());
    }
  }

  // Rank 0 writes the training checkpoint; `epoch`/`batches` is where a resumed run continues.
  void write_checkpoint(int64_t at_epoch, int64_t batches, bool on_stop = false) {
    if (!options.save_checkpoint || !main_rank()) return;
    if (options.save_checkpoint_only_on_stop && !on_stop) return;
    auto d = new_dict();
    d.insert("format", std::string(kCheckpointFormat));
    d.insert("version", int64_t{1});
    d.insert("model", state_dict_to_ivalue(module_state_dict(*model)));
    d.insert("optimizer", optimizer_state());
    d.insert("scheduler", schedule_state());
    auto sc = new_dict();
    if (scaler) {
      sc.insert("scale", scaler->get_scale());
      sc.insert("growth_factor", scaler->options().growth_factor);
      sc.insert("backoff_factor", scaler->options().backoff_factor);
      sc.insert("growth_interval", scaler->options().growth_interval);
      sc.insert("_growth_tracker", scaler->growth_tracker());
    }
    d.insert("scaler", sc);
    auto sa = new_dict();
    sa.insert("epoch", at_epoch);
    sa.insert("batches_consumed", batches);
    sa.insert("seed", static_cast<int64_t>(options.seed));
    sa.insert("num_replicas", static_cast<int64_t>(world));
    sa.insert("batch_size", options.batch_size);
    sa.insert("accum_steps", options.accum_steps);
    d.insert("sampler", sa);
    d.insert("rng", rng_state());
    d.insert("epoch", at_epoch);
    d.insert("step", global_step);
    d.insert("arch", options.arch);
    d.insert("num_classes", resnet_options.num_classes);
    save_torch_file(d, *options.save_checkpoint);
    last_checkpoint = *options.save_checkpoint;
    gpufeed::log_text(LogLevel::kInfo, "train: wrote training checkpoint " + last_checkpoint.string() +
                                           " (epoch " + std::to_string(at_epoch) + ", batch " +
                                           std::to_string(batches) + ", step " +
                                           std::to_string(global_step) + ")");
  }

  void resume_from(const fs::path& path) {
    const std::string file = path.string();
    const c10::IValue loaded = load_torch_file(path);
    if (!loaded.isGenericDict()) throw std::runtime_error(file + ": not a training checkpoint (not a dict)");
    const auto d = loaded.toGenericDict();
    auto fmt = d.find("format");
    if (fmt == d.end() || !fmt->value().isString() || fmt->value().toStringRef() != kCheckpointFormat) {
      throw std::runtime_error(file + ": not a gpufeed training checkpoint (use --init-weights for "
                               "a plain state_dict)");
    }
    const auto check = [&](const std::string& what, int64_t saved, int64_t now) {
      if (saved != now) {
        throw std::runtime_error(file + ": cannot resume: " + what + " was " + std::to_string(saved) +
                                 ", this run has " + std::to_string(now));
      }
    };
    if (at_key(d, "arch", file).toStringRef() != options.arch) {
      throw std::runtime_error(file + ": cannot resume: arch was " + at_key(d, "arch", file).toStringRef() +
                               ", this run has " + options.arch);
    }
    check("num_classes", at_key(d, "num_classes", file).toInt(), resnet_options.num_classes);
    const auto sa = at_key(d, "sampler", file).toGenericDict();
    check("world size", at_key(sa, "num_replicas", file).toInt(), world);
    check("batch size", at_key(sa, "batch_size", file).toInt(), options.batch_size);
    check("accum steps", at_key(sa, "accum_steps", file).toInt(), options.accum_steps);
    check("seed", at_key(sa, "seed", file).toInt(), static_cast<int64_t>(options.seed));
    load_state_dict(*model, find_state_dict(at_key(d, "model", file), file), file);
    load_optimizer_state(at_key(d, "optimizer", file), file);
    const auto sc = at_key(d, "scaler", file).toGenericDict();
    if (scaler && sc.size() > 0) {
      scaler->set_state(at_key(sc, "scale", file).toDouble(), at_key(sc, "_growth_tracker", file).toInt());
    }
    load_rng_state(at_key(d, "rng", file).toGenericDict());
    epoch = at_key(sa, "epoch", file).toInt();
    batches_done = at_key(sa, "batches_consumed", file).toInt();
    global_step = at_key(d, "step", file).toInt();
    if (auto sched = d.find("scheduler"); sched != d.end()) {
      check_resumed_schedule(sched->value().toGenericDict(), global_step, file);
    }
    gpufeed::log_text(LogLevel::kInfo, "train: resumed from " + file + " at epoch " +
                                           std::to_string(epoch) + ", batch " +
                                           std::to_string(batches_done) + ", step " +
                                           std::to_string(global_step));
  }
};

namespace {

// Validation labels index the training set's classes, so both must list the same classes in the
// same order. Throws std::invalid_argument naming both sets and the first difference.
void check_same_classes(const loader::Dataset& val, const fs::path& val_root, const loader::Dataset& train,
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

}  // namespace

Trainer::Trainer(TrainOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.options = std::move(options);
  const TrainOptions& o = m.options;
  if (o.epochs < 1 || o.batch_size < 1 || o.image_size < 8 || o.accum_steps < 1) {
    throw std::invalid_argument("Trainer: epochs, batch_size and accum_steps must be >= 1, image_size >= 8");
  }
  if (o.label_smoothing < 0 || o.label_smoothing >= 1) {
    throw std::invalid_argument("Trainer: label_smoothing must be in [0, 1)");
  }
  // torch.optim.SGD's own checks, made before any work.
  if (!std::isfinite(o.lr) || o.lr < 0) throw std::invalid_argument("Trainer: lr must be finite and >= 0, got " + std::to_string(o.lr));
  if (!std::isfinite(o.momentum) || o.momentum < 0) throw std::invalid_argument("Trainer: momentum must be finite and >= 0");
  if (!std::isfinite(o.weight_decay) || o.weight_decay < 0) throw std::invalid_argument("Trainer: weight_decay must be finite and >= 0");
  if (o.max_steps_per_epoch < 0) throw std::invalid_argument("Trainer: max_steps_per_epoch must be >= 0 (0 = whole epoch)");
  if (o.batch_size == 1 && !o.freeze_bn) {
    throw std::invalid_argument(
        "Trainer: batch_size 1 cannot train BatchNorm (PyTorch: \"Expected more than 1 value per "
        "channel when training\"); use a larger batch or freeze_bn (--freeze-bn)");
  }

  // Distributed? torchrun's or Slurm's environment, or neither.
  std::optional<DistEnv> env;
  if (o.distributed != "off") {
    env = detect_dist_env();
    if (env && o.distributed == "auto" && env->source == "slurm" && env->world_size == 1) env.reset();
    if (!env && o.distributed == "on") {
      throw std::invalid_argument("Trainer: --distributed on, but neither torchrun's (RANK, WORLD_SIZE) "
                                  "nor Slurm's (SLURM_PROCID, SLURM_NTASKS) environment is set");
    }
  }
  std::string device = o.device;
  if (env) {
    if (!o.dp_devices.empty()) throw std::invalid_argument("Trainer: DataParallel (--devices) and a distributed run do not combine");
    if (device == "cuda") device = "cuda:" + std::to_string(env->local_rank);
  } else if (device == "cuda") {
    device = "cuda:0";
  }
  if (!o.dp_devices.empty()) device = o.dp_devices.front();
  try {
    m.device = c10::Device(device);
  } catch (const c10::Error&) {
    throw std::invalid_argument("Trainer: device '" + device + "' is not cpu, cuda or cuda:N");
  }
  if (m.device.is_cuda()) {
    if (!prefetch::cuda_available()) throw std::runtime_error("Trainer: " + device + " asked for, but no CUDA device is available");
    c10::impl::getDeviceGuardImpl(c10::kCUDA)->setDevice(m.device);
    if (o.cudnn_benchmark) at::globalContext().setBenchmarkCuDNN(true);
  }
  if (env) {
    ProcessGroupOptions po;
    po.backend = o.dist_backend;
    po.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.dist_timeout_s * 1000));
    m.group = ProcessGroup::create(*env, m.device, po);
    m.rank = m.group->rank();
    m.world = m.group->size();
  }

  m.train_set = loader::open_dataset(o.data);
  sampler::DistributedSamplerOptions so;  // torch's DistributedSampler: shuffled, seed + epoch
  so.num_replicas = m.world;
  so.rank = m.rank;
  so.seed = o.seed;
  m.train_sampler = std::make_shared<sampler::DistributedSampler>(m.train_set->size(), so);
  if (o.val_data) {  // before any training, not after the first epoch
    m.val_set = loader::open_dataset(*o.val_data);
    check_same_classes(*m.val_set, *o.val_data, *m.train_set, o.data);
  }
  const bool forced_drop = !o.drop_last && !o.freeze_bn && m.train_sampler->size() % o.batch_size == 1;
  if (forced_drop) {
    m.options.drop_last = true;
    gpufeed::log_text(LogLevel::kWarn,
                      "train: each rank's last batch would hold 1 sample (" +
                          std::to_string(m.train_sampler->size()) + " samples per rank, batch " +
                          std::to_string(o.batch_size) +
                          "), which BatchNorm cannot train on: dropping it every epoch (drop_last)");
  }
  m.train_loader = std::make_shared<loader::Loader>(m.train_set, m.train_sampler, m.loader_options(true),
                                                    prefetch::host_allocator_for(m.device));
  if (m.steps_per_epoch() == 0) {
    const bool forced = forced_drop;
    throw std::invalid_argument(
        "Trainer: an epoch would take no optimizer step: " + o.data.string() + " has " +
        std::to_string(m.train_set->size()) + " images; world size " + std::to_string(m.world) +
        " gives each rank " + std::to_string(m.train_sampler->size()) +
        " (DistributedSampler pads to a multiple of the world size), and batch size " +
        std::to_string(o.batch_size) + " with drop_last " +
        (forced ? "(turned on because the only batch would hold 1 sample, which BatchNorm cannot train on)"
                : (o.drop_last ? "on" : "off")) +
        " leaves 0 batches. Use a smaller --batch-size, fewer ranks or more images" +
        (forced ? std::string(", or --freeze-bn") : std::string()));
  }
  m.prefetch_options.device = m.device;
  m.prefetch_options.channels_last = o.channels_last;
  if (m.amp() && m.device.is_cuda()) m.prefetch_options.dtype = m.amp_dtype();  // half the H2D traffic
  m.prefetcher = prefetch::make_prefetcher(m.train_loader, m.prefetch_options);

  torch::manual_seed(o.seed);
  m.resnet_options.arch = o.arch;
  m.resnet_options.num_classes = static_cast<int64_t>(m.train_set->classes().size());
  m.resnet_options.zero_init_residual = o.zero_init_residual;
  m.model = make_resnet(m.resnet_options);
  if (o.init_weights) {
    LoadStateDictOptions lo;
    lo.exclude = o.init_weights_exclude;
    lo.skip_mismatched_shapes = o.init_weights_skip_mismatched;
    load_state_dict(*m.model, *o.init_weights, lo);
  } else if (!o.init_weights_exclude.empty() || o.init_weights_skip_mismatched) {
    throw std::invalid_argument("Trainer: init_weights_exclude / init_weights_skip_mismatched without init_weights");
  }
  m.model->to(m.device);
  if (o.channels_last) to_channels_last(*m.model);

  // Parameter groups: with no_decay_norm_bias, BatchNorm parameters and biases go without decay.
  std::vector<at::Tensor> decay, no_decay;
  {
    std::unordered_set<const c10::TensorImpl*> norm;
    for (const auto& mod : m.model->modules(false)) {
      if (dynamic_cast<torch::nn::BatchNorm2dImpl*>(mod.get())) {
        for (const auto& p : mod->parameters(false)) norm.insert(p.unsafeGetTensorImpl());
      }
    }
    for (const auto& p : m.model->named_parameters(true)) {
      const bool is_bias = p.key() == "bias" || (p.key().size() > 5 && p.key().ends_with(".bias"));
      const bool plain = o.no_decay_norm_bias && (is_bias || norm.count(p.value().unsafeGetTensorImpl()));
      (plain ? no_decay : decay).push_back(p.value());
    }
  }
  const double lr = scaled_lr();
  auto sgd = [&](double wd) {
    return std::make_unique<torch::optim::SGDOptions>(
        torch::optim::SGDOptions(lr).momentum(o.momentum).nesterov(o.nesterov).weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, sgd(o.weight_decay));
  if (!no_decay.empty()) groups.emplace_back(no_decay, sgd(0.0));
  m.optimizer = std::make_unique<torch::optim::SGD>(groups, torch::optim::SGDOptions(lr).momentum(o.momentum));
  m.params = decay;
  m.params.insert(m.params.end(), no_decay.begin(), no_decay.end());

  if (o.precision == Precision::kFloat16) m.scaler = std::make_unique<GradScaler>(m.device, o.grad_scaler);
  m.plan_schedule(lr);
  if (o.resume) m.resume_from(*o.resume);

  if (m.group) {
    DdpOptions ddp_options;
    ddp_options.bucket_cap_bytes = o.ddp_bucket_mb << 20;
    m.ddp = std::make_unique<DistributedDataParallel>(m.model.ptr(), m.group, ddp_options);
  } else if (!o.dp_devices.empty()) {
    std::vector<c10::Device> devices;
    for (const auto& d : o.dp_devices) devices.emplace_back(d);
    ResNetOptions ro = m.resnet_options;
    const bool cl = o.channels_last;
    m.dp = std::make_unique<DataParallel>(
        m.model.ptr(),
        [ro, cl]() -> std::shared_ptr<torch::nn::Module> {
          // Structure only: keep the global RNG where it was.
          auto gen = at::globalContext().defaultGenerator(c10::Device(c10::kCPU));
          at::Tensor state;
          {
            std::lock_guard<std::mutex> lock(gen.mutex());
            state = gen.get_state();
          }
          auto r = make_resnet(ro);
          if (cl) to_channels_last(*r);
          std::lock_guard<std::mutex> lock(gen.mutex());
          gen.set_state(state);
          return r.ptr();
        },
        devices,
        [](torch::nn::Module& mod, const at::Tensor& x) { return static_cast<ResNetImpl&>(mod).forward(x); });
  }

  std::string parallel = "1 process";
  if (m.group) parallel = "DDP world " + std::to_string(m.world) + " (" + m.group->backend() + ")";
  if (m.dp) parallel = "DataParallel over " + std::to_string(o.dp_devices.size()) + " devices";
  gpufeed::log_text(
      LogLevel::kInfo,
      c10::str("train: ", o.arch, " on ", m.device.str(), ", ", parallel, " (", m.train_set->size(),
               " images, ", m.resnet_options.num_classes, " classes); lr ", o.lr, " per 256 x global batch ",
               global_batch(), " (", o.batch_size, " x ", o.accum_steps, " accum x ", m.world,
               " ranks) = ", lr, "; schedule ", lr_schedule_kind_name(o.lr_schedule), ", warmup ",
               o.warmup_epochs, " epochs; precision ",
               o.precision == Precision::kFloat32 ? "fp32" : (o.precision == Precision::kBFloat16 ? "bf16" : "fp16"),
               o.channels_last ? ", channels_last" : "",
               m.device.is_cuda() && o.cudnn_benchmark ? ", cudnn.benchmark" : ""));
}

Trainer::~Trainer() = default;

ResNet& Trainer::model() { return impl_->model; }
double Trainer::scaled_lr() const {
  return impl_->options.lr * static_cast<double>(global_batch()) / 256.0;
}
int64_t Trainer::global_batch() const {
  return impl_->options.batch_size * impl_->options.accum_steps * impl_->world;
}
int64_t Trainer::num_classes() const {
  return static_cast<int64_t>(impl_->train_set->classes().size());
}
int Trainer::rank() const { return impl_->rank; }
int Trainer::world_size() const { return impl_->world; }
std::string Trainer::device() const { return impl_->device.str(); }
const RunProfile& Trainer::profile() const { return impl_->profile; }
void Trainer::set_step_callback(std::function<void(const StepStats&)> on_step) {
  impl_->on_step = std::move(on_step);
}
void Trainer::request_stop(int reason) noexcept { impl_->stop_request.store(reason == 0 ? 1 : reason); }
int Trainer::stopped() const { return impl_->stopped; }
fs::path Trainer::last_checkpoint() const { return impl_->last_checkpoint; }

std::vector<EpochStats> Trainer::fit(const std::function<void(const EpochStats&)>& on_epoch) {
  Impl& m = *impl_;
  const TrainOptions& o = m.options;
  const int64_t steps_per_epoch = m.steps_per_epoch();
  const int64_t micro_per_epoch = m.micro_batches();
  const LrSchedule& schedule = *m.schedule;
  auto& optimizer = *m.optimizer;
  StopVote vote(m.group.get(), m.device);
  m.stopped = 0;

  std::vector<EpochStats> history;
  RunInfo run;  // for the profiler (profiler.h): phases timed per step, verdict at the end
  run.device = m.device.str();
  run.model = o.arch;
  run.epochs = o.epochs;
  run.steps_per_epoch = steps_per_epoch * o.accum_steps;  // the profiler counts micro-batches
  run.batch_size = o.batch_size;
  run.hardware_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  run.workers = o.workers > 0 ? o.workers : run.hardware_threads;
  run.prefetch_depth = o.prefetch_depth;
  run.image_size = o.image_size;
  run.allreduce = m.ddp != nullptr;  // else the all-reduce phase is recorded as zero-length
  Profiler profiler(o.profile, run, m.train_loader.get());
  const auto stat_options = at::TensorOptions().device(m.device);

  for (int64_t epoch = m.epoch; epoch < o.epochs && m.stopped == 0; ++epoch) {
    int64_t batch_index = epoch == m.epoch ? m.batches_done : 0;  // micro-batches done in this epoch
    int64_t step_in_epoch = (batch_index + o.accum_steps - 1) / o.accum_steps;
    m.set_train_mode();
    m.train_sampler->set_epoch(epoch);  // DistributedSampler.set_epoch, every epoch
    m.prefetcher->start_epoch(epoch, batch_index);
    profiler.begin_epoch(epoch);
    EpochStats st;
    st.epoch = epoch;
    double wait_s = 0;
    at::Tensor loss_sum = at::zeros({1}, stat_options.dtype(at::kDouble));
    at::Tensor correct = at::zeros({1}, stat_options.dtype(at::kLong));
    const auto t0 = Clock::now();
    while (step_in_epoch < steps_per_epoch && batch_index < micro_per_epoch) {
      // One optimizer step: accum_steps micro-batches (fewer at the end of an epoch), each loss
      // weighted by its share of the step's samples, so the gradient is the whole step's mean.
      const int64_t micro = std::min(o.accum_steps, micro_per_epoch - batch_index);
      int64_t step_samples = 0;
      for (int64_t j = 0; j < micro; ++j) step_samples += m.micro_batch_size(batch_index + j);
      st.lr = schedule.lr(m.global_step);
      const std::optional<double> momentum = schedule.momentum(m.global_step);
      for (auto& group : optimizer.param_groups()) {
        auto& so = static_cast<torch::optim::SGDOptions&>(group.options());
        so.lr(st.lr);
        if (momentum) so.momentum(*momentum);
      }
      const double loss_scale = m.scaler ? m.scaler->get_scale() : 1.0;
      at::Tensor step_loss = at::zeros({1}, stat_options.dtype(at::kDouble));
      StepStats ss;
      bool skipped = false;
      at::Tensor nonfinite;  // fp32/bf16: any micro-batch loss of this step not finite
      for (int64_t j = 0; j < micro; ++j) {
        const bool last = j + 1 == micro;
        // Phase 1: data wait.
        profiler.step_begin();
        auto batch = m.prefetcher->next();
        if (!batch) throw std::runtime_error("train: the loader ended the epoch early");
        profiler.batch_ready(*batch);
        wait_s += batch->wait_ms / 1000.0;
        const int64_t n = batch->labels.size(0);
        // Phase 2: forward + backward. Gradient all-reduces start inside backward as DDP's
        // buckets fill (not for the micro-batches before the last: no_sync).
        at::Tensor logits, loss;
        {
          std::optional<DistributedDataParallel::NoSync> no_sync;
          if (m.ddp && !last) no_sync.emplace(*m.ddp);
          if (m.ddp) m.ddp->pre_forward();
          {
            std::optional<AutocastGuard> autocast;
            if (m.amp()) autocast.emplace(m.device.type(), m.amp_dtype());
            logits = m.forward(batch->images);
            loss = torch::nn::functional::cross_entropy(
                logits.to(at::kFloat), batch->labels,
                torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(o.label_smoothing));
          }
          if (!m.scaler) {
            const at::Tensor bad = at::isfinite(loss.detach()).logical_not();
            nonfinite = nonfinite.defined() ? nonfinite.logical_or(bad) : bad;
          }
          at::Tensor objective = loss * (static_cast<double>(n) / static_cast<double>(step_samples));
          if (m.scaler) objective = m.scaler->scale(objective);
          objective.backward();
        }
        profiler.phase_done(Phase::kForwardBackward);
        // Phase 3: all-reduce wait (DDP, last micro-batch only).
        if (last && m.ddp) m.ddp->finish_gradient_sync();
        profiler.phase_done(Phase::kAllReduce);
        // Phase 4: optimizer step (last micro-batch only).
        if (last) {
          if (m.scaler) {
            if (m.scaler->step_ok(m.params)) {
              optimizer.step();
            } else {
              skipped = true;
              ++st.skipped_steps;
            }
            m.scaler->update();
          } else {
            if (nonfinite.item<bool>()) {
              throw std::runtime_error(
                  "train: the loss is not finite (" +
                  (std::isnan(loss.item<double>())      ? std::string("nan")
                   : std::isfinite(loss.item<double>()) ? std::string("an earlier micro-batch's")
                                                        : short_number(loss.item<double>())) +
                  ") in epoch " +
                  std::to_string(epoch + 1) + "/" + std::to_string(o.epochs) + ", step " +
                  std::to_string(step_in_epoch + 1) + " of the epoch (optimizer step " +
                  std::to_string(m.global_step + 1) + " of the run, lr " + short_number(st.lr) +
                  "): stopped before that step's update; no checkpoint was written" +
                  (m.last_checkpoint.empty() ? std::string()
                                             : " (the last one, " + m.last_checkpoint.string() + ", is intact)") +
                  ". Lower --lr or check the data; --precision fp16 skips such steps instead");
            }
            optimizer.step();
          }
          optimizer.zero_grad(/*set_to_none=*/true);
        }
        profiler.phase_done(Phase::kOptimizer);
        {
          torch::NoGradGuard no_grad;
          const at::Tensor l = loss.detach().to(at::kDouble) * static_cast<double>(n);
          loss_sum += l;
          step_loss += l;
          correct += logits.detach().argmax(1).eq(batch->labels).sum();
        }
        if (m.on_step) ss.indices.insert(ss.indices.end(), batch->indices.begin(), batch->indices.end());
        st.samples += n;
        ++batch_index;
        profiler.step_end(n);
      }
      ++st.steps;
      ++step_in_epoch;
      if (m.on_step) {
        ss.epoch = epoch;
        ss.step = m.global_step;
        ss.samples = step_samples;
        ss.loss = step_loss.item<double>() / static_cast<double>(step_samples);
        ss.lr = st.lr;
        ss.skipped = skipped;
        ss.loss_scale = loss_scale;
        m.on_step(ss);
      }
      ++m.global_step;
      int local = m.stop_request.load();
      if (local == 0 && o.stop_flag) local = o.stop_flag->load();
      if (const int stop = vote.after_step(local); stop != 0) m.stopped = stop;
      const bool epoch_over = step_in_epoch >= steps_per_epoch || batch_index >= micro_per_epoch;
      if (m.stopped != 0) {
        m.write_checkpoint(epoch_over ? epoch + 1 : epoch, epoch_over ? 0 : batch_index, /*on_stop=*/true);
        gpufeed::log_text(LogLevel::kWarn, "train: stop requested (" + std::to_string(m.stopped) +
                                               "): stopped after step " + std::to_string(m.global_step));
        break;
      }
      if (o.checkpoint_every_steps > 0 && m.global_step % o.checkpoint_every_steps == 0 && !epoch_over) {
        m.write_checkpoint(epoch, batch_index);
      }
    }
    if (st.steps == 0 && m.stopped == 0) {
      throw std::runtime_error("train: epoch " + std::to_string(epoch + 1) + " took no optimizer step (" +
                               std::to_string(micro_per_epoch) + " micro-batches per epoch on this rank, " +
                               std::to_string(batch_index) + " already consumed when it started)");
    }
    st.seconds = seconds_since(t0);
    profiler.end_epoch();
    // Totals over all ranks.
    const auto skipped_here = static_cast<double>(m.train_loader->epoch_summary().skipped);
    at::Tensor totals = at::cat({loss_sum, correct.to(at::kDouble),
                                 at::full({1}, static_cast<double>(st.samples), stat_options.dtype(at::kDouble)),
                                 at::full({1}, skipped_here, stat_options.dtype(at::kDouble))});
    if (m.group) {
      std::vector<at::Tensor> t{totals};
      m.group->all_reduce_sum(t);
    }
    const at::Tensor tot = totals.cpu();
    const double samples = tot[2].item<double>();
    st.samples = static_cast<int64_t>(samples);
    st.skipped_samples = static_cast<int64_t>(tot[3].item<double>());
    st.loss = samples > 0 ? tot[0].item<double>() / samples : 0;
    st.top1 = samples > 0 ? tot[1].item<double>() / samples : 0;
    st.images_per_s = st.seconds > 0 ? samples / st.seconds : 0;
    st.data_wait_fraction = st.seconds > 0 ? wait_s / st.seconds : 0;
    if (m.stopped != 0) {
      history.push_back(st);
      if (on_epoch) on_epoch(st);
      break;
    }
    if (o.val_data) {
      const EvalStats ev = evaluate(*o.val_data);
      st.val_loss = ev.loss;
      st.val_top1 = ev.top1;
      st.val_top5 = ev.top5;
    }
    m.epoch = epoch + 1;
    m.batches_done = 0;
    m.write_checkpoint(epoch + 1, 0);
    history.push_back(st);
    if (on_epoch) on_epoch(st);
  }
  m.profile = profiler.finish();
  if (o.checkpoint && m.stopped == 0) {
    const bool per_rank = o.checkpoint->string().find("{rank}") != std::string::npos;
    if (per_rank || m.main_rank()) {
      const fs::path path = replace_rank(*o.checkpoint, m.rank);
      save_state_dict(*m.model, path);
      gpufeed::log_text(LogLevel::kInfo, "train: wrote state_dict to " + path.string());
    }
  }
  return history;
}

EvalStats Trainer::evaluate(const fs::path& root) {
  Impl& m = *impl_;
  std::shared_ptr<loader::Dataset> dataset = m.val_set;
  if (!dataset || root != *m.options.val_data) {
    dataset = loader::open_dataset(root);
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
  m.model->eval();
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
      logits = m.forward(batch->images).to(at::kFloat);
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
