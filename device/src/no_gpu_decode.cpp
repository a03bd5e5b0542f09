// GpuDecoder in a build without the GPU decode path (no CUDA toolkit, or nvImageCodec's headers not
// found at configure time): constructing one throws, saying why.
#include <stdexcept>

#include "gpufeed/device/gpu_decode.h"

namespace gpufeed::device {

struct GpuDecoder::Impl {
  GpuDecoderOptions options;
};

GpuDecoder::GpuDecoder(GpuDecoderOptions) {
  throw std::runtime_error(
      "this gpufeed build has no GPU decode path: it was built without the CUDA toolkit or without "
      "nvImageCodec's headers (pip install " + std::string(kNvImageCodecPackage) + " before building)");
}
GpuDecoder::~GpuDecoder() = default;
std::vector<GpuDecodeResult> GpuDecoder::decode(std::span<const GpuDecodeItem>, std::span<uint8_t* const>, StreamHandle) {
  throw std::logic_error("unreachable");
}
const GpuDecoderOptions& GpuDecoder::options() const { return impl_->options; }
GpuDecodeStats GpuDecoder::stats() const { return {}; }
bool built_with_gpu_decode() { return false; }

}  // namespace gpufeed::device
