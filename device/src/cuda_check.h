#pragma once
// CUDA error checking and a device guard for the device room's own sources (CUDA builds only).
#include <cuda_runtime_api.h>

namespace gpufeed::device {

/// The calling thread's current device; throws std::runtime_error when CUDA has none.
int current_device_or_throw();

namespace detail {

/// Throws std::runtime_error "<what>: <CUDA's reason>" unless err is cudaSuccess.
void check(cudaError_t err, const char* what);

/// Makes `device` current for the guard's scope, restoring the previous one after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace detail
}  // namespace gpufeed::device
