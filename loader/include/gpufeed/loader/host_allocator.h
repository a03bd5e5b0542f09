#pragma once
#include <cstddef>
#include <memory>

namespace gpufeed::loader {

/// Where batch slots live. The loader allocates every slot once, before the first batch, and frees
/// them when it is destroyed; it never allocates slot memory in steady state. The prefetch room
/// injects a pinned (page-locked) allocator for CUDA; the default is plain aligned host memory.
class HostAllocator {
 public:
  virtual ~HostAllocator() = default;
  /// Returns `bytes` bytes aligned to at least 64 bytes. Throws std::bad_alloc (or the
  /// allocator's own error) on failure; never returns null.
  virtual void* allocate(size_t bytes) = 0;
  /// Frees memory from allocate(p's size in bytes). Never throws.
  virtual void deallocate(void* p, size_t bytes) noexcept = 0;
  /// True when the memory is page-locked, so host-to-device copies from it can be asynchronous.
  virtual bool pinned() const { return false; }
};

/// Page-aligned (4096-byte) ordinary host memory.
std::shared_ptr<HostAllocator> default_host_allocator();

}  // namespace gpufeed::loader
