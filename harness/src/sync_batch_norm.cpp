#include "gpufeed/harness/sync_batch_norm.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>

#include <utility>
#include <vector>

namespace gpufeed::harness {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

const std::vector<int64_t> kReduceDims{0, 2, 3};

at::Tensor per_channel(const at::Tensor& v) { return v.view({1, -1, 1, 1}); }

// torch.nn.modules._functions.SyncBatchNorm, over ProcessGroup's all-reduce. The group is kept
// alive by whoever calls sync_batch_norm (convert_sync_batchnorm's closure) for at least as long
// as the graph: backward reads it through the saved pointer.
struct SyncBatchNormFunction : torch::autograd::Function<SyncBatchNormFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, torch::nn::BatchNorm2dImpl* bn,
                            ProcessGroup* group) {
    const int64_t c = x.size(1);
    const auto f32 = x.options().dtype(at::kFloat);
    const at::Tensor xf = x.to(at::kFloat);
    // Round 1: per-channel sum and the value count (one count, the same for every channel).
    at::Tensor sum_count = at::empty({c + 1}, f32.memory_format(c10::MemoryFormat::Contiguous));
    sum_count.narrow(0, 0, c).copy_(xf.sum(kReduceDims));
    sum_count.narrow(0, c, 1).fill_(static_cast<double>(x.numel() / std::max<int64_t>(c, 1)));
    {
      std::vector<at::Tensor> t{sum_count};
      group->all_reduce_sum(t);
    }
    const at::Tensor count = sum_count.narrow(0, c, 1);  // [1], the whole batch's
    const at::Tensor mean = sum_count.narrow(0, 0, c) / count;
    // Round 2: per-channel sum of squared deviations from the global mean.
    const at::Tensor xmu = xf - per_channel(mean);
    at::Tensor m2 = (xmu * xmu).sum(kReduceDims).contiguous();
    {
      std::vector<at::Tensor> t{m2};
      group->all_reduce_sum(t);
    }
    const double n_total = count.item<double>();  // one host sync per layer (the error check)
    TORCH_CHECK(n_total > 1, "Expected more than 1 value per channel when training, got input size ",
                x.sizes(), " on this rank and ", n_total, " values per channel over the group");
    const at::Tensor var = m2 / count;  // biased: what normalises
    const at::Tensor invstd = (var + bn->options.eps()).rsqrt();

    if (bn->options.track_running_stats() && bn->running_mean.defined()) {
      double factor = bn->options.momentum().value_or(0.0);
      if (bn->num_batches_tracked.defined()) {
        bn->num_batches_tracked += 1;
        if (!bn->options.momentum()) factor = 1.0 / bn->num_batches_tracked.item<double>();
      }
      const at::Tensor unbiased = m2 / (count - 1);
      bn->running_mean.mul_(1 - factor).add_(mean.to(bn->running_mean.scalar_type()), factor);
      bn->running_var.mul_(1 - factor).add_(unbiased.to(bn->running_var.scalar_type()), factor);
    }

    at::Tensor scale = invstd;
    if (weight.defined()) scale = scale * weight.to(at::kFloat);
    at::Tensor y = xmu * per_channel(scale);
    if (bias.defined()) y = y + per_channel(bias.to(at::kFloat));

    ctx->save_for_backward({x, weight, mean, invstd, count});
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    ctx->saved_data["has_bias"] = bias.defined();
    return y.to(x.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& mean = saved[2];
    const at::Tensor& invstd = saved[3];
    const at::Tensor& count = saved[4];
    auto* group = reinterpret_cast<ProcessGroup*>(ctx->saved_data["group"].toInt());
    const int64_t c = x.size(1);
    const at::Tensor g = grad_outputs[0].to(at::kFloat);
    const at::Tensor xmu = x.to(at::kFloat) - per_channel(mean);
    // This rank's sums (torch's batch_norm_backward_reduce), then the group's.
    at::Tensor sums = at::empty({2 * c}, g.options().memory_format(c10::MemoryFormat::Contiguous));
    sums.narrow(0, 0, c).copy_(g.sum(kReduceDims));
    sums.narrow(0, c, c).copy_((g * xmu).sum(kReduceDims));
    const at::Tensor grad_bias = ctx->saved_data["has_bias"].toBool() ? sums.narrow(0, 0, c).clone() : at::Tensor();
    const at::Tensor grad_weight = weight.defined() ? sums.narrow(0, c, c) * invstd : at::Tensor();
    {
      std::vector<at::Tensor> t{sums};
      group->all_reduce_sum(t);
    }
    const at::Tensor mean_dy = sums.narrow(0, 0, c) / count;
    const at::Tensor mean_dy_xmu = sums.narrow(0, c, c) / count;
    // torch's batch_norm_backward_elemt.
    at::Tensor scale = invstd;
    if (weight.defined()) scale = scale * weight.to(at::kFloat);
    const at::Tensor grad_in = (g - per_channel(mean_dy) - xmu * per_channel(invstd * invstd * mean_dy_xmu)) *
                               per_channel(scale);
    return {grad_in.to(x.scalar_type()),
            grad_weight.defined() ? grad_weight.to(weight.scalar_type()) : at::Tensor(),
            grad_bias, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor sync_batch_norm(torch::nn::BatchNorm2dImpl& bn, const at::Tensor& x, ProcessGroup& group) {
  if (!bn.is_training() || group.size() == 1) return bn.forward(x);
  TORCH_CHECK(x.dim() == 4 && x.size(1) == bn.options.num_features(), "SyncBatchNorm: expected input [N, ",
              bn.options.num_features(), ", H, W], got ", x.sizes());
  return SyncBatchNormFunction::apply(x, bn.weight, bn.bias, &bn, &group);
}

int64_t convert_sync_batchnorm(ResNetImpl& model, std::shared_ptr<ProcessGroup> group) {
  int64_t layers = 0;
  for (const auto& m : model.modules(/*include_self=*/false)) {
    if (m->as<torch::nn::BatchNorm2d>() != nullptr) ++layers;
  }
  if (!group) {
    model.set_batch_norm_forward({});
    return layers;
  }
  model.set_batch_norm_forward([group = std::move(group)](torch::nn::BatchNorm2dImpl& bn, const at::Tensor& x) {
    return sync_batch_norm(bn, x, *group);
  });
  return layers;
}

}  // namespace gpufeed::harness
