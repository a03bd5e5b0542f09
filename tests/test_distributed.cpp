// `gpufeed launch` and `gpufeed train` as processes: two Gloo ranks on this machine (no GPU
// needed), rank failures, signals and crashes during checkpoint writes. Faults are injected
// deterministically through GPUFEED_TEST_FAULT (tools/cmd_train.cpp), never by timing.
#include <ATen/ops/equal.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <torch/nn/modules/linear.h>
#include <torch/serialize.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "gpufeed/harness/checkpoint.h"
#include "gpufeed/harness/resnet.h"
#include "gpufeed/harness/torch_file.h"
#include "gpufeed/loader/synthetic.h"
#include "test_util.h"

using namespace gpufeed;
namespace fs = std::filesystem;

namespace {

using test::read_text;
using test::TempDir;
using test::tiny_dataset;

// How a process ended: its exit code, or 128 + the signal that killed it.
int code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

// Runs `cmd` with a shell, output (both streams) to `log`. Returns code_of(status).
int run(const std::string& cmd, const fs::path& log) {
  const std::string full = cmd + " > " + log.string() + " 2>&1";
  return code_of(std::system(full.c_str()));
}

const std::string kGpufeed = GPUFEED_CLI;

// One intra-op thread per process (the machine is shared; 2 ranks share its cores).
const std::string kEnv = "OMP_NUM_THREADS=1 ";

// A small run whose samples do not interact (BatchNorm frozen, blocks start as the identity).
std::string train_args(const fs::path& data) {
  return " train --data " + data.string() +
         " --arch resnet18 --image-size 32 --workers 1 --progress off --freeze-bn "
         "--zero-init-residual --lr 0.8 --seed 0";
}

// Two ranks through `gpufeed launch`, 4 steps of batch 4 with a training checkpoint, and a fault
// injected by GPUFEED_TEST_FAULT; returns the launcher's exit code, its output in `log`.
int launch_two_ranks_with_fault(const std::string& fault, const fs::path& data, const fs::path& ckpt,
                                const fs::path& log) {
  return run("GPUFEED_TEST_FAULT=" + fault + " " + kEnv + kGpufeed +
                 " launch --nproc-per-node 2 --master-port 0 -- gpufeed" + train_args(data) +
                 " --batch-size 4 --max-steps-per-epoch 4 --save-checkpoint " + ckpt.string(),
             log);
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

harness::StateDict load(const fs::path& p) {
  return harness::find_state_dict(harness::load_torch_file(p), p.string());
}

}  // namespace

TEST(Launch, TwoGlooRanksStayIdenticalAndEqualOneProcessOnTheUnionOfTheirBatches) {
  // Rank r trains on DistributedSampler shard r (2 images x 2 accumulated micro-batches per
  // step); one process with 4 x 2 sees the union of both ranks' samples in each step. BatchNorm
  // is frozen (per-rank batch statistics would differ by design); accumulation exercises no_sync.
  TempDir dir("ddp");
  const fs::path data = tiny_dataset(dir.path / "data");
  const std::string common = train_args(data) + " --accum-steps 2 --max-steps-per-epoch 3";
  const int launched =
      run(kEnv + kGpufeed + " launch --nproc-per-node 2 --master-port 0 -- gpufeed" + common +
              " --batch-size 2 --checkpoint " + (dir.path / "rank{rank}.pt").string(),
          dir.path / "launch.log");
  const std::string log = read_text(dir.path / "launch.log");
  ASSERT_EQ(launched, 0) << log;
  EXPECT_NE(log.find("world 2, global batch 8 (2 x 2 accum x 2)"), std::string::npos) << log;
  EXPECT_NE(log.find("backend gloo"), std::string::npos) << log;
  ASSERT_EQ(run(kEnv + kGpufeed + common + " --batch-size 4 --distributed off --checkpoint " +
                    (dir.path / "single.pt").string(),
                dir.path / "single.log"),
            0)
      << read_text(dir.path / "single.log");
  const auto r0 = load(dir.path / "rank0.pt"), r1 = load(dir.path / "rank1.pt"),
             one = load(dir.path / "single.pt");
  ASSERT_EQ(r0.size(), one.size());
  double worst = 0;
  for (const auto& kv : r0) {
    EXPECT_TRUE(at::equal(kv.value(), r1.at(kv.key()))) << kv.key() << " differs between the ranks";
    worst = std::max(worst, (kv.value() - one.at(kv.key())).abs().max().item<double>());
  }
  std::cout << "max |param(2 ranks) - param(1 process, union batch)| = " << worst << "\n";
  EXPECT_LE(worst, 1e-5);
  // And they did train: the weights moved away from the seed's initial ones.
  torch::manual_seed(0);
  auto init = harness::make_resnet({"resnet18", 4, /*zero_init_residual=*/true});
  EXPECT_GT((init->fc->weight - r0.at("fc.weight")).abs().max().item<double>(), 1e-4);
}

TEST(Launch, KilledRankMakesThePeerFailNamingTheCauseAndTheLauncherReportsIt) {
  TempDir dir("kill");
  const fs::path data = tiny_dataset(dir.path / "data");
  const int code =
      run(kEnv + "GPUFEED_TEST_FAULT=kill-rank=1:step=2 " + kGpufeed +
              " launch --nproc-per-node 2 --master-port 0 --stop-timeout 60 -- gpufeed" +
              train_args(data) + " --batch-size 4 --max-steps-per-epoch 4",
          dir.path / "launch.log");
  const std::string log = read_text(dir.path / "launch.log");
  EXPECT_EQ(code, 128 + 9) << log;  // the first failure's code: rank 1, SIGKILL
  EXPECT_NE(log.find("rank 1 (local rank 1, pid"), std::string::npos) << log;
  EXPECT_NE(log.find("was killed by signal 9"), std::string::npos) << log;
  EXPECT_NE(log.find("failed: rank 1 was killed by signal 9"), std::string::npos) << log;
  // Rank 0 either saw the broken connection first (its own error, naming the cause) or was
  // stopped by the launcher's SIGTERM; either way it exited non-zero.
  EXPECT_EQ(log.find("rank 0 exited with code 0"), std::string::npos) << log;
}

TEST(Train, StartedLikeTorchrunWithoutTheLauncherAPeerDeathIsAnErrorNamingTheCause) {
  // What torchrun (or srun) does: two processes with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
  TempDir dir("torchrun");
  const fs::path data = tiny_dataset(dir.path / "data");
  const std::string env = kEnv +
                          "WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                          std::to_string(free_port()) + " GPUFEED_TEST_FAULT=kill-rank=1:step=2 ";
  const std::string cmd = kGpufeed + train_args(data) + " --batch-size 4 --max-steps-per-epoch 4";
  const std::string script =
      "RANK=0 LOCAL_RANK=0 " + env + cmd + " > " + (dir.path / "r0.log").string() +
      " 2>&1 & p0=$!; " + "RANK=1 LOCAL_RANK=1 " + env + cmd + " > " +
      (dir.path / "r1.log").string() + " 2>&1 & p1=$!; " + "wait $p0; echo $? > " +
      (dir.path / "rc0").string() + "; wait $p1; echo $? > " + (dir.path / "rc1").string();
  std::ofstream(dir.path / "run.sh") << script << "\n";
  ASSERT_EQ(std::system(("sh " + (dir.path / "run.sh").string()).c_str()), 0);
  const std::string log0 = read_text(dir.path / "r0.log");
  EXPECT_EQ(std::stoi(read_text(dir.path / "rc1")), 128 + 9);
  EXPECT_EQ(std::stoi(read_text(dir.path / "rc0")), 1) << log0;
  EXPECT_NE(log0.find("joined via torchrun"), std::string::npos) << log0;
  EXPECT_NE(log0.find("gpufeed: error: rank 0 of 2:"), std::string::npos) << log0;
  EXPECT_NE(log0.find("another rank may have exited"), std::string::npos) << log0;
}

TEST(Signals, SigintFinishesTheStepWritesACheckpointAndExits130ThenResumes) {
  TempDir dir("sigint");
  const fs::path data = tiny_dataset(dir.path / "data");
  const fs::path ckpt = dir.path / "train.pt";
  const std::string cmd = kEnv + kGpufeed + train_args(data) +
                          " --batch-size 8 --epochs 2 --max-steps-per-epoch 3 --save-checkpoint " +
                          ckpt.string();
  const int code = run("GPUFEED_TEST_FAULT=signal=INT:step=2 " + cmd, dir.path / "a.log");
  const std::string log = read_text(dir.path / "a.log");
  EXPECT_EQ(code, 130) << log;
  EXPECT_NE(log.find("stopped by signal 2"), std::string::npos) << log;
  auto c = harness::load_torch_file(ckpt).toGenericDict();
  EXPECT_EQ(c.at("step").toInt(), 2);
  EXPECT_EQ(c.at("sampler").toGenericDict().at("batches_consumed").toInt(), 2);
  ASSERT_EQ(run(cmd + " --resume " + ckpt.string(), dir.path / "b.log"), 0)
      << read_text(dir.path / "b.log");
  c = harness::load_torch_file(ckpt).toGenericDict();
  EXPECT_EQ(c.at("step").toInt(), 6);
  EXPECT_EQ(c.at("epoch").toInt(), 2);
}

TEST(Signals, SecondSigintExitsAtOnceWithoutACheckpoint) {
  TempDir dir("sigint2");
  const fs::path data = tiny_dataset(dir.path / "data");
  const fs::path ckpt = dir.path / "train.pt";
  const int code =
      run("GPUFEED_TEST_FAULT=signal=INT:step=1,signal=INT:step=1 " + kEnv + kGpufeed +
              train_args(data) + " --batch-size 8 --max-steps-per-epoch 3 --save-checkpoint " +
              ckpt.string(),
          dir.path / "a.log");
  const std::string log = read_text(dir.path / "a.log");
  EXPECT_EQ(code, 130) << log;
  EXPECT_NE(log.find("second SIGINT"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(ckpt));
}

TEST(Signals, SigtermOnOneRankStopsBothRanksAfterTheSameStep) {
  TempDir dir("sigterm");
  const fs::path data = tiny_dataset(dir.path / "data");
  const fs::path ckpt = dir.path / "train.pt";
  const int code =
      launch_two_ranks_with_fault("signal=TERM:step=2:rank=0", data, ckpt, dir.path / "launch.log");
  const std::string log = read_text(dir.path / "launch.log");
  EXPECT_EQ(code, 143) << log;
  EXPECT_NE(log.find("rank 0 exited with code 143"), std::string::npos) << log;
  EXPECT_NE(log.find("rank 1 exited with code 143"), std::string::npos) << log;
  EXPECT_EQ(log.find("failed"), std::string::npos) << log;
  // Rank 0 asked during step 2; the ranks agree one step later.
  EXPECT_EQ(harness::load_torch_file(ckpt).toGenericDict().at("step").toInt(), 3);
}

TEST(Checkpoint, CrashWhileWritingLeavesThePreviousCheckpointLoadable) {
  TempDir dir("crash");
  const fs::path data = tiny_dataset(dir.path / "data");
  const fs::path ckpt = dir.path / "train.pt";
  const std::string cmd = kEnv + kGpufeed + train_args(data) +
                          " --batch-size 8 --epochs 2 --max-steps-per-epoch 2 --save-checkpoint " +
                          ckpt.string();
  // The second write (end of epoch 2) aborts the process after its first 1 MiB.
  const int code = run("GPUFEED_TEST_FAULT=abort-checkpoint-write=2 " + cmd, dir.path / "a.log");
  EXPECT_EQ(code, 128 + 6) << read_text(dir.path / "a.log");
  const auto c = harness::load_torch_file(ckpt).toGenericDict();
  EXPECT_EQ(c.at("epoch").toInt(), 1);
  EXPECT_EQ(c.at("step").toInt(), 2);
  ASSERT_EQ(run(cmd + " --resume " + ckpt.string(), dir.path / "b.log"), 0)
      << read_text(dir.path / "b.log");
  EXPECT_EQ(harness::load_torch_file(ckpt).toGenericDict().at("step").toInt(), 4);
}

TEST(Signals, LauncherForwardsSigtermToEveryWorkerAndExits143) {
  TempDir dir("fwd");
  const fs::path data = tiny_dataset(dir.path / "data");
  const fs::path ckpt = dir.path / "train.pt";
  // Rank 1 signals the launcher (as a terminal or a scheduler would); the launcher passes it on.
  const int code =
      launch_two_ranks_with_fault("signal-launcher=TERM:step=2:rank=1", data, ckpt, dir.path / "launch.log");
  const std::string log = read_text(dir.path / "launch.log");
  EXPECT_EQ(code, 143) << log;
  EXPECT_NE(log.find("passing it to the workers"), std::string::npos) << log;
  EXPECT_NE(log.find("rank 0 exited with code 143"), std::string::npos) << log;
  EXPECT_NE(log.find("rank 1 exited with code 143"), std::string::npos) << log;
  const int64_t step = harness::load_torch_file(ckpt).toGenericDict().at("step").toInt();
  EXPECT_GE(step, 2);
  EXPECT_LE(step, 4);
}

TEST(Ckpt, ListsAndConvertsAPythonCheckpointIntoAFileLibTorchReads) {
  TempDir dir("ckptcli");
  const fs::path nested = fs::path(GPUFEED_GOLDEN_DIR) / "ckpt_nested_module.pt";
  ASSERT_EQ(run(kGpufeed + " ckpt list " + nested.string(), dir.path / "list.log"), 0)
      << read_text(dir.path / "list.log");
  const std::string list = read_text(dir.path / "list.log");
  EXPECT_NE(list.find("args: object of argparse.Namespace"), std::string::npos) << list;
  EXPECT_NE(
      list.find("state_dict under 'model' (122 tensors), keys had the 'module.' prefix (stripped)"),
      std::string::npos)
      << list;
  EXPECT_NE(list.find("conv1.weight\t[64, 3, 7, 7]\tFloat"), std::string::npos) << list;
  EXPECT_NE(list.find("bn1.num_batches_tracked\t[]\tLong"), std::string::npos) << list;
  const fs::path out = dir.path / "plain.pt";
  ASSERT_EQ(run(kGpufeed + " ckpt convert " + nested.string() + " " + out.string() +
                    " --add-prefix module.",
                dir.path / "convert.log"),
            0)
      << read_text(dir.path / "convert.log");
  // LibTorch's own reader, which maps an OrderedDict to None, reads the converted file.
  std::ifstream in(out, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const c10::IValue v = torch::pickle_load(bytes);
  ASSERT_TRUE(v.isGenericDict());
  EXPECT_EQ(v.toGenericDict().size(), 122u);
  EXPECT_TRUE(v.toGenericDict().contains("module.conv1.weight"));
  harness::StateDictSource src;
  harness::find_state_dict(harness::load_torch_file(out), out.string(), &src);
  EXPECT_EQ(src.stripped_prefix, "module.");
}

// Issue 11, kinds 1 and 3 on the command line: `ckpt list` names the wrappers it peeled,
// `ckpt convert` writes keys without them (and drops keys on request), and `train
// --init-weights-exclude` fine-tunes a 1000-class file onto a 4-class folder.
TEST(Ckpt, ListNamesTheWrappersConvertStripsThemAndDropsKeysTrainExcludesTheHead) {
  TempDir dir("ckptwrap");
  const fs::path wrapped = fs::path(GPUFEED_GOLDEN_DIR) / "ckpt_compile_ddp.pt";
  ASSERT_EQ(run(kGpufeed + " ckpt list " + wrapped.string(), dir.path / "list.log"), 0)
      << read_text(dir.path / "list.log");
  const std::string list = read_text(dir.path / "list.log");
  EXPECT_NE(list.find("keys had the '_orig_mod.module.' prefix (stripped): wrappers torch.compile "
                      "(_orig_mod.) > DistributedDataParallel/DataParallel (module.)"),
            std::string::npos)
      << list;
  EXPECT_NE(list.find("\nconv1.weight\t[64, 3, 7, 7]\tFloat"), std::string::npos) << list;
  const fs::path out = dir.path / "plain.pt";
  ASSERT_EQ(run(kGpufeed + " ckpt convert " + wrapped.string() + " " + out.string() + " --drop fc",
                dir.path / "convert.log"),
            0)
      << read_text(dir.path / "convert.log");
  const std::string conv = read_text(dir.path / "convert.log");
  EXPECT_NE(conv.find("dropped 2 keys: fc.weight fc.bias"), std::string::npos) << conv;
  EXPECT_NE(conv.find("120 tensors, plain dict, keys without a wrapper prefix"), std::string::npos) << conv;
  std::ifstream in(out, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto d = torch::pickle_load(bytes).toGenericDict();
  EXPECT_EQ(d.size(), 120u);
  EXPECT_TRUE(d.contains("conv1.weight"));
  EXPECT_FALSE(d.contains("fc.weight"));
  EXPECT_NE(run(kGpufeed + " ckpt convert " + wrapped.string() + " " + out.string() + " --drop classifier",
                dir.path / "nomatch.log"),
            0);
  EXPECT_NE(read_text(dir.path / "nomatch.log").find("key pattern 'classifier' matches no key"), std::string::npos)
      << read_text(dir.path / "nomatch.log");

  const fs::path data = tiny_dataset(dir.path / "data");
  const fs::path r18 = fs::path(GPUFEED_GOLDEN_DIR) / "ckpt_r18_1000.pt";
  const std::string train = kEnv + kGpufeed + train_args(data) +
                            " --batch-size 8 --max-steps-per-epoch 1 --init-weights " + r18.string();
  EXPECT_EQ(run(train, dir.path / "refused.log"), 1);
  EXPECT_NE(read_text(dir.path / "refused.log").find("fc.weight: [1000, 512] in the file, [4, 512] in the model"),
            std::string::npos)
      << read_text(dir.path / "refused.log");
  ASSERT_EQ(run(train + " --init-weights-exclude fc", dir.path / "train.log"), 0) << read_text(dir.path / "train.log");
  EXPECT_NE(read_text(dir.path / "train.log").find("left at their initial values (excluded): fc.weight, fc.bias"),
            std::string::npos)
      << read_text(dir.path / "train.log");
}

// Issue 11, kind 5 across ranks: 3 images over 4 ranks with batch 2 leave every rank one sample
// (padded), which the single-sample rule drops: every rank refuses at start-up, naming the sizes.
TEST(Launch, FourRanksOnThreeImagesAreRefusedAtStartUpNamingTheSizes) {
  TempDir dir("fourranks");
  const fs::path src = tiny_dataset(dir.path / "src");
  fs::create_directories(dir.path / "three" / "only");
  for (int i = 0; i < 3; ++i) {
    fs::copy_file(test::list_files_of(src).at(static_cast<size_t>(i)),
                  dir.path / "three" / "only" / ("img" + std::to_string(i) + ".jpg"));
  }
  const int code = run(kEnv + kGpufeed + " launch --nproc-per-node 4 --master-port 0 -- gpufeed train --data " +
                           (dir.path / "three").string() +
                           " --arch resnet18 --image-size 32 --workers 1 --progress off --batch-size 2",
                       dir.path / "launch.log");
  const std::string log = read_text(dir.path / "launch.log");
  EXPECT_EQ(code, 1) << log;
  EXPECT_NE(log.find("an epoch would take no optimizer step: " + (dir.path / "three").string() +
                     " has 3 images; world size 4 gives each rank 1"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("batch size 2 with drop_last (turned on"), std::string::npos) << log;
  EXPECT_EQ(log.find("steps: 0"), std::string::npos) << log;
}
