#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/stat.h>

#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include <ATen/autocast_mode.h>

#include <cmath>
#include <iostream>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <regex>

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#ifdef GPUFEED_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "golden.h"
#include "gpufeed/harness/amp.h"
#include "gpufeed/harness/checkpoint.h"
#include "gpufeed/harness/distributed.h"
#include "gpufeed/harness/lr_schedule.h"
#include "gpufeed/harness/resnet.h"
#include "gpufeed/harness/torch_file.h"
#include "gpufeed/harness/train_checkpoint.h"
#include "gpufeed/harness/trainer.h"
#include "gpufeed/pack/pack.h"
#include "gpufeed/datasets/synthetic.h"
#include "gpufeed/sampler/sampler.h"
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
  o.loader.batch_size = 8;
  o.loader.transform.rrc.size = 32;
  o.loader.num_workers = 1;
  o.lr = 0.8;  // per 256: 0.025 at 8
  o.freeze_bn = true;
  o.zero_init_residual = true;
  o.distributed = harness::DistributedMode::kOff;
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

// fit() with a step callback collecting every step's stats: the steps, and the epochs in `epochs`.
std::vector<harness::StepStats> fit_collecting_steps(harness::Trainer& t,
                                                     std::vector<harness::EpochStats>* epochs = nullptr) {
  std::vector<harness::StepStats> steps;
  t.set_step_callback([&](const harness::StepStats& s) { steps.push_back(s); });
  auto history = t.fit();
  t.set_step_callback({});
  if (epochs) *epochs = std::move(history);
  return steps;
}

// A run of `o` stopped (request_stop(15)) after its global step `stop_after`, writing its training
// checkpoint to o.save_checkpoint, then a run resumed from that checkpoint (writing its own to
// o.save_checkpoint + ".resumed.pt", leaving the stopped run's in place): the resumed run.
struct Resumed {
  std::unique_ptr<harness::Trainer> trainer;
  std::vector<harness::StepStats> steps;
  std::vector<harness::EpochStats> epochs;
};
Resumed stop_and_resume(harness::TrainOptions o, int64_t stop_after) {
  {
    harness::Trainer b(o);
    b.set_step_callback([&](const harness::StepStats& s) {
      if (s.step == stop_after) b.request_stop(15);
    });
    b.fit();
    EXPECT_EQ(b.stopped(), 15);
    EXPECT_EQ(b.last_checkpoint(), o.save_checkpoint);
  }
  o.resume = o.save_checkpoint;
  o.save_checkpoint = o.resume->string() + ".resumed.pt";
  Resumed r;
  r.trainer = std::make_unique<harness::Trainer>(o);
  r.steps = fit_collecting_steps(*r.trainer, &r.epochs);
  return r;
}

// Each resumed step equals the uninterrupted run's step of the same number (full[k].step == k).
void expect_same_steps(const std::vector<harness::StepStats>& resumed, const std::vector<harness::StepStats>& full) {
  for (const auto& r : resumed) {
    ASSERT_LT(static_cast<size_t>(r.step), full.size());
    const auto& u = full[static_cast<size_t>(r.step)];
    EXPECT_EQ(r.epoch, u.epoch) << "step " << u.step;
    EXPECT_EQ(r.indices, u.indices) << "step " << u.step;
    EXPECT_EQ(r.lr, u.lr) << "step " << u.step;
    EXPECT_EQ(r.loss, u.loss) << "step " << u.step;
  }
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

// The options of a tests/goldens/gen_schedule.py case.
harness::LrScheduleOptions schedule_options_of(const nlohmann::json& c) {
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
  return o;
}

}  // namespace

TEST(LrSchedule, MatchesTorchLrSchedulerStepByStep) {
  const auto cases = test::load_golden("schedule.json");
  ASSERT_GE(cases.size(), 16u);
  int onecycle_cases = 0;
  for (const auto& c : cases) {
    const harness::LrScheduleOptions o = schedule_options_of(c);
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
  // Values that would make some step's rate infinite or NaN.
  const auto message_of = [](const harness::LrScheduleOptions& so) -> std::string {
    try {
      harness::LrSchedule s(so);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  harness::LrScheduleOptions oc;
  oc.kind = harness::LrScheduleKind::kOneCycle;
  oc.total_steps = 40;
  oc.div_factor = 0;
  EXPECT_NE(message_of(oc).find("div_factor"), std::string::npos);
  oc.div_factor = 25;
  oc.base_lr = std::numeric_limits<double>::infinity();
  EXPECT_NE(message_of(oc).find("finite"), std::string::npos);
  harness::LrScheduleOptions st;
  st.kind = harness::LrScheduleKind::kMultiStep;
  st.total_steps = 10;
  st.gamma = std::nan("");
  EXPECT_NE(message_of(st).find("gamma"), std::string::npos);
}

// Every configuration torch.optim.lr_scheduler refuses (OneCycleLR's zero-width
// phases divide by zero, LinearLR's start_factor, StepLR's step_size) is refused up front, and
// its accepted neighbours are accepted with finite rates that match torch's.
TEST(LrSchedule, RefusesExactlyTheConfigurationsTorchRefusesAndKeepsEveryRateFinite) {
  const auto cases = test::load_golden("schedule_raises.json");
  ASSERT_GE(cases.size(), 14u);
  int refused = 0;
  for (const auto& c : cases) {
    const harness::LrScheduleOptions o = schedule_options_of(c);
    const std::string what = c.dump().substr(0, 200);
    if (c["raises"].get<bool>()) {
      ++refused;
      try {
        harness::LrSchedule s(o);
        ADD_FAILURE() << "torch raised " << c["error"] << " but LrSchedule accepted " << what;
      } catch (const std::invalid_argument& e) {
        const std::string w = e.what();
        if (o.kind == harness::LrScheduleKind::kOneCycle) {
          EXPECT_NE(w.find("zero width"), std::string::npos) << w;
          EXPECT_NE(w.find("ZeroDivisionError"), std::string::npos) << w;
        }
      }
    } else {
      const harness::LrSchedule s(o);
      const auto lrs = c["lrs"].get<std::vector<double>>();
      ASSERT_EQ(lrs.size(), static_cast<size_t>(o.total_steps)) << what;
      for (size_t k = 0; k < lrs.size(); ++k) {
        EXPECT_TRUE(std::isfinite(s.lr(static_cast<int64_t>(k)))) << what;
        EXPECT_NEAR(s.lr(static_cast<int64_t>(k)), lrs[k], 1e-9 * std::max(1.0, lrs[k])) << "step " << k << " of " << what;
      }
    }
  }
  EXPECT_GE(refused, 9);
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

// Wrapper prefixes in any nesting -- real torch.compile(DDP(model)) and
// DDP(torch.compile(model)) saves from a 1-rank Gloo group, and a Lightning checkpoint whose
// LightningModule holds a DDP-wrapped network as self.model -- load into the model and name the
// wrappers they peeled.
TEST(Checkpoint, StripsWrapperPrefixesInAnyNestingAndNamesTheWrappers) {
  struct Case {
    const char* file;
    std::vector<std::string> location;
    const char* prefix;
    std::vector<std::string> wrappers;
  };
  const std::vector<Case> cases = {
      {"ckpt_compile_ddp.pt", {}, "_orig_mod.module.", {"torch.compile", "DistributedDataParallel/DataParallel"}},
      {"ckpt_ddp_compile.pt", {}, "module._orig_mod.", {"DistributedDataParallel/DataParallel", "torch.compile"}},
      {"ckpt_lightning.pt", {"state_dict"}, "model.module.",
       {"LightningModule.model", "DistributedDataParallel/DataParallel"}},
  };
  for (const auto& c : cases) {
    harness::StateDictSource source;
    EXPECT_LE(logits_error(test::golden_path(c.file), &source), 1e-5) << c.file;
    EXPECT_EQ(source.location, c.location) << c.file;
    EXPECT_EQ(source.stripped_prefix, c.prefix) << c.file;
    std::vector<std::string> names;
    for (const auto& w : source.wrappers) names.push_back(w.name);
    EXPECT_EQ(names, c.wrappers) << c.file;
    EXPECT_EQ(source.tensors, 122) << c.file;
    EXPECT_NE(source.describe().find(std::string("'") + c.prefix + "' prefix (stripped): wrappers "),
              std::string::npos)
        << source.describe();
  }
  // A prefix only some keys carry is a key name, not a wrapper: kept.
  harness::StateDict mixed;
  mixed.insert("model.fc.weight", torch::ones({2}));
  mixed.insert("head.weight", torch::ones({2}));
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  for (const auto& kv : mixed) d.insert(kv.key(), kv.value());
  harness::StateDictSource src;
  const auto sd = harness::find_state_dict(d, "m.pt", &src);
  EXPECT_TRUE(sd.contains("model.fc.weight"));
  EXPECT_TRUE(src.wrappers.empty());
}

// State_dicts without BatchNorm's num_batches_tracked (PyTorch < 0.4.1, or
// copied into a dict without _metadata) load, keeping the model's counters, as torchvision's
// strict load does (the golden script checks that torch accepts both files).
TEST(Checkpoint, AcceptsStateDictsWithoutNumBatchesTrackedAsTorchDoes) {
  for (const char* file : {"ckpt_no_nbt.pt", "ckpt_no_nbt_v1.pt"}) {
    harness::ResNetOptions ro;
    ro.num_classes = 10;
    auto model = harness::make_resnet(ro);
    const auto state = harness::find_state_dict(harness::load_torch_file(test::golden_path(file)), file);
    EXPECT_EQ(state.size(), 102u) << file;
    const harness::LoadReport report = harness::load_state_dict(*model, state, file);
    ASSERT_EQ(report.defaulted_num_batches_tracked.size(), 20u) << file;
    EXPECT_EQ(report.defaulted_num_batches_tracked.front(), "bn1.num_batches_tracked");
    EXPECT_EQ(model->bn1->num_batches_tracked.item<int64_t>(), 0) << "kept at the model's value";
    EXPECT_TRUE(report.excluded.empty());
    harness::StateDictSource source;
    EXPECT_LE(logits_error(test::golden_path(file), &source), 1e-5) << file;
  }
  // Any other missing buffer or parameter is still an error.
  harness::ResNetOptions ro;
  ro.num_classes = 10;
  auto model = harness::make_resnet(ro);
  auto state = harness::find_state_dict(harness::load_torch_file(test::golden_path("ckpt_no_nbt.pt")), "f");
  ASSERT_EQ(state.erase("bn1.running_var"), 1u);
  try {
    harness::load_state_dict(*model, state, "f.pt");
    ADD_FAILURE() << "a missing running_var must be refused";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("missing keys: bn1.running_var;"), std::string::npos) << e.what();
  }
}

// Fine-tuning: torchvision's 1000-class resnet18 onto a 2-class model, by exclusion
// pattern (module prefix, regex) or by skipping mismatched shapes; the new head keeps its fresh
// initialisation, everything else is the file's.
TEST(Checkpoint, FineTunesOntoAnotherClassCountByExclusionOrSkippingMismatchedShapes) {
  const fs::path file = test::golden_path("ckpt_r18_1000.pt");
  const auto state = harness::find_state_dict(harness::load_torch_file(file), file.string());
  const auto fresh = [] {
    torch::manual_seed(5);
    harness::ResNetOptions ro;
    ro.num_classes = 2;
    return harness::make_resnet(ro);
  };
  const auto check_loaded = [&](harness::ResNet& m, const std::string& how) {
    auto init = fresh();
    EXPECT_TRUE(torch::equal(m->fc->weight, init->fc->weight)) << how << ": fc keeps its fresh init";
    EXPECT_TRUE(torch::equal(m->fc->bias, init->fc->bias)) << how;
    EXPECT_TRUE(torch::equal(m->conv1->weight, state.at("conv1.weight"))) << how;
    EXPECT_TRUE(torch::equal(m->layer4->named_parameters()["0.conv2.weight"], state.at("layer4.0.conv2.weight")))
        << how;
  };
  {
    auto m = fresh();  // without an option: refused, naming both shapes and the options
    try {
      harness::load_state_dict(*m, state, "r18.pt");
      ADD_FAILURE() << "a 1000-class head into a 2-class model must be refused";
    } catch (const std::runtime_error& e) {
      const std::string w = e.what();
      EXPECT_NE(w.find("fc.weight: [1000, 512] in the file, [2, 512] in the model"), std::string::npos) << w;
      EXPECT_NE(w.find("fc.bias: [1000] in the file, [2] in the model"), std::string::npos) << w;
      EXPECT_NE(w.find("`init_weights_exclude` fc"), std::string::npos) << w;
    }
  }
  for (const std::string pattern : {"fc", "fc\\.(weight|bias)"}) {
    auto m = fresh();
    harness::LoadStateDictOptions lo;
    lo.exclude = {pattern};
    const auto report = harness::load_state_dict(*m, state, "r18.pt", lo);
    EXPECT_EQ(report.excluded, (std::vector<std::string>{"fc.weight", "fc.bias"})) << pattern;
    EXPECT_TRUE(report.mismatched.empty());
    check_loaded(m, "exclude " + pattern);
  }
  {
    auto m = fresh();
    harness::LoadStateDictOptions lo;
    lo.skip_mismatched_shapes = true;
    const auto report = harness::load_state_dict(*m, state, "r18.pt", lo);
    EXPECT_EQ(report.mismatched.size(), 2u);
    check_loaded(m, "skip mismatched");
  }
  {
    auto m = fresh();  // a pattern that matches nothing is an error, not a silent no-op
    harness::LoadStateDictOptions lo;
    lo.exclude = {"fc", "classifier"};
    EXPECT_THROW(harness::load_state_dict(*m, state, "r18.pt", lo), std::runtime_error);
    EXPECT_THROW(harness::key_matches("fc.weight", "fc["), std::invalid_argument);
    EXPECT_FALSE(harness::key_matches("fc2.weight", "fc"));
    std::vector<std::string> dropped;
    const auto kept = harness::drop_keys(state, {"fc", "layer4\\..*"}, &dropped);
    EXPECT_EQ(kept.size(), state.size() - dropped.size());
    EXPECT_EQ(dropped.size(), 2u + 30u);  // layer4: 2 blocks x (2 conv + 2 x 5 bn) + downsample (conv + 5 bn)
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
    EXPECT_NE(std::string(e.what()).find("fc.weight: [5, 512] in the file, [10, 512] in the model"),
              std::string::npos)
        << e.what();
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
  profiler::set_write_fault_hook([&](const fs::path&, int64_t written, int64_t total) {
    seen = total;
    if (written < total) throw std::runtime_error("injected fault");
  });
  EXPECT_THROW(harness::save_torch_file(v2, file), std::runtime_error);
  profiler::set_write_fault_hook({});
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
    profiler::write_file_atomically(fifo, bytes);
    ADD_FAILURE() << "writing over a FIFO must be refused";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("pipe.pt"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_fifo(fs::symlink_status(fifo)));
  fs::create_directories(dir.path / "folder.pt");
  EXPECT_THROW(profiler::write_file_atomically(dir.path / "folder.pt", bytes), std::runtime_error);
  EXPECT_TRUE(fs::is_directory(dir.path / "folder.pt"));
  if (fs::exists("/dev/null")) {
    EXPECT_THROW(profiler::write_file_atomically("/dev/null", bytes), std::runtime_error);
    EXPECT_TRUE(fs::is_character_file("/dev/null"));
  }
  // A symlink to a regular file: the target gets the bytes, the link stays a link.
  const fs::path target = dir.path / "real.pt", link = dir.path / "link.pt";
  std::ofstream(target) << "old";
  fs::create_symlink(target, link);
  profiler::write_file_atomically(link, bytes);
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
  acc.loader.batch_size = 4;
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
  o.loader.error_policy = loader::ErrorPolicy::kSkip;
  o.loader.max_skips = 1;
  harness::Trainer skip(o);
  const auto history = skip.fit();
  ASSERT_EQ(history.size(), 1u);
  EXPECT_EQ(history[0].samples, 32);      // batch shapes and count unchanged
  EXPECT_EQ(history[0].skipped_samples, 1);

  o.loader.error_policy = loader::ErrorPolicy::kRaise;
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
  o.loader.batch_size = 1;
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
  o.schedule.warmup_epochs = 0.5;
  o.schedule.lr_schedule = harness::LrScheduleKind::kCosine;
  o.nesterov = true;
  o.no_decay_norm_bias = true;
  o.label_smoothing = 0.1;
  harness::Trainer a(o);
  const auto full = fit_collecting_steps(a);
  ASSERT_EQ(full.size(), 6u);

  o.save_checkpoint = dir.path / "train.pt";
  const Resumed c = stop_and_resume(o, 3);  // stopped during the 2nd epoch's 2nd step
  const auto ck = harness::load_torch_file(*o.save_checkpoint).toGenericDict();
  EXPECT_EQ(ck.at("step").toInt(), 4);
  EXPECT_EQ(ck.at("sampler").toGenericDict().at("epoch").toInt(), 1);
  EXPECT_EQ(ck.at("sampler").toGenericDict().at("batches_consumed").toInt(), 1);
  ASSERT_EQ(c.steps.size(), 2u);
  EXPECT_EQ(c.steps[0].step, 4);
  expect_same_steps(c.steps, full);
  EXPECT_TRUE(params_equal(a.model(), c.trainer->model()));
}

// Progressive resizing (FFCV's get_resolution, min_res 32, max_res 96, end_ramp 2): epochs at
// 32, 64 and 96 from one set of slots; stopped in the middle of epoch 1 and resumed, the run
// continues at epoch 1's size with the uninterrupted run's batches, rates and losses.
TEST(Trainer, ResumedRunUnderAResolutionRampEqualsTheUninterruptedRun) {
  TempDir dir("resume_ramp");
  const fs::path data = tiny_dataset(dir.path / "data");
  harness::TrainOptions o = tiny_run(data);
  o.epochs = 3;
  o.max_steps_per_epoch = 3;
  o.schedule.resolution = harness::ResolutionSchedule{.min_res = 32, .max_res = 96, .start_ramp = 0, .end_ramp = 2};
  harness::Trainer a(o);
  std::vector<harness::EpochStats> history;
  const auto full = fit_collecting_steps(a, &history);
  ASSERT_EQ(full.size(), 9u);
  ASSERT_EQ(history.size(), 3u);
  EXPECT_EQ(history[0].image_size, 32);
  EXPECT_EQ(history[1].image_size, 64);
  EXPECT_EQ(history[2].image_size, 96);

  o.save_checkpoint = dir.path / "train.pt";
  const Resumed c = stop_and_resume(o, 4);  // stopped after epoch 1's 2nd step
  ASSERT_EQ(c.epochs.size(), 2u);
  EXPECT_EQ(c.epochs[0].image_size, 64);  // the resumed epoch's own size, not the first epoch's
  EXPECT_EQ(c.epochs[1].image_size, 96);
  ASSERT_EQ(c.steps.size(), 4u);
  EXPECT_EQ(c.steps[0].step, 5);
  expect_same_steps(c.steps, full);
  EXPECT_TRUE(params_equal(a.model(), c.trainer->model()));

  // A ramp whose rounding gives a side below 8 is refused at start-up, naming the epoch.
  o.schedule.resolution = harness::ResolutionSchedule{.min_res = 8, .max_res = 40, .start_ramp = 0, .end_ramp = 4};
  try {
    harness::Trainer bad(o);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("epoch 1 (0-based) an image size of 0"), std::string::npos) << e.what();
  }
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
  datasets::SyntheticOptions so;
  so.num_classes = 4;
  so.images_per_class = 24;
  so.min_size = 48;
  so.max_size = 72;
  ASSERT_EQ(datasets::write_synthetic_image_folder(root, so), 96);
  harness::TrainOptions o;
  o.data = root;
  o.val_data = root;  // evaluated with the eval transform: what the model learned, not augmentation luck
  o.arch = "resnet18";
  o.epochs = 4;
  o.loader.batch_size = 16;
  o.lr = 0.4;  // per 256 -> 0.025 at batch 16
  o.schedule.warmup_epochs = 0.5;
  o.loader.num_workers = 2;
  o.loader.transform.rrc.size = 48;
  o.loader.seed = 0;
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

namespace {

// `n` images of one class (copies of a tiny_dataset image) under `root`/only.
fs::path few_images(const fs::path& root, int n) {
  const fs::path src = tiny_dataset(root / "src");
  fs::create_directories(root / "few" / "only");
  for (int i = 0; i < n; ++i) {
    fs::copy_file(test::list_files_of(src).at(static_cast<size_t>(i)),
                  root / "few" / "only" / ("img" + std::to_string(i) + ".jpg"));
  }
  return root / "few";
}

std::string construction_error(const harness::TrainOptions& o) {
  try {
    harness::Trainer t(o);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// A run whose epochs would take no optimizer step is refused at start-up,
// naming the dataset size, batch size, world size and drop_last.
TEST(Trainer, AnEpochWithoutAnOptimizerStepIsRefusedAtStartUpNamingTheSizes) {
  TempDir dir("nosteps");
  harness::TrainOptions o = tiny_run(few_images(dir.path / "one", 1));
  o.loader.batch_size = 4;
  o.freeze_bn = false;  // the automatic single-sample drop
  std::string m = construction_error(o);
  EXPECT_NE(m.find("an epoch would take no optimizer step"), std::string::npos) << m;
  EXPECT_NE(m.find("has 1 images; world size 1 gives each rank 1"), std::string::npos) << m;
  EXPECT_NE(m.find("batch size 4 with drop_last (turned on because the only batch would hold 1 sample"),
            std::string::npos)
      << m;
  o.data = few_images(dir.path / "three", 3);  // explicit drop_last, a dataset smaller than a batch
  o.loader.drop_last = true;
  m = construction_error(o);
  EXPECT_NE(m.find("has 3 images; world size 1 gives each rank 3"), std::string::npos) << m;
  EXPECT_NE(m.find("batch size 4 with drop_last on leaves 0 batches"), std::string::npos) << m;
  o.loader.drop_last = false;  // 3 images, batch 4: one batch of 3, one step
  EXPECT_EQ(construction_error(o), "");
}

// Schedules that would produce a NaN rate are refused at start-up.
TEST(Trainer, ASchedulePlanTorchWouldRefuseStopsTheRunAtStartUp) {
  TempDir dir("badplan");
  const fs::path data = tiny_dataset(dir.path / "data");
  harness::TrainOptions o = tiny_run(data);
  o.loader.batch_size = 16;  // 2 steps per epoch, pct_start 0.5: a zero-width warm-up
  o.schedule.lr_schedule = harness::LrScheduleKind::kOneCycle;
  o.schedule.onecycle_pct_start = 0.5;
  std::string m = construction_error(o);
  EXPECT_NE(m.find("1 epochs x 2 optimizer steps per epoch = 2 steps"), std::string::npos) << m;
  EXPECT_NE(m.find("the warm-up phase has zero width"), std::string::npos) << m;
  o.loader.batch_size = 8;  // 4 steps, pct_start 0.25: the same kind
  o.schedule.onecycle_pct_start = 0.25;
  EXPECT_NE(construction_error(o).find("zero width"), std::string::npos);
  o.schedule.onecycle_pct_start = 0.3;
  EXPECT_EQ(construction_error(o), "");
  o.schedule.lr_schedule = harness::LrScheduleKind::kCosine;  // a warmup as long as the run
  o.schedule.warmup_epochs = 1;
  m = construction_error(o);
  EXPECT_NE(m.find("need 0 <= warmup_steps < total_steps, got warmup 4, total 4"), std::string::npos) << m;
}

// A non-finite loss in fp32 and bf16 stops the run naming the epoch and step,
// before that step's update, and leaves the last training checkpoint as it was. fp32: a rate
// that explodes in epoch 2; bf16: weights with a NaN, so the very first loss is NaN.
TEST(Trainer, NonFiniteLossStopsTheRunNamingEpochAndStepAndKeepsTheLastCheckpoint) {
  TempDir dir("nanloss");
  const fs::path data = tiny_dataset(dir.path / "data");
  harness::TrainOptions o = tiny_run(data);
  o.epochs = 2;
  o.max_steps_per_epoch = 3;
  o.schedule.lr_schedule = harness::LrScheduleKind::kMultiStep;  // sane in epoch 1, absurd in epoch 2
  o.schedule.lr_milestones = {1};
  o.schedule.lr_gamma = 1e30;
  o.save_checkpoint = dir.path / "train.pt";
  harness::Trainer t(o);
  std::vector<harness::StepStats> steps;
  t.set_step_callback([&](const harness::StepStats& s) { steps.push_back(s); });
  try {
    t.fit();
    ADD_FAILURE() << "a NaN loss must stop the run";
  } catch (const std::runtime_error& e) {
    const std::string w = e.what();
    std::smatch at;
    ASSERT_TRUE(std::regex_search(w, at, std::regex("in epoch 2/2, step (\\d) of the epoch \\(optimizer step (\\d) of the run")))
        << w;
    // The steps that ran (reported to on_step) are the ones before the failing one.
    EXPECT_EQ(std::stoll(at[2]), static_cast<int64_t>(steps.size()) + 1) << w;
    EXPECT_EQ(std::stoll(at[1]), static_cast<int64_t>(steps.size()) - 3 + 1) << w;
    EXPECT_NE(w.find("no checkpoint was written (the last one, " + o.save_checkpoint->string() + ", is intact)"),
              std::string::npos)
        << w;
  }
  ASSERT_GE(steps.size(), 4u);
  for (const auto& s : steps) EXPECT_TRUE(std::isfinite(s.loss)) << "step " << s.step;
  const auto ck = harness::load_torch_file(*o.save_checkpoint).toGenericDict();
  EXPECT_EQ(ck.at("step").toInt(), 3);
  EXPECT_EQ(ck.at("epoch").toInt(), 1);
  for (const auto& kv : harness::find_state_dict(ck, "train.pt")) {
    EXPECT_TRUE(at::isfinite(kv.value()).all().item<bool>()) << kv.key();
  }

  // bf16 autocast, weights with a NaN: the first step stops, nothing is written.
  harness::ResNetOptions ro;
  ro.num_classes = 4;
  auto poisoned = harness::make_resnet(ro);
  {
    torch::NoGradGuard no_grad;
    poisoned->fc->weight[0][0] = std::nan("");
  }
  harness::save_state_dict(*poisoned, dir.path / "nan.pt");
  harness::TrainOptions b = tiny_run(data);
  b.precision = harness::Precision::kBFloat16;
  b.init_weights = dir.path / "nan.pt";
  b.save_checkpoint = dir.path / "bf16.pt";
  harness::Trainer u(b);
  try {
    u.fit();
    ADD_FAILURE() << "a NaN loss under bf16 must stop the run";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("the loss is not finite (nan) in epoch 1/1, step 1 of the epoch "
                                         "(optimizer step 1 of the run"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(*b.save_checkpoint));
}

// No host sync per training step on CUDA: torch's sync debug mode reports every synchronizing
// CUDA call (item(), a blocking copy to the host, a stream synchronize) as a warning; a run of 4
// steps must report no more of them than a run of 1 step (epoch start and end read the device,
// a step does not). fp32 (the non-finite loss check) and fp16 (GradScaler's found-inf flag, read
// per step as torch's own GradScaler.step does without a fused optimizer: not counted here).
TEST(Trainer, CudaTrainingStepsReadNothingFromTheDevice) {
#ifndef GPUFEED_WITH_CUDA
  GTEST_SKIP() << "a CPU-only build: the per-step device reads are counted where CUDA runs (tools/gpu_check.sh)";
#else
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device here: the per-step device reads are counted on the GPU machine (tools/gpu_check.sh)";
  }
  struct SyncCounter : c10::WarningHandler {
    int syncs = 0;
    void process(const c10::Warning& w) override {
      if (w.msg().find("synchroniz") != std::string::npos) ++syncs;
    }
  };
  TempDir dir("nosync");
  const fs::path data = tiny_dataset(dir.path / "data");
  const auto syncs_of = [&](int64_t steps) {
    harness::TrainOptions o = tiny_run(data);
    o.device = "cuda";
    o.max_steps_per_epoch = steps;
    harness::Trainer t(o);
    SyncCounter counter;
    c10::WarningUtils::WarningHandlerGuard guard(&counter);
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_WARN);
    t.fit();
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
    return counter.syncs;
  };
  const int one = syncs_of(1), four = syncs_of(4);
  EXPECT_EQ(four, one) << "synchronizing CUDA calls: " << one << " in a 1-step run, " << four << " in a 4-step run";
#endif
}

// Fine-tuning through the trainer: a 1000-class torchvision checkpoint onto a 4-class
// dataset with init_weights_exclude; and the same through a compile(DDP) key layout (wrapper
// prefixes).
TEST(Trainer, InitWeightsFromAnotherClassCountWithExcludedHead) {
  TempDir dir("finetune");
  const fs::path data = tiny_dataset(dir.path / "data");
  harness::TrainOptions o = tiny_run(data);
  o.init_weights = test::golden_path("ckpt_r18_1000.pt");
  const std::string m = construction_error(o);
  EXPECT_NE(m.find("fc.weight: [1000, 512] in the file, [4, 512] in the model"), std::string::npos) << m;
  o.init_weights_exclude = {"fc"};
  harness::Trainer t(o);
  const auto file = harness::find_state_dict(harness::load_torch_file(*o.init_weights), "f");
  EXPECT_TRUE(torch::equal(t.model()->conv1->weight, file.at("conv1.weight")));
  EXPECT_EQ(t.model()->fc->weight.size(0), 4);
  // 10-class weights saved by torch.compile(DDP(model)), head skipped for its shape.
  o.init_weights = test::golden_path("ckpt_compile_ddp.pt");
  o.init_weights_exclude.clear();
  o.init_weights_skip_mismatched = true;
  harness::Trainer u(o);
  const auto file2 = harness::find_state_dict(harness::load_torch_file(*o.init_weights), "f");
  EXPECT_TRUE(torch::equal(u.model()->layer1->named_parameters()["0.bn1.weight"], file2.at("layer1.0.bn1.weight")));
  EXPECT_TRUE(torch::equal(t.model()->fc->weight, u.model()->fc->weight)) << "same seed, same fresh head";
}

// Resuming with another schedule plan (more epochs, another lr) is refused,
// naming what changed and the next step's rate on both plans, unless resume_replan_schedule;
// then the run continues on the new plan. Wrapper prefixes where they apply to --resume: the
// checkpoint's model entry with wrapper prefixes resumes as well.
TEST(Trainer, ResumingOntoAnotherSchedulePlanIsRefusedUnlessReplanned) {
  TempDir dir("replan");
  const fs::path data = tiny_dataset(dir.path / "data");
  harness::TrainOptions o = tiny_run(data);
  o.epochs = 2;
  o.max_steps_per_epoch = 2;
  o.schedule.lr_schedule = harness::LrScheduleKind::kOneCycle;
  o.save_checkpoint = dir.path / "train.pt";
  {
    harness::Trainer a(o);
    a.fit();
  }
  // The model entry as a torch.compile(DDP(...)) save would name it.
  auto ck = harness::load_torch_file(*o.save_checkpoint).toGenericDict();
  ck.insert_or_assign("model", harness::state_dict_to_ivalue(harness::add_key_prefix(
                                   harness::find_state_dict(ck.at("model"), "m"), "_orig_mod.module.")));
  harness::save_torch_file(ck, dir.path / "prefixed.pt");

  harness::TrainOptions r = o;
  r.resume = dir.path / "prefixed.pt";
  r.save_checkpoint = dir.path / "resumed.pt";
  r.epochs = 4;
  std::string m = construction_error(r);
  EXPECT_NE(m.find("cannot resume: the learning-rate schedule differs from the saved run's: "
                   "total_steps 4 -> 8, epochs 2 -> 4"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("step 4 continues at lr"), std::string::npos) << m;
  EXPECT_NE(m.find("(the saved plan: "), std::string::npos) << m;
  EXPECT_NE(m.find("`resume_replan_schedule`"), std::string::npos) << m;
  harness::TrainOptions lr = o;  // another member of the kind: the learning rate
  lr.resume = r.resume;
  lr.lr = 1.6;
  m = construction_error(lr);
  EXPECT_NE(m.find("base_lr 0.025000000000000001 -> 0.050000000000000003"), std::string::npos) << m;

  r.resume_replan_schedule = true;
  harness::Trainer c(r);
  std::vector<harness::StepStats> rest;
  c.set_step_callback([&](const harness::StepStats& s) { rest.push_back(s); });
  c.fit();
  ASSERT_EQ(rest.size(), 4u);
  harness::LrScheduleOptions plan;
  plan.kind = harness::LrScheduleKind::kOneCycle;
  plan.base_lr = c.scaled_lr();
  plan.total_steps = 8;
  const harness::LrSchedule s(plan);
  for (const auto& st : rest) EXPECT_EQ(st.lr, s.lr(st.step)) << "step " << st.step;
  EXPECT_EQ(rest.front().step, 4);
}

// The step's named hook points run where trainer.h says: the batch transform per micro-batch
// before the forward pass, the gradient transform once per step on the complete gradients (here
// it zeroes them, so with no weight decay nothing moves), the post-step hook after each update.
TEST(Trainer, StepHooksRunAtTheirPlacesInTheStep) {
  TempDir dir("hooks");
  const fs::path data = tiny_dataset(dir.path / "data");
  harness::TrainOptions o = tiny_run(data);
  o.max_steps_per_epoch = 2;
  o.loader.batch_size = 4;
  o.accum_steps = 2;
  o.weight_decay = 0;
  harness::Trainer t(o);
  std::map<std::string, at::Tensor> before;
  for (const auto& p : t.model()->named_parameters()) before[p.key()] = p.value().detach().clone();
  std::vector<std::string> events;
  harness::StepHooks hooks;
  hooks.batch_transform = [&](at::Tensor& images, at::Tensor& labels) {
    events.push_back("batch " + std::to_string(images.size(0)) + " " + std::to_string(labels.size(0)));
  };
  hooks.gradient_transform = [&](const std::vector<at::Tensor>& params) {
    int64_t with_grad = 0;
    for (const auto& p : params) {
      if (p.grad().defined()) {
        ++with_grad;
        p.grad().zero_();
      }
    }
    events.push_back("gradients " + std::to_string(with_grad));
  };
  hooks.post_step = [&](int64_t step) { events.push_back("post " + std::to_string(step)); };
  t.set_step_hooks(hooks);
  t.fit();
  const std::vector<std::string> expected = {"batch 4 4", "batch 4 4", "gradients 62", "post 0",
                                             "batch 4 4", "batch 4 4", "gradients 62", "post 1"};
  EXPECT_EQ(events, expected);
  for (const auto& p : t.model()->named_parameters()) {
    EXPECT_TRUE(torch::equal(p.value(), before[p.key()])) << p.key() << " moved although its gradient was zeroed";
  }
}

// ---- activation checkpointing --------------------------------------------------------------------

namespace {

// Bytes glibc's malloc has handed out and not taken back (arena chunks in use + mmapped chunks):
// LibTorch's CPU allocator allocates through it.
size_t malloc_in_use() {
  const struct mallinfo2 m = ::mallinfo2();
  return m.uordblks + m.hblkhd;
}

// Counts its parameter's post-accumulate-grad calls: the hook DistributedDataParallel's buckets use.
struct CountingHook : torch::autograd::PostAccumulateGradHook {
  explicit CountingHook(int* count) : count(count) {}
  void operator()(const torch::autograd::Variable& /*tensor*/) override { ++*count; }
  int* count;
};

struct OneStep {
  at::Tensor loss;
  std::vector<int> accumulations;  // post-accumulate-grad hook calls per parameter
  std::vector<std::pair<std::string, at::Tensor>> grads, buffers;
  size_t held_after_forward = 0;  // malloc bytes the forward left held (the autograd graph's)
};

// One training forward + backward of a seeded resnet18 (BatchNorm training) on x, y.
OneStep resnet18_step(bool checkpointing, bool bf16, const at::Tensor& x, const at::Tensor& y) {
  torch::manual_seed(0);
  auto model = harness::make_resnet({"resnet18", 10, false});
  model->train();
  model->set_activation_checkpointing(checkpointing);
  OneStep r;
  const auto params = model->parameters();
  r.accumulations.assign(params.size(), 0);
  for (size_t i = 0; i < params.size(); ++i) {
    torch::autograd::impl::set_post_acc_grad_hooks(params[i], std::make_unique<CountingHook>(&r.accumulations[i]));
  }
  const size_t before = malloc_in_use();
  {
    std::optional<harness::AutocastGuard> autocast;
    if (bf16) autocast.emplace(c10::kCPU, c10::kBFloat16);
    r.loss = torch::nn::functional::cross_entropy(model->forward(x).to(at::kFloat), y);
  }
  r.held_after_forward = malloc_in_use() - before;
  r.loss.backward();
  for (const auto& p : model->named_parameters()) r.grads.emplace_back(p.key(), p.value().grad().clone());
  for (const auto& b : model->named_buffers()) r.buffers.emplace_back(b.key(), b.value().clone());
  return r;
}

}  // namespace

TEST(ActivationCheckpointing, Resnet18GradientsLossAndRunningStatisticsEqualTheRunWithout) {
  // Memory: run this test alone to read the printed numbers (command in docs/PERFORMANCE.md).
  torch::manual_seed(5);
  const at::Tensor x = at::randn({8, 3, 64, 64});
  const at::Tensor y = at::randint(0, 10, {8});
  for (const bool bf16 : {false, true}) {
    const OneStep plain = resnet18_step(false, bf16, x, y);
    const OneStep ckpt = resnet18_step(true, bf16, x, y);
    const char* what = bf16 ? "bf16 autocast" : "fp32";
    EXPECT_TRUE(at::equal(plain.loss, ckpt.loss)) << what << ": " << plain.loss.item<double>() << " vs "
                                                  << ckpt.loss.item<double>();
    ASSERT_EQ(plain.grads.size(), ckpt.grads.size());
    double worst = 0;
    std::string worst_name;
    for (size_t i = 0; i < plain.grads.size(); ++i) {
      ASSERT_EQ(plain.grads[i].first, ckpt.grads[i].first);
      ASSERT_TRUE(ckpt.grads[i].second.defined()) << ckpt.grads[i].first << " got no gradient";
      const double d = (plain.grads[i].second - ckpt.grads[i].second).abs().max().item<double>();
      if (d > worst) worst = d, worst_name = plain.grads[i].first;
    }
    EXPECT_LE(worst, 1e-6) << what << ": " << worst_name;
    // Every parameter's gradient accumulated (and its post-accumulate hooks run) exactly once.
    EXPECT_EQ(ckpt.accumulations, std::vector<int>(ckpt.grads.size(), 1)) << what;
    EXPECT_EQ(plain.accumulations, std::vector<int>(plain.grads.size(), 1)) << what;
    // Running statistics and num_batches_tracked: updated once, identically.
    for (size_t i = 0; i < plain.buffers.size(); ++i) {
      EXPECT_TRUE(at::equal(plain.buffers[i].second, ckpt.buffers[i].second)) << what << ": " << plain.buffers[i].first;
    }
    std::cout << what << ": max |grad(checkpointed) - grad(plain)| = " << worst << " (" << plain.grads.size()
              << " parameters); malloc bytes held after the forward of resnet18, batch 8x3x64x64: without "
              << plain.held_after_forward / 1024 << " KiB, with activation checkpointing "
              << ckpt.held_after_forward / 1024 << " KiB\n";
  }
}

TEST(ActivationCheckpointing, NoGradAndEvalForwardsAreTheUsualOnes) {
  torch::manual_seed(0);
  auto model = harness::make_resnet({"resnet18", 10, false});
  const at::Tensor x = at::randn({2, 3, 32, 32});
  model->eval();
  torch::NoGradGuard no_grad;
  const at::Tensor plain = model->forward(x);
  model->set_activation_checkpointing(true);
  EXPECT_TRUE(at::equal(model->forward(x), plain));
}

TEST(Trainer, ActivationCheckpointingTrainsTheSameWeightsAndIsRefusedWithDataParallel) {
  // BatchNorm trains here (not tiny_run's frozen BN): running statistics must match too.
  TempDir dir("ckpt_act");
  const fs::path data = tiny_dataset(dir.path / "data");
  harness::TrainOptions plain = tiny_run(data);
  plain.freeze_bn = false;
  plain.max_steps_per_epoch = 2;
  harness::TrainOptions ckpt = plain;
  ckpt.activation_checkpointing = true;
  harness::Trainer a(plain), b(ckpt);
  EXPECT_TRUE(b.model()->activation_checkpointing());
  std::vector<double> la, lb;
  a.set_step_callback([&](const harness::StepStats& s) { la.push_back(s.loss); });
  b.set_step_callback([&](const harness::StepStats& s) { lb.push_back(s.loss); });
  a.fit();
  b.fit();
  EXPECT_EQ(la, lb);
  const double diff = max_param_diff(a.model(), b.model());
  std::cout << "max |param(activation checkpointing) - param(without)| after 2 steps = " << diff << "\n";
  EXPECT_LE(diff, 1e-6);
  auto bb = b.model()->named_buffers();
  for (const auto& kv : a.model()->named_buffers()) EXPECT_TRUE(at::equal(kv.value(), bb[kv.key()])) << kv.key();
  harness::TrainOptions dp = ckpt;
  dp.dp_devices = {"cpu", "cpu"};
  try {
    harness::Trainer t(dp);
    ADD_FAILURE() << "DataParallel with activation checkpointing was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("`activation_checkpointing` does not combine with DataParallel"),
              std::string::npos)
        << e.what();
  }
}

// A checkpoint of rank 0 of a 2-rank run, stopped after 2 of its 6 batches of epoch 0 (batch 3,
// 32 images: 16 per rank), resumed on 1 rank (docs/SCALING.md, "Resuming on another number of
// ranks"): the resumed epoch trains, in their order, the DistributedSampler list positions the two
// ranks had not consumed (the union of both ranks' lists from batch 2 on, each once), and the next
// epoch is DistributedSampler(num_replicas=1)'s. Its own checkpoint mid-epoch records that epoch's
// list (epoch_world_size 2) and start, and resumes again on 1 rank where it stopped.
TEST(Trainer, ACheckpointOfTwoRanksResumesOnOneTrainingEachRemainingSampleOnce) {
  TempDir dir("reworld");
  const fs::path data = tiny_dataset(dir.path / "data");
  harness::TrainOptions o = tiny_run(data);
  o.epochs = 2;
  o.loader.batch_size = 3;
  o.save_checkpoint = dir.path / "one.pt";
  {
    harness::Trainer a(o);
    a.set_step_callback([&](const harness::StepStats& s) {
      if (s.step == 1) a.request_stop(15);
    });
    a.fit();
  }
  // As rank 0 of 2 ranks would have written it after its 2nd batch.
  auto ck = harness::load_torch_file(*o.save_checkpoint).toGenericDict();
  auto sa = ck.at("sampler").toGenericDict();
  EXPECT_EQ(sa.at("batches_consumed").toInt(), 2);
  EXPECT_EQ(sa.at("dataset_size").toInt(), 32);
  EXPECT_FALSE(sa.at("drop_last").toBool());
  sa.insert_or_assign("num_replicas", int64_t{2});
  sa.insert_or_assign("epoch_world_size", int64_t{2});
  harness::save_torch_file(ck, dir.path / "two.pt");

  // The oracle: the two ranks' DistributedSampler lists (checked against torch's elsewhere).
  std::vector<std::vector<int64_t>> rank_lists;
  for (int64_t r = 0; r < 2; ++r) {
    sampler::DistributedSampler s(32, {.num_replicas = 2, .rank = r, .seed = 0});
    s.set_epoch(0);
    rank_lists.push_back(s.indices());
  }
  std::vector<int64_t> remaining;  // positions 12.. of the global list: rank p % 2's (p / 2)-th
  for (int64_t p = 2 * 3 * 2; p < 32; ++p) remaining.push_back(rank_lists[p % 2][p / 2]);
  sampler::DistributedSampler one(32, {.num_replicas = 1, .rank = 0, .seed = 0});
  one.set_epoch(1);

  harness::TrainOptions r = o;
  r.resume = dir.path / "two.pt";
  r.save_checkpoint = dir.path / "resumed.pt";
  r.resume_replan_schedule = true;  // the saved plan is the 1-rank run's, not a 2-rank one's
  std::vector<int64_t> epoch0, epoch1;
  {
    harness::Trainer t(r);
    for (const auto& s : fit_collecting_steps(t)) {
      auto& into = s.epoch == 0 ? epoch0 : epoch1;
      into.insert(into.end(), s.indices.begin(), s.indices.end());
    }
  }
  EXPECT_EQ(epoch0, remaining);
  EXPECT_EQ(epoch1, one.indices());

  // Stopped after 1 batch of the resumed epoch: its checkpoint says where that epoch's list stands.
  harness::TrainOptions s = r;
  s.save_checkpoint = dir.path / "again.pt";
  {
    harness::Trainer t(s);
    bool first = true;
    t.set_step_callback([&](const harness::StepStats&) {
      if (first) t.request_stop(15);
      first = false;
    });
    t.fit();
  }
  const auto again = harness::load_torch_file(dir.path / "again.pt").toGenericDict().at("sampler").toGenericDict();
  EXPECT_EQ(again.at("num_replicas").toInt(), 1);
  EXPECT_EQ(again.at("epoch_world_size").toInt(), 2);
  EXPECT_EQ(again.at("epoch_start").toInt(), 12);
  EXPECT_EQ(again.at("batches_consumed").toInt(), 1);
  harness::TrainOptions u = o;
  u.resume = dir.path / "again.pt";
  u.save_checkpoint.reset();
  u.epochs = 1;
  u.resume_replan_schedule = true;  // 1 epoch instead of 2
  harness::Trainer t(u);
  std::vector<int64_t> rest;
  for (const auto& st : fit_collecting_steps(t)) rest.insert(rest.end(), st.indices.begin(), st.indices.end());
  EXPECT_EQ(rest, std::vector<int64_t>(remaining.begin() + 3, remaining.end()));
}

// Checkpoints that cannot tell where another world size resumes are refused, naming what they
// lack: one without the dataset size and drop_last (written before they were recorded).
TEST(Trainer, AnOlderCheckpointResumesOnlyOnItsOwnWorldSize) {
  TempDir dir("oldworld");
  const fs::path data = tiny_dataset(dir.path / "data");
  harness::TrainOptions o = tiny_run(data);
  o.max_steps_per_epoch = 1;
  o.save_checkpoint = dir.path / "a.pt";
  {
    harness::Trainer a(o);
    a.fit();
  }
  auto ck = harness::load_torch_file(*o.save_checkpoint).toGenericDict();
  auto sa = ck.at("sampler").toGenericDict();
  for (const char* key : {"dataset_size", "drop_last", "sampler_drop_last", "epoch_world_size", "epoch_start"}) EXPECT_EQ(sa.erase(key), 1u) << key;
  harness::save_torch_file(ck, dir.path / "old.pt");
  harness::TrainOptions r = o;
  r.resume = dir.path / "old.pt";
  EXPECT_EQ(construction_error(r), "") << "its own world size";
  sa.insert_or_assign("num_replicas", int64_t{2});
  harness::save_torch_file(ck, dir.path / "old2.pt");
  r.resume = dir.path / "old2.pt";
  const std::string m = construction_error(r);
  EXPECT_NE(m.find("old2.pt: cannot resume on world size 1: the checkpoint does not record the dataset size and "
                   "drop_last, which resuming on another world size needs; resume it on world size 2"),
            std::string::npos)
      << m;
}

// shuffle_order: the trainer deals the shard-aware order over shards, records it (with its window
// and partitions) in the training checkpoint, and refuses to resume it in another order.
TEST(Trainer, TheShardOrderIsRecordedInTheCheckpointAndAnotherOrderIsRefused) {
  TempDir dir("shard_order");
  const fs::path data = tiny_dataset(dir.path / "data");
  pack::PackOptions po;
  po.max_samples_per_shard = 5;
  pack::pack_dataset(datasets::ImageFolder(data, {.index_cache = "off"}), data, dir.path / "shards", po);
  harness::TrainOptions o = tiny_run(dir.path / "shards");
  o.index_cache.index_cache = "off";
  o.max_steps_per_epoch = 1;
  o.loader.shuffle_order = loader::ShuffleOrder::kShards;
  o.loader.shard_window = 2;
  o.save_checkpoint = dir.path / "train.pt";
  {
    harness::Trainer a(o);
    a.fit();
  }
  const harness::TrainCheckpoint ck = harness::load_train_checkpoint(*o.save_checkpoint);
  EXPECT_EQ(ck.run.shuffle_order, "shards");
  EXPECT_EQ(ck.run.shard_window, 2);
  EXPECT_EQ(ck.run.shard_partitions, 24);
  harness::TrainOptions r = o;
  r.resume = o.save_checkpoint;
  r.save_checkpoint = dir.path / "resumed.pt";
  r.loader.shuffle_order = loader::ShuffleOrder::kAuto;  // exact for local shards
  EXPECT_NE(construction_error(r).find("cannot resume: shuffle_order was shards, this run has exact"),
            std::string::npos)
      << construction_error(r);
  r.loader.shuffle_order = loader::ShuffleOrder::kShards;
  r.loader.shard_window = 3;
  EXPECT_NE(construction_error(r).find("cannot resume: shard_window was 2, this run has 3"), std::string::npos)
      << construction_error(r);
  // The shard order on a folder is an error naming the option and the data.
  harness::TrainOptions f = tiny_run(data);
  f.loader.shuffle_order = loader::ShuffleOrder::kShards;
  EXPECT_NE(construction_error(f).find("`shuffle_order` shards needs a dataset of shards"), std::string::npos)
      << construction_error(f);
}
