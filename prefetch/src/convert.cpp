#include <ATen/ATen.h>

#include "gpufeed/prefetch/prefetcher.h"

namespace gpufeed::prefetch {

std::pair<at::Tensor, at::Tensor> as_tensors(const loader::Batch& b) {
  auto images = at::from_blob(b.images, {b.size, b.height, b.width, 3}, at::kByte);
  auto labels = at::from_blob(b.labels, {b.size}, at::kLong);
  return {images, labels};
}

at::Tensor convert_images(const at::Tensor& nhwc, c10::ScalarType dtype, bool channels_last,
                          const NormalizeOptions& n) {
  // Permuting an NHWC buffer gives an [N, C, H, W] view with channels_last strides for free.
  at::Tensor nchw = nhwc.permute({0, 3, 1, 2});
  const auto format = channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  if (dtype == at::kByte) return nchw.contiguous(format);
  // (x/255 - mean)/std = x * scale - shift, scale = 1/(255 std), shift = mean/std: one cast
  // (which also lays out the result) and one fused multiply-subtract, computed in float32.
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(nhwc.device());
  at::Tensor scale = at::empty({1, 3, 1, 1}, at::kFloat);
  at::Tensor shift = at::empty({1, 3, 1, 1}, at::kFloat);
  for (int c = 0; c < 3; ++c) {
    scale.data_ptr<float>()[c] = 1.0f / (255.0f * n.std[static_cast<size_t>(c)]);
    shift.data_ptr<float>()[c] = n.mean[static_cast<size_t>(c)] / n.std[static_cast<size_t>(c)];
  }
  scale = scale.to(opts, /*non_blocking=*/true);
  shift = shift.to(opts, /*non_blocking=*/true);
  at::Tensor out = at::empty(nchw.sizes(), opts.memory_format(format));
  out.copy_(nchw);
  out.mul_(scale).sub_(shift);
  return dtype == at::kFloat ? out : out.to(dtype);
}

}  // namespace gpufeed::prefetch
