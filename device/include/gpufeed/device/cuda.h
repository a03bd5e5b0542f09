#pragma once
// The CUDA runtime as the rest of gpufeed needs it, without torch and without CUDA's headers in
// the interface: device selection, page-locked host memory for batch slots, and stream marks
// (timing events) for profilers. A build without the CUDA toolkit keeps this API; every call that
// needs a device then throws std::runtime_error saying the build has no CUDA path.

#include <memory>
#include <string>

#include "gpufeed/loader/host_allocator.h"

namespace gpufeed::device {

/// A CUDA stream (a cudaStream_t), opaque here. nullptr is the legacy default stream, which is
/// also what torch.cuda.default_stream().cuda_stream and c10's default stream are (0).
using StreamHandle = void*;

/// True when this build has the CUDA path and the driver shows at least one device
/// (CUDA_VISIBLE_DEVICES applies). Never throws.
bool cuda_available();

/// True when this build was compiled with the CUDA path (whatever the machine has).
bool built_with_cuda();

/// A device named as torch names one: "cpu" -> -1; "cuda" -> the calling thread's current CUDA
/// device (cudaGetDevice, 0 unless changed); "cuda:N" -> N. Throws std::invalid_argument for
/// anything else ("cuda:x", "mps"), naming the string.
int parse_device(const std::string& name);

/// Makes `device` the calling thread's current CUDA device (cudaSetDevice). Throws
/// std::runtime_error naming the device and CUDA's reason.
void set_device(int device);

/// The device's PCI bus id as NVML spells it ("00000000:3b:00.0"). Throws std::runtime_error.
std::string pci_bus_id(int device);

/// Page-locked host memory (cudaHostAlloc, portable), so copies from slots are asynchronous.
/// allocate() throws std::runtime_error with CUDA's reason.
std::shared_ptr<loader::HostAllocator> pinned_host_allocator();

/// A point on a CUDA stream's timeline (a timing-enabled CUDA event): the GPU clock between two
/// marks measures the work the stream did between them.
class StreamMark {
 public:
  virtual ~StreamMark() = default;
  /// True once the stream has passed the mark. Never blocks.
  virtual bool reached() const = 0;
  /// Milliseconds on the GPU clock from `earlier` to this mark (negative when this one came
  /// first). Blocks until both are reached. Both marks must be on the same device; throws
  /// std::invalid_argument for a mark from another implementation.
  virtual double ms_since(const StreamMark& earlier) const = 0;
};

/// Records a mark on `stream` of `device` (cudaEventRecord of a timing event). Throws
/// std::runtime_error in a build without the CUDA path or on a CUDA error.
std::shared_ptr<StreamMark> record_stream_mark(int device, StreamHandle stream);

}  // namespace gpufeed::device
