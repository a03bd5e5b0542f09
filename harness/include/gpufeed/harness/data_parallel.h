#pragma once
// Single-process data parallelism over several devices: torch.nn.DataParallel's semantics.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <vector>

namespace gpufeed::harness {

/// torch.nn.DataParallel for one module. Each forward splits the batch along dim 0 into chunks
/// of ceil(N / devices) (torch's scatter; fewer devices are used when N is small), runs chunk 0
/// on the module itself (on devices[0]) and chunk i on replica i (on devices[i]) in parallel
/// threads, and gathers the outputs, in order, on devices[0]. As in torch:
///  - the replicas receive the module's current parameters and buffers before every forward;
///  - gradients flow back into the module's parameters, summed over devices (LibTorch's
///    torch::nn::replicate_grad_edges and its ReduceAdd node), so the optimizer sees the
///    gradient of the whole batch;
///  - BatchNorm statistics are per chunk, and only devices[0]'s updates of the running
///    statistics are kept (they are the module's own).
/// Replicas are built once (make_replica) and persist, instead of LibTorch's replicate(), which
/// clones -- re-creating and re-initialising -- every module at every step. The worker threads
/// run with the caller's thread-local state (grad mode, autocast), which at::parallel_for would
/// not carry. On CUDA devices the input chunks are scattered and the outputs gathered with
/// LibTorch's autograd Scatter / Gather; on the CPU (for tests) with chunk and cat.
class DataParallel {
 public:
  /// Runs a module (the one given or a replica) on an input chunk.
  using Forward = std::function<at::Tensor(torch::nn::Module&, const at::Tensor&)>;

  /// `module` must already be on devices[0]. `make_replica` builds a module with the same
  /// structure (its values do not matter); it is called once per extra device and the result is
  /// moved there. Throws std::invalid_argument for an empty device list or a module not on
  /// devices[0].
  DataParallel(std::shared_ptr<torch::nn::Module> module,
               const std::function<std::shared_ptr<torch::nn::Module>()>& make_replica,
               std::vector<c10::Device> devices, Forward forward);

  /// [N, ...] on any device -> the module's output for the whole batch, on devices[0].
  /// Rethrows the first exception of any device.
  at::Tensor forward(const at::Tensor& input);

  /// The devices, module's first.
  const std::vector<c10::Device>& devices() const { return devices_; }

 private:
  std::shared_ptr<torch::nn::Module> module_;
  std::vector<std::shared_ptr<torch::nn::Module>> replicas_;  // devices_[1..]
  std::vector<c10::Device> devices_;
  Forward forward_;
};

}  // namespace gpufeed::harness
