#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpufeed/decode/decoder.h"
#include "gpufeed/transforms/transform.h"

namespace gpufeed::loader {

/// A sample the skip error policy replaced, and why.
struct SkippedSample {
  int64_t index = -1;          ///< dataset index that failed
  int64_t replaced_by = -1;    ///< dataset index decoded in its place (its own sample of the epoch)
  int64_t position = -1;       ///< place in this rank's epoch order: batch_index * batch_size + k
  std::string path;            ///< the failing file
  /// decode::to_string(DecodeError::kind()): "empty", "truncated", "corrupt", "unsupported",
  /// "too_large" or "io" (missing, unreadable, changed under us); "error" for any other failure.
  std::string kind;
  std::string reason;          ///< DecodeError::reason() (without path and kind); else what()
};

/// A sample the workers read, probed and planned but left for the GPU decoder
/// (LoaderOptions::decode_device gpu or auto): its row of Batch::images is not written; the CUDA
/// engine decodes `bytes` on the GPU into that row of its device copy (gpufeed/device/engine.h),
/// or on the CPU through Loader::decode_deferred_on_cpu where the GPU cannot.
struct DeferredSample {
  int64_t position = 0;            ///< row k of the batch
  int64_t index = -1;              ///< dataset index
  decode::ByteBuffer bytes;        ///< the whole encoded file
  decode::ImageInfo info;          ///< its header (decode::probe)
  transforms::SamplePlan plan;     ///< loader::plan_for's plan, the CPU path's
  std::string source;              ///< path or URL, for messages
  bool pending = false;            ///< internal: set for the batch being assembled
};

/// One view of a multi-crop batch (LoaderOptions::views): [size, height, width, 3] uint8 RGB,
/// NHWC, contiguous, inside the batch's slot.
struct BatchView {
  uint8_t* images = nullptr;
  int64_t height = 0;  ///< pixels
  int64_t width = 0;   ///< pixels
};

/// One batch, as plain data over a slot of the loader's ring: no torch, no copy. The slot goes
/// back to the ring when the last copy of this Batch (or of its `lease`) is destroyed, so hold a
/// Batch exactly as long as its memory is needed (the CUDA prefetcher holds it until its copy's
/// event completed).
struct Batch {
  /// [size, height, width, 3] uint8 RGB, NHWC, contiguous. With views: view 0 (views[0]).
  uint8_t* images = nullptr;
  int64_t* labels = nullptr;   ///< [size] int64 class indices
  int64_t size = 0;            ///< samples in this batch (<= batch_size; the last may be short)
  int64_t height = 0;          ///< pixels
  int64_t width = 0;           ///< pixels
  int64_t epoch = 0;           ///< the epoch this batch belongs to
  int64_t batch_index = 0;     ///< position within the epoch, 0-based, in sampler order
  std::vector<int64_t> indices;          ///< [size] dataset indices, in sampler order
  std::vector<SkippedSample> skipped;    ///< samples the skip policy replaced, by position
  /// Samples left for the GPU decoder (decode_device gpu/auto), by position; owned by the slot,
  /// valid while `lease` is held. Empty under decode_device cpu.
  std::vector<const DeferredSample*> deferred;
  /// LoaderOptions::views: the K views, in order, each [size, S_k, S_k, 3]; empty without views.
  std::vector<BatchView> views;
  std::shared_ptr<const void> epoch_plan;  ///< internal: the epoch this batch came from (skip replacement)
  std::shared_ptr<void> lease;  ///< keeps the slot out of the ring while held

  /// Bytes of `images`: size * height * width * 3 (view 0's only, with views).
  int64_t image_bytes() const { return size * height * width * 3; }
};

}  // namespace gpufeed::loader
