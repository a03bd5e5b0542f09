// loader_only: gpufeed's loader feeding an engine that is not PyTorch.
//
// The engine owns its input buffers ([batch, H, W, 3] uint8 images and [batch] int64 labels) and
// the memory of the loader's batch slots (CountingAllocator, a gpufeed::loader::HostAllocator).
// Each batch is copied into the engine's buffers and released at once, so its slot goes back to
// the loader's ring while the engine works. Per epoch it prints a checksum (64-bit FNV-1a over
// every batch's image bytes, then its labels as int64, in order): the same dataset, seed and
// options give the same checksum on any machine and with any number of workers.
//
//   loader_only DATA [--epochs 2] [--batch-size 32] [--image-size 64] [--num-workers 2] [--seed 0]
//                    [--rank 0 --world-size 1]
// DATA: an ImageFolder root, a flat folder of images or a "path label" file list.
#include <gpufeed/loader.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

// Slot memory from the engine: page-aligned, counted. The loader allocates prefetch_depth slots
// once, before the first batch, and frees them when it is destroyed.
class CountingAllocator : public gpufeed::loader::HostAllocator {
 public:
  void* allocate(size_t bytes) override {
    void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (p == nullptr) throw std::bad_alloc();
    ++allocations;
    allocated_bytes += bytes;
    return p;
  }
  void deallocate(void* p, size_t) noexcept override { std::free(p); }
  int allocations = 0;
  size_t allocated_bytes = 0;
};

uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

struct Args {
  std::string data;
  int64_t epochs = 2, batch_size = 32, world_size = 1, rank = 0;
  int image_size = 64, num_workers = 2;
  uint64_t seed = 0;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> long long {
      if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
      return std::stoll(argv[++i]);
    };
    if (arg == "--epochs") a.epochs = value();
    else if (arg == "--batch-size") a.batch_size = value();
    else if (arg == "--image-size") a.image_size = static_cast<int>(value());
    else if (arg == "--num-workers") a.num_workers = static_cast<int>(value());
    else if (arg == "--seed") a.seed = static_cast<uint64_t>(value());
    else if (arg == "--rank") a.rank = value();
    else if (arg == "--world-size") a.world_size = value();
    else if (a.data.empty() && arg.rfind("--", 0) != 0) a.data = arg;
    else throw std::invalid_argument("unknown argument " + arg);
  }
  if (a.data.empty()) throw std::invalid_argument("usage: loader_only DATA [--epochs N] ...");
  return a;
}

}  // namespace

int main(int argc, char** argv) try {
  namespace gl = gpufeed::loader;
  namespace gd = gpufeed::datasets;
  namespace gt = gpufeed::transforms;
  const Args args = parse(argc, argv);

  std::shared_ptr<gd::Dataset> dataset = gd::open_dataset(args.data);
  // This rank's shard, in PyTorch's DistributedSampler order (shuffled with seed + epoch).
  auto sampler = std::make_shared<gpufeed::sampler::DistributedSampler>(
      dataset->size(), gpufeed::sampler::DistributedSamplerOptions{
                           .num_replicas = args.world_size, .rank = args.rank, .seed = args.seed});
  gl::LoaderOptions options;
  options.batch_size = args.batch_size;
  options.num_workers = args.num_workers;
  options.seed = args.seed;  // augmentation: sample i of epoch e draws from (seed, e, i)
  options.transform = gt::TransformOptions::imagenet(gt::TransformOptions::Kind::kTrain, args.image_size);
  auto allocator = std::make_shared<CountingAllocator>();
  gl::Loader loader(dataset, sampler, options, allocator);

  // The engine's own input buffers, reused for every batch.
  const size_t sample_bytes = size_t(args.image_size) * args.image_size * 3;
  std::vector<uint8_t> images(sample_bytes * args.batch_size);
  std::vector<int64_t> labels(args.batch_size);

  std::printf("gpufeed %s: %lld samples, %zu classes, rank %lld of %lld\n", GPUFEED_VERSION_STRING,
              static_cast<long long>(dataset->size()), dataset->classes().size(),
              static_cast<long long>(args.rank), static_cast<long long>(args.world_size));
  for (int64_t epoch = 0; epoch < args.epochs; ++epoch) {
    const auto t0 = std::chrono::steady_clock::now();
    loader.start_epoch(epoch);
    uint64_t checksum = 0xcbf29ce484222325ULL;
    int64_t batches = 0, samples = 0;
    while (std::optional<gl::Batch> batch = loader.next()) {
      // batch->images: [size, height, width, 3] uint8, contiguous; batch->labels: [size] int64.
      std::memcpy(images.data(), batch->images, static_cast<size_t>(batch->image_bytes()));
      std::memcpy(labels.data(), batch->labels, static_cast<size_t>(batch->size) * sizeof(int64_t));
      const int64_t n = batch->size;
      batch.reset();  // release the slot now: the loader refills it while the engine works
      checksum = fnv1a(checksum, images.data(), static_cast<size_t>(n) * sample_bytes);
      checksum = fnv1a(checksum, labels.data(), static_cast<size_t>(n) * sizeof(int64_t));
      ++batches;
      samples += n;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("epoch %lld batches %lld samples %lld checksum %016llx images/s %.1f\n",
                static_cast<long long>(epoch), static_cast<long long>(batches),
                static_cast<long long>(samples), static_cast<unsigned long long>(checksum),
                static_cast<double>(samples) / s);
  }
  std::printf("allocator: %d slots, %zu bytes\n", allocator->allocations, allocator->allocated_bytes);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "loader_only: %s\n", e.what());
  return 1;
}
