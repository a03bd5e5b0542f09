// The per-sample path allocates nothing once its thread-local buffers have grown: in steady state,
// reading, probing, planning, decoding (libjpeg's per-image pools included: decode/src/jpeg.cpp's
// ImageArena) and resizing a sample make no heap allocation at all. Counted by replacing the
// global operator new and, on glibc without a sanitizer (which owns malloc then), malloc itself.
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <new>

#include <unistd.h>

#include "gpufeed/decode/decoder.h"
#include "gpufeed/datasets/dataset.h"
#include "gpufeed/loader/loader.h"
#include "gpufeed/datasets/synthetic.h"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<int64_t> g_news{0}, g_mallocs{0};
}  // namespace

// Replaceable global allocation functions ([new.delete]): count while g_counting is set. Not
// inlined: GCC would otherwise pair an inlined free() with gtest's `new` and warn
// (-Wmismatched-new-delete) although both sides are these functions.
[[gnu::noinline]] void* operator new(size_t n) {
  if (g_counting.load(std::memory_order_relaxed)) g_news.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, size_t) noexcept { std::free(p); }

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define GPUFEED_COUNT_MALLOC 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define GPUFEED_COUNT_MALLOC 0
#endif
#endif
#if !defined(GPUFEED_COUNT_MALLOC) && defined(__GLIBC__)
#define GPUFEED_COUNT_MALLOC 1
#endif
#ifndef GPUFEED_COUNT_MALLOC
#define GPUFEED_COUNT_MALLOC 0
#endif

#if GPUFEED_COUNT_MALLOC
// glibc's own entry points; defining malloc & co. in the executable interposes them for every
// library (libjpeg, libstdc++, ...), as allocators like jemalloc do.
extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
void __libc_free(void*);

static void count_malloc() {
  if (g_counting.load(std::memory_order_relaxed)) g_mallocs.fetch_add(1, std::memory_order_relaxed);
}
void* malloc(size_t n) {
  count_malloc();
  return __libc_malloc(n);
}
void* calloc(size_t a, size_t b) {
  count_malloc();
  return __libc_calloc(a, b);
}
void* realloc(void* p, size_t n) {
  count_malloc();
  return __libc_realloc(p, n);
}
void* aligned_alloc(size_t align, size_t n) {
  count_malloc();
  return __libc_memalign(align, n);
}
int posix_memalign(void** out, size_t align, size_t n) {
  count_malloc();
  void* p = __libc_memalign(align, n);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}
void free(void* p) { __libc_free(p); }
}
#endif

namespace fs = std::filesystem;
using namespace gpufeed::loader;
using namespace gpufeed::datasets;
using namespace gpufeed::transforms;

TEST(HotPath, LoadingASampleAllocatesNothingInSteadyState) {
  const fs::path root = fs::temp_directory_path() / ("gpufeed_hot_path_" + std::to_string(::getpid()));
  SyntheticOptions so;
  so.num_classes = 2;
  so.images_per_class = 6;
  so.min_size = 120;
  so.max_size = 700;  // large enough that some samples decode at 2/8 or 4/8
  write_synthetic_image_folder(root, so);
  const ImageFolder ds(root);
  // train, eval, and train with every augmentation on (random-valued erasing included)
  for (const int config : {0, 1, 2}) {
    const auto kind = config == 1 ? TransformOptions::Kind::kEval : TransformOptions::Kind::kTrain;
    const char* name = config == 0 ? "train" : config == 1 ? "eval" : "train + augment";
    LoaderOptions o;
    o.transform.kind = kind;
    if (config == 2) {
      o.transform.augment.auto_augment = AutoAugmentPolicy::kRandAugment;
      o.transform.augment.ra_num_ops = 3;
      o.transform.augment.color_jitter = {0.4f, 0.4f, 0.4f, 0.1f};
      o.transform.augment.random_erasing.p = 1.0f;
      o.transform.augment.random_erasing.random_value = true;
    }
    std::vector<uint8_t> out(224 * 224 * 3);
    // Warm up on the same samples: the thread's buffers grow to the largest file, decoded image,
    // libjpeg pool and filter table they need; the second run of the same work is the steady state.
    for (int64_t epoch = 1; epoch < 4; ++epoch)
      for (int64_t i = 0; i < ds.size(); ++i) load_sample(ds, i, epoch, o, out.data());
    g_news = 0;
    g_mallocs = 0;
    g_counting = true;
    for (int64_t epoch = 1; epoch < 4; ++epoch)
      for (int64_t i = 0; i < ds.size(); ++i) load_sample(ds, i, epoch, o, out.data());
    g_counting = false;
    EXPECT_EQ(g_news.load(), 0) << name << ": operator new";
    EXPECT_EQ(g_mallocs.load(), 0) << name << ": malloc and friends";
  }
  if (!GPUFEED_COUNT_MALLOC) std::cout << "(malloc not counted under a sanitizer)\n";
  fs::remove_all(root);
}
