#include <ATen/ATen.h>

#include <stdexcept>

#include "gpufeed/prefetch/prefetcher.h"

#ifdef GPUFEED_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

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
  // (x/255 - mean)/std = x * scale - shift, scale = 1/(255 std), shift = mean/std, computed in
  // float32 as a multiply then a subtract (two roundings), on every device alike.
  const device::NormalizeConstants k = device::normalize_constants(n);
#ifdef GPUFEED_WITH_CUDA
  if (nhwc.is_cuda()) {
    // One fused pass (normalize_kernel.cu) on the current stream: reads the uint8 batch once and
    // writes the result once, in the requested dtype and layout.
    TORCH_CHECK(nhwc.is_contiguous() && nhwc.dim() == 4 && nhwc.size(3) == 3,
                "convert_images: expected a contiguous [N, H, W, 3] uint8 tensor");
    const auto type = dtype == at::kFloat      ? device::OutputType::kFloat32
                      : dtype == at::kBFloat16 ? device::OutputType::kBFloat16
                      : dtype == at::kHalf     ? device::OutputType::kFloat16
                                               : throw std::invalid_argument(
                                                     "convert_images: unsupported dtype");
    at::Tensor out = at::empty(nchw.sizes(), at::TensorOptions().dtype(dtype).device(nhwc.device())
                                                 .memory_format(format));
    device::launch_normalize(nhwc.data_ptr<uint8_t>(), out.data_ptr(), type, nhwc.size(0), nhwc.size(1),
                             nhwc.size(2), channels_last, k,
                             c10::cuda::getCurrentCUDAStream(nhwc.device().index()).stream());
    return out;
  }
#endif
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(nhwc.device());
  const at::Tensor scale = at::from_blob(const_cast<float*>(k.scale), {1, 3, 1, 1}, at::kFloat).clone();
  const at::Tensor shift = at::from_blob(const_cast<float*>(k.shift), {1, 3, 1, 1}, at::kFloat).clone();
  at::Tensor out = at::empty(nchw.sizes(), opts.memory_format(format));
  out.copy_(nchw);
  out.mul_(scale).sub_(shift);
  return dtype == at::kFloat ? out : out.to(dtype);
}

}  // namespace gpufeed::prefetch
