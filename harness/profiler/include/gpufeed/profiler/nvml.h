#pragma once
// GPU utilization, memory and clocks from NVML, sampled on a background thread. The library is
// loaded at run time with dlopen("libnvidia-ml.so.1"), so gpufeed builds without NVML headers and
// runs on machines without a driver: the sampler then reports itself unavailable and says why.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gpufeed::profiler {

/// One NVML reading of one device.
struct GpuSample {
  int64_t time_ns = 0;          ///< std::chrono::steady_clock time (since its epoch) of the read
  double util_percent = 0;      ///< % of the driver's last sample period a kernel was running
  double mem_util_percent = 0;  ///< % of that period device memory was read or written
  int64_t mem_used_bytes = 0;   ///< device memory in use (all processes)
  int64_t mem_total_bytes = 0;  ///< device memory installed
  int sm_clock_mhz = 0;         ///< current SM clock
  int mem_clock_mhz = 0;        ///< current memory clock
};

/// Where to find NVML and which device to watch.
struct NvmlOptions {
  std::string library = "libnvidia-ml.so.1";  ///< dlopen name or path (tests point it at a fake)
  /// PCI bus id ("0000:3b:00.0") of the device: preferred, because CUDA_VISIBLE_DEVICES renumbers
  /// CUDA devices but not NVML's.
  std::string pci_bus_id;
  unsigned device_index = 0;     ///< NVML device index, used when pci_bus_id is empty
  double interval_ms = 100;      ///< time between samples; the first is taken at construction
  size_t max_pending = 1 << 16;  ///< samples kept until take() collects them (oldest dropped)
};

/// Samples one device's utilization every interval_ms until destroyed. Thread-safe.
class NvmlSampler {
 public:
  /// Loads the library and opens the device. Never throws for a missing library, driver or device:
  /// available() is then false and unavailable_reason() says why.
  explicit NvmlSampler(NvmlOptions options = {});
  /// Stops the sampling thread, shuts NVML down and unloads the library.
  ~NvmlSampler();
  NvmlSampler(const NvmlSampler&) = delete;
  NvmlSampler& operator=(const NvmlSampler&) = delete;

  /// True when the library loaded, initialised and the device was found.
  bool available() const;
  /// Why available() is false ("dlopen(libnvidia-ml.so.1): ... not found"); empty when it is true.
  const std::string& unavailable_reason() const;
  /// The samples taken since the last call, oldest first (and forgets them).
  std::vector<GpuSample> take();
  /// The most recent sample taken, if any (take() does not clear it).
  std::optional<GpuSample> latest() const;
  /// Reads the device once, now, on the calling thread; std::nullopt when unavailable or the
  /// read fails.
  std::optional<GpuSample> read_now();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpufeed::profiler
