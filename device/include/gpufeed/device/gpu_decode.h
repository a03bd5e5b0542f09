#pragma once
// JPEG decode on the GPU through nvImageCodec's C API (libnvimgcodec.so.0 and its nvJPEG
// extension: the hardware JPEG engine where the GPU has one, CUDA decode elsewhere), loaded at run
// time. Each sample is decoded only inside its region of interest (the RandomResizedCrop box, or
// the Resize+CenterCrop source rectangle widened by the filter's reach), then resized and mirrored
// by a CUDA kernel into its row of a uint8 [N, S, S, 3] batch on the device, which the engine's
// conversion kernel (normalize.h) turns into the consumer's tensor.
//
// The plan per sample (box, flip, output size, filter) is the CPU path's (loader::plan_for), so
// the GPU path crops the same pixels; its values differ slightly (nvJPEG's IDCT and upsampling,
// and a resize computed in float in one 2D pass where PIL rounds after each 1D pass).
// docs/PERFORMANCE.md states the measured differences.
//
// Where the GPU cannot decode a sample (nvImageCodec reports it: an unsupported JPEG variant, a
// damaged stream), decode() says so per sample; the caller decodes it on the CPU (the engine does,
// under the loader's error policy).
//
// GpuDecoder::kCpuOnly runs the same calls on nvImageCodec's CPU backend (its libjpeg-turbo
// extension) into host memory, and the resize on the host: the plumbing (batching, regions,
// statuses, fallback) is tested without a GPU that way.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gpufeed/device/cuda.h"
#include "gpufeed/transforms/transform.h"

namespace gpufeed::device {

class DeviceAllocator;

/// The pip package that provides libnvimgcodec.so.0 with its nvJPEG extension; named in errors.
inline constexpr const char* kNvImageCodecPackage = "nvidia-nvimgcodec-cu13[nvjpeg]";

/// One sample to decode: the whole encoded file and its plan.
struct GpuDecodeItem {
  const uint8_t* data = nullptr;  ///< the encoded file (JPEG), host memory, valid until decode() returns
  size_t size = 0;                ///< bytes
  /// The source rectangle to decode, source pixels (as stored; EXIF orientation not applied):
  /// gpu_decode_region(plan, width, height).
  decode::CropRect roi;
  transforms::BoxF region;  ///< the source region mapped onto the whole output, source pixels
  bool flip = false;        ///< mirror left-right after resizing
  int output_size = 0;      ///< S: the output row is [S, S, 3] uint8
  transforms::ResizeFilter filter = transforms::ResizeFilter::kBilinear;
  std::string source;  ///< the file's path or URL, for messages
};

/// The source rectangle the GPU path decodes for `plan` on a width x height image: plan.box for
/// train (torchvision crops, then resizes), plan.box widened by the filter's reach
/// (ceil(support * max(region / output, 1)) + 1 pixels per side) and clamped to the image for eval
/// (torchvision resizes the whole image, then crops). Pure function.
decode::CropRect gpu_decode_region(const transforms::SamplePlan& plan, int width, int height);

/// What happened to one sample of a decode() call.
struct GpuDecodeResult {
  bool ok = false;
  std::string reason;  ///< why not, when !ok: nvImageCodec's status in words
};

struct GpuDecoderOptions {
  /// CUDA device index, or kCpuOnly for nvImageCodec's CPU backend (host memory throughout).
  int device = 0;
  /// Threads nvImageCodec's own executor may use (parsing, and Huffman decoding where its hybrid
  /// backend runs). Kept small: the loader's workers own the CPUs.
  int max_cpu_threads = 2;
  /// Where device memory for the decoded regions comes from; null: stream_ordered_allocator(device).
  std::shared_ptr<DeviceAllocator> allocator;
  /// Decode only each sample's region (nvImageCodec's code stream view). Where nvImageCodec
  /// refuses a region for a sample that is not damaged, the sample is decoded whole and cropped by
  /// the resize, and so is every later one (logged once). false: always whole images.
  bool region_decode = true;
};

/// Totals over a GpuDecoder's life.
struct GpuDecodeStats {
  int64_t calls = 0;
  int64_t samples = 0;        ///< samples decoded and resized by this decoder
  int64_t failed = 0;         ///< samples it could not decode (left to the caller's CPU fallback)
  int64_t encoded_bytes = 0;  ///< bytes of the files it decoded
  /// Samples decoded whole (then cropped by the resize): region decode off, or refused by
  /// nvImageCodec for them.
  int64_t whole_images = 0;
};

class GpuDecoder {
 public:
  static constexpr int kCpuOnly = -99999;  ///< nvImageCodec's NVIMGCODEC_DEVICE_CPU_ONLY

  /// Loads nvImageCodec (see nvimgcodec_library()) and creates its instance and decoder. Throws
  /// std::runtime_error naming kNvImageCodecPackage when the library is absent or fails to
  /// start, and when this build has no GPU decode path (CUDA toolkit or nvImageCodec's headers
  /// missing at build time).
  explicit GpuDecoder(GpuDecoderOptions options);
  ~GpuDecoder();
  GpuDecoder(const GpuDecoder&) = delete;
  GpuDecoder& operator=(const GpuDecoder&) = delete;

  /// Decodes `items` as one nvImageCodec batch and writes sample i's [S, S, 3] uint8 row to
  /// out[i] (device memory of options.device; host memory under kCpuOnly). The rows are written
  /// by work enqueued on `stream` (ignored under kCpuOnly, where they are written before
  /// decode() returns). Returns one result per item; a failed item's row is left as it was.
  /// Throws std::runtime_error for a failure of the whole call (a CUDA error, an allocation).
  std::vector<GpuDecodeResult> decode(std::span<const GpuDecodeItem> items, std::span<uint8_t* const> out,
                                      StreamHandle stream);

  const GpuDecoderOptions& options() const;
  GpuDecodeStats stats() const;

 private:
  struct Impl;
  struct Pass;
  Pass run_pass(std::span<const GpuDecodeItem> items, std::span<uint8_t* const> out, const std::vector<size_t>& which,
                bool regions, StreamHandle stream, std::vector<GpuDecodeResult>& results);
  std::unique_ptr<Impl> impl_;
};

/// The nvImageCodec library GpuDecoder loads: $GPUFEED_NVIMGCODEC_LIBRARY when set, else
/// libnvimgcodec.so.0 by the dynamic loader's search (LD_LIBRARY_PATH, the run path). The Python
/// package sets the variable to the nvidia-nvimgcodec wheel's copy when it is installed.
std::string nvimgcodec_library();

/// True when this build has the GPU decode path (the CUDA toolkit and nvImageCodec's headers were
/// found at build time), whatever the machine has.
bool built_with_gpu_decode();

}  // namespace gpufeed::device
