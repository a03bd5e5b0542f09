#pragma once
// The fused conversion of a batch on the device: uint8 [N, H, W, 3] (the loader's slot layout)
// -> [N, 3, H, W] float32 / bfloat16 / float16, (x / 255 - mean) / std per RGB channel, written
// NCHW-contiguous or channels_last in one pass (one read of the batch, one write of the result).
// No torch, no CUDA headers: the stream is a device::StreamHandle.

#include <array>
#include <cstdint>

#include "gpufeed/device/cuda.h"
#include "gpufeed/transforms/transform.h"

namespace gpufeed::device {

/// The element type of a converted batch.
enum class OutputType {
  kUInt8,     ///< no normalisation: the uint8 values, only laid out (NCHW or channels_last)
  kFloat32,
  kBFloat16,  ///< rounded to nearest even from the float32 result
  kFloat16,   ///< rounded to nearest even from the float32 result
};

/// Bytes of one element of `type` (1, 4, 2, 2).
int64_t element_size(OutputType type);

/// Normalisation applied to x / 255: (x / 255 - mean) / std, per RGB channel. Defaults are the
/// ImageNet statistics torchvision's models were trained with (gpufeed/transforms/transform.h).
struct NormalizeOptions {
  std::array<float, 3> mean = transforms::kImageNetMean;
  std::array<float, 3> std = transforms::kImageNetStd;
};

/// The conversion as a multiply then a subtract in float32 (two roundings, no fused multiply-add):
/// out = x * scale[c] - shift[c], scale = 1 / (255 std), shift = mean / std. The CPU path of the
/// LibTorch prefetcher uses the same two constants, so float32 results are bit-identical.
struct NormalizeConstants {
  float scale[3];
  float shift[3];
};
NormalizeConstants normalize_constants(const NormalizeOptions& normalize);

/// Enqueues the conversion on `stream` of the current device: `src` [n, h, w, 3] uint8 and `dst`
/// (n * h * w * 3 elements of `type`) are device pointers. channels_last writes dst as [n, h, w, 3]
/// in memory (the NHWC strides of an [n, 3, h, w] tensor); otherwise [n, 3, h, w]. Throws
/// std::runtime_error with CUDA's reason for a failed launch, or in a build without CUDA.
void launch_normalize(const uint8_t* src, void* dst, OutputType type, int64_t n, int64_t h, int64_t w,
                      bool channels_last, const NormalizeConstants& constants, StreamHandle stream);

}  // namespace gpufeed::device
