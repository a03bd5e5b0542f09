#include "gpufeed/harness/activation_checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>
#include <torch/autograd.h>
#include <torch/custom_class.h>

#include <utility>
#include <vector>

#include "gpufeed/harness/amp.h"

namespace gpufeed::harness {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What backward needs to run the forward again: the module, the function, and the autocast
// state of the first forward (autocast is thread-local, and backward runs outside the scope).
struct Recompute : torch::CustomClassHolder {
  torch::nn::Module* module = nullptr;
  std::function<at::Tensor(const at::Tensor&)> fn;
  bool cpu_autocast = false, cuda_autocast = false;
  c10::ScalarType cpu_dtype = c10::kBFloat16, cuda_dtype = c10::kHalf;
};

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  // Runs with gradients disabled (Function::apply): fn's activations are not kept.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList /*params*/,
                            const c10::intrusive_ptr<Recompute>& r) {
    ctx->save_for_backward({x});
    ctx->saved_data["recompute"] = c10::IValue::make_capsule(r);
    return r->fn(x);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto r = c10::static_intrusive_pointer_cast<Recompute>(ctx->saved_data["recompute"].toCapsule());
    const at::Tensor saved_x = ctx->get_saved_variables()[0];
    const bool x_needs_grad = ctx->needs_input_grad(0);
    const at::Tensor x = saved_x.detach().requires_grad_(x_needs_grad);
    std::vector<at::Tensor> params = r->module->parameters(/*recurse=*/true);
    std::vector<at::Tensor> buffers = r->module->buffers(/*recurse=*/true);
    std::vector<at::Tensor> kept;
    kept.reserve(buffers.size());
    for (const at::Tensor& b : buffers) kept.push_back(b.detach().clone());
    at::Tensor out;
    {
      const at::AutoGradMode grad(true);
      const AutocastGuard cpu(c10::kCPU, r->cpu_dtype, r->cpu_autocast);
      const AutocastGuard cuda(c10::kCUDA, r->cuda_dtype, r->cuda_autocast);
      out = r->fn(x);
    }
    // Gradients with respect to x and the parameters that need one, without touching .grad.
    std::vector<at::Tensor> inputs;
    std::vector<size_t> slot;  // position in the returned list
    if (x_needs_grad) {
      inputs.push_back(x);
      slot.push_back(0);
    }
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].requires_grad() && ctx->needs_input_grad(i + 1)) {
        inputs.push_back(params[i]);
        slot.push_back(i + 1);
      }
    }
    variable_list result(params.size() + 2);  // x, every parameter, the Recompute
    if (!inputs.empty() && out.requires_grad()) {
      const variable_list grads = torch::autograd::grad({out}, inputs, {grad_outputs[0]}, /*retain_graph=*/false,
                                                        /*create_graph=*/false, /*allow_unused=*/true);
      for (size_t k = 0; k < grads.size(); ++k) result[slot[k]] = grads[k];
    }
    // The buffers back as the first forward left them, after the recomputed graph is done with
    // them (BatchNorm's backward node saves running_mean/var: restoring earlier would be an
    // in-place change autograd refuses).
    out.reset();
    const at::NoGradGuard no_grad;
    for (size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(kept[i]);
    return result;
  }
};

}  // namespace

at::Tensor checkpoint_module(torch::nn::Module& module, std::function<at::Tensor(const at::Tensor&)> fn,
                             const at::Tensor& x) {
  const std::vector<at::Tensor> params = module.parameters(/*recurse=*/true);
  bool any = x.requires_grad();
  for (const at::Tensor& p : params) any = any || p.requires_grad();
  if (!at::GradMode::is_enabled() || !any) return fn(x);
  auto r = c10::make_intrusive<Recompute>();
  r->module = &module;
  r->fn = std::move(fn);
  r->cpu_autocast = at::autocast::is_autocast_enabled(c10::kCPU);
  r->cpu_dtype = at::autocast::get_autocast_dtype(c10::kCPU);
  r->cuda_autocast = at::autocast::is_autocast_enabled(c10::kCUDA);
  r->cuda_dtype = at::autocast::get_autocast_dtype(c10::kCUDA);
  return CheckpointFunction::apply(x, at::TensorList(params), r);
}

}  // namespace gpufeed::harness
