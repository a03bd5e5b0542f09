#pragma once
// Activation checkpointing for one module (torch.utils.checkpoint.checkpoint's idea; LibTorch's C++
// API has none, so this is an autograd Function of its own: docs/DESIGN-NOTES.md).
//
// checkpoint_module(m, fn, x) returns fn(x) computed without keeping any of fn's intermediate
// activations: only x is saved. In backward, fn(x) is computed again with gradients enabled, under
// the autocast state (enabled flag and dtype, CPU and CUDA) of the first forward, and the incoming
// gradient is backpropagated through it to x and to m's parameters. Parameter gradients leave the
// checkpoint as ordinary outputs of one autograd node (the recomputation's own graph never touches
// .grad), so each parameter's AccumulateGrad -- and its post-accumulate hooks, such as
// DistributedDataParallel's bucket hooks -- runs exactly once per backward, as without
// checkpointing.
//
// Buffers: the recomputation sees m's buffers as the first forward left them, and puts them back
// afterwards. A BatchNorm in training mode therefore normalises the recomputation with the batch
// statistics of the same input (the same values as the first pass), and its running statistics
// and num_batches_tracked are updated once, by the first forward (torch.utils.checkpoint instead
// updates them twice: its documented caveat). The restore copies every buffer of m before and
// after each recomputation (for a ResNet stage, 2 x C floats per BatchNorm: small).
//
// fn must be deterministic given x, m's parameters and buffers (no dropout or other random draws:
// the RNG state is not replayed), must not modify x in place, and must compute the same collectives
// in the same order on every rank if it runs any (SyncBatchNorm: the recomputation all-reduces
// again, on every rank, in the same backward order).

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <functional>

namespace gpufeed::harness {

/// fn(x) with activation checkpointing over `module` (the module fn runs: its parameters get
/// gradients, its buffers are saved and restored around the recomputation). When gradients are
/// disabled (GradMode off) or neither x nor any parameter of `module` requires a gradient, this is
/// fn(x). The output is fn's [any shape] tensor, detached from fn's graph and attached to one
/// node whose backward recomputes fn. Throws what fn throws.
at::Tensor checkpoint_module(torch::nn::Module& module, std::function<at::Tensor(const at::Tensor&)> fn,
                             const at::Tensor& x);

}  // namespace gpufeed::harness
