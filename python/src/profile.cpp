// gpufeed._C._Profiler: the step profiler of `gpufeed train` (harness/profiler.h) for any Python
// training loop; python/gpufeed/_profile.py drives it around the user's iterator.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "bindings.h"
#include "fields_dict.h"
#include "gpufeed/option.h"
#include "gpufeed/cpu_budget.h"
#include "gpufeed/profiler/profile_fields.h"
#include "gpufeed/profiler/profiler.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace gpufeed::python {
namespace {

nb::dict breakdown_dict(const profiler::StepBreakdown& s) {
  nb::dict d;
  d["steps"] = s.steps;
  d["images"] = s.images;
  d["wall_ms"] = s.wall_ms;
  d["data_wait_ms"] = s.data_wait_ms;
  d["h2d_ms"] = s.h2d_ms;
  d["compute_ms"] = s.compute_ms;
  d["allreduce_ms"] = s.allreduce_ms;
  d["optimizer_ms"] = s.optimizer_ms;
  d["gpu_busy_ms"] = s.gpu_busy_ms;
  d["gpu"] = s.gpu;
  d["skipped"] = s.skipped;
  d["images_per_s"] = s.images_per_s();
  d["data_wait_fraction"] = s.data_wait_fraction();
  d["gpu_busy_fraction"] = s.gpu_busy_fraction();
  d["gpu_util_percent"] = s.gpu_util_percent();
  return d;
}

class PyProfiler {
 public:
  PyProfiler(std::optional<std::string> metrics, int64_t metrics_every, std::optional<std::string> trace,
             int64_t trace_max_events, bool nvml, const std::string& device, const std::string& model,
             int64_t epochs, int64_t steps_per_epoch, int64_t batch_size, int num_workers, int prefetch_depth,
             int image_size, bool allreduce, nb::handle py_loader, uintptr_t stream) {
    stream_.store(stream);
    profiler::ProfileOptions o;
    if (metrics) o.metrics_path = *metrics;
    o.metrics_every_steps = metrics_every;
    if (trace) o.trace_path = *trace;
    o.trace_max_events = trace_max_events;
    o.nvml = nvml;
    profiler::RunInfo run;
    run.device = device;
    run.model = model;
    run.epochs = epochs;
    run.steps_per_epoch = steps_per_epoch;
    run.batch_size = batch_size;
    run.num_workers = num_workers;
    run.hardware_threads = static_cast<int>(std::thread::hardware_concurrency());
    run.cpu_budget = gpufeed::cpu_budget();
    run.prefetch_depth = prefetch_depth;
    run.image_size = image_size;
    run.allreduce = allreduce;
    if (!py_loader.is_none()) loader_ = loader_of(py_loader);
    // CUDA marks go on the stream the Python loop runs on (set_stream at each step).
    o.current_stream = [this] { return reinterpret_cast<device::StreamHandle>(stream_.load()); };
    profiler_ = std::make_unique<profiler::Profiler>(o, run, loader_.get());
  }

  void begin_epoch(int64_t epoch) { profiler_->begin_epoch(epoch); }
  void step_begin() { profiler_->step_begin(); }
  void set_stream(uintptr_t stream) { stream_.store(stream); }
  void batch_ready(double wait_ms, int64_t batch_index, int64_t skipped) {
    profiler::ReadyBatch b;
    b.wait_ms = wait_ms;
    b.batch_index = batch_index;
    b.skipped = skipped;
    profiler_->batch_ready(b);
  }
  void phase_done(const std::string& phase) {
    if (phase == "forward_backward")
      profiler_->phase_done(profiler::Phase::kForwardBackward);
    else if (phase == "all_reduce")
      profiler_->phase_done(profiler::Phase::kAllReduce);
    else if (phase == "optimizer")
      profiler_->phase_done(profiler::Phase::kOptimizer);
    else
      throw nb::value_error(("phase must be 'forward_backward', 'all_reduce' or 'optimizer', not '" + phase + "'").c_str());
  }
  void step_end(int64_t images) { profiler_->step_end(images); }
  nb::dict end_epoch() {
    profiler::StepBreakdown b;
    {
      nb::gil_scoped_release nogil;  // waits for the epoch's CUDA events
      b = profiler_->end_epoch();
    }
    return breakdown_dict(b);
  }
  nb::dict finish() {
    profiler::RunProfile p;
    {
      nb::gil_scoped_release nogil;
      p = profiler_->finish();
    }
    nb::dict d;
    d["steps"] = breakdown_dict(p.steps);
    d["steady"] = breakdown_dict(p.steady);
    d["warmup_steps_excluded"] = p.warmup_steps_excluded;
    nb::dict v = to_dict(p.verdict);
    // The profiler names options in backticks (`num_workers`): keywords here (num_workers=).
    v["knob"] = options::spell_options(p.verdict.knob, options::Front::kPython);
    v["text"] = options::spell_options(p.verdict.text, options::Front::kPython);
    d["verdict"] = v;
    d["allreduce_measured"] = p.allreduce_measured;
    d["nvml_status"] = p.nvml_status;
    d["trace_events"] = p.trace_events;
    d["trace_dropped"] = p.trace_dropped;
    d["loader_samples"] = p.loader.samples;
    return d;
  }

 private:
  std::atomic<uintptr_t> stream_{0};        // a cudaStream_t; 0: the legacy default stream
  std::shared_ptr<loader::Loader> loader_;  // outlives profiler_ (declared first)
  std::unique_ptr<profiler::Profiler> profiler_;
};

}  // namespace

void bind_profiler(nb::module_& m) {
  nb::class_<PyProfiler>(m, "_Profiler")
      .def(nb::init<std::optional<std::string>, int64_t, std::optional<std::string>, int64_t, bool,
                    const std::string&, const std::string&, int64_t, int64_t, int64_t, int, int, int, bool,
                    nb::handle, uintptr_t>(),
           "metrics"_a.none(), "metrics_every"_a, "trace"_a.none(), "trace_max_events"_a, "nvml"_a, "device"_a,
           "model"_a, "epochs"_a, "steps_per_epoch"_a, "batch_size"_a, "num_workers"_a, "prefetch_depth"_a,
           "image_size"_a, "allreduce"_a, "loader"_a.none(), "stream"_a = 0)
      .def("set_stream", &PyProfiler::set_stream, "stream"_a)
      .def("begin_epoch", &PyProfiler::begin_epoch)
      .def("step_begin", &PyProfiler::step_begin)
      .def("batch_ready", &PyProfiler::batch_ready, "wait_ms"_a, "batch_index"_a, "skipped"_a)
      .def("phase_done", &PyProfiler::phase_done)
      .def("step_end", &PyProfiler::step_end)
      .def("end_epoch", &PyProfiler::end_epoch)
      .def("finish", &PyProfiler::finish);
}

}  // namespace gpufeed::python
