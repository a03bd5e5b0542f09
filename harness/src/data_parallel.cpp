#include "gpufeed/harness/data_parallel.h"

#include <ATen/ThreadLocalState.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/DeviceGuard.h>

#ifdef GPUFEED_WITH_CUDA
// replicate_grad_edges, Scatter and Gather; the header pulls in CUDA stream headers.
#include <torch/nn/parallel/data_parallel.h>
#endif

#include <exception>
#include <stdexcept>
#include <thread>

namespace gpufeed::harness {

#ifdef GPUFEED_WITH_CUDA

DataParallel::DataParallel(std::shared_ptr<torch::nn::Module> module,
                           const std::function<std::shared_ptr<torch::nn::Module>()>& make_replica,
                           std::vector<c10::Device> devices, Forward forward)
    : module_(std::move(module)), devices_(std::move(devices)), forward_(std::move(forward)) {
  if (devices_.empty()) throw std::invalid_argument("DataParallel: no devices");
  for (const auto& p : module_->parameters()) {
    if (p.device() != devices_[0]) {
      throw std::invalid_argument("DataParallel: the module must be on " + devices_[0].str() +
                                  ", a parameter is on " + p.device().str());
    }
  }
  for (size_t i = 1; i < devices_.size(); ++i) {
    auto r = make_replica();
    r->to(devices_[i]);
    replicas_.push_back(std::move(r));
  }
}

at::Tensor DataParallel::forward(const at::Tensor& input) {
  if (replicas_.empty()) return forward_(*module_, input.to(devices_[0], /*non_blocking=*/true));
  const bool cuda = devices_[0].is_cuda();
  // Scatter: torch's chunk sizes (ceil(N / k)); small batches use fewer devices.
  std::vector<at::Tensor> chunks;
  if (cuda) {
    torch::autograd::Scatter scatter(devices_, std::nullopt, /*dim=*/0);
    chunks = scatter.apply({input});
  } else {
    for (auto& c : input.chunk(static_cast<int64_t>(devices_.size()), 0)) chunks.push_back(c);
  }
  const size_t used = chunks.size();
  std::vector<std::shared_ptr<torch::nn::Module>> replicas(
      replicas_.begin(), replicas_.begin() + static_cast<long>(used - 1));
  // Replicas take the module's current values, then their parameters' gradients are routed
  // into the module's (ReduceAdd), as torch::nn::parallel::replicate does for its clones.
  {
    at::NoGradGuard no_grad;
    const auto params = module_->named_parameters(true);
    const auto buffers = module_->named_buffers(true);
    for (auto& r : replicas) {
      auto rp = r->named_parameters(true);
      auto rb = r->named_buffers(true);
      for (const auto& p : params) rp[p.key()].copy_(p.value(), /*non_blocking=*/true);
      for (const auto& b : buffers) rb[b.key()].copy_(b.value(), /*non_blocking=*/true);
    }
  }
  // Same train/eval state, module by module (e.g. BatchNorm frozen in eval mode while training).
  {
    const auto mods = module_->modules(/*include_self=*/true);
    for (auto& r : replicas) {
      const auto rmods = r->modules(/*include_self=*/true);
      for (size_t k = 0; k < mods.size() && k < rmods.size(); ++k)
        rmods[k]->train(mods[k]->is_training());
    }
  }
  std::vector<c10::Device> replica_devices(devices_.begin() + 1,
                                           devices_.begin() + static_cast<long>(used));
  torch::nn::replicate_grad_edges(module_, replicas, replica_devices);

  // Parallel apply, each worker with the caller's thread-local state (grad mode, autocast).
  std::vector<at::Tensor> outputs(used);
  std::vector<std::exception_ptr> errors(used);
  const at::ThreadLocalState tls;
  auto run = [&](size_t i) {
    try {
      at::ThreadLocalStateGuard guard(tls);
      c10::DeviceGuard device_guard(devices_[i]);
      torch::nn::Module& m = i == 0 ? *module_ : *replicas[i - 1];
      outputs[i] = forward_(m, chunks[i]);
    } catch (...) {
      errors[i] = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  for (size_t i = 1; i < used; ++i) threads.emplace_back(run, i);
  run(0);
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  if (cuda)
    return torch::autograd::Gather(devices_[0], /*dim=*/0).apply(std::move(outputs)).front();
  return at::cat(outputs, 0);
}

#else

DataParallel::DataParallel(std::shared_ptr<torch::nn::Module>,
                           const std::function<std::shared_ptr<torch::nn::Module>()>&,
                           std::vector<c10::Device>, Forward) {
  throw std::runtime_error("DataParallel needs gpufeed built with CUDA (GPUFEED_WITH_CUDA)");
}

at::Tensor DataParallel::forward(const at::Tensor&) {
  throw std::runtime_error("DataParallel needs gpufeed built with CUDA (GPUFEED_WITH_CUDA)");
}

#endif

}  // namespace gpufeed::harness
