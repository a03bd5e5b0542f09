#include "gpufeed/harness/distributed.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>

#include "gpufeed/log_text.h"
#include "process_group_backends.h"

namespace gpufeed::harness {
namespace {

int parse_int(const EnvLookup& env, const std::string& name, int fallback, int min_value) {
  const auto v = env(name);
  if (!v || v->empty()) return fallback;
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v->c_str(), &end, 10);
  if (errno != 0 || end == v->c_str() || (*end != '\0' && *end != '(') || x < min_value ||
      x > 1000000000L) {
    throw std::invalid_argument("environment variable " + name + "='" + *v +
                                "' is not an integer >= " + std::to_string(min_value));
  }
  return static_cast<int>(x);
}

// "gpu[03-04,7],cpu01" -> "gpu03"; "a,b" -> "a"; "host" -> "host".
std::string first_slurm_host(const std::string& list) {
  size_t depth = 0, end = list.size();
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i] == '[')
      ++depth;
    else if (list[i] == ']' && depth > 0)
      --depth;
    else if (list[i] == ',' && depth == 0) {
      end = i;
      break;
    }
  }
  const std::string first = list.substr(0, end);
  const size_t open = first.find('[');
  if (open == std::string::npos) return first;
  const size_t close = first.find(']', open);
  if (close == std::string::npos) return first;
  const std::string ranges = first.substr(open + 1, close - open - 1);
  const size_t stop = ranges.find_first_of("-,");
  return first.substr(0, open) + ranges.substr(0, stop) + first.substr(close + 1);
}

void check_ranks(const DistEnv& e, const std::string& what) {
  if (e.world_size < 1 || e.rank < 0 || e.rank >= e.world_size) {
    throw std::invalid_argument(what + ": rank " + std::to_string(e.rank) + " is not in [0, " +
                                std::to_string(e.world_size) + ")");
  }
  if (e.local_world_size < 1 || e.local_rank < 0 || e.local_rank >= e.local_world_size) {
    throw std::invalid_argument(what + ": local rank " + std::to_string(e.local_rank) +
                                " is not in [0, " + std::to_string(e.local_world_size) + ")");
  }
  if (e.master_port < 1 || e.master_port > 65535) {
    throw std::invalid_argument(what + ": master port " + std::to_string(e.master_port) +
                                " is not in [1, 65535]");
  }
}

/// An exception's message; a c10::Error's without its C++ stack trace (noise to a user).
std::string message_of(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

/// True when `message` (from TCPStore) says the port could not be bound because it is taken.
bool says_address_in_use(const std::string& message) {
  return message.find("EADDRINUSE") != std::string::npos ||
         message.find("ddress already in use") != std::string::npos;
}

std::string rank_tag(int rank, int size) {
  return "rank " + std::to_string(rank) + " of " + std::to_string(size);
}

}  // namespace

std::optional<std::string> process_env(const std::string& name) {
  const char* v = std::getenv(name.c_str());
  if (!v) return std::nullopt;
  return std::string(v);
}

std::optional<DistEnv> detect_dist_env(const EnvLookup& env) {
  DistEnv e;
  if (env("RANK") && env("WORLD_SIZE")) {
    e.source = "torchrun";
    e.rank = parse_int(env, "RANK", 0, 0);
    e.world_size = parse_int(env, "WORLD_SIZE", 1, 1);
    e.local_rank = parse_int(env, "LOCAL_RANK", 0, 0);
    e.local_world_size = parse_int(env, "LOCAL_WORLD_SIZE", std::max(1, e.local_rank + 1), 1);
    if (auto a = env("MASTER_ADDR"); a && !a->empty()) e.master_addr = *a;
    e.master_port = parse_int(env, "MASTER_PORT", 29500, 1);
    e.agent_store = env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
    check_ranks(e, "torchrun environment");
    return e;
  }
  if (env("SLURM_PROCID") && env("SLURM_NTASKS")) {
    e.source = "slurm";
    e.rank = parse_int(env, "SLURM_PROCID", 0, 0);
    e.world_size = parse_int(env, "SLURM_NTASKS", 1, 1);
    e.local_rank = parse_int(env, "SLURM_LOCALID", 0, 0);
    int local = parse_int(env, "SLURM_NTASKS_PER_NODE", 0, 0);
    if (local == 0) local = parse_int(env, "SLURM_TASKS_PER_NODE", 0, 0);  // "4(x2)" -> 4
    e.local_world_size = local > 0 ? local : std::max(1, e.local_rank + 1);
    if (auto a = env("MASTER_ADDR"); a && !a->empty()) {
      e.master_addr = *a;
    } else if (auto l = env("SLURM_STEP_NODELIST"); l && !l->empty()) {
      e.master_addr = first_slurm_host(*l);
    } else if (auto j = env("SLURM_JOB_NODELIST"); j && !j->empty()) {
      e.master_addr = first_slurm_host(*j);
    }
    const int job = parse_int(env, "SLURM_JOB_ID", 0, 0);
    e.master_port = parse_int(env, "MASTER_PORT", 15000 + job % 20000, 1);
    check_ranks(e, "Slurm environment");
    return e;
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------

struct ProcessGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  std::string backend;
  c10::Device device{c10::kCPU};
  int rank = 0, size = 1;
};

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProcessGroup::~ProcessGroup() = default;

std::shared_ptr<ProcessGroup> ProcessGroup::create(const DistEnv& env, const c10::Device& device,
                                                   const ProcessGroupOptions& options) {
  auto m = std::make_unique<Impl>();
  m->rank = env.rank;
  m->size = env.world_size;
  m->device = device;
  std::string backend = options.backend;
  if (backend == "auto") backend = device.is_cuda() ? "nccl" : "gloo";
  if (backend != "nccl" && backend != "gloo") {
    throw std::invalid_argument("ProcessGroup: unknown backend '" + backend +
                                "' (nccl, gloo, auto)");
  }
  if (backend == "nccl" && !device.is_cuda()) {
    throw std::invalid_argument("ProcessGroup: NCCL needs a CUDA device, got " + device.str());
  }
  m->backend = backend;
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  const std::string who = rank_tag(env.rank, env.world_size);
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(env.master_port);
    so.isServer = env.rank == 0 && !env.agent_store;
    so.numWorkers = static_cast<size_t>(env.world_size);
    so.waitWorkers = !env.agent_store;
    so.timeout = options.timeout;
    auto tcp = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
    m->store = c10::make_intrusive<c10d::PrefixStore>(options.store_prefix, tcp);
  } catch (const std::exception& e) {
    const std::string why = message_of(e);
    const bool hosting = env.rank == 0 && !env.agent_store;
    if (hosting && says_address_in_use(why)) {
      const std::string port = std::to_string(env.master_port);
      throw std::runtime_error(
          "ProcessGroup: " + who + " cannot host the TCPStore on port " + port +
          " (MASTER_PORT): the port is already in use, by another run or by the workers of one "
          "that was killed. Use another port (gpufeed launch `master_port` P, or 0 for a free "
          "one on a single node) or stop what holds it (ss -ltnp 'sport = :" + port + "').");
    }
    throw std::runtime_error("ProcessGroup: " + who + " cannot rendezvous through the TCPStore at " +
                             where + (hosting ? " (hosting it)" : "") + ": " + why);
  }
  try {
    c10::intrusive_ptr<c10d::Backend> b;
    c10d::ProcessGroup::BackendType type;
    if (backend == "nccl") {
      c10::impl::getDeviceGuardImpl(c10::kCUDA)->setDevice(device);
      b = internal::make_nccl_backend(m->store, env.rank, env.world_size, options.timeout);
      type = c10d::ProcessGroup::BackendType::NCCL;
    } else {
      b = internal::make_gloo_backend(m->store, env.rank, env.world_size, options.timeout);
      type = c10d::ProcessGroup::BackendType::GLOO;
    }
    m->pg = c10::make_intrusive<c10d::ProcessGroup>(m->store, env.rank, env.world_size);
    m->pg->setBackend(device.type(), type, b);
    m->pg->setDefaultBackend(type);
  } catch (const std::exception& e) {
    throw std::runtime_error("ProcessGroup: " + who + " cannot create the " + backend +
                             " backend (store at " + where + "): " + message_of(e));
  }
  gpufeed::log_text(LogLevel::kInfo, "distributed: " + who + " (local " +
                                         std::to_string(env.local_rank) + ") joined via " +
                                         env.source + " at " + where + ", backend " + backend +
                                         " on " + device.str());
  return std::shared_ptr<ProcessGroup>(new ProcessGroup(std::move(m)));
}

int ProcessGroup::rank() const { return impl_->rank; }
int ProcessGroup::size() const { return impl_->size; }
const std::string& ProcessGroup::backend() const { return impl_->backend; }
const c10::Device& ProcessGroup::device() const { return impl_->device; }

namespace {
class WorkPending : public ProcessGroup::Pending {
 public:
  WorkPending(c10::intrusive_ptr<c10d::Work> work, std::string who)
      : work_(std::move(work)), who_(std::move(who)) {}
  void wait() override {
    try {
      work_->wait();
    } catch (const std::exception& e) {
      throw std::runtime_error(who_ +
                               ": collective failed (another rank may have exited or "
                               "stopped responding): " +
                               e.what());
    }
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::string who_;
};
}  // namespace

std::unique_ptr<ProcessGroup::Pending> ProcessGroup::all_reduce_sum_async(
    std::vector<at::Tensor>& tensors) {
  const std::string who = rank_tag(impl_->rank, impl_->size);
  try {
    return std::make_unique<WorkPending>(impl_->pg->allreduce(tensors), who);
  } catch (const std::exception& e) {
    throw std::runtime_error(who + ": cannot start an all-reduce: " + e.what());
  }
}

void ProcessGroup::all_reduce_sum(std::vector<at::Tensor>& tensors) {
  all_reduce_sum_async(tensors)->wait();
}

void ProcessGroup::broadcast_coalesced(const std::vector<at::Tensor>& tensors, int root,
                                       int64_t bucket_bytes) {
  if (tensors.empty()) return;
  try {
    c10d::broadcast_coalesced(impl_->pg, tensors, static_cast<size_t>(bucket_bytes), root);
  } catch (const std::exception& e) {
    throw std::runtime_error(rank_tag(impl_->rank, impl_->size) +
                             ": broadcast failed (another rank may have exited or stopped "
                             "responding): " +
                             e.what());
  }
}

void ProcessGroup::barrier() {
  std::vector<at::Tensor> t{at::zeros({1}, at::TensorOptions().device(impl_->device))};
  all_reduce_sum(t);
}

// ---------------------------------------------------------------------------------------------
// DistributedDataParallel

struct DistributedDataParallel::State {
  struct Bucket {
    std::vector<size_t> params;    // indices into State::params
    std::vector<int64_t> offsets;  // element offsets in buffer
    at::Tensor buffer;             // flat, the bucket's dtype and device
    size_t pending = 0;            // gradients not yet copied in
    std::unique_ptr<ProcessGroup::Pending> work;
  };
  std::mutex mu;
  ProcessGroup* group = nullptr;
  std::vector<at::Tensor> params;
  std::vector<std::string> names;
  std::vector<Bucket> buckets;
  std::vector<size_t> bucket_of, slot_of;  // param -> bucket, position in bucket
  std::vector<char> ready;
  size_t next_bucket = 0;
  bool armed = false;

  // Buckets: reverse registration order, one dtype/device each, up to cap_bytes (a parameter
  // larger than that gets a bucket of its own), each with its flat buffer.
  void make_buckets(int64_t cap_bytes) {
    bucket_of.resize(params.size());
    slot_of.resize(params.size());
    ready.assign(params.size(), 0);
    int64_t bytes = 0;
    for (size_t k = params.size(); k-- > 0;) {
      const at::Tensor& p = params[k];
      const int64_t pb = p.numel() * static_cast<int64_t>(p.element_size());
      bool fresh = buckets.empty() || bytes + pb > cap_bytes;
      if (!fresh) {
        const at::Tensor& first = params[buckets.back().params.front()];
        fresh = first.scalar_type() != p.scalar_type() || first.device() != p.device();
      }
      if (fresh) {
        buckets.emplace_back();
        bytes = 0;
      }
      Bucket& b = buckets.back();
      bucket_of[k] = buckets.size() - 1;
      slot_of[k] = b.params.size();
      b.offsets.push_back(b.params.empty() ? 0
                                           : b.offsets.back() + params[b.params.back()].numel());
      b.params.push_back(k);
      bytes += pb;
    }
    for (auto& b : buckets) {
      const at::Tensor& last = params[b.params.back()];
      const int64_t n = b.offsets.back() + last.numel();
      b.buffer = at::empty({n}, last.options().memory_format(c10::MemoryFormat::Contiguous));
    }
  }

  void arm() {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& b : buckets) {
      b.pending = b.params.size();
      b.work.reset();
    }
    std::fill(ready.begin(), ready.end(), 0);
    next_bucket = 0;
    armed = true;
  }

  // Autograd calls this once the parameter's .grad holds this backward's (accumulated) gradient.
  void grad_ready(size_t i) {
    std::lock_guard<std::mutex> lock(mu);
    if (!armed || ready[i]) return;
    ready[i] = 1;
    Bucket& b = buckets[bucket_of[i]];
    const at::Tensor& p = params[i];
    const size_t slot = slot_of[i];
    b.buffer.narrow(0, b.offsets[slot], p.numel()).view(p.sizes()).copy_(p.grad());
    --b.pending;
    // Launch strictly in bucket order, so every rank issues the same collectives in the same order.
    while (next_bucket < buckets.size() && buckets[next_bucket].pending == 0) {
      Bucket& nb = buckets[next_bucket++];
      nb.buffer.div_(group->size());
      std::vector<at::Tensor> t{nb.buffer};
      nb.work = group->all_reduce_sum_async(t);
    }
  }
};

namespace {
struct GradReadyHook : torch::autograd::PostAccumulateGradHook {
  GradReadyHook(std::weak_ptr<DistributedDataParallel::State> s, size_t i)
      : state(std::move(s)), index(i) {}
  void operator()(const torch::autograd::Variable& /*tensor*/) override {
    if (auto s = state.lock()) s->grad_ready(index);
  }
  std::weak_ptr<DistributedDataParallel::State> state;
  size_t index;
};

// Same model on every rank? Compares (count, elements, a fingerprint of the shapes) of the
// trained parameters across the group; throws naming this rank's when they differ.
void check_same_model(ProcessGroup& group, const std::vector<at::Tensor>& params) {
  int64_t numel = 0, fingerprint = 0;
  for (const auto& p : params) {
    numel += p.numel();
    for (int64_t d : p.sizes()) fingerprint = (fingerprint * 31 + d) % 1000000007;
  }
  std::vector<int64_t> mine{static_cast<int64_t>(params.size()), numel, fingerprint};
  std::vector<at::Tensor> t{
      at::tensor(mine, at::TensorOptions().dtype(at::kLong)).to(group.device())};
  group.all_reduce_sum(t);
  const at::Tensor total = t[0].cpu();
  for (int k = 0; k < 3; ++k) {
    if (total[k].item<int64_t>() != mine[static_cast<size_t>(k)] * group.size()) {
      throw std::runtime_error("DistributedDataParallel: rank " + std::to_string(group.rank()) +
                               ": the model differs across ranks (parameter count " +
                               std::to_string(params.size()) + ", elements " +
                               std::to_string(numel) + " here)");
    }
  }
}

// Rank 0's parameters and buffers (all of them, trained or not) everywhere.
void broadcast_rank0_state(torch::nn::Module& module, ProcessGroup& group) {
  std::vector<at::Tensor> states;
  for (const auto& p : module.named_parameters(true)) states.push_back(p.value().detach());
  for (const auto& b : module.named_buffers(true)) states.push_back(b.value().detach());
  at::NoGradGuard no_grad;
  group.broadcast_coalesced(states, 0);
}
}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                 std::shared_ptr<ProcessGroup> group,
                                                 DdpOptions options)
    : module_(std::move(module)),
      group_(std::move(group)),
      options_(options),
      state_(std::make_shared<State>()) {
  State& s = *state_;
  s.group = group_.get();
  for (const auto& p : module_->named_parameters(/*recurse=*/true)) {
    if (!p.value().requires_grad()) continue;
    s.params.push_back(p.value());
    s.names.push_back(p.key());
  }
  check_same_model(*group_, s.params);
  broadcast_rank0_state(*module_, *group_);
  s.make_buckets(options_.bucket_cap_bytes);
  std::weak_ptr<State> weak = state_;
  for (size_t k = 0; k < s.params.size(); ++k) {
    torch::autograd::impl::set_post_acc_grad_hooks(s.params[k],
                                                   std::make_unique<GradReadyHook>(weak, k));
  }
  std::string sizes;
  for (int64_t b : bucket_bytes()) sizes += (sizes.empty() ? "" : ", ") + std::to_string(b);
  gpufeed::log_text(LogLevel::kInfo, "ddp: " + std::to_string(s.params.size()) + " parameters in " +
                                         std::to_string(s.buckets.size()) + " buckets (bytes: " +
                                         sizes + "), rank 0's state broadcast");
}

DistributedDataParallel::~DistributedDataParallel() {
  for (auto& p : state_->params) {
    torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
  }
}

void DistributedDataParallel::pre_forward() {
  if (!sync_) return;  // no_sync(): neither buffer sync nor gradient sync, as in torch
  if (options_.broadcast_buffers) {
    std::vector<at::Tensor> buffers;
    for (const auto& b : module_->named_buffers(true)) buffers.push_back(b.value().detach());
    if (!buffers.empty()) {
      at::NoGradGuard no_grad;
      group_->broadcast_coalesced(buffers, 0);
    }
  }
  state_->arm();
}

void DistributedDataParallel::finish_gradient_sync() {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.armed) return;
  s.armed = false;
  if (s.next_bucket < s.buckets.size()) {
    std::string missing;
    for (size_t k = 0; k < s.params.size(); ++k) {
      if (!s.ready[k]) missing += (missing.empty() ? "" : ", ") + s.names[k];
    }
    // The buckets already launched must still complete before the error leaves (they write
    // into our buffers); a failure there is secondary.
    for (auto& b : s.buckets) {
      if (b.work) {
        try {
          b.work->wait();
        } catch (const std::exception&) {
        }
      }
    }
    throw std::runtime_error("DistributedDataParallel: rank " + std::to_string(group_->rank()) +
                             ": these parameters got no gradient in backward (every parameter "
                             "must be used in every step): " +
                             missing);
  }
  for (auto& b : s.buckets) {
    b.work->wait();
    b.work.reset();
  }
  at::NoGradGuard no_grad;
  for (size_t k = 0; k < s.params.size(); ++k) {
    State::Bucket& b = s.buckets[s.bucket_of[k]];
    at::Tensor& p = s.params[k];
    p.mutable_grad().copy_(b.buffer.narrow(0, b.offsets[s.slot_of[k]], p.numel()).view(p.sizes()));
  }
}

void DistributedDataParallel::sync_without_backward() {
  if (!sync_) return;
  pre_forward();
  State& s = *state_;
  {
    at::NoGradGuard no_grad;
    for (at::Tensor& p : s.params) {
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
    }
  }
  for (size_t k = s.params.size(); k-- > 0;) s.grad_ready(k);  // launched in bucket order
  finish_gradient_sync();
}

std::vector<int64_t> DistributedDataParallel::bucket_bytes() const {
  std::vector<int64_t> out;
  for (const auto& b : state_->buckets)
    out.push_back(b.buffer.numel() * static_cast<int64_t>(b.buffer.element_size()));
  return out;
}

DistributedDataParallel::NoSync::NoSync(DistributedDataParallel& ddp)
    : ddp_(ddp), prev_(ddp.sync_) {
  ddp_.sync_ = false;
}
DistributedDataParallel::NoSync::~NoSync() { ddp_.sync_ = prev_; }

}  // namespace gpufeed::harness
