// The CUDA runtime calls behind gpufeed/device/cuda.h (a build with the CUDA path).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <stdexcept>
#include <string>

#include "cuda_check.h"
#include "gpufeed/device/cuda.h"

namespace gpufeed::device {
namespace {

// Page-locked host memory, so H2D copies from slots are truly asynchronous.
class PinnedAllocator final : public loader::HostAllocator {
 public:
  void* allocate(size_t bytes) override {
    void* p = nullptr;
    detail::check(cudaHostAlloc(&p, bytes, cudaHostAllocPortable), "cudaHostAlloc");
    return p;
  }
  void deallocate(void* p, size_t) noexcept override { cudaFreeHost(p); }
  bool pinned() const override { return true; }
};

// A timing-enabled event recorded on a stream at construction.
class CudaStreamMark final : public StreamMark {
 public:
  CudaStreamMark(int device, StreamHandle stream) : device_(device) {
    detail::DeviceGuard guard(device);
    detail::check(cudaEventCreate(&event_), "cudaEventCreate");
    detail::check(cudaEventRecord(event_, static_cast<cudaStream_t>(stream)), "cudaEventRecord");
  }
  ~CudaStreamMark() override { cudaEventDestroy(event_); }
  CudaStreamMark(const CudaStreamMark&) = delete;
  CudaStreamMark& operator=(const CudaStreamMark&) = delete;

  bool reached() const override { return cudaEventQuery(event_) == cudaSuccess; }
  double ms_since(const StreamMark& earlier) const override {
    const auto* e = dynamic_cast<const CudaStreamMark*>(&earlier);
    if (!e) throw std::invalid_argument("StreamMark::ms_since: not a CUDA stream mark");
    detail::check(cudaEventSynchronize(e->event_), "cudaEventSynchronize");
    detail::check(cudaEventSynchronize(event_), "cudaEventSynchronize");
    float ms = 0;
    detail::check(cudaEventElapsedTime(&ms, e->event_, event_), "cudaEventElapsedTime");
    return ms;
  }

 private:
  int device_;
  cudaEvent_t event_ = nullptr;
};

}  // namespace

namespace detail {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear a sticky-less error so the next call does not report it again
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
  }
}

DeviceGuard::DeviceGuard(int device) {
  check(cudaGetDevice(&previous_), "cudaGetDevice");
  if (previous_ != device) check(cudaSetDevice(device), "cudaSetDevice");
}
DeviceGuard::~DeviceGuard() {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
}

}  // namespace detail

bool built_with_cuda() { return true; }

bool cuda_available() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  if (!ok) cudaGetLastError();
  return ok;
}

void set_device(int device) {
  const cudaError_t err = cudaSetDevice(device);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error("cannot use cuda:" + std::to_string(device) + ": " + cudaGetErrorString(err) +
                             " (check CUDA_VISIBLE_DEVICES and the driver)");
  }
}

int current_device_or_throw() {
  int d = 0;
  detail::check(cudaGetDevice(&d), "cudaGetDevice (is a CUDA driver installed?)");
  return d;
}

std::string pci_bus_id(int device) {
  cudaDeviceProp prop{};
  detail::check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  char bus[32];
  std::snprintf(bus, sizeof bus, "%08x:%02x:%02x.0", static_cast<unsigned>(prop.pciDomainID),
                static_cast<unsigned>(prop.pciBusID), static_cast<unsigned>(prop.pciDeviceID));
  return bus;
}

std::shared_ptr<loader::HostAllocator> pinned_host_allocator() { return std::make_shared<PinnedAllocator>(); }

std::shared_ptr<StreamMark> record_stream_mark(int device, StreamHandle stream) {
  return std::make_shared<CudaStreamMark>(device, stream);
}

}  // namespace gpufeed::device
