#pragma once
// Helpers shared by the loader, harness and distributed tests (torch-free: the sanitizer builds
// include it too).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "gpufeed/loader/host_allocator.h"
#include "gpufeed/datasets/synthetic.h"
#include "process_util.h"

namespace gpufeed::test {

/// A scratch folder `<tmp>/gpufeed_<name>_<pid>`, emptied on construction, removed at the end.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& name)
      : path(std::filesystem::temp_directory_path() /
             ("gpufeed_" + name + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

/// 4 classes x 8 small JPEGs (36..56 px) written by the synthetic-dataset writer under `root`.
inline std::filesystem::path tiny_dataset(const std::filesystem::path& root) {
  datasets::SyntheticOptions so;
  so.num_classes = 4;
  so.images_per_class = 8;
  so.min_size = 36;
  so.max_size = 56;
  datasets::write_synthetic_image_folder(root, so);
  return root;
}

/// Every regular file under `root`, sorted.
inline std::vector<std::filesystem::path> list_files_of(const std::filesystem::path& root) {
  std::vector<std::filesystem::path> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root))
    if (e.is_regular_file()) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

/// Polls `predicate()` every `poll` until it holds or `seconds` have passed; returns its last
/// value. For conditions a test waits on (a process gone, a loader's slots decoded) with a bound
/// generous enough for a loaded machine: a hang guard, never a pace assertion.
template <typename P>
bool eventually(P predicate, double seconds, std::chrono::microseconds poll = std::chrono::milliseconds(50)) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!predicate()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(poll);
  }
  return true;
}

/// A HostAllocator that counts live and total allocations (slots must be allocated once and all
/// returned), forwarding to the default allocator.
class CountingAllocator : public loader::HostAllocator {
 public:
  void* allocate(size_t bytes) override {
    ++live;
    ++total;
    return loader::default_host_allocator()->allocate(bytes);
  }
  void deallocate(void* p, size_t bytes) noexcept override {
    --live;
    loader::default_host_allocator()->deallocate(p, bytes);
  }
  std::atomic<int> live{0}, total{0};
};

}  // namespace gpufeed::test
