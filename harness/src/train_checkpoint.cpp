// The training checkpoint's entries (layout: gpufeed/harness/train_checkpoint.h).
#include "gpufeed/harness/train_checkpoint.h"

#include <ATen/ATen.h>
#include <c10/util/StringUtil.h>

#include <cstdio>
#include <mutex>
#include <sstream>
#include <stdexcept>

#include <torch/utils.h>

#include "gpufeed/harness/torch_file.h"

namespace gpufeed::harness {
namespace fs = std::filesystem;
namespace {

c10::impl::GenericDict new_dict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
}

const c10::IValue& at_key(const c10::impl::GenericDict& d, const std::string& key, const std::string& file) {
  auto it = d.find(key);
  if (it == d.end()) throw std::runtime_error(file + ": training checkpoint has no '" + key + "' entry");
  return it->value();
}

// A value of the "scheduler" entry as text, exact for doubles, for comparing plans.
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

// The saved plan as LrScheduleOptions (fields a checkpoint without them lacks throw).
LrScheduleOptions saved_plan(const c10::impl::GenericDict& saved, LrScheduleOptions so) {
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
  if (auto it = saved.find("steps_per_epoch"); it != saved.end()) so.steps_per_epoch = it->value().toInt();
  if (auto it = saved.find("peak_epoch"); it != saved.end()) so.peak_epoch = it->value().toDouble();
  return so;
}

}  // namespace

void save_train_checkpoint(const TrainCheckpoint& ckpt, const fs::path& path) {
  auto d = new_dict();
  d.insert("format", std::string(kTrainCheckpointFormat));
  d.insert("version", int64_t{1});
  d.insert("model", ckpt.model);
  d.insert("optimizer", ckpt.optimizer);
  d.insert("scheduler", ckpt.scheduler);
  d.insert("scaler", ckpt.scaler);
  auto sa = new_dict();
  sa.insert("epoch", ckpt.progress.epoch);
  sa.insert("batches_consumed", ckpt.progress.batches_consumed);
  sa.insert("seed", ckpt.run.seed);
  sa.insert("num_replicas", ckpt.run.world_size);
  sa.insert("batch_size", ckpt.run.batch_size);
  sa.insert("accum_steps", ckpt.run.accum_steps);
  sa.insert("ra_reps", ckpt.run.ra_reps);
  if (ckpt.run.dataset_size) sa.insert("dataset_size", *ckpt.run.dataset_size);
  if (ckpt.run.drop_last) sa.insert("drop_last", *ckpt.run.drop_last);
  sa.insert("shuffle_order", ckpt.run.shuffle_order);
  if (ckpt.run.shuffle_order == "shards") {
    sa.insert("shard_window", ckpt.run.shard_window);
    sa.insert("shard_partitions", ckpt.run.shard_partitions);
  }
  sa.insert("sampler_drop_last", false);  // the Trainer's DistributedSampler pads
  sa.insert("epoch_world_size", ckpt.progress.epoch_world_size > 0 ? ckpt.progress.epoch_world_size : ckpt.run.world_size);
  sa.insert("epoch_start", ckpt.progress.epoch_start);
  d.insert("sampler", sa);
  d.insert("rng", ckpt.rng);
  if (!ckpt.model_ema.isNone()) d.insert("model_ema", ckpt.model_ema);
  d.insert("epoch", ckpt.progress.epoch);
  d.insert("step", ckpt.progress.step);
  d.insert("arch", ckpt.run.arch);
  d.insert("num_classes", ckpt.run.num_classes);
  save_torch_file(d, path);
}

TrainCheckpoint load_train_checkpoint(const fs::path& path) {
  const std::string file = path.string();
  const c10::IValue loaded = load_torch_file(path);
  if (!loaded.isGenericDict()) throw std::runtime_error(file + ": not a training checkpoint (not a dict)");
  const auto d = loaded.toGenericDict();
  auto fmt = d.find("format");
  if (fmt == d.end() || !fmt->value().isString() || fmt->value().toStringRef() != kTrainCheckpointFormat) {
    throw std::runtime_error(file + ": not a gpufeed training checkpoint (use `init_weights` for "
                             "a plain state_dict)");
  }
  TrainCheckpoint c;
  const auto sa = at_key(d, "sampler", file).toGenericDict();
  c.run.arch = at_key(d, "arch", file).toStringRef();
  c.run.num_classes = at_key(d, "num_classes", file).toInt();
  c.run.world_size = at_key(sa, "num_replicas", file).toInt();
  c.run.batch_size = at_key(sa, "batch_size", file).toInt();
  c.run.accum_steps = at_key(sa, "accum_steps", file).toInt();
  c.run.seed = at_key(sa, "seed", file).toInt();
  if (auto it = sa.find("ra_reps"); it != sa.end()) c.run.ra_reps = it->value().toInt();
  if (auto it = sa.find("dataset_size"); it != sa.end()) c.run.dataset_size = it->value().toInt();
  if (auto it = sa.find("drop_last"); it != sa.end()) c.run.drop_last = it->value().toBool();
  if (auto it = sa.find("shuffle_order"); it != sa.end()) c.run.shuffle_order = it->value().toStringRef();
  if (auto it = sa.find("shard_window"); it != sa.end()) c.run.shard_window = it->value().toInt();
  if (auto it = sa.find("shard_partitions"); it != sa.end()) c.run.shard_partitions = it->value().toInt();
  if (auto it = sa.find("epoch_world_size"); it != sa.end()) c.progress.epoch_world_size = it->value().toInt();
  if (auto it = sa.find("epoch_start"); it != sa.end()) c.progress.epoch_start = it->value().toInt();
  if (auto it = sa.find("sampler_drop_last"); it != sa.end() && it->value().toBool()) {
    throw std::runtime_error(file + ": the checkpoint's sampler dropped its tail (sampler_drop_last): the "
                             "trainer's DistributedSampler pads");
  }
  if (c.progress.epoch_world_size < 0 || c.progress.epoch_start < 0 ||
      (c.progress.epoch_start == 0 && c.progress.epoch_world_size > 0 && c.progress.epoch_world_size != c.run.world_size)) {
    throw std::runtime_error(file + ": the checkpoint's epoch_world_size " + std::to_string(c.progress.epoch_world_size) +
                             " with epoch_start " + std::to_string(c.progress.epoch_start) +
                             " contradicts its num_replicas " + std::to_string(c.run.world_size));
  }
  c.progress.epoch = at_key(sa, "epoch", file).toInt();
  c.progress.batches_consumed = at_key(sa, "batches_consumed", file).toInt();
  c.progress.step = at_key(d, "step", file).toInt();
  c.model = at_key(d, "model", file);
  c.optimizer = at_key(d, "optimizer", file);
  if (auto it = d.find("scheduler"); it != d.end()) c.scheduler = it->value().toGenericDict();
  c.scaler = at_key(d, "scaler", file).toGenericDict();
  c.rng = at_key(d, "rng", file).toGenericDict();
  if (auto it = d.find("model_ema"); it != d.end()) c.model_ema = it->value();
  return c;
}

void check_same_run(const TrainRunIdentity& saved, const TrainRunIdentity& now, const std::string& file) {
  const auto differs = [&](const std::string& what, const std::string& was, const std::string& is) {
    throw std::runtime_error(file + ": cannot resume: " + what + " was " + was + ", this run has " + is);
  };
  if (saved.arch != now.arch) differs("arch", saved.arch, now.arch);
  if (saved.shuffle_order != now.shuffle_order) differs("shuffle_order", saved.shuffle_order, now.shuffle_order);
  const std::pair<const char*, std::pair<int64_t, int64_t>> numbers[] = {
      {"num_classes", {saved.num_classes, now.num_classes}},
      {"batch size", {saved.batch_size, now.batch_size}},
      {"accum steps", {saved.accum_steps, now.accum_steps}},
      {"seed", {saved.seed, now.seed}},
      {"ra_reps (0: no `ra_sampler`)", {saved.ra_reps, now.ra_reps}},
      {"shard_window", {saved.shard_window, now.shard_window}},
      {"shard_partitions", {saved.shard_partitions, now.shard_partitions}},
  };
  if (saved.dataset_size && now.dataset_size && *saved.dataset_size != *now.dataset_size) {
    differs("the dataset's size", std::to_string(*saved.dataset_size), std::to_string(*now.dataset_size));
  }
  for (const auto& [what, v] : numbers) {
    if (v.first != v.second) differs(what, std::to_string(v.first), std::to_string(v.second));
  }
}

c10::IValue sgd_state_dict(const torch::optim::SGD& optimizer) {
  auto state = c10::impl::GenericDict(c10::IntType::get(), c10::AnyType::get());
  auto groups = c10::impl::GenericList(c10::AnyType::get());
  int64_t index = 0;
  for (const auto& g : optimizer.param_groups()) {
    const auto& so = static_cast<const torch::optim::SGDOptions&>(g.options());
    auto gd = new_dict();
    gd.insert("lr", so.lr());
    gd.insert("momentum", so.momentum());
    gd.insert("dampening", so.dampening());
    gd.insert("weight_decay", so.weight_decay());
    gd.insert("nesterov", so.nesterov());
    auto ids = c10::impl::GenericList(c10::AnyType::get());  // Any: an int list would pickle as torch.jit._pickle.build_intlist
    for (const auto& p : g.params()) {
      auto it = optimizer.state().find(p.unsafeGetTensorImpl());
      if (it != optimizer.state().end()) {
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

void load_sgd_state_dict(torch::optim::SGD& optimizer, const c10::IValue& v, const std::string& file) {
  const auto d = v.toGenericDict();
  const auto groups = at_key(d, "param_groups", file).toList();
  if (groups.size() != optimizer.param_groups().size()) {
    throw std::runtime_error(file + ": optimizer has " + std::to_string(groups.size()) +
                             " parameter groups, this run " +
                             std::to_string(optimizer.param_groups().size()) +
                             " (`norm_weight_decay`, `bias_weight_decay` or `no_decay_norm_bias` differ?)");
  }
  std::vector<at::Tensor> params;  // numbered in group order, as sgd_state_dict numbers them
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto ids = at_key(c10::IValue(groups.get(g)).toGenericDict(), "params", file).toList();
    const auto& mine = optimizer.param_groups()[g].params();
    if (ids.size() != mine.size()) {
      throw std::runtime_error(file + ": optimizer parameter group " + std::to_string(g) +
                               " differs in size from this run's");
    }
    params.insert(params.end(), mine.begin(), mine.end());
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
    optimizer.state()[params[i].unsafeGetTensorImpl()] = std::move(s);
  }
}

c10::impl::GenericDict grad_scaler_state_dict(const GradScaler* scaler) {
  auto sc = new_dict();
  if (scaler) {
    sc.insert("scale", scaler->get_scale());
    sc.insert("growth_factor", scaler->options().growth_factor);
    sc.insert("backoff_factor", scaler->options().backoff_factor);
    sc.insert("growth_interval", scaler->options().growth_interval);
    sc.insert("_growth_tracker", scaler->growth_tracker());
  }
  return sc;
}

void load_grad_scaler_state_dict(GradScaler* scaler, const c10::impl::GenericDict& sc, const std::string& file) {
  if (scaler && sc.size() > 0) {
    scaler->set_state(at_key(sc, "scale", file).toDouble(), at_key(sc, "_growth_tracker", file).toInt());
  }
}

c10::impl::GenericDict rng_state_dict(c10::Device device) {
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

void load_rng_state_dict(const c10::impl::GenericDict& d, c10::Device device) {
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

c10::impl::GenericDict schedule_state_dict(const LrSchedule& schedule, int64_t step, int64_t epochs,
                                           int64_t steps_per_epoch) {
  const LrScheduleOptions& so = schedule.options();
  auto d = new_dict();
  d.insert("kind", lr_schedule_kind_name(so.kind));
  d.insert("last_step", step);
  d.insert("total_steps", so.total_steps);
  d.insert("epochs", epochs);
  d.insert("steps_per_epoch", steps_per_epoch);
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
  d.insert("peak_epoch", so.peak_epoch);
  return d;
}

std::string schedule_change(const c10::impl::GenericDict& saved, const c10::impl::GenericDict& now_state,
                            const LrSchedule& now, int64_t step) {
  std::string changed;
  for (const auto& kv : now_state) {
    const std::string& key = kv.key().toStringRef();
    auto it = saved.find(key);
    if (key == "last_step" || it == saved.end()) continue;  // older checkpoints have fewer fields
    const std::string was = field_text(it->value()), is = field_text(kv.value());
    if (was != is) changed += (changed.empty() ? "" : ", ") + key + " " + was + " -> " + is;
  }
  if (changed.empty()) return "";
  std::string before;  // the saved plan's rate at `step`, when the file has the whole plan
  try {
    before = " (the saved plan: " + c10::str(LrSchedule(saved_plan(saved, now.options())).lr(step)) + ")";
  } catch (const std::exception&) {
    before = "";
  }
  const LrScheduleOptions& so = now.options();
  return "the learning-rate schedule differs from the saved run's: " + changed + ". Re-planned, the " +
         lr_schedule_kind_name(so.kind) + " schedule runs over " + std::to_string(so.total_steps) +
         " steps (warmup " + std::to_string(so.warmup_steps) + ") and step " + std::to_string(step) +
         " continues at lr " + c10::str(now.lr(step)) + before;
}

}  // namespace gpufeed::harness
