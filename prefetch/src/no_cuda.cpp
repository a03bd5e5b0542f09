// Built when the CUDA path is off: the CPU path is complete, CUDA requests fail clearly.
#include <stdexcept>

#include "gpufeed/prefetch/prefetcher.h"
#include "internal.h"

namespace gpufeed::prefetch {

bool cuda_available() { return false; }

device::StreamHandle current_stream(const c10::Device&) { return nullptr; }

std::shared_ptr<StreamMark> record_stream_mark(const c10::Device& device) {
  throw std::runtime_error("gpufeed was built without the CUDA path; cannot mark " + device.str());
}

std::shared_ptr<loader::HostAllocator> host_allocator_for(const c10::Device& device) {
  if (device.is_cuda()) {
    throw std::runtime_error("gpufeed was built without the CUDA path; cannot use " + device.str());
  }
  return loader::default_host_allocator();
}

std::unique_ptr<Prefetcher> make_cuda_prefetcher(std::shared_ptr<loader::Loader>,
                                                 const PrefetchOptions& options) {
  throw std::runtime_error("gpufeed was built without the CUDA path; cannot use " +
                           options.device.str());
}

}  // namespace gpufeed::prefetch
