// custom_trainer: your own LibTorch model and optimizer, fed by gpufeed (Loader,
// DistributedSampler, Prefetcher), data-parallel across processes with gpufeed's distributed
// helpers -- not gpufeed's Trainer. Started alone it trains in one process; started by torchrun
// (or `gpufeed launch`, or srun) every process trains its DistributedSampler shard and gradients
// are averaged (Gloo on the CPU, NCCL on CUDA).
//
//   custom_trainer DATA [--epochs 3] [--batch-size 32] [--image-size 64] [--num-workers 2]
//                       [--lr 0.1] [--seed 0] [--device cpu|cuda]
//
// Per epoch rank 0 prints loss and top-1 over all ranks, images/s (all ranks) and the fraction of
// the epoch spent waiting for data (rank 0); at the end every rank prints a checksum of its
// parameters, which DDP keeps identical on all ranks.
#include <gpufeed/torch.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>

namespace {

// The model is yours; this one is small enough to train on a CPU in seconds.
struct NetImpl : torch::nn::Module {
  explicit NetImpl(int64_t classes) {
    using namespace torch::nn;
    features = register_module("features", Sequential(
        Conv2d(Conv2dOptions(3, 16, 3).stride(2).padding(1).bias(false)), BatchNorm2d(16), ReLU(),
        Conv2d(Conv2dOptions(16, 32, 3).stride(2).padding(1).bias(false)), BatchNorm2d(32), ReLU(),
        AdaptiveAvgPool2d(1)));
    head = register_module("head", Linear(32, classes));
  }
  at::Tensor forward(const at::Tensor& x) { return head(features->forward(x).flatten(1)); }
  torch::nn::Sequential features{nullptr};
  torch::nn::Linear head{nullptr};
};

struct Args {
  std::string data, device = "cpu";
  int64_t epochs = 3, batch_size = 32;
  int image_size = 64, num_workers = 2;
  double lr = 0.1;
  uint64_t seed = 0;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--epochs") a.epochs = std::stoll(value());
    else if (arg == "--batch-size") a.batch_size = std::stoll(value());
    else if (arg == "--image-size") a.image_size = std::stoi(value());
    else if (arg == "--num-workers") a.num_workers = std::stoi(value());
    else if (arg == "--lr") a.lr = std::stod(value());
    else if (arg == "--seed") a.seed = std::stoull(value());
    else if (arg == "--device") a.device = value();
    else if (a.data.empty() && arg.rfind("--", 0) != 0) a.data = arg;
    else throw std::invalid_argument("unknown argument " + arg);
  }
  if (a.data.empty()) throw std::invalid_argument("usage: custom_trainer DATA [--epochs N] ...");
  return a;
}

}  // namespace

int main(int argc, char** argv) try {
  namespace gh = gpufeed::harness;
  namespace gl = gpufeed::loader;
  namespace gd = gpufeed::datasets;
  namespace gt = gpufeed::transforms;
  const Args args = parse(argc, argv);

  // torchrun's RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT (or Slurm's); none: one process.
  const std::optional<gh::DistEnv> env = gh::detect_dist_env();
  const int rank = env ? env->rank : 0, world = env ? env->world_size : 1;
  const c10::Device device = args.device == "cuda" ? c10::Device(c10::kCUDA, env ? env->local_rank : 0)
                                                   : c10::Device(args.device);
  std::shared_ptr<gh::ProcessGroup> group;
  if (world > 1) group = gh::ProcessGroup::create(*env, device);  // NCCL on CUDA, Gloo on the CPU

  // Data: this rank's shard, decoded into slots the prefetcher turns into normalised tensors.
  std::shared_ptr<gd::Dataset> dataset = gd::open_dataset(args.data);
  auto sampler = std::make_shared<gpufeed::sampler::DistributedSampler>(
      dataset->size(), gpufeed::sampler::DistributedSamplerOptions{
                           .num_replicas = world, .rank = rank, .seed = args.seed});
  gl::LoaderOptions options;
  options.batch_size = args.batch_size;
  options.drop_last = true;  // equal steps on every rank, and no 1-sample batch for BatchNorm
  options.num_workers = args.num_workers;
  options.seed = args.seed;
  options.transform = gt::TransformOptions::imagenet(gt::TransformOptions::Kind::kTrain, args.image_size);
  auto loader = std::make_shared<gl::Loader>(dataset, sampler, options,
                                             gpufeed::prefetch::host_allocator_for(device));
  std::unique_ptr<gpufeed::prefetch::Prefetcher> prefetcher =
      gpufeed::prefetch::make_prefetcher(loader, {.device = device});  // float32 NCHW, ImageNet mean/std

  // Model and optimizer: plain LibTorch. DDP broadcasts rank 0's weights, then averages gradients.
  torch::manual_seed(args.seed);
  auto model = std::make_shared<NetImpl>(static_cast<int64_t>(dataset->classes().size()));
  model->to(device);
  std::unique_ptr<gh::DistributedDataParallel> ddp;
  if (group) ddp = std::make_unique<gh::DistributedDataParallel>(model, group);
  torch::optim::SGD optimizer(model->parameters(),
                              torch::optim::SGDOptions(args.lr).momentum(0.9).weight_decay(1e-4));

  for (int64_t epoch = 0; epoch < args.epochs; ++epoch) {
    model->train();
    prefetcher->start_epoch(epoch);  // the sampler's set_epoch: a new shuffle
    const auto t0 = std::chrono::steady_clock::now();
    double wait_ms = 0;
    at::Tensor totals = torch::zeros({3}, torch::kDouble);  // samples, loss sum, correct
    while (std::optional<gpufeed::prefetch::DeviceBatch> batch = prefetcher->next()) {
      wait_ms += batch->wait_ms;  // time next() blocked: the input pipeline's share
      if (ddp) ddp->pre_forward();
      const at::Tensor logits = model->forward(batch->images);  // images: [N, 3, H, W] float32
      const at::Tensor loss = torch::nn::functional::cross_entropy(logits, batch->labels);
      optimizer.zero_grad();
      loss.backward();
      if (ddp) ddp->finish_gradient_sync();  // wait for the averaged gradients
      optimizer.step();
      const auto n = static_cast<double>(batch->labels.size(0));
      totals += torch::tensor({n, loss.item<double>() * n,
                               logits.argmax(1).eq(batch->labels).sum().item<double>()}, torch::kDouble);
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (group) {
      std::vector<at::Tensor> t{totals.to(device)};
      group->all_reduce_sum(t);
      totals = t[0].cpu();
    }
    const double samples = totals[0].item<double>();
    if (rank == 0)
      std::printf("epoch %lld: loss %.4f top1 %.3f samples %.0f images/s %.1f data wait %.1f%%\n",
                  static_cast<long long>(epoch), totals[1].item<double>() / samples,
                  totals[2].item<double>() / samples, samples, samples / seconds,
                  100.0 * wait_ms / (seconds * 1000.0));
  }
  double checksum = 0;
  for (const at::Tensor& p : model->parameters()) checksum += p.detach().to(torch::kDouble).abs().sum().item<double>();
  std::printf("rank %d: parameter checksum %.9g\n", rank, checksum);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "custom_trainer: %s\n", e.what());
  return 1;
}
