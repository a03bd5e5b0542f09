#include "gpufeed/harness/amp.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_amp_update_scale.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <stdexcept>

namespace gpufeed::harness {

AutocastGuard::AutocastGuard(c10::DeviceType device_type, c10::ScalarType dtype, bool enabled)
    : device_type_(device_type) {
  if (device_type != c10::kCUDA && device_type != c10::kCPU) {
    throw std::invalid_argument("AutocastGuard: autocast supports CUDA and CPU devices only");
  }
  if (dtype != c10::kBFloat16 && dtype != c10::kHalf) {
    throw std::invalid_argument("AutocastGuard: dtype must be bfloat16 or float16");
  }
  prev_enabled_ = at::autocast::is_autocast_enabled(device_type);
  prev_dtype_ = at::autocast::get_autocast_dtype(device_type);
  at::autocast::set_autocast_enabled(device_type, enabled);
  at::autocast::set_autocast_dtype(device_type, dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  // Python's autocast.__exit__: the outermost scope drops the thread's cast cache.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_type_, prev_enabled_);
  at::autocast::set_autocast_dtype(device_type_, prev_dtype_);
}

GradScaler::GradScaler(c10::Device device, GradScalerOptions options)
    : device_(device), options_(options) {
  if (options_.growth_factor <= 1.0)
    throw std::invalid_argument("GradScaler: growth_factor must be > 1");
  if (options_.backoff_factor >= 1.0 || options_.backoff_factor <= 0) {
    throw std::invalid_argument("GradScaler: backoff_factor must be in (0, 1)");
  }
  if (options_.growth_interval < 1)
    throw std::invalid_argument("GradScaler: growth_interval must be >= 1");
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device_);
  scale_ = at::full({1}, options_.init_scale, f32);
  growth_tracker_ = at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(device_));
  found_inf_ = at::zeros({1}, f32);
}

at::Tensor GradScaler::scale(const at::Tensor& loss) {
  if (!options_.enabled) return loss;
  return loss * scale_.to(loss.device(), /*non_blocking=*/true);
}

void GradScaler::unscale_(const std::vector<at::Tensor>& params) {
  if (!options_.enabled) return;
  if (unscaled_)
    throw std::logic_error("GradScaler::unscale_ called twice in one step (call update())");
  at::NoGradGuard no_grad;
  // Python: inv_scale = scale.double().reciprocal().float()
  const at::Tensor inv_scale = scale_.to(at::kDouble).reciprocal().to(at::kFloat);
  // One kernel launch per (device, dtype), as Python's GradScaler groups them.
  std::vector<std::pair<std::pair<c10::Device, c10::ScalarType>, std::vector<at::Tensor>>> groups;
  for (const auto& p : params) {
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    const std::pair<c10::Device, c10::ScalarType> key{g.device(), g.scalar_type()};
    auto it =
        std::find_if(groups.begin(), groups.end(), [&](const auto& e) { return e.first == key; });
    if (it == groups.end()) it = groups.insert(groups.end(), {key, {}});
    it->second.push_back(g);
  }
  found_inf_.zero_();
  for (auto& [key, grads] : groups) {
    if (key.first == device_) {
      at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf_, inv_scale);
    } else {
      at::Tensor found = at::zeros({1}, found_inf_.options().device(key.first));
      at::_amp_foreach_non_finite_check_and_unscale_(grads, found, inv_scale.to(key.first));
      found_inf_.add_(found.to(device_));
    }
  }
  unscaled_ = true;
}

bool GradScaler::step_ok(const std::vector<at::Tensor>& params) {
  if (!options_.enabled) return true;
  if (!unscaled_) unscale_(params);
  return found_inf_.item<float>() == 0.0f;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  if (!unscaled_)
    throw std::logic_error("GradScaler::update called before step_ok/unscale_ this step");
  at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, options_.growth_factor,
                         options_.backoff_factor, options_.growth_interval);
  unscaled_ = false;
}

double GradScaler::get_scale() const { return options_.enabled ? scale_.item<double>() : 1.0; }

int64_t GradScaler::growth_tracker() const { return growth_tracker_.item<int64_t>(); }

void GradScaler::set_state(double scale, int64_t growth_tracker) {
  scale_.fill_(scale);
  growth_tracker_.fill_(growth_tracker);
  unscaled_ = false;
}

}  // namespace gpufeed::harness
