// CUDA prefetch checks. Skipped with a printed reason where no GPU is visible; run on the GPU
// machine by tools/gpu_check.sh.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "gpu_spin.h"
#include "gpufeed/datasets/synthetic.h"
#include "gpufeed/device/engine.h"
#include "gpufeed/device/gpu_decode.h"
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

// decode_device gpu through the CUDA engine: uint8 rows against the CPU path's on the same plans
// (the measured difference is printed; docs/PERFORMANCE.md records it), every deferred row decoded
// on the GPU, and auto keeping its share in [0, 1] while every sample arrives.
namespace {

struct RowDiff {
  int max = 0;
  double mean = 0;
  int64_t samples = 0;
};

// Runs one epoch of `lo` through the engine (uint8, the slot layout) and the CPU loader; returns the
// difference and the engine's GPU totals.
RowDiff engine_vs_cpu(const std::shared_ptr<const datasets::Dataset>& ds, loader::LoaderOptions lo,
                      device::EngineBatch* last = nullptr) {
  auto sampler = std::make_shared<sampler::SequentialSampler>(ds->size());
  loader::LoaderOptions co = lo;
  co.decode_device = loader::DecodeDevice::kCpu;
  auto cl = std::make_shared<loader::Loader>(ds, sampler, co);
  auto gl = std::make_shared<loader::Loader>(ds, sampler, lo, device::pinned_host_allocator());
  device::EngineOptions eo;
  eo.dtype = device::OutputType::kUInt8;
  eo.channels_last = true;
  device::CudaEngine engine(gl, eo);
  engine.start_epoch(0);
  cl->start_epoch(0);
  RowDiff d;
  double sum = 0;
  while (auto g = engine.next(nullptr)) {
    auto c = cl->next();
    EXPECT_TRUE(c);
    if (!c) break;
    std::vector<uint8_t> host(static_cast<size_t>(c->image_bytes()));
    EXPECT_EQ(cudaMemcpy(host.data(), g->images->data(), host.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t k = 0; k < host.size(); ++k) {
      const int e = std::abs(int(host[k]) - int(c->images[k]));
      d.max = std::max(d.max, e);
      sum += e;
    }
    d.samples += g->size;
    if (last) *last = *g;
  }
  d.mean = d.samples > 0 ? sum / (static_cast<double>(d.samples) * lo.transform.output_size() * lo.transform.output_size() * 3) : 0;
  return d;
}

}  // namespace

TEST(CudaGpuDecode, RowsMatchTheCpuPathWithinMeasuredDifferences) {
  REQUIRE_GPU();
  if (!device::built_with_gpu_decode()) GTEST_SKIP() << "this build has no GPU decode path";
  auto ds = std::make_shared<datasets::ImageFolder>(dataset(4, 16, 400));
  for (const auto kind : {transforms::TransformOptions::Kind::kTrain, transforms::TransformOptions::Kind::kEval}) {
    loader::LoaderOptions lo;
    lo.batch_size = 16;
    lo.num_workers = 4;
    lo.transform = transforms::TransformOptions::imagenet(kind, 224);
    lo.decode_device = loader::DecodeDevice::kGpu;
    device::EngineBatch last;
    RowDiff d;
    try {
      d = engine_vs_cpu(ds, lo, &last);
    } catch (const std::runtime_error& e) {
      GTEST_SKIP() << e.what();
    }
    std::printf("gpu decode %s 224: %lld samples, max |GPU - CPU| %d, mean %.3f; GPU decoded %lld, fell back %lld\n",
                kind == transforms::TransformOptions::Kind::kTrain ? "train" : "eval", static_cast<long long>(d.samples),
                d.max, d.mean, static_cast<long long>(last.gpu_decoded_total), static_cast<long long>(last.gpu_fallbacks_total));
    EXPECT_EQ(d.samples, 64);
    EXPECT_EQ(last.gpu_decoded_total + last.gpu_fallbacks_total, 64);
    EXPECT_EQ(last.gpu_fallbacks_total, 0);
    EXPECT_LE(d.mean, 2.0);
  }
  loader::LoaderOptions lo;
  lo.batch_size = 16;
  lo.num_workers = 2;
  lo.transform.rrc.size = 128;
  lo.decode_device = loader::DecodeDevice::kAuto;
  device::EngineBatch last;
  const RowDiff d = engine_vs_cpu(ds, lo, &last);
  std::printf("gpu decode auto: share %.3f after %lld samples (GPU %lld)\n", last.gpu_decode_share,
              static_cast<long long>(d.samples), static_cast<long long>(last.gpu_decoded_total));
  EXPECT_EQ(d.samples, 64);
  EXPECT_GE(last.gpu_decode_share, 0.0);
  EXPECT_LE(last.gpu_decode_share, 1.0);
  EXPECT_LE(d.mean, 2.0);
}
