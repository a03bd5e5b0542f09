#include "gpufeed/loader/host_allocator.h"

#include <cstdlib>
#include <new>

namespace gpufeed::loader {
namespace {

class AlignedHostAllocator final : public HostAllocator {
 public:
  void* allocate(size_t bytes) override {
    constexpr size_t kAlign = 4096;
    const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, rounded == 0 ? kAlign : rounded);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void deallocate(void* p, size_t) noexcept override { std::free(p); }
};

}  // namespace

std::shared_ptr<HostAllocator> default_host_allocator() {
  static const auto allocator = std::make_shared<AlignedHostAllocator>();
  return allocator;
}

}  // namespace gpufeed::loader
