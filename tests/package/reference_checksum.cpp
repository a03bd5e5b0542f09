// The in-tree reference for examples/loader_only (tests/package/check_package.py): the same
// per-epoch checksum, computed without the Loader -- each sample decoded alone by
// gpufeed::loader::load_sample, in DistributedSampler order, from the build tree's libraries.
// Equal checksums mean the installed package's Loader, driven by the example through only the
// installed headers, delivered exactly these pixels and labels in exactly this order.
//   reference_checksum DATA --epochs E --batch-size B --image-size S --seed X --rank R --world-size W
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpufeed/datasets/dataset.h"
#include "gpufeed/loader/loader.h"
#include "gpufeed/sampler/sampler.h"

int main(int argc, char** argv) try {
  namespace gl = gpufeed::loader;
  namespace gd = gpufeed::datasets;
  namespace gt = gpufeed::transforms;
  if (argc != 14) throw std::invalid_argument("usage: see the file's header");
  auto value = [&](int i, const char* name) {
    if (std::strcmp(argv[i], name) != 0) throw std::invalid_argument(std::string("expected ") + name);
    return std::stoll(argv[i + 1]);
  };
  const int64_t epochs = value(2, "--epochs"), batch_size = value(4, "--batch-size");
  const int size = static_cast<int>(value(6, "--image-size"));
  const auto seed = static_cast<uint64_t>(value(8, "--seed"));
  const int64_t rank = value(10, "--rank"), world = value(12, "--world-size");

  auto dataset = gd::open_dataset(argv[1]);
  gpufeed::sampler::DistributedSampler sampler(
      dataset->size(), {.num_replicas = world, .rank = rank, .seed = seed});
  gl::LoaderOptions options;
  options.seed = seed;
  options.transform = gt::TransformOptions::imagenet(gt::TransformOptions::Kind::kTrain, size);
  std::vector<uint8_t> pixels(static_cast<size_t>(size) * size * 3);
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    sampler.set_epoch(epoch);
    const std::vector<int64_t> order = sampler.indices();
    uint64_t checksum = 0xcbf29ce484222325ULL;  // FNV-1a 64, as the example computes it
    auto hash = [&](const void* data, size_t n) {
      for (size_t i = 0; i < n; ++i) checksum = (checksum ^ static_cast<const uint8_t*>(data)[i]) * 0x100000001b3ULL;
    };
    // The example hashes each batch's images, then its labels.
    for (size_t begin = 0; begin < order.size(); begin += static_cast<size_t>(batch_size)) {
      const size_t end = std::min(order.size(), begin + static_cast<size_t>(batch_size));
      for (size_t k = begin; k < end; ++k) {
        gl::load_sample(*dataset, order[k], epoch, options, pixels.data());
        hash(pixels.data(), pixels.size());
      }
      for (size_t k = begin; k < end; ++k) {
        const int64_t label = dataset->at(order[k]).label;
        hash(&label, sizeof label);
      }
    }
    const auto batches = (static_cast<int64_t>(order.size()) + batch_size - 1) / batch_size;
    std::printf("epoch %lld batches %lld samples %zu checksum %016llx\n", static_cast<long long>(epoch),
                static_cast<long long>(batches), order.size(), static_cast<unsigned long long>(checksum));
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "reference_checksum: %s\n", e.what());
  return 1;
}
