// `gpufeed launch` and `gpufeed train` as processes: two Gloo ranks on this machine (no GPU
// needed), rank failures, signals and crashes during checkpoint writes. Faults are injected
// deterministically through GPUFEED_TEST_FAULT (tools/cli/cmd_train.cpp), never by timing.
#include <ATen/ATen.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/linear.h>
#include <torch/serialize.h>
#include <torch/utils.h>
#include <unistd.h>

#include <fcntl.h>
#include <signal.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "gpufeed/harness/checkpoint.h"
#include "gpufeed/harness/distributed.h"
#include "gpufeed/harness/resnet.h"
#include "gpufeed/harness/sync_batch_norm.h"
#include "gpufeed/harness/torch_file.h"
#include "gpufeed/datasets/synthetic.h"
#include "gpufeed/sampler/sampler.h"
#include "test_util.h"

using namespace gpufeed;
namespace fs = std::filesystem;

namespace {

using test::code_of;
using test::read_text;
using test::run;
using test::TempDir;
using test::eventually;
using test::tiny_dataset;

const std::string kGpufeed = GPUFEED_CLI;

// One intra-op thread per process (the machine is shared; 2 ranks share its cores).
const std::string kEnv = "OMP_NUM_THREADS=1 ";

// The fault-injection tests need a CLI that honours GPUFEED_TEST_FAULT: one built with
// GPUFEED_FAULT_INJECTION (on whenever the tests are built, unless turned off).
#ifdef GPUFEED_FAULT_INJECTION
#define REQUIRE_FAULT_INJECTION() (void)0
#else
#define REQUIRE_FAULT_INJECTION() \
  GTEST_SKIP() << "gpufeed was built with -DGPUFEED_FAULT_INJECTION=OFF: GPUFEED_TEST_FAULT is ignored"
#endif

// A small run whose samples do not interact (BatchNorm frozen, blocks start as the identity).
std::string train_args(const fs::path& data) {
  return " train --data " + data.string() +
         " --arch resnet18 --image-size 32 --num-workers 1 --progress off --freeze-bn "
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
  REQUIRE_FAULT_INJECTION();
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
  REQUIRE_FAULT_INJECTION();
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
  REQUIRE_FAULT_INJECTION();
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
  REQUIRE_FAULT_INJECTION();
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
  REQUIRE_FAULT_INJECTION();
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
  REQUIRE_FAULT_INJECTION();
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
  REQUIRE_FAULT_INJECTION();
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

// Wrapper prefixes and fine-tuning on the command line: `ckpt list` names the wrappers it peeled,
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

// An epoch without an optimizer step, across ranks: 3 images over 4 ranks with batch 2 leave
// every rank one sample (padded), which the single-sample rule drops: every rank refuses at
// start-up, naming the sizes.
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
                           " --arch resnet18 --image-size 32 --num-workers 1 --progress off --batch-size 2",
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

// --- stop signals before the first step ---------------------------------------------------------

namespace {

/// True when some socket of this machine listens on TCP `port` (/proc/net/tcp and tcp6: local
/// address "...:PPPP" in hex, state 0A = LISTEN).
bool listening_on(int port) {
  char hex[8];
  std::snprintf(hex, sizeof hex, ":%04X", port);
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      if (state == "0A" && local.size() > 5 && local.compare(local.size() - 5, 5, hex) == 0) return true;
    }
  }
  return false;
}

/// Starts `gpufeed args...` (fork + exec of the built binary) with `env` added, stdout and stderr
/// to `log`. Returns its pid.
pid_t start_gpufeed(const std::vector<std::string>& args, const std::vector<std::string>& env,
                    const fs::path& log) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ::dup2(fd, 1);
  ::dup2(fd, 2);
  for (const auto& kv : env) ::putenv(const_cast<char*>(kv.c_str()));
  std::vector<char*> argv{const_cast<char*>(kGpufeed.c_str())};
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execv(kGpufeed.c_str(), argv.data());
  ::_exit(127);
}

/// Waits up to `seconds` for `pid` to end; its code_of() status, or -1 on timeout (then kills it).
int wait_for(pid_t pid, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return code_of(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  return -1;
}

/// True while `pid` exists and is not a zombie.
bool alive(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

/// Pids whose parent is `parent`.
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream rest(stat.substr(paren + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent) out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return out;
}

// Rank 0 of a world of 2 whose rank 1 never comes: it hosts the TCPStore on `port` and waits
// there for --dist-timeout (300 s) unless a signal ends it.
std::vector<std::string> waiting_rank0_args(const fs::path& data) {
  return {"train", "--data", data.string(), "--arch", "resnet18", "--image-size", "32", "--num-workers", "1",
          "--progress", "off", "--distributed", "on", "--dist-timeout", "300", "--batch-size", "4"};
}

}  // namespace

TEST(Signals, SigintOrSigtermWhileWaitingInRendezvousEndsTheRankAtOnce) {
  // No step has started, so nothing is deferred: exit 130/143 within seconds, not at the end of
  // the 300 s rendezvous timeout (the bound is generous: a loaded machine, a cold start).
  TempDir dir("rdzv_signal");
  const fs::path data = tiny_dataset(dir.path / "data");
  for (const int sig : {SIGINT, SIGTERM}) {
    SCOPED_TRACE(strsignal(sig));
    const int port = free_port();
    const fs::path log = dir.path / ("rank0_" + std::to_string(sig) + ".log");
    const pid_t pid = start_gpufeed(waiting_rank0_args(data),
                                    {"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1",
                                     "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port),
                                     "OMP_NUM_THREADS=1"},
                                    log);
    ASSERT_TRUE(eventually([&] { return listening_on(port) || !alive(pid); }, 120)) << read_text(log);
    ASSERT_TRUE(alive(pid)) << read_text(log);
    const auto t0 = std::chrono::steady_clock::now();
    ::kill(pid, sig);
    const int code = wait_for(pid, 60);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(code, 128 + sig) << read_text(log);
    EXPECT_LT(seconds, 30.0);
    EXPECT_NE(read_text(log).find("before the first training step: exiting now"), std::string::npos)
        << read_text(log);
    EXPECT_FALSE(listening_on(port));
  }
}

TEST(Signals, LauncherStopsWaitingWorkersAtOnceAndKilledLauncherTakesThemAlong) {
  // Node 0 of 2: its worker (rank 0) hosts the TCPStore and waits for node 1, which never comes.
  TempDir dir("rdzv_launch");
  const fs::path data = tiny_dataset(dir.path / "data");
  const auto launch_args = [&](int port) {
    std::vector<std::string> a = {"launch", "--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "1",
                                  "--master-port", std::to_string(port), "--stop-timeout", "30", "--",
                                  "gpufeed"};
    for (const auto& t : waiting_rank0_args(data)) a.push_back(t);
    return a;
  };
  {
    // Ctrl-C to the launcher: forwarded, honoured at once; not 4 x --stop-timeout (120 s).
    const int port = free_port();
    const fs::path log = dir.path / "launch_int.log";
    const pid_t launcher = start_gpufeed(launch_args(port), {"OMP_NUM_THREADS=1"}, log);
    ASSERT_TRUE(eventually([&] { return listening_on(port) || !alive(launcher); }, 120)) << read_text(log);
    const auto t0 = std::chrono::steady_clock::now();
    ::kill(launcher, SIGINT);
    EXPECT_EQ(wait_for(launcher, 90), 130) << read_text(log);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
    EXPECT_NE(read_text(log).find("rank 0 exited with code 130"), std::string::npos) << read_text(log);
    EXPECT_FALSE(listening_on(port));
  }
  {
    // SIGKILL to the launcher: its worker gets SIGTERM (PR_SET_PDEATHSIG) and leaves the port.
    const int port = free_port();
    const fs::path log = dir.path / "launch_kill.log";
    const pid_t launcher = start_gpufeed(launch_args(port), {"OMP_NUM_THREADS=1"}, log);
    ASSERT_TRUE(eventually([&] { return listening_on(port) || !alive(launcher); }, 120)) << read_text(log);
    const std::vector<pid_t> workers = children_of(launcher);
    ASSERT_EQ(workers.size(), 1u);
    ::kill(launcher, SIGKILL);
    ::waitpid(launcher, nullptr, 0);
    EXPECT_TRUE(eventually([&] { return !alive(workers[0]); }, 30)) << "the worker outlived its launcher";
    EXPECT_TRUE(eventually([&] { return !listening_on(port); }, 5)) << "port " << port << " still held";
    if (alive(workers[0])) ::kill(workers[0], SIGKILL);
  }
}

TEST(Train, APortInUseIsOneClearLineNamingThePortAndWhatToDo) {
  TempDir dir("port_in_use");
  const fs::path data = tiny_dataset(dir.path / "data");
  // Hold a port as another run's store would.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  const fs::path log = dir.path / "rank0.log";
  const pid_t pid = start_gpufeed(waiting_rank0_args(data),
                                  {"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1",
                                   "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port),
                                   "OMP_NUM_THREADS=1"},
                                  log);
  const int code = wait_for(pid, 120);
  ::close(fd);
  const std::string text = read_text(log);
  EXPECT_EQ(code, 1) << text;
  const std::string p = std::to_string(port);
  EXPECT_NE(text.find("gpufeed: error: ProcessGroup: rank 0 of 2 cannot host the TCPStore on port " + p +
                      " (MASTER_PORT): the port is already in use"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("ss -ltnp 'sport = :" + p + "'"), std::string::npos) << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << "one line:\n" << text;
  EXPECT_EQ(text.find("Exception raised from"), std::string::npos) << "a C++ backtrace:\n" << text;
  EXPECT_EQ(text.find("frame #"), std::string::npos) << "a C++ backtrace:\n" << text;
}

// Progressive resizing from the command line: FFCV's get_resolution with min_res 32, max_res 64,
// end_ramp 2 gives epochs 0, 1, 2 the sides 32, 64 (48 is 1.5 x 32, rounded half to even) and
// 64, printed at start-up and on every epoch line. --recipe ffcv-rn50 sets the 88-epoch config's
// ramp, an explicit flag overriding its key; --image-size with a ramp is refused.
TEST(Train, ProgressiveResizingLogsEachEpochsImageSize) {
  TempDir dir("progressive");
  const fs::path data = tiny_dataset(dir.path / "data");
  const std::string args = " train --data " + data.string() +
                           " --arch resnet18 --num-workers 1 --progress off --freeze-bn --batch-size 8 "
                           "--max-steps-per-epoch 1 --distributed off --epochs 3 --min-res 32 --max-res 64 --end-ramp 2";
  ASSERT_EQ(run(kEnv + kGpufeed + args, dir.path / "ramp.log"), 0) << read_text(dir.path / "ramp.log");
  const std::string log = read_text(dir.path / "ramp.log");
  EXPECT_NE(log.find("progressive resizing (FFCV's get_resolution: min_res 32, max_res 64, start_ramp 0, "
                     "end_ramp 2): image size 32 (epoch 1), 64 (epochs 2-3)"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("epoch 1/3  image size 32  loss"), std::string::npos) << log;
  EXPECT_NE(log.find("epoch 2/3  image size 64  loss"), std::string::npos) << log;
  EXPECT_NE(log.find("epoch 3/3  image size 64  loss"), std::string::npos) << log;

  // The preset's ramp (printed before the run fails on a missing dataset), --end-ramp kept.
  run(kGpufeed + " train --recipe ffcv-rn50 --end-ramp 80 --data " + (dir.path / "none").string(),
      dir.path / "recipe.log");
  const std::string recipe = read_text(dir.path / "recipe.log");
  EXPECT_NE(recipe.find(" --min-res 160 --max-res 192 --start-ramp 65 --val-crop-size 256"), std::string::npos)
      << recipe;
  EXPECT_NE(recipe.find("given explicitly, kept: --end-ramp 80"), std::string::npos) << recipe;
  EXPECT_NE(run(kGpufeed + args + " --image-size 48", dir.path / "both.log"), 0);
  EXPECT_NE(read_text(dir.path / "both.log").find("--image-size/--train-crop-size and progressive resizing"),
            std::string::npos)
      << read_text(dir.path / "both.log");
}

// The library names options in backticks (`resume_replan_schedule`); gpufeed's log lines spell
// them as its flags, as its error lines do.
TEST(Train, LogLinesNameOptionsAsFlags) {
  TempDir dir("replan_log");
  const fs::path data = tiny_dataset(dir.path / "data");
  const std::string args = " train --data " + data.string() +
                           " --arch resnet18 --num-workers 1 --progress off --freeze-bn --batch-size 8 "
                           "--max-steps-per-epoch 1 --distributed off --warmup-epochs 0 --save-checkpoint " +
                           (dir.path / "run.pt").string();
  ASSERT_EQ(run(kEnv + kGpufeed + args + " --epochs 1", dir.path / "first.log"), 0) << read_text(dir.path / "first.log");
  ASSERT_EQ(run(kEnv + kGpufeed + args + " --epochs 2 --resume " + (dir.path / "run.pt").string() +
                    " --resume-replan-schedule",
                dir.path / "replan.log"),
            0)
      << read_text(dir.path / "replan.log");
  const std::string log = read_text(dir.path / "replan.log");
  EXPECT_NE(log.find("epochs 1 -> 2"), std::string::npos) << log;
  EXPECT_NE(log.find(" (--resume-replan-schedule)\n"), std::string::npos) << log;
  EXPECT_EQ(log.find("`resume_replan_schedule`"), std::string::npos) << log;
}

// Both presets train on the CPU: each expands to its documented flags (printed), runs two short
// epochs of a synthetic ImageFolder at a small size (the sizes and the schedule's length given
// explicitly, which the presets keep), validates, and ends with finite losses. torchvision-v2
// runs TrivialAugmentWide with bilinear geometric ops, RandomErasing, MixUp/CutMix, the RA
// sampler and EMA (its EMA line); ffcv-rn50 its resolution ramp and flip-averaged validation.
TEST(Train, BothRecipesTrainTwoEpochsOfASyntheticFolderOnTheCpu) {
  TempDir dir("recipes");
  // 264 training images: the RA sampler keeps n // 256 * 256 per epoch, so at least 256.
  datasets::SyntheticOptions so;
  so.num_classes = 4;
  so.images_per_class = 66;
  so.min_size = 36;
  so.max_size = 56;
  const fs::path data = dir.path / "train";
  datasets::write_synthetic_image_folder(data, so);
  const fs::path val = tiny_dataset(dir.path / "val");
  const std::string common = " --data " + data.string() + " --val-data " + val.string() +
                             " --arch resnet18 --epochs 2 --batch-size 8 --num-workers 1 --progress off "
                             "--distributed off --max-steps-per-epoch 2";
  const fs::path v2 = dir.path / "v2.log";
  ASSERT_EQ(run(kEnv + kGpufeed + " train --recipe torchvision-v2" + common +
                    " --warmup-epochs 1 --train-crop-size 32 --val-resize-size 37 --val-crop-size 32 --model-ema-steps 1",
                v2),
            0)
      << read_text(v2);
  std::string log = read_text(v2);
  for (const char* want : {"recipe torchvision-v2 (", " --auto-augment ta_wide --augment-interpolation bilinear "
                           "--random-erase 0.1", " --mixup-alpha 0.2 --cutmix-alpha 1.0", " --ra-sampler --ra-reps 4",
                           "epoch 1/2  image size 32  loss", "epoch 2/2  image size 32  loss", "epoch 2/2  EMA  val_loss"}) {
    EXPECT_NE(log.find(want), std::string::npos) << want << "\n" << log;
  }
  EXPECT_EQ(log.find("nan"), std::string::npos) << log;
  const fs::path ffcv = dir.path / "ffcv.log";
  ASSERT_EQ(run(kEnv + kGpufeed + " train --recipe ffcv-rn50" + common +
                    " --min-res 32 --max-res 64 --start-ramp 0 --end-ramp 1 --val-crop-size 32 --lr-peak-epoch 1",
                ffcv),
            0)
      << read_text(ffcv);
  log = read_text(ffcv);
  for (const char* want : {"recipe ffcv-rn50 (", " --lr-schedule triangular", " --val-flip-average",
                           "epoch 1/2  image size 32  loss", "epoch 2/2  image size 64  loss", "val_top1"}) {
    EXPECT_NE(log.find(want), std::string::npos) << want << "\n" << log;
  }
  EXPECT_EQ(log.find("nan"), std::string::npos) << log;
}

namespace {

// Two Gloo ranks in this process (threads), each running `body(rank, group)`; failures in
// rank 1's thread are reported as test failures.
void two_gloo_ranks(const std::function<void(int, const std::shared_ptr<harness::ProcessGroup>&)>& body) {
  const int port = free_port();
  const auto rank_body = [&](int rank) {
    harness::DistEnv env;
    env.rank = env.local_rank = rank;
    env.world_size = env.local_world_size = 2;
    env.master_port = port;
    harness::ProcessGroupOptions options;
    options.backend = "gloo";
    options.timeout = std::chrono::seconds(60);
    auto group = harness::ProcessGroup::create(env, c10::Device(c10::kCPU), options);
    body(rank, group);
    group->barrier();  // neither rank tears its group down while the other still uses it
  };
  std::thread rank1([&] {
    try {
      rank_body(1);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank 1: " << e.what();
    }
  });
  rank_body(0);
  rank1.join();
}

}  // namespace

// The public ProcessGroup API on two Gloo ranks in one process (one thread each): barrier()
// holds rank 1 until rank 0 arrives (rank 0 arrives 300 ms late, after setting a flag rank 1
// reads once released), and all_reduce_sum sums across the ranks.
TEST(ProcessGroup, BarrierHoldsEveryRankUntilAllArriveAndAllReduceSums) {
  std::atomic<bool> rank0_arrived{false};
  bool rank1_saw_rank0 = false;
  std::vector<at::Tensor> sums(2);
  two_gloo_ranks([&](int rank, const std::shared_ptr<harness::ProcessGroup>& group) {
    if (rank == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      rank0_arrived = true;
    }
    group->barrier();
    if (rank == 1) rank1_saw_rank0 = rank0_arrived.load();
    std::vector<at::Tensor> t{at::full({3}, static_cast<double>(rank + 1))};
    group->all_reduce_sum(t);
    sums[static_cast<size_t>(rank)] = t[0];
  });
  EXPECT_TRUE(rank1_saw_rank0) << "rank 1 left barrier() before rank 0 reached it";
  for (const at::Tensor& t : sums) EXPECT_TRUE(at::equal(t, at::full({3}, 3.0)));
}

// ---- SyncBatchNorm -----------------------------------------------------------------------------

namespace {

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

torch::nn::BatchNorm2d seeded_bn(int64_t channels) {
  torch::nn::BatchNorm2d bn(torch::nn::BatchNorm2dOptions(channels).eps(1e-5).momentum(0.1));
  torch::NoGradGuard no_grad;
  bn->weight.copy_(at::linspace(0.5, 1.5, channels));
  bn->bias.copy_(at::linspace(-0.3, 0.4, channels));
  bn->running_mean.copy_(at::linspace(0.1, 0.2, channels));
  bn->running_var.copy_(at::linspace(0.9, 1.3, channels));
  return bn;
}

}  // namespace

// Rank r holds samples [offset_r, offset_r + n_r) of one batch X; each runs sync_batch_norm on
// its part and backpropagates sum(y_r * G_r) (G fixed): the sum over ranks is sum(y * G) of the
// whole batch. The reference is one torch::nn::BatchNorm2d (ATen's batch_norm) on X in one
// process: torch.nn.SyncBatchNorm is defined to equal it, and it is what this checks. (torch's
// SyncBatchNorm itself cannot be the golden here: on CPU ranks it fails in aten::batch_norm_stats,
// which has no CPU kernel in torch 2.11, and this machine has no GPU.) Compared: outputs,
// input gradients, weight/bias gradients summed over the ranks (what DDP's average of the ranks'
// gradients makes of them, up to its 1/world), running_mean/var and num_batches_tracked.
class SyncBatchNormSplit : public ::testing::TestWithParam<std::pair<int64_t, int64_t>> {};

TEST_P(SyncBatchNormSplit, TwoGlooRanksEqualOneBatchNorm2dOnTheConcatenatedBatch) {
  const auto [n0, n1] = GetParam();
  constexpr int64_t kC = 4, kH = 5, kW = 3;
  torch::manual_seed(7);
  const at::Tensor X = at::randn({n0 + n1, kC, kH, kW}) * 2.0 + 3.0;  // far from mean 0, var 1
  const at::Tensor G = at::randn({n0 + n1, kC, kH, kW});

  auto ref = seeded_bn(kC);
  ref->train();
  const at::Tensor Xr = X.clone().requires_grad_(true);
  const at::Tensor Y = ref->forward(Xr);
  (Y * G).sum().backward();

  struct RankResult {
    at::Tensor y, grad_x, grad_w, grad_b, running_mean, running_var, batches;
  };
  std::array<RankResult, 2> got;
  two_gloo_ranks([&](int rank, const std::shared_ptr<harness::ProcessGroup>& group) {
    const int64_t offset = rank == 0 ? 0 : n0, n = rank == 0 ? n0 : n1;
    auto bn = seeded_bn(kC);
    bn->train();
    const at::Tensor x = X.narrow(0, offset, n).clone().requires_grad_(true);
    const at::Tensor y = harness::sync_batch_norm(*bn, x, *group);
    (y * G.narrow(0, offset, n)).sum().backward();
    got[static_cast<size_t>(rank)] = {y.detach(), x.grad(), bn->weight.grad(), bn->bias.grad(),
                                      bn->running_mean.clone(), bn->running_var.clone(),
                                      bn->num_batches_tracked.clone()};
  });
  const double d_y = max_abs_diff(at::cat({got[0].y, got[1].y}), Y.detach());
  const double d_gx = max_abs_diff(at::cat({got[0].grad_x, got[1].grad_x}), Xr.grad());
  const double d_gw = max_abs_diff(got[0].grad_w + got[1].grad_w, ref->weight.grad());
  const double d_gb = max_abs_diff(got[0].grad_b + got[1].grad_b, ref->bias.grad());
  std::cout << "ranks of " << n0 << " and " << n1 << " samples: max |diff| y " << d_y << ", grad x " << d_gx
            << ", grad weight " << d_gw << ", grad bias " << d_gb << "\n";
  // fp32 sums of 40-75 values of magnitude ~3: 1e-5 absolute on O(1) outputs and gradients.
  EXPECT_LE(d_y, 1e-5);
  EXPECT_LE(d_gx, 1e-5);
  EXPECT_LE(d_gw, 1e-4);  // sums of up to 75 products of magnitude ~2
  EXPECT_LE(d_gb, 1e-4);
  for (const RankResult& r : got) {
    EXPECT_LE(max_abs_diff(r.running_mean, ref->running_mean), 1e-6);
    EXPECT_LE(max_abs_diff(r.running_var, ref->running_var), 1e-5);
    EXPECT_EQ(r.batches.item<int64_t>(), 1);
  }
  // The check has teeth: rank 0's samples alone normalise differently.
  auto alone = seeded_bn(kC);
  alone->train();
  const at::Tensor y_alone = alone->forward(X.narrow(0, 0, n0));
  EXPECT_GT(max_abs_diff(y_alone.detach(), Y.detach().narrow(0, 0, n0)), 1e-2);
}

INSTANTIATE_TEST_SUITE_P(EvenAndUneven, SyncBatchNormSplit,
                         ::testing::Values(std::pair<int64_t, int64_t>{4, 4}, std::pair<int64_t, int64_t>{3, 5}));

TEST(SyncBatchNorm, EvalModeUsesTheRunningStatisticsWithoutACollective) {
  // One rank, a group of two: a collective would block for the group's timeout; eval mode runs
  // BatchNorm2d's own forward at once, bit for bit.
  two_gloo_ranks([](int rank, const std::shared_ptr<harness::ProcessGroup>& group) {
    if (rank != 0) return;
    auto bn = seeded_bn(3);
    bn->eval();
    torch::manual_seed(3);
    const at::Tensor x = at::randn({2, 3, 4, 4});
    EXPECT_TRUE(at::equal(harness::sync_batch_norm(*bn, x, *group), bn->forward(x)));
  });
}

TEST(SyncBatchNorm, ConvertKeepsTheStateDictKeysAndCountsTheLayers) {
  torch::manual_seed(0);
  auto model = harness::make_resnet({"resnet18", 10, false});
  std::vector<std::string> before;
  for (const auto& kv : model->named_parameters()) before.push_back(kv.key());
  for (const auto& kv : model->named_buffers()) before.push_back(kv.key());
  EXPECT_EQ(harness::convert_sync_batchnorm(*model, nullptr), 20);
  std::vector<std::string> after;
  for (const auto& kv : model->named_parameters()) after.push_back(kv.key());
  for (const auto& kv : model->named_buffers()) after.push_back(kv.key());
  EXPECT_EQ(before, after);
  auto r50 = harness::make_resnet({"resnet50", 10, false});
  EXPECT_EQ(harness::convert_sync_batchnorm(*r50, nullptr), 53);
}

TEST(Launch, SyncBnTwoGlooRanksEqualOneProcessWithPlainBatchNormOnTheUnionOfTheirBatches) {
  // As TwoGlooRanksStayIdentical... but BatchNorm trains (no --freeze-bn): with --sync-bn each
  // BatchNorm layer of rank r sees the statistics of both ranks' micro-batch, which is the one
  // process's micro-batch of 4. Without --sync-bn the two runs differ (checked when this test
  // was written: parameters by up to 0.06, running variances by 0.55 -- the per-rank statistics
  // of 2 samples instead of 4). A moderate lr and zero-init-residual keep the 3 steps tame: at
  // --lr 0.8 without zero-init-residual the runs agree to 1.6e-5 after one step but drift to
  // 1e-1 after three (batch statistics of 4 values on layer4's 1x1 maps amplify float rounding).
  TempDir dir("syncbn");
  const fs::path data = tiny_dataset(dir.path / "data");
  const std::string common = " train --data " + data.string() +
                             " --arch resnet18 --image-size 32 --num-workers 1 --progress off --lr 0.1 --seed 0"
                             " --zero-init-residual --accum-steps 2 --max-steps-per-epoch 3";
  const int launched =
      run(kEnv + kGpufeed + " launch --nproc-per-node 2 --master-port 0 -- gpufeed" + common +
              " --sync-bn --batch-size 2 --checkpoint " + (dir.path / "rank{rank}.pt").string(),
          dir.path / "launch.log");
  const std::string log = read_text(dir.path / "launch.log");
  ASSERT_EQ(launched, 0) << log;
  EXPECT_NE(log.find("SyncBatchNorm: 20 layers synchronised over 2 ranks"), std::string::npos) << log;
  ASSERT_EQ(run(kEnv + kGpufeed + common + " --batch-size 4 --distributed off --checkpoint " +
                    (dir.path / "single.pt").string(),
                dir.path / "single.log"),
            0)
      << read_text(dir.path / "single.log");
  const auto r0 = load(dir.path / "rank0.pt"), r1 = load(dir.path / "rank1.pt"), one = load(dir.path / "single.pt");
  ASSERT_EQ(r0.size(), one.size());
  double worst = 0, worst_running = 0;
  for (const auto& kv : r0) {
    EXPECT_TRUE(at::equal(kv.value(), r1.at(kv.key()))) << kv.key() << " differs between the ranks";
    const double d = (kv.value().to(at::kDouble) - one.at(kv.key()).to(at::kDouble)).abs().max().item<double>();
    const bool running = kv.key().find("running_") != std::string::npos;
    (running ? worst_running : worst) = std::max(running ? worst_running : worst, d);
    if (kv.key().find("num_batches_tracked") != std::string::npos) {
      EXPECT_EQ(kv.value().item<int64_t>(), 6) << kv.key();  // 3 steps x 2 micro-batches
      EXPECT_EQ(one.at(kv.key()).item<int64_t>(), 6) << kv.key();
    }
  }
  std::cout << "sync-bn: max |param(2 ranks) - param(1 process, union batch)| = " << worst
            << ", running statistics " << worst_running << "\n";
  EXPECT_LE(worst, 1e-5);  // measured: ~1e-6
  EXPECT_LE(worst_running, 1e-5);
}

TEST(Train, SyncBnIsRefusedWithDataParallelOrFrozenBatchNorm) {
  TempDir dir("syncbn_refused");
  const fs::path data = tiny_dataset(dir.path / "data");
  const std::string cmd = kEnv + kGpufeed + " train --data " + data.string() +
                          " --arch resnet18 --image-size 32 --num-workers 1 --progress off --sync-bn --batch-size 2";
  EXPECT_NE(run(cmd + " --freeze-bn", dir.path / "a.log"), 0);
  EXPECT_NE(read_text(dir.path / "a.log").find("--sync-bn and --freeze-bn do not combine"), std::string::npos)
      << read_text(dir.path / "a.log");
  EXPECT_NE(run(cmd + " --devices cpu,cpu", dir.path / "b.log"), 0);
  EXPECT_NE(read_text(dir.path / "b.log").find("does not combine with DataParallel (--devices)"), std::string::npos)
      << read_text(dir.path / "b.log");
}

TEST(Launch, TwoNodesOfOneRankEachSeeEverySampleOfTheShardsOnceInDistributedSamplerOrder) {
  // Two "nodes" on this host: two launchers with --nnodes 2 --node-rank 0|1
  // --nproc-per-node 1 and one master address and port, Gloo, reading WebDataset shards written
  // by GNU tar. Each rank logs the dataset indices of its steps (--log-samples); per epoch each
  // rank's list must be torch's DistributedSampler's for its global rank, and together they must
  // cover the 32 samples exactly once.
  TempDir dir("nodes");
  const std::vector<fs::path> files = test::list_files_of(tiny_dataset(dir.path / "images"));
  ASSERT_EQ(files.size(), 32u);
  const fs::path flat = dir.path / "flat";
  fs::create_directories(flat);
  std::string members[2];
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string cls = files[i].parent_path().filename().string();  // class_003
    const std::string key = cls + "_" + files[i].stem().string();
    fs::copy_file(files[i], flat / (key + ".jpg"));
    std::ofstream(flat / (key + ".cls")) << std::stoi(cls.substr(6));
    members[i / 16] += " " + key + ".jpg " + key + ".cls";
  }
  for (int s = 0; s < 2; ++s) {
    ASSERT_EQ(run("tar -cf " + (dir.path / ("shard-" + std::to_string(s) + ".tar")).string() + " -C " +
                      flat.string() + members[s],
                  dir.path / "tar.log"),
              0)
        << read_text(dir.path / "tar.log");
  }
  const int port = free_port();
  const std::string train = " -- gpufeed train --data '" + (dir.path / "shard-{0..1}.tar").string() +
                            "' --index-cache off --arch resnet18 --image-size 32 --num-workers 1 --progress off"
                            " --batch-size 4 --epochs 2 --seed 7 --log-samples " +
                            (dir.path / "samples{rank}.tsv").string();
  auto node = [&](int node_rank) {
    return run(kEnv + kGpufeed + " launch --nnodes 2 --node-rank " + std::to_string(node_rank) +
                   " --nproc-per-node 1 --master-addr 127.0.0.1 --master-port " + std::to_string(port) + train,
               dir.path / ("node" + std::to_string(node_rank) + ".log"));
  };
  int node1 = -1;
  std::thread second([&] { node1 = node(1); });
  const int node0 = node(0);
  second.join();
  const std::string log0 = read_text(dir.path / "node0.log"), log1 = read_text(dir.path / "node1.log");
  ASSERT_EQ(node0, 0) << log0;
  ASSERT_EQ(node1, 0) << log1;
  EXPECT_NE(log0.find("ranks 0..0 of 2"), std::string::npos) << log0;
  EXPECT_NE(log1.find("ranks 1..1 of 2"), std::string::npos) << log1;
  EXPECT_NE(log0.find("world 2, global batch 8"), std::string::npos) << log0;
  // seen[epoch][rank]: the indices in step order.
  std::vector<int64_t> seen[2][2];
  for (int rank = 0; rank < 2; ++rank) {
    std::istringstream in(read_text(dir.path / ("samples" + std::to_string(rank) + ".tsv")));
    std::string line;
    int64_t lines = 0;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      int64_t epoch = -1, step = -1, index = -1;
      std::istringstream(line) >> epoch >> step >> index;
      ASSERT_TRUE(epoch == 0 || epoch == 1) << line;
      seen[epoch][rank].push_back(index);
      ++lines;
    }
    EXPECT_EQ(lines, 32) << "rank " << rank << ": 16 samples in each of 2 epochs";
  }
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<int64_t> all;
    for (int rank = 0; rank < 2; ++rank) {
      sampler::DistributedSampler expected(32, {.num_replicas = 2, .rank = rank, .shuffle = true, .seed = 7});
      expected.set_epoch(epoch);
      EXPECT_EQ(seen[epoch][rank], expected.indices()) << "epoch " << epoch << ", rank " << rank;
      all.insert(all.end(), seen[epoch][rank].begin(), seen[epoch][rank].end());
    }
    std::sort(all.begin(), all.end());
    std::vector<int64_t> every(32);
    std::iota(every.begin(), every.end(), 0);
    EXPECT_EQ(all, every) << "epoch " << epoch << ": every sample exactly once across the two nodes";
  }
}

TEST(ActivationCheckpointing, UnderDdpWithSyncBnEveryGradientArrivesOnceAndEqualsTheRunWithout) {
  // Two in-process Gloo ranks, each a resnet18 under DistributedDataParallel with SyncBatchNorm,
  // one step with and one without activation checkpointing: DDP's post-accumulate hooks see every
  // gradient (finish_gradient_sync names any parameter whose hook never fired), and the
  // all-reduced gradients (which a second accumulation would double) and the running statistics
  // equal the run without. (test_harness counts those hooks: once per parameter.)
  torch::manual_seed(11);
  const at::Tensor X = at::randn({6, 3, 32, 32});
  const at::Tensor Y = at::randint(0, 10, {6});
  struct Result {
    std::vector<at::Tensor> grads, buffers;
  };
  std::array<std::array<Result, 2>, 2> got;  // [checkpointing][rank]
  // Built here, one after the other: the global generator is not for two threads at once.
  std::vector<harness::ResNet> models;  // [checkpointing * 2 + rank]
  for (int k = 0; k < 4; ++k) {
    torch::manual_seed(0);
    models.push_back(harness::make_resnet({"resnet18", 10, false}));
  }
  two_gloo_ranks([&](int rank, const std::shared_ptr<harness::ProcessGroup>& group) {
    for (const bool checkpointing : {false, true}) {
      harness::ResNet& model = models[static_cast<size_t>((checkpointing ? 2 : 0) + rank)];
      model->set_activation_checkpointing(checkpointing);
      EXPECT_EQ(harness::convert_sync_batchnorm(*model, group), 20);
      harness::DistributedDataParallel ddp(model.ptr(), group);
      Result& r = got[checkpointing ? 1 : 0][static_cast<size_t>(rank)];
      const auto params = model->parameters();
      model->train();
      ddp.pre_forward();
      const int64_t offset = rank == 0 ? 0 : 2, n = rank == 0 ? 2 : 4;  // uneven: 2 and 4 samples
      const at::Tensor logits = model->forward(X.narrow(0, offset, n));
      torch::nn::functional::cross_entropy(logits, Y.narrow(0, offset, n)).backward();
      ddp.finish_gradient_sync();
      for (const auto& p : params) r.grads.push_back(p.grad().clone());
      for (const auto& b : model->buffers()) r.buffers.push_back(b.clone());
    }
  });
  for (size_t rank = 0; rank < 2; ++rank) {
    const Result& plain = got[0][rank];
    const Result& ckpt = got[1][rank];
    ASSERT_EQ(plain.grads.size(), ckpt.grads.size());
    double worst = 0;
    for (size_t i = 0; i < plain.grads.size(); ++i) {
      worst = std::max(worst, max_abs_diff(plain.grads[i], ckpt.grads[i]));
    }
    std::cout << "rank " << rank << ": max |grad(checkpointed) - grad(plain)| under DDP + SyncBatchNorm = " << worst
              << "\n";
    EXPECT_LE(worst, 1e-6);
    for (size_t i = 0; i < plain.buffers.size(); ++i) {
      EXPECT_LE(max_abs_diff(plain.buffers[i], ckpt.buffers[i]), 1e-6) << "buffer " << i;
    }
  }
}

// Each rank's --log-samples file: the indices of epoch `epoch`, in step order.
std::vector<int64_t> logged_samples(const fs::path& file, int64_t epoch) {
  std::istringstream in(read_text(file));
  std::vector<int64_t> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    int64_t e = -1, step = -1, index = -1;
    std::istringstream(line) >> e >> step >> index;
    if (e == epoch) out.push_back(index);
  }
  return out;
}

TEST(Launch, TwoRanksStoppedMidEpochResumeOnThreeEachRemainingSampleOnceThenDistributedSamplerOrder) {
  // 2 Gloo ranks, batch 2, 32 images (16 per rank, 8 batches): SIGTERM during step 2, the ranks
  // agree after step 3, so rank 0's checkpoint says 3 batches: positions 0..11 of epoch 0's list
  // consumed. Resumed on 3 ranks (docs/SCALING.md, "Resuming on another number of ranks"), the 20
  // remaining positions are dealt 7, 7, 6: rank 2 runs out a batch early and joins rank 0's last
  // step without data, and the three replicas end equal. The same options plan the same schedule
  // at world size 2, so no re-plan is asked for. Epoch 1 is DistributedSampler(3)'s order.
  REQUIRE_FAULT_INJECTION();
  TempDir dir("reworld3");
  const fs::path data = tiny_dataset(dir.path / "data");
  const fs::path ckpt = dir.path / "train.pt";
  const std::string args = train_args(data) + " --batch-size 2 --epochs 2 --save-checkpoint " + ckpt.string();
  const int code = run("GPUFEED_TEST_FAULT=signal=TERM:step=2:rank=0 " + kEnv + kGpufeed +
                           " launch --nproc-per-node 2 --master-port 0 -- gpufeed" + args,
                       dir.path / "a.log");
  ASSERT_EQ(code, 143) << read_text(dir.path / "a.log");
  ASSERT_EQ(harness::load_torch_file(ckpt).toGenericDict().at("sampler").toGenericDict().at("batches_consumed").toInt(), 3);
  ASSERT_EQ(run(kEnv + kGpufeed + " launch --nproc-per-node 3 --master-port 0 -- gpufeed" + args + " --resume " +
                    ckpt.string() + " --log-samples " + (dir.path / "samples{rank}.tsv").string() + " --checkpoint " +
                    (dir.path / "rank{rank}.pt").string(),
                dir.path / "b.log"),
            0)
      << read_text(dir.path / "b.log");
  const std::string log = read_text(dir.path / "b.log");
  EXPECT_NE(log.find("resuming on world size 3 a checkpoint of world size 2 (docs/SCALING.md): 20 of epoch 0's 32 "
                     "positions remain, dealt to the 3 ranks without padding (this rank: 6 samples in 3 batches, rank 0: 4)"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("schedule differs"), std::string::npos) << log;
  std::vector<std::vector<int64_t>> old_lists;
  for (int64_t r = 0; r < 2; ++r) {
    sampler::DistributedSampler s(32, {.num_replicas = 2, .rank = r, .shuffle = true, .seed = 0});
    s.set_epoch(0);
    old_lists.push_back(s.indices());
  }
  for (int64_t r = 0; r < 3; ++r) {
    const fs::path file = dir.path / ("samples" + std::to_string(r) + ".tsv");
    std::vector<int64_t> expected;  // positions 12 + r, 15 + r, ... of the 2-rank list
    for (int64_t p = 12 + r; p < 32; p += 3) expected.push_back(old_lists[static_cast<size_t>(p % 2)][static_cast<size_t>(p / 2)]);
    EXPECT_EQ(logged_samples(file, 0), expected) << "rank " << r << ", the resumed epoch";
    sampler::DistributedSampler next(32, {.num_replicas = 3, .rank = r, .shuffle = true, .seed = 0});
    next.set_epoch(1);
    EXPECT_EQ(logged_samples(file, 1), next.indices()) << "rank " << r << ", the next epoch";
  }
  const auto r0 = load(dir.path / "rank0.pt");
  for (const char* other : {"rank1.pt", "rank2.pt"}) {
    const auto o = load(dir.path / other);
    for (const auto& kv : r0) EXPECT_TRUE(at::equal(kv.value(), o.at(kv.key()))) << kv.key() << " differs in " << other;
  }
}
