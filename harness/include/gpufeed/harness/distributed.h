#pragma once
// Multi-process data parallelism (one process per device), the C++ twin of
// torch.distributed.init_process_group("env://") + DistributedDataParallel:
//  - DistEnv reads the rendezvous from torchrun's environment (or Slurm's);
//  - ProcessGroup is a c10d process group (NCCL on CUDA, Gloo on the CPU) reached through a
//    TCPStore at MASTER_ADDR:MASTER_PORT;
//  - DistributedDataParallel broadcasts rank 0's parameters and buffers at start and averages
//    gradients across ranks in ~25 MB buckets, each all-reduce started as soon as its bucket's
//    gradients are ready during backward, and waited for by finish_gradient_sync() before the
//    optimizer step.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gpufeed::harness {

/// Where this process sits in a distributed job, and where to meet the others.
struct DistEnv {
  int rank = 0;                           ///< global rank, [0, world_size)
  int world_size = 1;                     ///< processes in the job
  int local_rank = 0;                     ///< rank on this node: the device index to use
  int local_world_size = 1;               ///< processes on this node
  std::string master_addr = "127.0.0.1";  ///< host of rank 0's TCPStore
  int master_port = 29500;                ///< its port
  /// Every rank connects to a store someone else hosts (torchrun's agent;
  /// TORCHELASTIC_USE_AGENT_STORE) instead of rank 0 hosting it.
  bool agent_store = false;
  /// "torchrun" (RANK, WORLD_SIZE, ...), "slurm" (SLURM_PROCID, SLURM_NTASKS, ...), or "none".
  std::string source = "none";
};

/// A getenv-like lookup (tests pass a map).
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
/// The process environment.
std::optional<std::string> process_env(const std::string& name);

/// Reads the rendezvous from the environment:
///  - torchrun's contract when RANK and WORLD_SIZE are set: RANK, WORLD_SIZE, LOCAL_RANK (0),
///    LOCAL_WORLD_SIZE (1), MASTER_ADDR (127.0.0.1), MASTER_PORT (29500),
///    TORCHELASTIC_USE_AGENT_STORE;
///  - otherwise Slurm's when SLURM_PROCID and SLURM_NTASKS are set: SLURM_PROCID, SLURM_NTASKS,
///    SLURM_LOCALID, the task count on this node from SLURM_NTASKS_PER_NODE or
///    SLURM_TASKS_PER_NODE ("4(x2)" -> 4); MASTER_ADDR if set, else the first host of
///    SLURM_STEP_NODELIST / SLURM_JOB_NODELIST ("gpu[03-04,7]" -> "gpu03"); MASTER_PORT if set,
///    else 15000 + SLURM_JOB_ID % 20000 (so concurrent jobs on a node differ);
///  - std::nullopt otherwise (a plain single process).
/// Throws std::invalid_argument naming the variable when a value is malformed or out of range.
std::optional<DistEnv> detect_dist_env(const EnvLookup& env = process_env);

/// Options of ProcessGroup::create.
struct ProcessGroupOptions {
  /// "nccl", "gloo", or "auto": NCCL for CUDA devices, Gloo for the CPU.
  std::string backend = "auto";
  /// Rendezvous and collective timeout (torch's default is 30 minutes).
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
  /// Prefix of this group's keys in the store.
  std::string store_prefix = "gpufeed";
};

/// A c10d process group with one backend. Collectives are synchronous here (they return when
/// the result is usable on the caller's current stream) unless stated otherwise.
class ProcessGroup {
 public:
  /// Connects to the others (rank 0 hosts the TCPStore unless env.agent_store) and creates the
  /// backend for `device` (NCCL needs a CUDA build and a CUDA device; it also makes `device` the
  /// current CUDA device). Blocks until every rank has joined or the timeout passes.
  /// Throws std::runtime_error naming the address, rank and reason on failure.
  static std::shared_ptr<ProcessGroup> create(const DistEnv& env, const c10::Device& device,
                                              const ProcessGroupOptions& options = {});
  ~ProcessGroup();

  int rank() const;
  int size() const;
  /// "nccl" or "gloo".
  const std::string& backend() const;
  /// The device collectives run on.
  const c10::Device& device() const;

  /// Sums `tensors` (each on device()) across ranks in place.
  void all_reduce_sum(std::vector<at::Tensor>& tensors);
  /// Starts an all-reduce (sum, in place) and returns a handle whose wait() blocks until the
  /// result is usable on the caller's current stream and rethrows a failure.
  class Pending {
   public:
    virtual ~Pending() = default;
    virtual void wait() = 0;
  };
  std::unique_ptr<Pending> all_reduce_sum_async(std::vector<at::Tensor>& tensors);
  /// Copies `tensors` from rank `root` to all ranks, in place, coalesced into buffers of up to
  /// `bucket_bytes` (torch's _broadcast_coalesced).
  void broadcast_coalesced(const std::vector<at::Tensor>& tensors, int root = 0,
                           int64_t bucket_bytes = int64_t{250} << 20);
  /// Blocks until every rank of the group has called barrier() (torch.distributed.barrier()).
  /// Throws std::runtime_error when a peer fails or the group's timeout passes.
  void barrier();

  struct Impl;

 private:
  explicit ProcessGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Options of DistributedDataParallel; defaults are torch's.
struct DdpOptions {
  int64_t bucket_cap_bytes = int64_t{25} << 20;  ///< torch's bucket_cap_mb = 25
  /// Copy rank 0's buffers (BatchNorm running statistics) to all ranks before every training
  /// forward (torch's broadcast_buffers=True).
  bool broadcast_buffers = true;
};

/// DistributedDataParallel for one module on this process's device. Use:
///   ddp.pre_forward();  logits = model(x);  loss.backward();  ddp.finish_gradient_sync();
///   optimizer.step();
/// and, for gradient accumulation, run the first micro-batches' backward inside
/// `auto guard = ddp.no_sync();` (local accumulation, no communication), like torch's no_sync().
/// Buckets hold parameters in reverse registration order (about the order backward produces
/// their gradients), up to bucket_cap_bytes each and one dtype and device per bucket; a bucket
/// is all-reduced (gradients divided by world size, then summed: an average) as soon as all its
/// gradients have been accumulated, and buckets are launched strictly in order on every rank, so
/// all ranks issue the same collectives in the same order. Every parameter that requires a
/// gradient must get one in every synchronised backward (torch's find_unused_parameters=False).
class DistributedDataParallel {
 public:
  /// Broadcasts rank 0's parameters and buffers to all ranks (after checking that every rank has
  /// the same parameter shapes), then installs the gradient hooks.
  /// Throws std::runtime_error when the ranks' models differ (naming the first mismatch).
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                          std::shared_ptr<ProcessGroup> group, DdpOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  /// Call before each training forward: broadcasts buffers (broadcast_buffers), and arms the
  /// gradient hooks unless a no_sync() scope is open.
  void pre_forward();

  /// Call after backward, before the optimizer: waits for every bucket's all-reduce and writes
  /// the averaged gradients into the parameters' .grad. A no-op after a backward run under
  /// no_sync(). Rethrows a failed collective as std::runtime_error naming this rank and the cause
  /// (for example a rank that exited). Throws std::runtime_error naming the parameters that got
  /// no gradient.
  void finish_gradient_sync();

  /// For a rank without data in this step (an epoch resumed on another world size, whose shares
  /// differ by a sample): pre_forward(), then every parameter's current .grad (zeros where it has
  /// none) into the buckets, all-reduced in order as a backward would, then finish_gradient_sync(),
  /// so its collectives match the other ranks' step (torch.distributed.algorithms.Join's shadow
  /// all-reduce; the average still divides by the world size). A no-op under no_sync().
  void sync_without_backward();

  /// RAII scope in which backward passes only accumulate gradients locally.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool prev_;
  };
  /// torch's no_sync(): `auto g = ddp.no_sync();` around forward and backward.
  NoSync no_sync() { return NoSync(*this); }

  /// Bucket sizes in bytes, in launch order (for tests and logs).
  std::vector<int64_t> bucket_bytes() const;
  /// The process group.
  ProcessGroup& group() { return *group_; }

  struct State;

 private:
  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<ProcessGroup> group_;
  DdpOptions options_;
  std::shared_ptr<State> state_;
  bool sync_ = true;
};

}  // namespace gpufeed::harness
