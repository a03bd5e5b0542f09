// Built when the CUDA path is off: the API of gpufeed/device/*.h stays, and every call that needs
// a device says the build has none.
#include <stdexcept>
#include <string>

#include "gpufeed/device/cuda.h"
#include "gpufeed/device/engine.h"
#include "gpufeed/device/normalize.h"

namespace gpufeed::device {
namespace {

[[noreturn]] void no_cuda(const std::string& what) {
  throw std::runtime_error("gpufeed was built without the CUDA path; cannot " + what);
}

}  // namespace

bool built_with_cuda() { return false; }
bool cuda_available() { return false; }
int current_device_or_throw() { no_cuda("use a CUDA device"); }
void set_device(int device) { no_cuda("use cuda:" + std::to_string(device)); }
std::string pci_bus_id(int device) { no_cuda("query cuda:" + std::to_string(device)); }
std::shared_ptr<loader::HostAllocator> pinned_host_allocator() { no_cuda("allocate pinned memory"); }
std::shared_ptr<StreamMark> record_stream_mark(int device, StreamHandle) {
  no_cuda("mark a stream of cuda:" + std::to_string(device));
}
void launch_normalize(const uint8_t*, void*, OutputType, int64_t, int64_t, int64_t, bool, const NormalizeConstants&,
                      StreamHandle) {
  no_cuda("convert a batch on a CUDA device");
}
std::shared_ptr<DeviceAllocator> stream_ordered_allocator(int device) {
  no_cuda("allocate on cuda:" + std::to_string(device));
}

struct CudaEngine::Impl {};
CudaEngine::CudaEngine(std::shared_ptr<loader::Loader>, EngineOptions options) {
  no_cuda("use cuda:" + std::to_string(options.device));
}
CudaEngine::~CudaEngine() = default;
void CudaEngine::start_epoch(int64_t, int64_t) { no_cuda("start an epoch on a CUDA device"); }
std::optional<EngineBatch> CudaEngine::next(StreamHandle) { no_cuda("copy to a CUDA device"); }
bool CudaEngine::wait_ready(std::chrono::nanoseconds) { no_cuda("copy to a CUDA device"); }
loader::Loader& CudaEngine::loader() { no_cuda("copy to a CUDA device"); }
const EngineOptions& CudaEngine::options() const { no_cuda("copy to a CUDA device"); }

}  // namespace gpufeed::device
