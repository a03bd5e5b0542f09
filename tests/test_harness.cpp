#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>

#include "golden.h"
#include "gpufeed/harness/checkpoint.h"
#include "gpufeed/harness/lr_schedule.h"
#include "gpufeed/harness/resnet.h"
#include "gpufeed/harness/trainer.h"
#include "gpufeed/loader/synthetic.h"

using namespace gpufeed;
namespace fs = std::filesystem;

TEST(WarmupCosineSchedule, MatchesTorchLrSchedulerStepByStep) {
  const auto cases = test::load_golden("schedule.json");
  ASSERT_GE(cases.size(), 3u);
  for (const auto& c : cases) {
    harness::WarmupCosineSchedule s;
    s.base_lr = c["base_lr"];
    s.warmup_steps = c["warmup"];
    s.total_steps = c["total"];
    s.start_factor = c["start_factor"];
    s.min_lr = c["min_lr"];
    const auto lrs = c["lrs"].get<std::vector<double>>();
    for (size_t k = 0; k < lrs.size(); ++k) {
      EXPECT_NEAR(s.lr(static_cast<int64_t>(k)), lrs[k], 1e-9 * std::max(1.0, lrs[k]))
          << "step " << k << " of " << c.dump().substr(0, 100);
    }
  }
}

TEST(Checkpoint, StateDictLoadsInPythonIntoTorchvisionAndBackInCpp) {
  const fs::path dir = fs::temp_directory_path() / ("gpufeed_ckpt_" + std::to_string(::getpid()));
  torch::manual_seed(0);
  harness::ResNetOptions o;
  o.num_classes = 10;
  auto model = harness::make_resnet(o);
  harness::save_state_dict(*model, dir / "r18.pt");
  ASSERT_TRUE(fs::exists(dir / "r18.pt"));
  EXPECT_FALSE(fs::exists(dir / "r18.pt.tmp"));
  // Python: torch.load with weights_only=True, strict load into torchvision's resnet18, then
  // save the state_dict with DataParallel's "module." prefix for the C++ side to read back.
  const std::string script =
      "import sys, torch, torchvision\n"
      "sd = torch.load(sys.argv[1], weights_only=True)\n"
      "m = torchvision.models.resnet18(num_classes=10)\n"
      "m.load_state_dict(sd, strict=True)\n"
      "assert torch.equal(m.conv1.weight, sd['conv1.weight'])\n"
      "torch.save({'module.' + k: v.clone() for k, v in m.state_dict().items()}, sys.argv[2])\n";
  const fs::path py = dir / "roundtrip.py";
  std::ofstream(py) << script;
  const std::string cmd = std::string(GPUFEED_PYTHON) + " " + py.string() + " " +
                          (dir / "r18.pt").string() + " " + (dir / "prefixed.pt").string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  torch::manual_seed(1);
  auto other = harness::make_resnet(o);
  ASSERT_FALSE(torch::equal(other->conv1->weight, model->conv1->weight));
  harness::load_state_dict(*other, dir / "prefixed.pt");
  EXPECT_TRUE(torch::equal(other->conv1->weight, model->conv1->weight));
  EXPECT_TRUE(torch::equal(other->fc->bias, model->fc->bias));
  fs::remove_all(dir);
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
