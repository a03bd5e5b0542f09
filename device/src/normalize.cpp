// device::launch_normalize over the kernel's host entry (normalize_kernel.cu).
#include "gpufeed/device/normalize.h"

#include "cuda_check.h"
#include "kernel_launch.h"

namespace gpufeed::device {

void launch_normalize(const uint8_t* src, void* dst, OutputType type, int64_t n, int64_t h, int64_t w,
                      bool channels_last, const NormalizeConstants& c, StreamHandle stream) {
  detail::check(detail::launch_normalize(src, dst, static_cast<detail::OutputType>(type), n, h, w, channels_last,
                                         c.scale, c.shift, static_cast<cudaStream_t>(stream)),
                "normalize kernel launch");
}

}  // namespace gpufeed::device
