#include <gtest/gtest.h>
#include <sys/stat.h>

#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include <ATen/autocast_mode.h>

#include <cmath>
#include <iostream>
#include <fstream>
#include <map>

#include "golden.h"
#include "gpufeed/harness/amp.h"
#include "gpufeed/harness/checkpoint.h"
#include "gpufeed/harness/distributed.h"
#include "gpufeed/harness/lr_schedule.h"
#include "gpufeed/harness/resnet.h"
#include "gpufeed/harness/torch_file.h"
#include "gpufeed/harness/trainer.h"
#include "gpufeed/loader/synthetic.h"
#include "test_util.h"

using namespace gpufeed;
namespace fs = std::filesystem;

namespace {

// One intra-op thread: the machine is shared, and OpenMP's spinning threads slow a loaded one.
const bool kOneThread = [] {
  at::set_num_threads(1);
  return true;
}();

using test::TempDir;
using test::tiny_dataset;  // 4 classes x 8 small JPEGs: 4 micro-batches of 8 per epoch

// A small run whose samples do not interact: BatchNorm frozen (running statistics, no batch
// statistics), each residual block starting as the identity so activations stay tame.
harness::TrainOptions tiny_run(const fs::path& data) {
  harness::TrainOptions o;
  o.data = data;
  o.arch = "resnet18";
  o.epochs = 1;
  o.batch_size = 8;
  o.image_size = 32;
  o.workers = 1;
  o.lr = 0.8;  // per 256: 0.025 at 8
  o.freeze_bn = true;
  o.zero_init_residual = true;
  o.distributed = "off";
  return o;
}

double max_param_diff(harness::ResNet& a, harness::ResNet& b) {
  double worst = 0;
  auto pb = b->named_parameters();
  for (const auto& p : a->named_parameters()) {
    worst = std::max(worst, (p.value() - pb[p.key()]).abs().max().item<double>());
  }
  return worst;
}

bool params_equal(harness::ResNet& a, harness::ResNet& b) {
  auto pb = b->named_parameters();
  for (const auto& p : a->named_parameters()) {
    if (!torch::equal(p.value(), pb[p.key()])) return false;
  }
  return true;
}

// Eval-mode logits of a C++ resnet18 with these weights on the golden input, minus torchvision's.
double logits_error(const fs::path& weights, harness::StateDictSource* source) {
  harness::ResNetOptions ro;
  ro.num_classes = 10;
  torch::manual_seed(123);
  auto model = harness::make_resnet(ro);
  *source = harness::load_state_dict(*model, weights);
  model->eval();
  const auto io = harness::load_torch_file(test::golden_path("ckpt_io.pt")).toGenericDict();
  torch::NoGradGuard no_grad;
  const at::Tensor logits = model->forward(io.at("x").toTensor());
  return (logits - io.at("logits").toTensor()).abs().max().item<double>();
}

}  // namespace

TEST(LrSchedule, MatchesTorchLrSchedulerStepByStep) {
  const auto cases = test::load_golden("schedule.json");
  ASSERT_GE(cases.size(), 16u);
  int onecycle_cases = 0;
  for (const auto& c : cases) {
    harness::LrScheduleOptions o;
    o.kind = harness::parse_lr_schedule_kind(c["kind"]);
    o.base_lr = c["base_lr"];
    o.total_steps = c["total"];
    o.warmup_steps = c["warmup"];
    o.warmup_start_factor = c["start_factor"];
    o.step_size = c["step_size"];
    o.milestones = c["milestones"].get<std::vector<int64_t>>();
    o.gamma = c["gamma"];
    o.min_lr = c["min_lr"];
    o.pct_start = c["pct_start"];
    o.anneal = c["anneal"] == "cos" ? harness::AnnealStrategy::kCos : harness::AnnealStrategy::kLinear;
    o.div_factor = c["div_factor"];
    o.final_div_factor = c["final_div_factor"];
    o.three_phase = c["three_phase"];
    const harness::LrSchedule s(o);
    const auto lrs = c["lrs"].get<std::vector<double>>();
    ASSERT_EQ(lrs.size(), static_cast<size_t>(o.total_steps));
    for (size_t k = 0; k < lrs.size(); ++k) {
      EXPECT_NEAR(s.lr(static_cast<int64_t>(k)), lrs[k], 1e-9 * std::max(1.0, lrs[k]))
          << "step " << k << " of " << c.dump().substr(0, 160);
    }
    if (c.contains("momenta")) {
      ++onecycle_cases;
      const auto momenta = c["momenta"].get<std::vector<double>>();
      for (size_t k = 0; k < momenta.size(); ++k) {
        ASSERT_TRUE(s.momentum(static_cast<int64_t>(k)).has_value());
        EXPECT_NEAR(*s.momentum(static_cast<int64_t>(k)), momenta[k], 1e-12)
            << "momentum at step " << k << " of " << c.dump().substr(0, 160);
      }
    } else {
      EXPECT_FALSE(s.momentum(0).has_value());
    }
  }
  EXPECT_EQ(onecycle_cases, 6);
}

TEST(LrSchedule, RejectsBadOptionsNamingThem) {
  harness::LrScheduleOptions o;
  o.total_steps = 5;
  o.warmup_steps = 5;
  EXPECT_THROW(harness::LrSchedule{o}, std::invalid_argument);
  EXPECT_THROW(harness::parse_lr_schedule_kind("exp"), std::invalid_argument);
}

TEST(Checkpoint, LoadsPythonOrderedDictSavedFromCudaAndGivesTorchvisionLogits) {
  // torch.save(model.state_dict()) from CUDA: an OrderedDict, which torch::pickle_load turns into
  // None (pytorch#100741); load_torch_file reads it, onto the CPU.
  harness::StateDictSource source;
  const double err = logits_error(test::golden_path("ckpt_plain_cuda.pt"), &source);
  std::cout << "max |C++ logits - torchvision logits| = " << err << "\n";
  EXPECT_LE(err, 1e-5);
  EXPECT_TRUE(source.location.empty());
  EXPECT_EQ(source.stripped_prefix, "");
  EXPECT_EQ(source.tensors, 122);
}

TEST(Checkpoint, LoadsNestedDdpCheckpointBesideOptimizerStateAndForeignObjects) {
  harness::StateDictSource source;
  EXPECT_LE(logits_error(test::golden_path("ckpt_nested_module.pt"), &source), 1e-5);
  EXPECT_EQ(source.location, std::vector<std::string>{"model"});
  EXPECT_EQ(source.stripped_prefix, "module.");
  EXPECT_NE(source.describe().find("'module.' prefix"), std::string::npos) << source.describe();
  // The rest of the file is plain data; foreign classes are inert dicts naming them.
  const auto d = harness::load_torch_file(test::golden_path("ckpt_nested_module.pt")).toGenericDict();
  EXPECT_EQ(d.at("epoch").toInt(), 5);
  const auto args = d.at("args").toGenericDict();
  EXPECT_EQ(args.at("__class__").toStringRef(), "argparse.Namespace");
  EXPECT_DOUBLE_EQ(args.at("lr").toDouble(), 0.1);
  EXPECT_EQ(args.at("arch").toStringRef(), "resnet18");
  EXPECT_EQ(d.at("tag").toStringRef(), std::string("\x00\xff" "bytes", 7));
  EXPECT_FLOAT_EQ(d.at("best_acc1").toTensor().item<float>(), 0.5f);
  const auto opt = d.at("optimizer").toGenericDict();
  const auto state0 = opt.at("state").toGenericDict().at(int64_t{0}).toGenericDict();
  EXPECT_EQ(state0.at("momentum_buffer").toTensor().sizes(), (std::vector<int64_t>{64, 3, 7, 7}));
}

TEST(Checkpoint, CppStateDictLoadsInPythonWithWeightsOnlyAndGivesTheSameLogits) {
  TempDir dir("ckpt_py");
  torch::manual_seed(0);
  harness::ResNetOptions o;
  o.num_classes = 10;
  auto model = harness::make_resnet(o);
  harness::save_state_dict(*model, dir.path / "r18.pt");
  for (const auto& e : fs::directory_iterator(dir.path)) {
    EXPECT_EQ(e.path().filename(), "r18.pt") << "temporary file left behind";
  }
  model->eval();
  const at::Tensor x = torch::randn({2, 3, 64, 64});
  at::Tensor logits;
  {
    torch::NoGradGuard no_grad;
    logits = model->forward(x);
  }
  c10::impl::GenericDict io(c10::StringType::get(), c10::TensorType::get());
  io.insert("x", x);
  io.insert("logits", logits);
  harness::save_torch_file(io, dir.path / "io.pt");
  // Python: weights_only loads, strict load into torchvision, same logits; then a DDP-style save
  // for the C++ side to read back.
  const std::string script =
      "import sys, torch, torchvision\n"
      "sd = torch.load(sys.argv[1], weights_only=True)\n"
      "io = torch.load(sys.argv[2], weights_only=True)\n"
      "m = torchvision.models.resnet18(num_classes=10)\n"
      "m.load_state_dict(sd, strict=True)\n"
      "m.eval()\n"
      "with torch.no_grad():\n"
      "    err = (m(io['x']) - io['logits']).abs().max().item()\n"
      "assert err <= 1e-5, err\n"
      "torch.save({'module.' + k: v.clone() for k, v in m.state_dict().items()}, sys.argv[3])\n";
  std::ofstream(dir.path / "roundtrip.py") << script;
  const std::string cmd = std::string(GPUFEED_PYTHON) + " " + (dir.path / "roundtrip.py").string() + " " +
                          (dir.path / "r18.pt").string() + " " + (dir.path / "io.pt").string() + " " +
                          (dir.path / "prefixed.pt").string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  torch::manual_seed(1);
  auto other = harness::make_resnet(o);
  ASSERT_FALSE(torch::equal(other->conv1->weight, model->conv1->weight));
  const auto source = harness::load_state_dict(*other, dir.path / "prefixed.pt");
  EXPECT_EQ(source.stripped_prefix, "module.");
  EXPECT_TRUE(params_equal(other, model));
}

TEST(Checkpoint, FindsStateDictUnderKnownKeysAndStripsCompilePrefix) {
  c10::impl::GenericDict inner(c10::StringType::get(), c10::AnyType::get());
  inner.insert("_orig_mod.fc.weight", torch::ones({2, 3}));
  inner.insert("_orig_mod.fc.bias", torch::zeros({2}));
  c10::impl::GenericDict outer(c10::StringType::get(), c10::AnyType::get());
  outer.insert("epoch", int64_t{3});
  outer.insert("state_dict", inner);
  harness::StateDictSource src;
  const auto sd = harness::find_state_dict(outer, "x.pt", &src);
  EXPECT_EQ(src.location, std::vector<std::string>{"state_dict"});
  EXPECT_EQ(src.stripped_prefix, "_orig_mod.");
  ASSERT_EQ(sd.size(), 2u);
  EXPECT_TRUE(sd.contains("fc.weight"));
  c10::impl::GenericDict none(c10::StringType::get(), c10::AnyType::get());
  none.insert("epoch", int64_t{3});
  try {
    harness::find_state_dict(none, "x.pt");
    FAIL() << "no state_dict should throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("x.pt"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("epoch"), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, MismatchedStateDictNamesTheKeys) {
  harness::ResNetOptions o;
  o.num_classes = 10;
  auto model = harness::make_resnet(o);
  harness::StateDict sd = harness::module_state_dict(*model);
  harness::StateDict bad;
  for (const auto& kv : sd) {
    if (kv.key() != "fc.bias") bad.insert(kv.key(), kv.value());
  }
  bad.insert("head.weight", torch::zeros({1}));
  try {
    harness::load_state_dict(*model, bad, "f.pt");
    FAIL();
  } catch (const std::runtime_error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("missing keys: fc.bias"), std::string::npos) << w;
    EXPECT_NE(w.find("unexpected keys: head.weight"), std::string::npos) << w;
  }
  harness::StateDict shaped;
  for (const auto& kv : sd) shaped.insert(kv.key(), kv.key() == "fc.weight" ? torch::zeros({5, 512}) : kv.value());
  try {
    harness::load_state_dict(*model, shaped, "f.pt");
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("fc.weight has shape [5, 512]"), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, FailedWriteLeavesThePreviousFileLoadable) {
  TempDir dir("atomic");
  const fs::path file = dir.path / "c.pt";
  c10::impl::GenericDict v1(c10::StringType::get(), c10::AnyType::get());
  v1.insert("step", int64_t{1});
  v1.insert("w", torch::zeros({1000}));
  harness::save_torch_file(v1, file);
  c10::impl::GenericDict v2(c10::StringType::get(), c10::AnyType::get());
  v2.insert("step", int64_t{2});
  v2.insert("w", torch::ones({1 << 20}));  // 4 MiB: several chunks
  int64_t seen = 0;
  harness::set_write_fault_hook([&](const fs::path&, int64_t written, int64_t total) {
    seen = total;
    if (written < total) throw std::runtime_error("injected fault");
  });
  EXPECT_THROW(harness::save_torch_file(v2, file), std::runtime_error);
  harness::set_write_fault_hook({});
  EXPECT_GT(seen, int64_t{4} << 20);
  const auto back = harness::load_torch_file(file).toGenericDict();
  EXPECT_EQ(back.at("step").toInt(), 1);
  for (const auto& e : fs::directory_iterator(dir.path)) EXPECT_EQ(e.path().filename(), "c.pt");
  harness::save_torch_file(v2, file);
  EXPECT_EQ(harness::load_torch_file(file).toGenericDict().at("step").toInt(), 2);
}

TEST(Checkpoint, WritesThroughSymlinksAndRefusesToReplaceDevicesFifosAndFolders) {
  TempDir dir("nonregular");
  const std::vector<char> bytes = {'a', 'b', 'c'};
  // A FIFO stays a FIFO: the temporary-file-and-rename write would have replaced it.
  const fs::path fifo = dir.path / "pipe.pt";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  try {
    harness::write_file_atomically(fifo, bytes);
    ADD_FAILURE() << "writing over a FIFO must be refused";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("pipe.pt"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_fifo(fs::symlink_status(fifo)));
  fs::create_directories(dir.path / "folder.pt");
  EXPECT_THROW(harness::write_file_atomically(dir.path / "folder.pt", bytes), std::runtime_error);
  EXPECT_TRUE(fs::is_directory(dir.path / "folder.pt"));
  if (fs::exists("/dev/null")) {
    EXPECT_THROW(harness::write_file_atomically("/dev/null", bytes), std::runtime_error);
    EXPECT_TRUE(fs::is_character_file("/dev/null"));
  }
  // A symlink to a regular file: the target gets the bytes, the link stays a link.
  const fs::path target = dir.path / "real.pt", link = dir.path / "link.pt";
  std::ofstream(target) << "old";
  fs::create_symlink(target, link);
  harness::write_file_atomically(link, bytes);
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(link)));
  EXPECT_EQ(test::read_text(target), "abc");
}

TEST(Checkpoint, UnreadableFilesAreErrorsNamingTheFile) {
  TempDir dir("badfile");
  std::ofstream(dir.path / "legacy.pt") << "\x80\x02not a zip";
  try {
    harness::load_torch_file(dir.path / "legacy.pt");
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("legacy.pt: not a zip archive"), std::string::npos) << e.what();
  }
  EXPECT_THROW(harness::load_torch_file(dir.path / "missing.pt"), std::runtime_error);
  // A truncated gpufeed file.
  c10::impl::GenericDict v(c10::StringType::get(), c10::AnyType::get());
  v.insert("w", torch::ones({4096}));
  harness::save_torch_file(v, dir.path / "ok.pt");
  fs::resize_file(dir.path / "ok.pt", fs::file_size(dir.path / "ok.pt") / 2);
  try {
    harness::load_torch_file(dir.path / "ok.pt");
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("ok.pt"), std::string::npos) << e.what();
  }
}

TEST(GradScaler, MatchesTorchAmpGradScalerStepByStep) {
  const auto c = test::load_golden("amp.json");
  harness::GradScalerOptions so;
  so.init_scale = c["init_scale"];
  so.growth_factor = c["growth_factor"];
  so.backoff_factor = c["backoff_factor"];
  so.growth_interval = c["growth_interval"];
  harness::GradScaler scaler(c10::Device(c10::kCPU), so);
  auto to_tensor = [](const nlohmann::json& j) {
    std::vector<float> flat;
    std::vector<int64_t> shape;
    std::function<void(const nlohmann::json&, size_t)> walk = [&](const nlohmann::json& v, size_t depth) {
      if (v.is_array()) {
        if (shape.size() <= depth) shape.push_back(static_cast<int64_t>(v.size()));
        for (const auto& e : v) walk(e, depth + 1);
      } else {
        flat.push_back(v.get<float>());
      }
    };
    walk(j, 0);
    return torch::tensor(flat).view(shape);
  };
  at::Tensor w = to_tensor(c["weight"]).requires_grad_(), b = to_tensor(c["bias"]).requires_grad_();
  const at::Tensor x = to_tensor(c["x"]), y = to_tensor(c["y"]);
  torch::optim::SGD opt({w, b}, torch::optim::SGDOptions(c["lr"].get<double>()).momentum(c["momentum"].get<double>()));
  const auto& steps = c["steps"];
  for (size_t k = 0; k < steps.size(); ++k) {
    opt.zero_grad(true);
    const at::Tensor out = torch::nn::functional::linear(x[static_cast<int64_t>(k)], w, b);
    const at::Tensor loss = (out - y[static_cast<int64_t>(k)]).pow(2).mean();
    EXPECT_EQ(scaler.get_scale(), steps[k]["scale_used"].get<double>()) << "step " << k;
    scaler.scale(loss).backward();
    const std::string key = std::to_string(k);
    if (c["poison"].contains(key)) {
      const std::string kind = c["poison"][key];
      torch::NoGradGuard no_grad;
      w.mutable_grad()[1][2] = kind == "nan" ? NAN : (kind == "inf" ? INFINITY : -INFINITY);
    }
    const bool ok = scaler.step_ok({w, b});
    if (ok) opt.step();
    scaler.update();
    EXPECT_EQ(ok, steps[k]["stepped"].get<bool>()) << "step " << k;
    EXPECT_EQ(scaler.get_scale(), steps[k]["scale"].get<double>()) << "step " << k;
    EXPECT_EQ(scaler.growth_tracker(), steps[k]["growth_tracker"].get<int64_t>()) << "step " << k;
    EXPECT_LE((w - to_tensor(steps[k]["weight"])).abs().max().item<double>(), 1e-6) << "step " << k;
    EXPECT_LE((b - to_tensor(steps[k]["bias"])).abs().max().item<double>(), 1e-6) << "step " << k;
  }
  scaler.set_state(8.0, 1);  // what a resumed run restores
  EXPECT_EQ(scaler.get_scale(), 8.0);
  EXPECT_EQ(scaler.growth_tracker(), 1);
}

TEST(Autocast, Bf16OnTheCpuInsideTheScopeAndRestoredAfter) {
  const at::Tensor a = torch::randn({4, 8}), w = torch::randn({3, 8});
  ASSERT_FALSE(at::autocast::is_autocast_enabled(c10::kCPU));
  {
    harness::AutocastGuard outer(c10::kCPU, c10::kBFloat16);
    EXPECT_EQ(torch::nn::functional::linear(a, w).scalar_type(), c10::kBFloat16);
    {
      harness::AutocastGuard off(c10::kCPU, c10::kBFloat16, /*enabled=*/false);
      EXPECT_EQ(torch::nn::functional::linear(a, w).scalar_type(), c10::kFloat);
    }
    EXPECT_EQ(torch::nn::functional::linear(a, w).scalar_type(), c10::kBFloat16);
  }
  EXPECT_FALSE(at::autocast::is_autocast_enabled(c10::kCPU));
  EXPECT_EQ(torch::nn::functional::linear(a, w).scalar_type(), c10::kFloat);
  EXPECT_THROW(harness::AutocastGuard(c10::kCPU, c10::kFloat), std::invalid_argument);
}

TEST(DistEnv, ReadsTorchrunThenSlurmContracts) {
  auto env_of = [](std::map<std::string, std::string> m) {
    return [m](const std::string& k) -> std::optional<std::string> {
      auto it = m.find(k);
      return it == m.end() ? std::nullopt : std::optional<std::string>(it->second);
    };
  };
  EXPECT_FALSE(harness::detect_dist_env(env_of({})).has_value());
  auto t = harness::detect_dist_env(env_of({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                                            {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "node7"},
                                            {"MASTER_PORT", "1234"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}));
  ASSERT_TRUE(t);
  EXPECT_EQ(t->source, "torchrun");
  EXPECT_EQ(t->rank, 3);
  EXPECT_EQ(t->world_size, 8);
  EXPECT_EQ(t->local_rank, 1);
  EXPECT_EQ(t->local_world_size, 2);
  EXPECT_EQ(t->master_addr, "node7");
  EXPECT_EQ(t->master_port, 1234);
  auto s = harness::detect_dist_env(env_of({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
                                            {"SLURM_TASKS_PER_NODE", "4(x2)"}, {"SLURM_JOB_ID", "123456"},
                                            {"SLURM_JOB_NODELIST", "gpu[03-04,7],cpu1"}}));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->source, "slurm");
  EXPECT_EQ(s->rank, 5);
  EXPECT_EQ(s->world_size, 8);
  EXPECT_EQ(s->local_rank, 1);
  EXPECT_EQ(s->local_world_size, 4);
  EXPECT_EQ(s->master_addr, "gpu03");
  EXPECT_EQ(s->master_port, 15000 + 123456 % 20000);
  EXPECT_THROW(harness::detect_dist_env(env_of({{"RANK", "x"}, {"WORLD_SIZE", "2"}})), std::invalid_argument);
  EXPECT_THROW(harness::detect_dist_env(env_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}})), std::invalid_argument);
}

TEST(Trainer, AccumulatingMicroBatchesEqualsOneLargerBatch) {
  // BatchNorm aside (frozen: it normalises with running statistics, so samples do not interact),
  // two micro-batches of 4 give the step of one batch of 8: same samples, same gradient.
  TempDir dir("accum");
  const fs::path data = tiny_dataset(dir.path / "data");
  harness::TrainOptions big = tiny_run(data);
  big.max_steps_per_epoch = 3;
  harness::TrainOptions acc = big;
  acc.batch_size = 4;
  acc.accum_steps = 2;
  harness::Trainer a(big), b(acc);
  EXPECT_EQ(a.scaled_lr(), b.scaled_lr());  // same global batch
  std::vector<std::vector<int64_t>> ia, ib;
  a.set_step_callback([&](const harness::StepStats& s) { ia.push_back(s.indices); });
  b.set_step_callback([&](const harness::StepStats& s) { ib.push_back(s.indices); });
  a.fit();
  b.fit();
  ASSERT_EQ(ia.size(), 3u);
  EXPECT_EQ(ia, ib);
  const double diff = max_param_diff(a.model(), b.model());
  std::cout << "max |param(accumulated) - param(one batch)| = " << diff << "\n";
  EXPECT_LE(diff, 1e-5);
  torch::manual_seed(0);
  harness::ResNet init = harness::make_resnet({"resnet18", 4, /*zero_init_residual=*/true});
  EXPECT_GT(max_param_diff(a.model(), init), 1e-4) << "the runs must have moved the weights";
}

TEST(Trainer, OnErrorSkipReplacesABadFileAndCountsItRaiseStopsNamingIt) {
  TempDir dir("train_skip");
  const fs::path data = tiny_dataset(dir.path / "data");
  const std::vector<fs::path> files = test::list_files_of(data);
  ASSERT_EQ(files.size(), 32u);
  const fs::path bad = files[5];
  std::ofstream(bad, std::ios::binary | std::ios::trunc) << "not an image at all";

  harness::TrainOptions o = tiny_run(data);
  o.error_policy = loader::ErrorPolicy::kSkip;
  o.max_skips = 1;
  harness::Trainer skip(o);
  const auto history = skip.fit();
  ASSERT_EQ(history.size(), 1u);
  EXPECT_EQ(history[0].samples, 32);      // batch shapes and count unchanged
  EXPECT_EQ(history[0].skipped_samples, 1);

  o.error_policy = loader::ErrorPolicy::kRaise;
  harness::Trainer raise(o);
  try {
    raise.fit();
    ADD_FAILURE() << "a bad file under --on-error raise must stop training";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(bad.filename().string()), std::string::npos) << e.what();
  }
}

TEST(Trainer, ChecksOptionsAndTheValidationClassesBeforeAnyWork) {
  TempDir dir("train_checks");
  const fs::path data = tiny_dataset(dir.path / "data");
  const auto message_of = [](const harness::TrainOptions& o) -> std::string {
    try {
      harness::Trainer t(o);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  harness::TrainOptions o = tiny_run(data);
  o.lr = std::nan("");
  EXPECT_NE(message_of(o).find("lr must be finite"), std::string::npos);
  o = tiny_run(data);
  o.device = "banana";
  EXPECT_NE(message_of(o).find("device 'banana'"), std::string::npos);
  o = tiny_run(data);
  o.max_steps_per_epoch = -1;
  EXPECT_NE(message_of(o).find("max_steps_per_epoch"), std::string::npos);
  o = tiny_run(data);
  o.batch_size = 1;
  o.freeze_bn = false;
  EXPECT_NE(message_of(o).find("batch_size 1"), std::string::npos);
  o.freeze_bn = true;  // BatchNorm in eval mode trains on single samples
  EXPECT_EQ(message_of(o), "");

  // A validation set with other classes fails at construction, naming both sets.
  fs::create_directories(dir.path / "val" / "zebra");
  fs::copy_file(test::list_files_of(data).front(), dir.path / "val" / "zebra" / "a.jpg");
  o = tiny_run(data);
  o.val_data = dir.path / "val";
  const std::string m = message_of(o);
  EXPECT_NE(m.find("zebra"), std::string::npos) << m;
  EXPECT_NE(m.find(data.string()), std::string::npos) << m;
}

TEST(Trainer, DropsALastBatchOfOneSampleThatBatchNormCannotTrainOn) {
  TempDir dir("train_last1");
  const fs::path data = tiny_dataset(dir.path / "data");  // 32 images
  fs::copy_file(test::list_files_of(data).front(), data / "class_000" / "zz_extra.jpg");
  harness::TrainOptions o = tiny_run(data);  // batch 8: 33 = 4 x 8 + 1
  o.freeze_bn = false;
  harness::Trainer t(o);
  const auto history = t.fit();  // PyTorch would raise "Expected more than 1 value per channel"
  ASSERT_EQ(history.size(), 1u);
  EXPECT_EQ(history[0].samples, 32);
  EXPECT_EQ(history[0].steps, 4);
}

TEST(Trainer, ResumedRunContinuesWithTheUninterruptedRunsBatchesAndLosses) {
  TempDir dir("resume");
  const fs::path data = tiny_dataset(dir.path / "data");
  harness::TrainOptions o = tiny_run(data);
  o.epochs = 2;
  o.max_steps_per_epoch = 3;
  o.warmup_epochs = 0.5;
  o.lr_schedule = harness::LrScheduleKind::kCosine;
  o.nesterov = true;
  o.no_decay_norm_bias = true;
  o.label_smoothing = 0.1;
  std::vector<harness::StepStats> full;
  harness::Trainer a(o);
  a.set_step_callback([&](const harness::StepStats& s) { full.push_back(s); });
  a.fit();
  ASSERT_EQ(full.size(), 6u);

  o.save_checkpoint = dir.path / "train.pt";
  {
    harness::Trainer b(o);
    b.set_step_callback([&](const harness::StepStats& s) {
      if (s.step == 3) b.request_stop(15);  // during the 2nd epoch's 2nd step
    });
    b.fit();
    EXPECT_EQ(b.stopped(), 15);
    EXPECT_EQ(b.last_checkpoint(), o.save_checkpoint);
  }
  const auto ck = harness::load_torch_file(*o.save_checkpoint).toGenericDict();
  EXPECT_EQ(ck.at("step").toInt(), 4);
  EXPECT_EQ(ck.at("sampler").toGenericDict().at("epoch").toInt(), 1);
  EXPECT_EQ(ck.at("sampler").toGenericDict().at("batches_consumed").toInt(), 1);

  o.resume = o.save_checkpoint;
  std::vector<harness::StepStats> rest;
  harness::Trainer c(o);
  c.set_step_callback([&](const harness::StepStats& s) { rest.push_back(s); });
  c.fit();
  ASSERT_EQ(rest.size(), 2u);
  for (size_t k = 0; k < rest.size(); ++k) {
    const auto& u = full[4 + k];
    EXPECT_EQ(rest[k].step, u.step);
    EXPECT_EQ(rest[k].epoch, u.epoch);
    EXPECT_EQ(rest[k].indices, u.indices) << "step " << u.step;
    EXPECT_EQ(rest[k].lr, u.lr) << "step " << u.step;
    EXPECT_EQ(rest[k].loss, u.loss) << "step " << u.step;
  }
  EXPECT_TRUE(params_equal(a.model(), c.model()));
}

TEST(Trainer, DataParallelOverTwoDevicesEqualsOneDevice) {
  // Two CPU "devices" exercise the whole DataParallel path (scatter, replica refresh, parallel
  // apply with the caller's thread state, gradient edges into the module, gather); BatchNorm is
  // frozen, as DataParallel's per-device batch statistics would otherwise differ.
  TempDir dir("dp");
  const fs::path data = tiny_dataset(dir.path / "data");
  harness::TrainOptions one = tiny_run(data);
  one.max_steps_per_epoch = 2;
  harness::TrainOptions two = one;
  two.dp_devices = {"cpu", "cpu"};
  harness::Trainer a(one);
  std::unique_ptr<harness::Trainer> b;
  try {
    b = std::make_unique<harness::Trainer>(two);
  } catch (const std::runtime_error& e) {
    GTEST_SKIP() << e.what();  // a build without CUDA has no DataParallel
  }
  std::vector<double> la, lb;
  a.set_step_callback([&](const harness::StepStats& s) { la.push_back(s.loss); });
  b->set_step_callback([&](const harness::StepStats& s) { lb.push_back(s.loss); });
  a.fit();
  b->fit();
  ASSERT_EQ(la.size(), 2u);
  ASSERT_EQ(lb.size(), 2u);
  EXPECT_NEAR(la[0], lb[0], 1e-6);
  EXPECT_NEAR(la[1], lb[1], 1e-5);
  const double diff = max_param_diff(a.model(), b->model());
  std::cout << "max |param(DataParallel cpu,cpu) - param(one device)| = " << diff << "\n";
  EXPECT_LE(diff, 1e-5);
}

TEST(Trainer, LearnsTheSyntheticDatasetToNinetyPercent) {
  const fs::path root = fs::temp_directory_path() / ("gpufeed_train_" + std::to_string(::getpid()));
  loader::SyntheticOptions so;
  so.num_classes = 4;
  so.images_per_class = 24;
  so.min_size = 48;
  so.max_size = 72;
  ASSERT_EQ(loader::write_synthetic_image_folder(root, so), 96);
  harness::TrainOptions o;
  o.data = root;
  o.val_data = root;  // evaluated with the eval transform: what the model learned, not augmentation luck
  o.arch = "resnet18";
  o.epochs = 4;
  o.batch_size = 16;
  o.lr = 0.4;  // per 256 -> 0.025 at batch 16
  o.warmup_epochs = 0.5;
  o.workers = 2;
  o.image_size = 48;
  o.seed = 0;
  o.checkpoint = root / "final.pt";
  harness::Trainer trainer(o);
  const auto history = trainer.fit();
  ASSERT_EQ(history.size(), 4u);
  for (const auto& e : history) {
    EXPECT_EQ(e.samples, 96);
    EXPECT_GT(e.images_per_s, 0);
    EXPECT_GE(e.data_wait_fraction, 0);
    EXPECT_LE(e.data_wait_fraction, 1);
  }
  EXPECT_LT(history.back().loss, history.front().loss);
  ASSERT_TRUE(history.back().val_top1);
  EXPECT_GE(*history.back().val_top1, 0.9) << "train-set accuracy after 4 epochs";
  EXPECT_EQ(*history.back().val_top5, 1.0);  // 4 classes: top-5 covers all
  EXPECT_TRUE(fs::exists(root / "final.pt"));
  fs::remove_all(root);
}
