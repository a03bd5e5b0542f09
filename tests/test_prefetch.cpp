#include <gtest/gtest.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "gpufeed/datasets/synthetic.h"
#include "gpufeed/prefetch/prefetcher.h"

using namespace gpufeed;
namespace fs = std::filesystem;

namespace {

// torchvision.transforms.Normalize applied to ToTensor's output, written with plain torch ops.
at::Tensor reference(const at::Tensor& nhwc, const prefetch::NormalizeOptions& n) {
  auto x = nhwc.permute({0, 3, 1, 2}).to(at::kDouble).div(255.0);
  auto mean = at::tensor(std::vector<double>(n.mean.begin(), n.mean.end()), at::kDouble).view({1, 3, 1, 1});
  auto std = at::tensor(std::vector<double>(n.std.begin(), n.std.end()), at::kDouble).view({1, 3, 1, 1});
  return (x - mean) / std;
}

// A synthetic ImageFolder of 2 classes x 5 JPEGs with sides in [min_size, max_size] under the
// temporary folder, and 4-sample batches of 2 workers at side 32 over it.
fs::path synthetic_folder(const std::string& name, int min_size, int max_size) {
  const fs::path root = fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  datasets::SyntheticOptions so;
  so.num_classes = 2;
  so.images_per_class = 5;
  so.min_size = min_size;
  so.max_size = max_size;
  datasets::write_synthetic_image_folder(root, so);
  return root;
}

loader::LoaderOptions small_loader_options() {
  loader::LoaderOptions lo;
  lo.batch_size = 4;
  lo.num_workers = 2;
  lo.transform.rrc.size = 32;
  return lo;
}

}  // namespace

TEST(ConvertImages, Float32MatchesNormalizeWithinOneMillionth) {
  at::manual_seed(0);
  const at::Tensor u8 = at::randint(0, 256, {3, 5, 7, 3}, at::kByte);
  const prefetch::NormalizeOptions n;
  const at::Tensor out = prefetch::convert_images(u8, at::kFloat, false, n);
  EXPECT_EQ(out.sizes(), (at::IntArrayRef{3, 3, 5, 7}));
  EXPECT_TRUE(out.is_contiguous());
  EXPECT_EQ(out.scalar_type(), at::kFloat);
  EXPECT_LT((out.to(at::kDouble) - reference(u8, n)).abs().max().item<double>(), 1e-6);
}

TEST(ConvertImages, ChannelsLastHasNhwcStridesAndSameValues) {
  at::manual_seed(1);
  const at::Tensor u8 = at::randint(0, 256, {2, 4, 6, 3}, at::kByte);
  const prefetch::NormalizeOptions n;
  const at::Tensor cl = prefetch::convert_images(u8, at::kFloat, true, n);
  EXPECT_TRUE(cl.is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_FALSE(cl.is_contiguous());
  EXPECT_TRUE(at::equal(cl.contiguous(), prefetch::convert_images(u8, at::kFloat, false, n)));
}

TEST(ConvertImages, ReducedPrecisionDtypesRoundTheFloat32Result) {
  at::manual_seed(2);
  const at::Tensor u8 = at::randint(0, 256, {2, 3, 3, 3}, at::kByte);
  const prefetch::NormalizeOptions n;
  const at::Tensor f32 = prefetch::convert_images(u8, at::kFloat, false, n);
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    const at::Tensor r = prefetch::convert_images(u8, dtype, false, n);
    EXPECT_EQ(r.scalar_type(), dtype);
    EXPECT_TRUE(at::equal(r, f32.to(dtype)));
  }
  const at::Tensor raw = prefetch::convert_images(u8, at::kByte, false, n);
  EXPECT_TRUE(at::equal(raw, u8.permute({0, 3, 1, 2})));
}

TEST(CpuPrefetcher, YieldsTheLoadersBatchesConverted) {
  const fs::path root = synthetic_folder("gpufeed_prefetch", 48, 48);
  auto ds = std::make_shared<datasets::ImageFolder>(root);
  const loader::LoaderOptions lo = small_loader_options();
  auto sampler = std::make_shared<sampler::SequentialSampler>(ds->size());
  auto l = std::make_shared<loader::Loader>(ds, sampler, lo);
  // The same batches straight from a second loader, for reference.
  loader::Loader ref(ds, sampler, lo);
  auto p = prefetch::make_prefetcher(l, {});
  p->start_epoch(0);
  ref.start_epoch(0);
  int batches = 0;
  while (auto b = p->next()) {
    auto host = ref.next();
    ASSERT_TRUE(host);
    auto [images, labels] = prefetch::as_tensors(*host);
    EXPECT_EQ(b->images.sizes(), (at::IntArrayRef{host->size, 3, 32, 32}));
    EXPECT_TRUE(at::equal(b->labels, labels));
    EXPECT_LT((b->images.to(at::kDouble) - reference(images, {})).abs().max().item<double>(), 1e-6);
    EXPECT_EQ(b->indices, host->indices);
    ++batches;
  }
  EXPECT_EQ(batches, 3);
  fs::remove_all(root);
}

// Progressive resizing: the loader's batches change side between epochs (32, then 48, in slots
// for 48); the prefetcher converts each at its own Batch::height/width, channels_last, on the CPU
// and, where one is visible, on the GPU (the CUDA prefetcher's copy stream and kernel).
TEST(Prefetcher, ConvertsBatchesWhoseSizeChangesBetweenEpochs) {
  const fs::path root = synthetic_folder("gpufeed_prefetch_sizes", 40, 70);
  auto ds = std::make_shared<datasets::ImageFolder>(root);
  loader::LoaderOptions lo = small_loader_options();
  lo.max_image_size = 48;
  auto sampler = std::make_shared<sampler::SequentialSampler>(ds->size());
  std::vector<std::string> devices{"cpu"};
  if (prefetch::cuda_available()) devices.push_back("cuda:0");
  for (const std::string& device : devices) {
    SCOPED_TRACE(device);
    auto l = std::make_shared<loader::Loader>(ds, sampler, lo);
    prefetch::PrefetchOptions po;
    po.device = c10::Device(device);
    po.channels_last = true;
    auto p = prefetch::make_prefetcher(l, po);
    for (const auto& [epoch, side] : std::vector<std::pair<int64_t, int>>{{0, 32}, {1, 48}}) {
      loader::LoaderOptions fixed = lo;  // the same samples from a loader built at this side
      fixed.transform.rrc.size = side;
      fixed.max_image_size = 0;
      loader::Loader ref(ds, sampler, fixed);
      l->set_image_size(side);
      p->start_epoch(epoch);
      ref.start_epoch(epoch);
      int batches = 0;
      while (auto b = p->next()) {
        auto host = ref.next();
        ASSERT_TRUE(host);
        auto [images, labels] = prefetch::as_tensors(*host);
        EXPECT_EQ(b->images.sizes(), (at::IntArrayRef{host->size, 3, side, side})) << "epoch " << epoch;
        EXPECT_TRUE(b->images.is_contiguous(at::MemoryFormat::ChannelsLast));
        EXPECT_LT((b->images.cpu().to(at::kDouble) - reference(images, {})).abs().max().item<double>(), 1e-6);
        ++batches;
      }
      EXPECT_EQ(batches, 3);
    }
  }
  fs::remove_all(root);
}

TEST(CudaPrefetcher, FailsClearlyOrMatchesCpuPath) {
  if (!prefetch::cuda_available()) {
    prefetch::PrefetchOptions o;
    o.device = c10::Device("cuda:0");
    const fs::path list = fs::temp_directory_path() / ("gpufeed_one_" + std::to_string(::getpid()) + ".txt");
    std::ofstream(list) << "never_read.jpg 0\n";  // the prefetcher must fail before reading it
    auto ds = std::make_shared<datasets::FileList>(list, "/", datasets::DataOptions{.index_cache = "off"}, datasets::FileListOptions{.check_files = false});
    fs::remove(list);
    auto l = std::make_shared<loader::Loader>(ds, std::make_shared<sampler::SequentialSampler>(1),
                                              loader::LoaderOptions{});
    EXPECT_THROW(prefetch::make_prefetcher(l, o), std::runtime_error);
    GTEST_SKIP() << "no CUDA device visible: the CUDA prefetcher's pixel checks run on the GPU machine "
                    "(tools/gpu_check.sh)";
  }
  at::manual_seed(3);
  const at::Tensor u8 = at::randint(0, 256, {2, 8, 8, 3}, at::kByte);
  const at::Tensor cpu = prefetch::convert_images(u8, at::kFloat, false, {});
  const at::Tensor gpu = prefetch::convert_images(u8.to(at::kCUDA), at::kFloat, false, {});
  EXPECT_LT((gpu.cpu() - cpu).abs().max().item<float>(), 1e-6);
}
