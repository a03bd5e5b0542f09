#pragma once
// The step profiler: where each training step's time goes (data wait, H2D copy, forward+backward,
// all-reduce, optimizer), how busy the GPU is (CUDA events, and NVML when a driver is present),
// what the loader's threads spend per sample, and a verdict: is this run input-bound or
// compute-bound, by how much, and which knob is most likely to help.
//
// The trainer calls the hooks in order for each step:
//   step_begin(); next(); batch_ready(batch); <forward+backward> phase_done(kForwardBackward);
//   <all-reduce> phase_done(kAllReduce); <optimizer> phase_done(kOptimizer); step_end(n);
// On CUDA devices the phases are timed by events on the compute stream (GPU time) and the copy by
// the prefetcher's events on its copy stream; on the CPU by the wall clock.
//
// Outputs, all optional: a JSON-lines metrics file (records "run", "steps" every N steps, "epoch",
// "summary"; tools/bench/plot.py draws them), a Chrome trace (Perfetto, chrome://tracing) with tracks for
// the host's step phases, the compute stream, the copy stream, every loader thread and counters,
// and progress snapshots for a console display (progress.h).

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "gpufeed/device/cuda.h"
#include "gpufeed/profiler/progress.h"
#include "gpufeed/loader/loader.h"

namespace gpufeed::profiler {

/// What the profiler records and where. Part of TrainOptions.
struct ProfileOptions {
  /// JSON-lines metrics: a "run" record, a "steps" record every metrics_every_steps steps, an
  /// "epoch" record per epoch and a "summary" record with the verdict at the end.
  std::optional<std::filesystem::path> metrics_path;
  int64_t metrics_every_steps = 10;  ///< steps per "steps" record (>= 1)
  /// Chrome trace JSON, written at the end of the run.
  std::optional<std::filesystem::path> trace_path;
  /// Events the trace keeps: the first half and the most recent half of the run (about 100 bytes
  /// each in the file); the rest are counted in otherData.dropped_events.
  int64_t trace_max_events = 400000;
  bool nvml = true;  ///< sample NVML during CUDA runs when the library loads
  std::string nvml_library = "libnvidia-ml.so.1";  ///< dlopen name (tests use a fake)
  double nvml_interval_ms = 100;                   ///< NVML sampling period
  /// Steps at the start of the run left out of RunProfile::steady and the verdict (cuDNN
  /// autotuning, allocator growth and the loader's first fill make them slower; on the H200 the
  /// first epoch of ResNet-50 took 10x the later ones). Applied only when the run has more than
  /// twice as many steps; otherwise every step counts.
  int64_t warmup_steps = 10;
  /// Called on the training thread after every step (see progress.h for a printer).
  std::function<void(const ProgressSnapshot&)> on_progress;
  /// CUDA runs: the stream the steps run on, asked at each mark (the trainer gives c10's current
  /// stream; Python gives torch.cuda.current_stream()'s). Empty: the legacy default stream.
  std::function<device::StreamHandle()> current_stream;
};

/// What the profiler needs of a batch that arrived (prefetch::DeviceBatch, the Python iterator's
/// batch): its data wait, position, skips and, on CUDA, the copy stream's marks around its copy.
struct ReadyBatch {
  double wait_ms = 0;       ///< wall time the step waited for it (data wait)
  int64_t batch_index = 0;  ///< position within the epoch
  int64_t skipped = 0;      ///< samples the skip policy replaced in it
  std::shared_ptr<const device::StreamMark> copy_begin, copy_end;  ///< null on the CPU path
};

/// The run being profiled, as the trainer knows it.
struct RunInfo {
  std::string device = "cpu";  ///< "cpu" or "cuda:N"
  std::string model;           ///< e.g. "resnet18"
  int64_t epochs = 1;
  int64_t steps_per_epoch = 0;
  int64_t batch_size = 0;
  int num_workers = 0;       ///< loader threads actually used (--num-workers)
  int hardware_threads = 0;  ///< std::thread::hardware_concurrency()
  int cpu_budget = 0;        ///< gpufeed::cpu_budget(): the CPUs this process may use (affinity mask, cgroup quota)
  int prefetch_depth = 0;    ///< loader slots
  int image_size = 0;        ///< output side, pixels
  bool allreduce = false;    ///< the step has an all-reduce phase (else it is recorded as 0)
};

/// The phases a step's compute part is split into, in order.
enum class Phase {
  kForwardBackward,  ///< forward, loss and backward
  kAllReduce,        ///< waiting for the gradients' all-reduce (0 without data parallelism)
  kOptimizer,        ///< the optimizer step
};

/// Times of many steps, summed or averaged. All times are in milliseconds.
struct StepBreakdown {
  int64_t steps = 0;
  int64_t images = 0;
  double wall_ms = 0;       ///< sum of the steps' wall times (step_begin to step_end)
  double data_wait_ms = 0;  ///< sum: host blocked waiting for the batch
  double h2d_ms = 0;        ///< sum: copy+convert (CUDA: copy-stream GPU time; CPU: convert)
  double compute_ms = 0;    ///< sum: forward+backward
  double allreduce_ms = 0;  ///< sum: all-reduce wait
  double optimizer_ms = 0;  ///< sum: optimizer step
  double gpu_busy_ms = 0;   ///< sum: compute-stream GPU time per step (CUDA only)
  bool gpu = false;         ///< the step times come from CUDA events
  double gpu_util_percent_sum = 0;                      ///< NVML utilization readings, summed
  int64_t gpu_util_samples = 0;                         ///< NVML readings counted
  double slots_ready_sum = 0, slots_in_flight_sum = 0;  ///< sampled at each batch_ready
  int64_t skipped = 0;  ///< samples the skip policy replaced in these batches

  /// Adds another breakdown's sums.
  void add(const StepBreakdown& o);
  /// images / wall time.
  double images_per_s() const;
  /// data_wait_ms / wall_ms (0..1).
  double data_wait_fraction() const;
  /// gpu_busy_ms / wall_ms; absent unless gpu.
  std::optional<double> gpu_busy_fraction() const;
  /// Mean NVML utilization, percent; absent without readings.
  std::optional<double> gpu_util_percent() const;
};

/// What the verdict is computed from: a run's steps, the loader's counters and the machine.
struct VerdictInputs {
  StepBreakdown steps;
  int64_t loader_samples = 0;  ///< samples the loader produced during the run
  double loader_read_s = 0;    ///< thread time, summed over workers
  double loader_decode_s = 0;
  double loader_resize_s = 0;
  int num_workers = 1;  ///< loader threads
  int hardware_threads = 1;  ///< the machine's (std::thread::hardware_concurrency()), for the advice's text
  int cpu_budget = 1;        ///< the CPUs this process may use (gpufeed/cpu_budget.h): the most threads the advice asks for
  int prefetch_depth = 0;
  bool gpu = false;        ///< training on a GPU
  bool allreduce = false;  ///< the all-reduce phase was measured
};

/// The verdict on a run.
struct Verdict {
  enum class Bound { kUnknown, kInput, kCompute };
  Bound bound = Bound::kUnknown;
  double data_wait_fraction = 0;      ///< of step wall time, 0..1
  double delivered_images_per_s = 0;  ///< what the run achieved
  double model_images_per_s = 0;      ///< images / (step time - data wait): the model alone
  double loader_images_per_s = 0;     ///< loader capacity: samples / thread time * num_workers
  double read_fraction = 0, decode_fraction = 0, resize_fraction = 0;  ///< of loader thread time
  std::string knob;  ///< the change most likely to help, one sentence
  std::string text;  ///< one short paragraph, the whole verdict
};

/// Fraction of step time spent waiting for data from which a run is called input-bound.
inline constexpr double kInputBoundWaitFraction = 0.10;

/// The verdict, as a pure function of its inputs: input-bound when the steps waited for data at
/// least kInputBoundWaitFraction of their wall time, else compute-bound; kUnknown without steps.
Verdict make_verdict(const VerdictInputs& in);

/// A finished run's profile.
struct RunProfile {
  StepBreakdown steps;                  ///< all steps of all epochs
  /// The steps after the first warm-up steps (all of them in a short run): what
  /// the verdict judges, and the steady state the end-of-run report prints beside `steps`
  /// (ProfileOptions::warmup_steps).
  StepBreakdown steady;
  int64_t warmup_steps_excluded = 0;  ///< steps - steady.steps
  loader::LoaderStats loader;           ///< the training loader's counters during the run
  loader::LoaderHistograms histograms;  ///< its per-sample stage histograms (whole life)
  Verdict verdict;
  bool allreduce_measured = false;  ///< false: all-reduce recorded as 0 (no data parallelism)
  std::string nvml_status;          ///< "sampled" or why NVML was not used
  int64_t trace_events = 0;         ///< events written to the trace
  int64_t trace_dropped = 0;        ///< events dropped from the middle of a long run
};

/// Records one training run. Not thread-safe: the hooks are called from the training thread
/// (the loader's sample observer it installs runs on the workers and is thread-safe).
class Profiler {
 public:
  /// `loader` (may be null) is the training loader: its counters feed the verdict, its slots
  /// are sampled each step and, with a trace, its sample observer is set for the run (the
  /// loader must outlive the profiler). Opens NVML on CUDA devices. Throws std::runtime_error
  /// when the metrics file cannot be opened.
  Profiler(ProfileOptions options, RunInfo run, loader::Loader* loader);
  /// Removes the sample observer; does not write the trace (finish() does).
  ~Profiler();
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  /// An epoch starts: call it before the loader's start_epoch (it snapshots the loader's counters,
  /// and the workers start loading at once), and before the epoch's first step.
  void begin_epoch(int64_t epoch);
  /// A step starts: the host is about to ask the prefetcher for the next batch.
  void step_begin();
  /// The batch arrived: data wait ends (its copy marks, if any, give the H2D span).
  void batch_ready(const ReadyBatch& batch);
  /// `phase` has just been issued (CPU: has run).
  void phase_done(Phase phase);
  /// The step ends with `images` samples trained.
  void step_end(int64_t images);
  /// The epoch's steps are done: resolves its GPU times and writes its "epoch" record. Returns
  /// the epoch's breakdown.
  StepBreakdown end_epoch();
  /// Ends the run: writes the "summary" record and the trace, removes the observer, and returns
  /// the profile with its verdict. Call once.
  RunProfile finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Formats a number with thousands separators and no decimals: 1480.4 -> "1,480".
std::string format_count(double value);

}  // namespace gpufeed::profiler
