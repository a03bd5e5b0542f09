#include "gpufeed/profiler/nvml.h"

#include <dlfcn.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

namespace gpufeed::profiler {
namespace {

// The handful of NVML declarations we need, written out here instead of including nvml.h
// (NVML API version 12, unchanged in 13: the CUDA 12/13 drivers' libnvidia-ml.so.1). Every entry
// point is looked up with dlsym, so nothing links against NVML.
using nvmlReturn_t = int;  // enum nvmlReturn_enum; NVML_SUCCESS = 0
constexpr nvmlReturn_t kNvmlSuccess = 0;
struct nvmlDevice_st;
using nvmlDevice_t = nvmlDevice_st*;
struct nvmlUtilization_t {  // nvmlUtilization_st
  unsigned int gpu;         // % of the last sample period one or more kernels ran
  unsigned int memory;      // % of it device memory was read or written
};
struct nvmlMemory_t {                    // nvmlMemory_st (v1)
  unsigned long long total, free, used;  // bytes
};
enum nvmlClockType_t { kNvmlClockGraphics = 0, kNvmlClockSm = 1, kNvmlClockMem = 2 };

struct NvmlApi {
  nvmlReturn_t (*init)() = nullptr;                              // nvmlInit_v2
  nvmlReturn_t (*shutdown)() = nullptr;                          // nvmlShutdown
  const char* (*error_string)(nvmlReturn_t) = nullptr;           // nvmlErrorString
  nvmlReturn_t (*by_index)(unsigned, nvmlDevice_t*) = nullptr;   // nvmlDeviceGetHandleByIndex_v2
  nvmlReturn_t (*by_pci)(const char*, nvmlDevice_t*) = nullptr;  // nvmlDeviceGetHandleByPciBusId_v2
  nvmlReturn_t (*utilization)(nvmlDevice_t,
                              nvmlUtilization_t*) = nullptr;      // nvmlDeviceGetUtilizationRates
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*) = nullptr;  // nvmlDeviceGetMemoryInfo
  nvmlReturn_t (*clock)(nvmlDevice_t, nvmlClockType_t,
                        unsigned*) = nullptr;  // nvmlDeviceGetClockInfo
};

template <class F>
bool bind(void* lib, const char* name, F& fn) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  return fn != nullptr;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

struct NvmlSampler::Impl {
  NvmlOptions options;
  void* lib = nullptr;
  NvmlApi api;
  bool initialised = false;
  nvmlDevice_t device = nullptr;
  std::string reason;

  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::deque<GpuSample> pending;
  std::optional<GpuSample> last;
  std::thread thread;
  std::mutex read_mu;  // NVML is thread-safe; this only keeps read_now and the thread in order

  std::string error(nvmlReturn_t rc) const {
    const char* s = api.error_string ? api.error_string(rc) : nullptr;
    return s ? std::string(s) : "NVML error " + std::to_string(rc);
  }

  void open() {
    lib = dlopen(options.library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* e = dlerror();
      reason = "dlopen(" + options.library + "): " + (e ? e : "failed");
      return;
    }
    if (!bind(lib, "nvmlInit_v2", api.init) || !bind(lib, "nvmlShutdown", api.shutdown) ||
        !bind(lib, "nvmlErrorString", api.error_string) ||
        !bind(lib, "nvmlDeviceGetHandleByIndex_v2", api.by_index) ||
        !bind(lib, "nvmlDeviceGetHandleByPciBusId_v2", api.by_pci) ||
        !bind(lib, "nvmlDeviceGetUtilizationRates", api.utilization) ||
        !bind(lib, "nvmlDeviceGetMemoryInfo", api.memory) ||
        !bind(lib, "nvmlDeviceGetClockInfo", api.clock)) {
      reason = options.library + " lacks an NVML entry point this build needs";
      return;
    }
    if (const nvmlReturn_t rc = api.init(); rc != kNvmlSuccess) {
      reason = "nvmlInit_v2: " + error(rc);
      return;
    }
    initialised = true;
    const nvmlReturn_t rc = options.pci_bus_id.empty()
                                ? api.by_index(options.device_index, &device)
                                : api.by_pci(options.pci_bus_id.c_str(), &device);
    if (rc != kNvmlSuccess) {
      reason = (options.pci_bus_id.empty() ? "device " + std::to_string(options.device_index)
                                           : "device " + options.pci_bus_id) +
               ": " + error(rc);
      device = nullptr;
    }
  }

  std::optional<GpuSample> read() {
    if (!device) return std::nullopt;
    std::lock_guard<std::mutex> g(read_mu);
    GpuSample s;
    s.time_ns = now_ns();
    nvmlUtilization_t u{};
    if (api.utilization(device, &u) != kNvmlSuccess) return std::nullopt;
    s.util_percent = u.gpu;
    s.mem_util_percent = u.memory;
    nvmlMemory_t m{};
    if (api.memory(device, &m) == kNvmlSuccess) {
      s.mem_used_bytes = static_cast<int64_t>(m.used);
      s.mem_total_bytes = static_cast<int64_t>(m.total);
    }
    unsigned mhz = 0;
    if (api.clock(device, kNvmlClockSm, &mhz) == kNvmlSuccess)
      s.sm_clock_mhz = static_cast<int>(mhz);
    if (api.clock(device, kNvmlClockMem, &mhz) == kNvmlSuccess)
      s.mem_clock_mhz = static_cast<int>(mhz);
    return s;
  }

  void push(const GpuSample& s) {
    std::lock_guard<std::mutex> g(mu);
    pending.push_back(s);
    while (pending.size() > options.max_pending) pending.pop_front();
    last = s;
  }

  void run() {
    const auto interval = std::chrono::duration<double, std::milli>(options.interval_ms);
    std::unique_lock<std::mutex> lk(mu);
    while (!cv.wait_for(lk, interval, [&] { return stop; })) {
      lk.unlock();
      if (auto s = read()) push(*s);
      lk.lock();
    }
  }
};

NvmlSampler::NvmlSampler(NvmlOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.options = std::move(options);
  if (m.options.interval_ms <= 0) m.options.interval_ms = 100;
  m.open();
  if (!m.device) return;
  if (auto s = m.read()) m.push(*s);
  m.thread = std::thread([&m] { m.run(); });
}

NvmlSampler::~NvmlSampler() {
  Impl& m = *impl_;
  if (m.thread.joinable()) {
    {
      std::lock_guard<std::mutex> g(m.mu);
      m.stop = true;
    }
    m.cv.notify_all();
    m.thread.join();
  }
  if (m.initialised) m.api.shutdown();
  if (m.lib) dlclose(m.lib);
}

bool NvmlSampler::available() const { return impl_->device != nullptr; }
const std::string& NvmlSampler::unavailable_reason() const { return impl_->reason; }

std::vector<GpuSample> NvmlSampler::take() {
  std::lock_guard<std::mutex> g(impl_->mu);
  std::vector<GpuSample> out(impl_->pending.begin(), impl_->pending.end());
  impl_->pending.clear();
  return out;
}

std::optional<GpuSample> NvmlSampler::latest() const {
  std::lock_guard<std::mutex> g(impl_->mu);
  return impl_->last;
}

std::optional<GpuSample> NvmlSampler::read_now() {
  auto s = impl_->read();
  if (s) impl_->push(*s);
  return s;
}

}  // namespace gpufeed::profiler
