// CUDA prefetch checks. Skipped with a printed reason where no GPU is visible; run on the GPU
// machine by tools/gpu_check.sh.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <filesystem>

#include "gpu_spin.h"
#include "gpufeed/datasets/synthetic.h"
#include "gpufeed/prefetch/prefetcher.h"

using namespace gpufeed;
namespace fs = std::filesystem;

#define REQUIRE_GPU()                                                                  \
  if (!prefetch::cuda_available()) {                                                   \
    GTEST_SKIP() << "no CUDA device visible (CUDA_VISIBLE_DEVICES / driver); the GPU " \
                    "checks run on the GPU machine via tools/gpu_check.sh";            \
  }

namespace {

fs::path dataset(int classes, int per_class, int size) {
  const fs::path root = fs::temp_directory_path() /
                        ("gpufeed_gpu_" + std::to_string(::getpid()) + "_" + std::to_string(size));
  if (!fs::exists(root)) {
    datasets::SyntheticOptions o;
    o.num_classes = classes;
    o.images_per_class = per_class;
    o.min_size = o.max_size = size;
    datasets::write_synthetic_image_folder(root, o);
  }
  return root;
}

}  // namespace

TEST(CudaConvert, EqualsTheCpuPathForEveryDtypeAndLayout) {
  REQUIRE_GPU();
  at::manual_seed(0);
  const at::Tensor u8 = at::randint(0, 256, {4, 17, 13, 3}, at::kByte);
  const prefetch::NormalizeOptions n;
  for (bool cl : {false, true}) {
    for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf, at::kByte}) {
      const at::Tensor cpu = prefetch::convert_images(u8, dtype, cl, n);
      const at::Tensor gpu = prefetch::convert_images(u8.to(at::kCUDA), dtype, cl, n);
      ASSERT_TRUE(gpu.is_cuda());
      EXPECT_EQ(gpu.sizes(), cpu.sizes());
      EXPECT_EQ(gpu.strides(), cpu.strides()) << "layout channels_last=" << cl;
      EXPECT_EQ(gpu.scalar_type(), dtype);
      const double diff = (gpu.cpu().to(at::kDouble) - cpu.to(at::kDouble)).abs().max().item<double>();
      if (dtype == at::kFloat) {
        EXPECT_LE(diff, 1e-6) << "float32 channels_last=" << cl;
      } else {
        EXPECT_EQ(diff, 0.0) << c10::toString(dtype) << " channels_last=" << cl;
      }
    }
  }
}

TEST(CudaPrefetcher, DeliversTheCpuPrefetchersBatchesOnTheDevice) {
  REQUIRE_GPU();
  const fs::path root = dataset(3, 10, 80);
  auto ds = std::make_shared<datasets::ImageFolder>(root);
  loader::LoaderOptions lo;
  lo.batch_size = 8;
  lo.num_workers = 2;
  lo.transform.rrc.size = 48;
  auto sampler = std::make_shared<sampler::SequentialSampler>(ds->size());
  prefetch::PrefetchOptions po;
  po.device = c10::Device("cuda:0");
  po.channels_last = true;
  auto gl = std::make_shared<loader::Loader>(ds, sampler, lo, prefetch::host_allocator_for(po.device));
  auto cl = std::make_shared<loader::Loader>(ds, sampler, lo);
  auto gpu = prefetch::make_prefetcher(gl, po);
  prefetch::PrefetchOptions cpo = po;
  cpo.device = c10::Device("cpu");
  auto cpu = prefetch::make_prefetcher(cl, cpo);
  for (int64_t epoch : {0, 1}) {
    gpu->start_epoch(epoch);
    cpu->start_epoch(epoch);
    int batches = 0;
    while (auto g = gpu->next()) {
      auto c = cpu->next();
      ASSERT_TRUE(c);
      EXPECT_TRUE(g->images.is_cuda());
      EXPECT_TRUE(g->images.is_contiguous(at::MemoryFormat::ChannelsLast));
      EXPECT_TRUE(at::equal(g->labels.cpu(), c->labels));
      EXPECT_LE((g->images.cpu() - c->images).abs().max().item<float>(), 1e-6f);
      ++batches;
    }
    EXPECT_FALSE(cpu->next());
    EXPECT_EQ(batches, 4);
  }
}

TEST(CudaPrefetcher, CopiesOverlapComputeWithinFivePercent) {
  REQUIRE_GPU();
  // Small sources so 16 loader threads outpace the compute; the copy (batch of 224^2 images)
  // must hide behind a 40 ms compute step on the training stream.
  const fs::path root = dataset(8, 64, 160);  // 512 images: 8 batches
  auto ds = std::make_shared<datasets::ImageFolder>(root);
  loader::LoaderOptions lo;
  lo.batch_size = 64;
  lo.num_workers = 0;
  lo.prefetch_depth = 4;
  auto sampler = std::make_shared<sampler::SequentialSampler>(ds->size());
  prefetch::PrefetchOptions po;
  po.device = c10::Device("cuda:0");
  po.dtype = at::kBFloat16;
  po.channels_last = true;
  auto l = std::make_shared<loader::Loader>(ds, sampler, lo, prefetch::host_allocator_for(po.device));
  auto p = prefetch::make_prefetcher(l, po);
  int clock_khz = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0), cudaSuccess);
  const double step_ms = 40;
  auto stream = c10::cuda::getCurrentCUDAStream(0);
  auto timed = [&](bool with_data, int steps) {
    // ATen's events are created without timing unless asked (cudaEventDisableTiming).
    std::vector<at::cuda::CUDAEvent> ends;
    for (int s = 0; s <= steps; ++s) ends.emplace_back(cudaEventDefault);
    ends[0].record(stream);
    int done = 0;
    p->start_epoch(0);
    for (int s = 0; s < steps; ++s) {
      if (with_data) {
        auto b = p->next();
        if (!b) break;
        (void)b->images.sum();  // consume the batch on the training stream
      }
      EXPECT_EQ(launch_spin(step_ms, clock_khz, stream.stream()), cudaSuccess);
      ends[static_cast<size_t>(s) + 1].record(stream);
      ++done;
    }
    stream.synchronize();
    // Steady state: skip the first two steps (pipeline fill).
    return ends[2].elapsed_time(ends[static_cast<size_t>(done)]) / (done - 2);
  };
  const double compute_only = timed(false, 8);
  const double with_prefetch = timed(true, 8);
  std::printf("overlap: compute-only step %.3f ms, with prefetching %.3f ms, ratio %.4f\n",
              compute_only, with_prefetch, with_prefetch / compute_only);
  EXPECT_LE(with_prefetch, 1.05 * compute_only);
}
