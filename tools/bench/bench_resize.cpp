// bench_resize: the loader's two non-decode stages, each resize kernel and the read path, timed
// in CPU time on one thread (docs/PERFORMANCE.md, "The floor on AVX2-only CPUs"):
//
//   gpufeed_bench_resize DATA [--transform train|eval] [--image-size S] [--epochs E] [--rounds R]
//                        [--kernels scalar,hwy,avx2,avx512]
//
// Every sample of epochs 0..E-1 is planned (loader::plan_for) and decoded once, exactly as the
// loader does; then, per round, every kernel this CPU runs (scalar, Highway, AVX2, AVX-512) resizes all of
// them (transforms::resize_sample, flips included) and read_sample reads every file again. Each
// sample's decoded crop is copied into one reused buffer before its resize (as the loader's
// worker resizes what it has just decoded), and only the resize is timed, with
// CLOCK_THREAD_CPUTIME_ID: CPU time is what a shared machine's load disturbs least. The kernels'
// outputs are checked byte for byte against each other. Prints CPU microseconds per sample per
// kernel (median over rounds, and the minimum; and the scalar kernel's median over each kernel's,
// when the scalar kernel was timed) and per read. Not a test: a measurement.
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "gpufeed/decode/decoder.h"
#include "gpufeed/datasets/dataset.h"
#include "gpufeed/loader/loader.h"
#include "gpufeed/transforms/resize.h"
#include "gpufeed/transforms/transform.h"

namespace {

using namespace gpufeed;

int64_t thread_cpu_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

uint64_t fnv1a(const uint8_t* p, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Decoded {
  transforms::SamplePlan plan;
  decode::DecodeResult result;
  decode::ImageBuffer image;
};

// Whether the comma-separated `list` names `name`.
bool listed(std::string_view list, std::string_view name) {
  while (!list.empty()) {
    const size_t comma = std::min(list.find(','), list.size());
    if (list.substr(0, comma) == name) return true;
    list.remove_prefix(std::min(comma + 1, list.size()));
  }
  return false;
}

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: gpufeed_bench_resize DATA [--transform train|eval] [--image-size S] [--epochs E] "
               "[--rounds R] [--kernels scalar,hwy,avx2,avx512]\n");
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) usage();
  const std::string data = argv[1];
  std::string transform = "train";
  std::string only = "scalar,hwy,avx2,avx512";  // the kernels to time (those this CPU runs)
  int image_size = 224, epochs = 1, rounds = 5;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage();
    if (a == "--transform") transform = argv[++i];
    else if (a == "--image-size") image_size = std::atoi(argv[++i]);
    else if (a == "--epochs") epochs = std::atoi(argv[++i]);
    else if (a == "--rounds") rounds = std::atoi(argv[++i]);
    else if (a == "--kernels") only = argv[++i];
    else usage();
  }
  if ((transform != "train" && transform != "eval") || image_size < 1 || epochs < 1 || rounds < 1) usage();

  const auto ds = datasets::open_dataset(data, {.index_cache = "off"});
  loader::LoaderOptions o;
  o.transform = transforms::TransformOptions::imagenet(
      transform == "train" ? transforms::TransformOptions::Kind::kTrain : transforms::TransformOptions::Kind::kEval,
      image_size);
  std::vector<Decoded> samples;
  std::vector<uint8_t> bytes;
  decode::Decoder decoder;
  std::map<int, int64_t> taps;  // horizontal taps per output pixel (the widest of the row) -> samples
  for (int e = 0; e < epochs; ++e) {
    for (int64_t i = 0; i < ds->size(); ++i) {
      const datasets::SampleRef ref = ds->at(i);
      const std::string source = ref.source();
      datasets::read_sample(ref, bytes);
      const loader::PlannedSample p = loader::plan_for(decode::probe(bytes, source), o, e, i);
      Decoded d;
      d.plan = p.plan;
      d.result = decoder.decode(bytes, source, p.decode, d.image);
      const transforms::BoxF box = transforms::decoded_region(p.plan, d.result);
      const double scale = std::max(box.width() / image_size, 1.0);
      ++taps[static_cast<int>(2 * scale + 1)];
      samples.push_back(std::move(d));
    }
  }
  std::printf("%zu samples (%d epochs of %lld files, %s, %d px)\n", samples.size(), epochs,
              static_cast<long long>(ds->size()), transform.c_str(), image_size);
  std::printf("horizontal support, 2 x max(scale, 1) + 1 taps (rounded down): ");
  for (const auto& [t, n] : taps) std::printf("%d: %lld  ", t, static_cast<long long>(n));
  std::printf("\n");

  std::vector<std::pair<const char*, transforms::ResizeKernel>> kernels;
  for (const auto& k : {std::pair{"scalar", transforms::ResizeKernel::kScalar}, std::pair{"hwy", transforms::ResizeKernel::kHighway},
                        std::pair{"avx2", transforms::ResizeKernel::kAvx2}, std::pair{"avx512", transforms::ResizeKernel::kAvx512}})
    if (transforms::Resizer::supported(k.second) && listed(only, k.first)) kernels.push_back(k);
  std::printf("kernels this CPU runs: ");
  for (const auto& k : kernels) std::printf("%s ", k.first);
  std::printf("(auto picks %s)\n",
              [] {
                switch (transforms::Resizer().kernel()) {
                  case transforms::ResizeKernel::kAvx512: return "avx512";
                  case transforms::ResizeKernel::kAvx2: return "avx2";
                  case transforms::ResizeKernel::kHighway: return "hwy";
                  default: return "scalar";
                }
              }());

  const size_t out_bytes = static_cast<size_t>(image_size) * image_size * 3;
  std::vector<uint8_t> out(out_bytes);
  decode::ImageBuffer work;
  std::vector<std::vector<double>> us(kernels.size());
  std::vector<double> read_us;
  std::vector<uint64_t> hashes(kernels.size(), 0);
  for (int r = 0; r < rounds; ++r) {
    for (size_t k = 0; k < kernels.size(); ++k) {
      transforms::Resizer resizer(kernels[k].second);
      int64_t ns = 0;
      uint64_t h = 1469598103934665603ull;
      for (const Decoded& d : samples) {
        work.reshape(d.image.width, d.image.height);
        std::memcpy(work.pixels.data(), d.image.pixels.data(),
                    static_cast<size_t>(d.image.width) * d.image.height * 3);
        const int64_t t0 = thread_cpu_ns();
        transforms::resize_sample(d.plan, d.result, work, resizer, out.data());
        ns += thread_cpu_ns() - t0;
        if (r == 0) h = fnv1a(out.data(), out_bytes, h);
      }
      us[k].push_back(static_cast<double>(ns) / 1e3 / static_cast<double>(samples.size()));
      if (r == 0) hashes[k] = h;
    }
    const int64_t t0 = thread_cpu_ns();
    for (int64_t i = 0; i < ds->size(); ++i) datasets::read_sample(ds->at(i), bytes);
    read_us.push_back(static_cast<double>(thread_cpu_ns() - t0) / 1e3 / static_cast<double>(ds->size()));
  }
  int status = 0;
  for (size_t k = 0; k < kernels.size(); ++k) {
    const bool same = hashes[k] == hashes[0];
    if (!same) status = 1;
    const bool scalar_timed = kernels[0].second == transforms::ResizeKernel::kScalar;
    std::printf("resize %-7s %7.1f CPU us/sample (median of %d rounds; min %.1f)", kernels[k].first,
                median(us[k]), rounds, *std::min_element(us[k].begin(), us[k].end()));
    if (scalar_timed) std::printf("  %.2fx scalar", median(us[0]) / median(us[k]));
    std::printf("%s\n", same ? "" : "  OUTPUT DIFFERS FROM THE FIRST KERNEL'S");
  }
  std::printf("read           %7.1f CPU us/sample (median of %d rounds; min %.1f)\n", median(read_us), rounds,
              *std::min_element(read_us.begin(), read_us.end()));
  return status;
}
