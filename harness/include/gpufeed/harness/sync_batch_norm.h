#pragma once
// SyncBatchNorm for the C++ ResNet: torch.nn.SyncBatchNorm's semantics (PyTorch 2.11,
// torch/nn/modules/batchnorm.py and torch/nn/modules/_functions.py) over a harness ProcessGroup.
// LibTorch's C++ API has no SyncBatchNorm, so this is an autograd Function of its own
// (docs/DESIGN-NOTES.md).
//
// In training mode with a group of more than one rank, a layer normalises its input [N_r, C, H, W]
// on rank r with the statistics of the whole group's batch (N = sum of N_r samples, all ranks'
// N_r x H x W values per channel), so its output, input gradient and running statistics equal
// those of one BatchNorm2d on the concatenation of every rank's batch (torch's definition):
//  - forward: two all-reduces per layer, [per-channel sum, value count] and then the per-channel
//    sum of squared deviations from the global mean (an exact two-pass variance: no E[x^2] -
//    E[x]^2 cancellation); out = (x - mean) / sqrt(var + eps) * weight + bias, var biased;
//  - running statistics: running_mean = (1 - m) running_mean + m mean, running_var = (1 - m)
//    running_var + m var * n / (n - 1) with n the group's value count per channel (unbiased, as
//    torch updates them), num_batches_tracked += 1; m = momentum, or 1 / num_batches_tracked
//    when momentum is unset (cumulative average), as BatchNorm2d does;
//  - backward: one all-reduce of the per-channel sums of grad_out and grad_out * (x - mean);
//    grad_in = (grad_out - mean_dy - (x - mean) / (var + eps) * mean_dy_xmu) * weight /
//    sqrt(var + eps) with mean_dy, mean_dy_xmu those sums over n (torch's
//    batch_norm_backward_elemt). The weight and bias gradients are this rank's own (sum over
//    its samples of grad_out * xhat and of grad_out), as in torch: DistributedDataParallel's
//    gradient average then makes them the whole batch's.
// Statistics and the normalisation are computed in float32 whatever the input's dtype (fp16/bf16
// under autocast); the output and input gradient come back in the input's dtype and memory format.
// Eval mode, and a group of one rank, run the layer's own BatchNorm2d forward (no collective).
// Every rank must run the same layers in the same order (each training forward and backward is a
// collective), as with torch.

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/batchnorm.h>

#include <cstdint>
#include <memory>

#include "gpufeed/harness/distributed.h"
#include "gpufeed/harness/resnet.h"

namespace gpufeed::harness {

/// One SyncBatchNorm forward of `bn` (its weight, bias, eps, momentum and running statistics) on
/// this rank's part x [N_r, C, H, W] (any floating dtype; on group.device()), synchronised over
/// `group` as described above; differentiable with respect to x, bn.weight and bn.bias. N_r may
/// differ between ranks. Eval mode or
/// group.size() == 1: bn.forward(x). Reads the group's value count on the host once per training
/// forward (the check below; torch's SyncBatchNorm synchronises there too).
/// Throws c10::Error when x is not 4-D with bn's channel count, or the group's whole batch has
/// one value per channel or fewer in training mode (as BatchNorm2d: "Expected more than 1 value
/// per channel when training"); std::runtime_error when a collective fails (naming the rank).
at::Tensor sync_batch_norm(torch::nn::BatchNorm2dImpl& bn, const at::Tensor& x, ProcessGroup& group);

/// torch.nn.SyncBatchNorm.convert_sync_batchnorm(model, group) for the C++ ResNet: every
/// BatchNorm2d of `model` computes its training forward with sync_batch_norm over `group` (which
/// the model keeps alive). The modules, parameters, buffers and state_dict keys stay those of
/// BatchNorm2d, so checkpoints move to and from Python's SyncBatchNorm or BatchNorm2d models
/// unchanged. A null `group` (a single process) leaves the layers' own BatchNorm2d forward,
/// which is what SyncBatchNorm computes on a world of one. Returns the number of BatchNorm2d
/// layers (20 for resnet18, 53 for resnet50).
int64_t convert_sync_batchnorm(ResNetImpl& model, std::shared_ptr<ProcessGroup> group);

}  // namespace gpufeed::harness
