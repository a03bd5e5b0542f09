// The GPU decode path's plumbing without a GPU: nvImageCodec's C API on its CPU backend
// (GpuDecoder::kCpuOnly: the same batching, regions, statuses and resize, in host memory), the
// loader's deferred rows and their CPU fallback under each error policy. The GPU itself is
// tested by test_gpu on the GPU machine (tools/gpu_check.sh).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "bugkinds.h"
#include "gpufeed/datasets/dataset.h"
#include "gpufeed/decode/decoder.h"
#include "gpufeed/device/gpu_decode.h"
#include "gpufeed/loader/loader.h"
#include "gpufeed/sampler/sampler.h"
#include "test_util.h"

namespace gpufeed {
namespace {

using device::GpuDecodeItem;
using device::GpuDecoder;
namespace fs = std::filesystem;

// Skips the calling test, saying why, when nvImageCodec cannot start here.
std::unique_ptr<GpuDecoder> cpu_only_decoder() {
  if (!device::built_with_gpu_decode()) return nullptr;
#ifdef GPUFEED_TEST_NVIMGCODEC
  setenv("GPUFEED_NVIMGCODEC_LIBRARY", GPUFEED_TEST_NVIMGCODEC, /*overwrite=*/0);
#endif
  device::GpuDecoderOptions o;
  o.device = GpuDecoder::kCpuOnly;
  try {
    return std::make_unique<GpuDecoder>(o);
  } catch (const std::exception& e) {
    std::cout << "skipping: " << e.what() << "\n";
    return nullptr;
  }
}

#define GPUFEED_NEED_DECODER(d)                                                                   \
  auto d = cpu_only_decoder();                                                                    \
  if (!d) GTEST_SKIP() << "no nvImageCodec here (build without GPU decode, or library missing); " \
                          "set GPUFEED_NVIMGCODEC_LIBRARY or pip install nvidia-nvimgcodec-cu13"

void write_file(const fs::path& p, const test::Bytes& b) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

test::Bytes jpeg(int w, int h, test::JpegColor color, bool progressive, uint32_t seed) {
  test::JpegSpec spec;
  spec.width = w;
  spec.height = h;
  spec.color = color;
  spec.progressive = progressive;
  const int channels = color == test::JpegColor::kGray ? 1 : (color == test::JpegColor::kCmyk ? 4 : 3);
  return test::make_jpeg(spec, test::pattern(w, h, channels, seed));
}

// A flat folder: 6 JPEGs the GPU takes (colour 4:2:0, grey, progressive), a CMYK JPEG and a PNG it
// does not. Sorted names fix the indices: a0..a5 GPU, b_cmyk 6, c_png 7.
fs::path mixed_folder(const fs::path& root) {
  for (int i = 0; i < 6; ++i) {
    const auto color = i == 2 ? test::JpegColor::kGray : test::JpegColor::kYCbCr;
    std::string name = "a";  // (GCC 12 warns falsely on "a" + std::to_string(i) + ".jpg")
    name += std::to_string(i);
    name += ".jpg";
    write_file(root / name, jpeg(180 + 37 * i, 140 + 23 * i, color, i == 4, 7 + i));
  }
  write_file(root / "b_cmyk.jpg", jpeg(160, 120, test::JpegColor::kCmyk, false, 3));
  test::PngSpec png;
  png.width = 150;
  png.height = 110;
  write_file(root / "c_png.png", test::make_png(png, test::pattern(150, 110, 3, 5)));
  return root;
}

loader::LoaderOptions train_options(int size, int64_t batch) {
  loader::LoaderOptions o;
  o.transform = transforms::TransformOptions::imagenet(transforms::TransformOptions::Kind::kTrain, size);
  o.batch_size = batch;
  o.num_workers = 2;
  o.seed = 11;
  o.prefetch_next_epoch = false;
  return o;
}

TEST(GpuDecodeRegion, TrainIsTheBoxEvalWidensByTheFilterReachAndClamps) {
  transforms::SamplePlan train;
  train.box = {10, 20, 100, 80};
  train.taps_clamped_to_box = true;
  EXPECT_EQ(device::gpu_decode_region(train, 500, 400), train.box);
  transforms::SamplePlan eval;
  eval.box = {16, 16, 224, 224};
  eval.region = {16.5, 16.5, 239.5, 239.5};  // 223 source pixels onto 224: scale < 1, reach 1 + 1
  eval.taps_clamped_to_box = false;
  eval.output_size = 224;
  EXPECT_EQ(device::gpu_decode_region(eval, 256, 256), (decode::CropRect{14, 14, 228, 228}));
  eval.filter = transforms::ResizeFilter::kBicubic;  // reach 2 + 1
  EXPECT_EQ(device::gpu_decode_region(eval, 256, 256), (decode::CropRect{13, 13, 230, 230}));
  eval.box = {0, 0, 256, 256};  // clamped to the image
  EXPECT_EQ(device::gpu_decode_region(eval, 256, 256), (decode::CropRect{0, 0, 256, 256}));
}

// Plans every file of `dataset` as the loader does (epoch 3) and decodes them as one batch.
struct Planned {
  std::vector<decode::ByteBuffer> bytes;
  std::vector<GpuDecodeItem> items;
};

Planned plan_all(const datasets::Dataset& ds, const loader::LoaderOptions& o, int64_t epoch) {
  Planned p;
  for (int64_t i = 0; i < ds.size(); ++i) {
    p.bytes.emplace_back();
    ds.read(i, ds.at(i), p.bytes.back());
  }
  for (int64_t i = 0; i < ds.size(); ++i) {
    const std::string src = ds.at(i).source();
    const decode::ImageInfo info = decode::probe(p.bytes[i], src);
    const transforms::SamplePlan plan = loader::plan_for(info, o, epoch, i).plan;
    GpuDecodeItem it;
    it.data = p.bytes[i].data();
    it.size = p.bytes[i].size();
    it.roi = device::gpu_decode_region(plan, info.width, info.height);
    it.region = plan.region;
    it.flip = plan.flip;
    it.output_size = plan.output_size;
    it.filter = plan.filter;
    it.source = src;
    p.items.push_back(it);
  }
  return p;
}

struct Diff {
  int max = 0;
  double mean = 0;
};
Diff diff(const uint8_t* a, const uint8_t* b, size_t n) {
  Diff d;
  double sum = 0;
  for (size_t k = 0; k < n; ++k) {
    const int e = std::abs(int(a[k]) - int(b[k]));
    d.max = std::max(d.max, e);
    sum += e;
  }
  d.mean = sum / static_cast<double>(n);
  return d;
}

// Train and eval plans, bilinear and bicubic: the rows are the CPU path's crops of the same files
// (the CPU path: gpufeed's libjpeg-turbo crop decode at a DCT scale and PIL's two rounded passes;
// here: nvImageCodec's libjpeg-turbo decode of the whole region and one float 2D pass).
TEST(GpuDecodeCpuOnly, RowsAreTheCpuPathsCropsWithinAFewLevels) {
  GPUFEED_NEED_DECODER(dec);
  test::TempDir tmp("gpu_decode_rows");
  datasets::FlatFolder ds(mixed_folder(tmp.path / "d"));
  for (const auto kind : {transforms::TransformOptions::Kind::kTrain, transforms::TransformOptions::Kind::kEval}) {
    for (const auto filter : {transforms::ResizeFilter::kBilinear, transforms::ResizeFilter::kBicubic}) {
      loader::LoaderOptions o = train_options(64, 8);
      o.transform = transforms::TransformOptions::imagenet(kind, 64);
      o.transform.interpolation = filter;
      Planned p = plan_all(ds, o, 3);
      p.items.resize(6);  // the JPEGs the GPU takes
      const size_t row = 64 * 64 * 3;
      std::vector<uint8_t> got(6 * row), want(row);
      std::vector<uint8_t*> out;
      for (int i = 0; i < 6; ++i) out.push_back(got.data() + i * row);
      const auto results = dec->decode(p.items, out, nullptr);
      Diff worst;
      double mean = 0;
      for (int i = 0; i < 6; ++i) {
        ASSERT_TRUE(results[i].ok) << p.items[i].source << ": " << results[i].reason;
        loader::load_sample(ds, i, 3, o, want.data());
        const Diff d = diff(out[i], want.data(), row);
        worst.max = std::max(worst.max, d.max);
        mean += d.mean / 6;
      }
      std::cout << (kind == transforms::TransformOptions::Kind::kTrain ? "train" : "eval") << " "
                << (filter == transforms::ResizeFilter::kBicubic ? "bicubic" : "bilinear")
                << ": max |GPU path - CPU path| " << worst.max << ", mean " << mean << "\n";
      EXPECT_LE(mean, 1.5);
      // The CPU path decodes these small images at a DCT scale (1/2, 1/4) where nvImageCodec decodes
      // the full region: single pixels at sharp edges differ by up to ~41 levels; the mean is the check.
      EXPECT_LE(worst.max, 48);
    }
  }
  const device::GpuDecodeStats s = dec->stats();
  EXPECT_EQ(s.calls, 4);
  EXPECT_EQ(s.samples, 24);
  EXPECT_EQ(s.failed, 0);
}

// Whole images cropped by the resize (region_decode off, or nvImageCodec refusing a region): the
// same rows as region decode, byte for byte on nvImageCodec's libjpeg-turbo backend.
TEST(GpuDecodeCpuOnly, WholeImagesCroppedByTheResizeAreTheRegionRows) {
  GPUFEED_NEED_DECODER(dec);
  device::GpuDecoderOptions o;
  o.device = GpuDecoder::kCpuOnly;
  o.region_decode = false;
  GpuDecoder whole(o);
  test::TempDir tmp("gpu_decode_whole");
  datasets::FlatFolder ds(mixed_folder(tmp.path / "d"));
  Planned p = plan_all(ds, train_options(56, 8), 4);
  p.items.resize(6);
  const size_t row = 56 * 56 * 3;
  std::vector<uint8_t> a(6 * row), b(6 * row);
  std::vector<uint8_t*> ra, rb;
  for (int i = 0; i < 6; ++i) {
    ra.push_back(a.data() + i * row);
    rb.push_back(b.data() + i * row);
  }
  const auto r1 = dec->decode(p.items, ra, nullptr);
  const auto r2 = whole.decode(p.items, rb, nullptr);
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(r1[i].ok && r2[i].ok) << i;
  const Diff d = diff(a.data(), b.data(), a.size());
  std::cout << "whole vs region: max " << d.max << ", mean " << d.mean << "\n";
  EXPECT_EQ(d.max, 0) << "mean " << d.mean;
  EXPECT_EQ(whole.stats().whole_images, 6);
  EXPECT_EQ(dec->stats().whole_images, 0);
}

TEST(GpuDecodeCpuOnly, FlipMirrorsTheRowExactly) {
  GPUFEED_NEED_DECODER(dec);
  test::TempDir tmp("gpu_decode_flip");
  datasets::FlatFolder ds(mixed_folder(tmp.path / "d"));
  Planned p = plan_all(ds, train_options(48, 8), 1);
  std::vector<GpuDecodeItem> items{p.items[0], p.items[0]};
  items[0].flip = false;
  items[1].flip = true;
  std::vector<uint8_t> a(48 * 48 * 3), b(48 * 48 * 3);
  std::vector<uint8_t*> out{a.data(), b.data()};
  const auto r = dec->decode(items, out, nullptr);
  ASSERT_TRUE(r[0].ok && r[1].ok);
  for (int y = 0; y < 48; ++y)
    for (int x = 0; x < 48; ++x)
      for (int c = 0; c < 3; ++c) ASSERT_EQ(a[(y * 48 + x) * 3 + c], b[(y * 48 + 47 - x) * 3 + c]) << y << "," << x;
}

// Bad items fail alone, with a reason, their rows untouched; the good ones in the batch decode.
TEST(GpuDecodeCpuOnly, FailuresArePerSampleWithAReason) {
  GPUFEED_NEED_DECODER(dec);
  test::TempDir tmp("gpu_decode_fail");
  datasets::FlatFolder ds(mixed_folder(tmp.path / "d"));
  Planned p = plan_all(ds, train_options(32, 8), 0);
  test::Bytes garbage(4000, 0x5a);
  garbage[0] = 0xff;
  garbage[1] = 0xd8;  // SOI, then nothing a parser accepts
  std::vector<GpuDecodeItem> items{p.items[0], p.items[7], p.items[1]};
  items[1].data = garbage.data();
  items[1].size = garbage.size();
  items[1].roi = {0, 0, 20, 20};
  items[1].region = {0, 0, 20, 20};
  std::vector<uint8_t> rows(3 * 32 * 32 * 3, 0xab);
  std::vector<uint8_t*> out{rows.data(), rows.data() + 32 * 32 * 3, rows.data() + 2 * 32 * 32 * 3};
  const auto r = dec->decode(items, out, nullptr);
  EXPECT_TRUE(r[0].ok) << r[0].reason;
  EXPECT_FALSE(r[1].ok);
  EXPECT_FALSE(r[1].reason.empty());
  std::cout << "garbage: " << r[1].reason << "\n";
  EXPECT_TRUE(r[2].ok) << r[2].reason;
  EXPECT_TRUE(std::all_of(out[1], out[1] + 32 * 32 * 3, [](uint8_t v) { return v == 0xab; }));
  EXPECT_EQ(dec->stats().failed, 1);
}

TEST(GpuDecodeLibrary, AMissingLibraryIsAnErrorNamingThePackage) {
  if (!device::built_with_gpu_decode()) GTEST_SKIP() << "this build has no GPU decode path";
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process: the library is opened once per process
  EXPECT_EXIT(
      {
        setenv("GPUFEED_NVIMGCODEC_LIBRARY", "/nonexistent/libnvimgcodec.so.0", 1);
        try {
          device::GpuDecoderOptions o;
          o.device = GpuDecoder::kCpuOnly;
          GpuDecoder d(o);
        } catch (const std::runtime_error& e) {
          std::cerr << e.what() << "\n";
          std::exit(3);
        }
        std::exit(0);
      },
      testing::ExitedWithCode(3), "nvidia-nvimgcodec-cu13\\[nvjpeg\\].*/nonexistent/libnvimgcodec.so.0");
}

std::shared_ptr<loader::Loader> make_loader(std::shared_ptr<const datasets::Dataset> ds, loader::LoaderOptions o) {
  return std::make_shared<loader::Loader>(ds, std::make_shared<sampler::SequentialSampler>(ds->size()), o);
}

// decode_device gpu: the JPEGs' rows are deferred (read, probed, planned), CMYK and PNG decoded by
// the workers; the CPU fallback of a deferred row is the decode_device cpu row, byte for byte.
TEST(GpuDecodeLoader, DefersWhatTheGpuTakesAndFallsBackToTheCpuPathExactly) {
  test::TempDir tmp("gpu_decode_loader");
  auto ds = std::make_shared<datasets::FlatFolder>(mixed_folder(tmp.path / "d"));
  loader::LoaderOptions cpu = train_options(40, 8);
  auto ref_loader = make_loader(ds, cpu);
  ref_loader->start_epoch(2);
  const std::optional<loader::Batch> ref = ref_loader->next();
  ASSERT_TRUE(ref);

  loader::LoaderOptions gpu = cpu;
  gpu.decode_device = loader::DecodeDevice::kGpu;
  auto l = make_loader(ds, gpu);
  l->start_epoch(2);
  EXPECT_THROW(l->next(), std::logic_error);  // nothing would decode the deferred rows
  l->set_gpu_decode_share(1.0);
  l->start_epoch(2);
  std::optional<loader::Batch> b = l->next();
  ASSERT_TRUE(b);
  ASSERT_EQ(b->deferred.size(), 6u);
  const size_t row = 40 * 40 * 3;
  for (size_t i = 0; i < 6; ++i) {
    const loader::DeferredSample& d = *b->deferred[i];
    EXPECT_EQ(d.position, static_cast<int64_t>(i));
    EXPECT_EQ(d.index, static_cast<int64_t>(i));
    EXPECT_EQ(d.plan.output_size, 40);
    EXPECT_FALSE(d.bytes.empty());
    std::vector<uint8_t> out(row);
    EXPECT_FALSE(l->decode_deferred_on_cpu(*b, d, out.data()));
    EXPECT_TRUE(std::equal(out.begin(), out.end(), ref->images + i * row)) << d.source;
  }
  for (size_t k = 6; k < 8; ++k)  // CMYK and PNG: the workers' rows, as under cpu
    EXPECT_TRUE(std::equal(b->images + k * row, b->images + (k + 1) * row, ref->images + k * row)) << k;
  EXPECT_EQ(b->labels[7], ref->labels[7]);

  // Half the rows, spread: rows 1, 3, 5 of the JPEGs (and 7, the PNG, stays on the CPU).
  l->set_gpu_decode_share(0.5);
  l->start_epoch(3);
  b = l->next();
  ASSERT_TRUE(b);
  std::vector<int64_t> rows;
  for (const auto* d : b->deferred) rows.push_back(d->position);
  EXPECT_EQ(rows, (std::vector<int64_t>{1, 3, 5}));
}

TEST(GpuDecodeLoader, AugmentationsAreRefusedUnderGpu) {
  loader::LoaderOptions o = train_options(32, 4);
  o.decode_device = loader::DecodeDevice::kAuto;
  o.transform.augment.color_jitter.brightness = 0.4f;
  EXPECT_THROW(o.validate(), std::invalid_argument);
  o.decode_device = loader::DecodeDevice::kCpu;
  EXPECT_NO_THROW(o.validate());
}

// A deferred row the CPU cannot decode either: raise names the file; skip fills the row with the
// next sample of the epoch order, reports it in the batch and counts it in the epoch's summary.
TEST(GpuDecodeLoader, AFallbackThatFailsFollowsTheErrorPolicy) {
  test::TempDir tmp("gpu_decode_policy");
  const fs::path root = mixed_folder(tmp.path / "d");
  // a1.jpg keeps its header (the probe passes) and loses most of its scan: truncated.
  test::Bytes bad = jpeg(217, 163, test::JpegColor::kYCbCr, false, 8);
  bad.resize(bad.size() / 3);
  write_file(root / "a1.jpg", bad);
  auto ds = std::make_shared<datasets::FlatFolder>(root);
  for (const auto policy : {loader::ErrorPolicy::kRaise, loader::ErrorPolicy::kSkip}) {
    loader::LoaderOptions o = train_options(40, 8);
    o.decode_device = loader::DecodeDevice::kGpu;
    o.error_policy = policy;
    auto l = make_loader(ds, o);
    l->set_gpu_decode_share(1.0);
    l->start_epoch(0);
    std::optional<loader::Batch> b = l->next();
    ASSERT_TRUE(b);
    ASSERT_GE(b->deferred.size(), 2u);
    const loader::DeferredSample& d = *b->deferred[1];
    ASSERT_EQ(d.index, 1);
    std::vector<uint8_t> out(40 * 40 * 3);
    if (policy == loader::ErrorPolicy::kRaise) {
      try {
        l->decode_deferred_on_cpu(*b, d, out.data());
        ADD_FAILURE() << "no error for a truncated file";
      } catch (const decode::DecodeError& e) {
        EXPECT_NE(std::string(e.what()).find("a1.jpg"), std::string::npos) << e.what();
      }
    } else {
      const std::optional<loader::SkippedSample> s = l->decode_deferred_on_cpu(*b, d, out.data());
      ASSERT_TRUE(s);
      EXPECT_EQ(s->index, 1);
      EXPECT_EQ(s->replaced_by, 2);  // the next sample of the (sequential) order
      EXPECT_EQ(s->position, 1);
      std::vector<uint8_t> want(40 * 40 * 3);
      loader::LoaderOptions cpu = o;
      cpu.decode_device = loader::DecodeDevice::kCpu;
      loader::load_sample(*ds, 2, 0, cpu, want.data());
      EXPECT_EQ(out, want);
      while (l->next()) {
      }
      EXPECT_EQ(l->epoch_summary().skipped, 1);
    }
  }
}

}  // namespace
}  // namespace gpufeed
