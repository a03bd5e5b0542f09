#pragma once
// Automatic mixed precision: an autocast scope (torch.autocast) and a gradient scaler with
// torch.amp.GradScaler's semantics, which LibTorch does not ship.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <vector>

namespace gpufeed::harness {

/// torch.autocast(device_type, dtype, enabled) as an RAII scope: ops on `device_type` that
/// autocast lists run in `dtype` (kBFloat16 or kHalf) inside it. Scopes nest; the previous
/// enabled flag and dtype come back when a scope ends, and the outermost scope clears the cast
/// cache (autocast caches casts of leaf tensors thread-locally, as Python's autocast does on exit;
/// without this the cache would keep stale fp16/bf16 copies of the weights alive across steps).
/// Autocast state is thread-local: open the scope on the thread that runs the forward.
/// Throws std::invalid_argument for an unsupported device type (CUDA and CPU are supported) or
/// dtype (on CUDA, kHalf and kBFloat16; on the CPU, kBFloat16 and kHalf).
class AutocastGuard {
 public:
  AutocastGuard(c10::DeviceType device_type, c10::ScalarType dtype, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_type_;
  bool prev_enabled_;
  c10::ScalarType prev_dtype_;
};

/// GradScaler's parameters; the defaults are torch.amp.GradScaler's.
struct GradScalerOptions {
  double init_scale = 65536.0;     ///< 2**16
  double growth_factor = 2.0;      ///< scale *= this after growth_interval finite steps in a row
  double backoff_factor = 0.5;     ///< scale *= this after a step with inf/NaN gradients
  int64_t growth_interval = 2000;  ///< consecutive finite steps before growing
  bool enabled = true;  ///< disabled: scale() and unscale_() are identities, step() steps
};

/// Dynamic loss scaling for float16 training, following torch.amp.GradScaler:
///   scaler.scale(loss).backward();     // every micro-batch
///   scaler.unscale_(params);           // optional, e.g. before clipping; at most once per step
///   if (scaler.step_ok(params)) optimizer.step();   // unscales if not yet done; false = skip
///   scaler.update();                   // backoff on inf/NaN, else grow every growth_interval
/// The scale and the growth tracker live in float32 / int32 tensors on the device, updated with
/// at::_amp_foreach_non_finite_check_and_unscale_ and at::_amp_update_scale_ (the kernels Python's
/// GradScaler calls), so results match Python's step for step. With data parallelism, call it
/// after the gradients are all-reduced: an inf on any rank then reaches every rank, and all ranks
/// skip the same steps.
class GradScaler {
 public:
  /// `device`: where the gradients live (CUDA or CPU).
  GradScaler(c10::Device device, GradScalerOptions options = {});

  /// loss * scale (a new tensor; `loss` unchanged). Identity when disabled.
  at::Tensor scale(const at::Tensor& loss);

  /// Divides the defined gradients of `params` by the scale in place and records whether any is
  /// inf or NaN. Throws std::logic_error when called twice without update() in between.
  void unscale_(const std::vector<at::Tensor>& params);

  /// Unscales (if unscale_ was not called this step) and returns whether the gradients are all
  /// finite, i.e. whether the caller should run optimizer.step(). Synchronises with the device
  /// (one scalar read), as Python's GradScaler.step does.
  bool step_ok(const std::vector<at::Tensor>& params);

  /// Updates the scale from this step's inf/NaN check (backoff, or growth after growth_interval
  /// finite steps) and resets the per-step state. Call once per optimizer step, after step_ok.
  void update();

  /// The current scale (a device read).
  double get_scale() const;
  /// Consecutive finite steps since the last growth or backoff (a device read).
  int64_t growth_tracker() const;
  /// Restores the scale and the growth tracker (checkpoint resume).
  void set_state(double scale, int64_t growth_tracker);
  /// The options in force.
  const GradScalerOptions& options() const { return options_; }
  /// Whether scaling is on.
  bool enabled() const { return options_.enabled; }

 private:
  c10::Device device_;
  GradScalerOptions options_;
  at::Tensor scale_;           // [1] float32
  at::Tensor growth_tracker_;  // [1] int32
  at::Tensor found_inf_;       // [1] float32, this step
  bool unscaled_ = false;
};

}  // namespace gpufeed::harness
