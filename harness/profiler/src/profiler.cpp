#include "gpufeed/profiler/profiler.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <vector>

#include "gpufeed/fields_json.h"
#include "gpufeed/profiler/nvml.h"
#include "gpufeed/profiler/profile_fields.h"
#include "gpufeed/profiler/trace.h"
#include "gpufeed/log_text.h"
#include "gpufeed/json_text.h"
#include "gpufeed/loader/stats_fields.h"


namespace gpufeed::profiler {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double ms(int64_t ns) { return static_cast<double>(ns) * 1e-6; }

std::string percent(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f%%", 100.0 * fraction);
  return buf;
}

std::string times(double ratio) {
  if (ratio >= 100) return format_count(ratio) + "x";
  char buf[32];
  std::snprintf(buf, sizeof buf, ratio >= 10 ? "%.0fx" : "%.1fx", ratio);
  return buf;
}

// Trace tracks ("threads" in the viewer).
constexpr int kHostTrack = 1;
constexpr int kComputeTrack = 2;
constexpr int kCopyTrack = 3;
constexpr int kLoaderTrack0 = 100;
constexpr int kCounterTrack = 0;

nlohmann::json histogram_json(const loader::LatencyHistogram& h) {
  return {{"p50_us", h.quantile_us(0.5)},
          {"p90_us", h.quantile_us(0.9)},
          {"p99_us", h.quantile_us(0.99)},
          {"count", h.total()},
          {"bucket_counts", h.counts}};
}

}  // namespace

// ---- StepBreakdown ---------------------------------------------------------------------------

void StepBreakdown::add(const StepBreakdown& o) {
  steps += o.steps;
  images += o.images;
  wall_ms += o.wall_ms;
  data_wait_ms += o.data_wait_ms;
  h2d_ms += o.h2d_ms;
  compute_ms += o.compute_ms;
  allreduce_ms += o.allreduce_ms;
  optimizer_ms += o.optimizer_ms;
  gpu_busy_ms += o.gpu_busy_ms;
  gpu = gpu || o.gpu;
  gpu_util_percent_sum += o.gpu_util_percent_sum;
  gpu_util_samples += o.gpu_util_samples;
  slots_ready_sum += o.slots_ready_sum;
  slots_in_flight_sum += o.slots_in_flight_sum;
  skipped += o.skipped;
}

double StepBreakdown::images_per_s() const {
  return wall_ms > 0 ? static_cast<double>(images) / (wall_ms / 1000.0) : 0.0;
}

double StepBreakdown::data_wait_fraction() const {
  return wall_ms > 0 ? std::clamp(data_wait_ms / wall_ms, 0.0, 1.0) : 0.0;
}

std::optional<double> StepBreakdown::gpu_busy_fraction() const {
  if (!gpu || wall_ms <= 0) return std::nullopt;
  return std::clamp(gpu_busy_ms / wall_ms, 0.0, 1.0);
}

std::optional<double> StepBreakdown::gpu_util_percent() const {
  if (gpu_util_samples == 0) return std::nullopt;
  return gpu_util_percent_sum / static_cast<double>(gpu_util_samples);
}

std::string format_count(double value) {
  if (!std::isfinite(value)) return "n/a";
  const bool negative = value < 0;
  std::string digits = std::to_string(static_cast<long long>(std::llround(std::fabs(value))));
  std::string out;
  for (size_t k = 0; k < digits.size(); ++k) {
    if (k > 0 && (digits.size() - k) % 3 == 0) out += ',';
    out += digits[k];
  }
  return negative ? "-" + out : out;
}

// ---- the verdict -----------------------------------------------------------------------------

namespace {

// Loader thread time, summed over workers: read + decode + resize.
double loader_thread_s(const VerdictInputs& in) {
  return in.loader_read_s + in.loader_decode_s + in.loader_resize_s;
}

// The rates and the loader's stage fractions the verdict is argued from.
void measure(const VerdictInputs& in, Verdict& v) {
  const StepBreakdown& s = in.steps;
  v.data_wait_fraction = s.data_wait_fraction();
  v.delivered_images_per_s = s.images_per_s();
  const double busy_ms = std::max(s.wall_ms - s.data_wait_ms, 1e-6);
  v.model_images_per_s = static_cast<double>(s.images) / (busy_ms / 1000.0);
  const int workers = std::max(1, in.num_workers);
  const double thread_s = loader_thread_s(in);
  if (thread_s > 0 && in.loader_samples > 0) {
    v.loader_images_per_s = static_cast<double>(in.loader_samples) / thread_s * workers;
    v.read_fraction = in.loader_read_s / thread_s;
    v.decode_fraction = in.loader_decode_s / thread_s;
    v.resize_fraction = in.loader_resize_s / thread_s;
  }
}

// " Decode is 60% of loader thread time (read 30%, resize 10%).": the stages by share, largest
// first; empty when no loader thread time was measured.
std::string stage_sentence(const VerdictInputs& in, const Verdict& v) {
  if (loader_thread_s(in) <= 0) return "";
  struct Stage {
    const char* name;
    double fraction;
  };
  std::vector<Stage> order = {
      {"decode", v.decode_fraction}, {"read", v.read_fraction}, {"resize", v.resize_fraction}};
  std::stable_sort(order.begin(), order.end(),
                   [](const Stage& a, const Stage& b) { return a.fraction > b.fraction; });
  return std::string(" ") + static_cast<char>(std::toupper(order[0].name[0])) +
         (order[0].name + 1) + " is " + percent(order[0].fraction) + " of loader thread time (" +
         order[1].name + " " + percent(order[1].fraction) + ", " + order[2].name + " " +
         percent(order[2].fraction) + ").";
}

// The knob for an input-bound run: more workers while the CPU budget has room and the loader
// cannot keep up, a deeper prefetch when it keeps up on average, else the dominant loader stage.
std::string input_bound_knob(const VerdictInputs& in, const Verdict& v) {
  const bool capacity_to_spare = v.loader_images_per_s > 1.25 * v.model_images_per_s;
  const bool limited = in.cpu_budget < in.hardware_threads;
  const std::string cpus =
      limited ? "this process may use " + std::to_string(in.cpu_budget) +
                    " CPUs of the machine's " + std::to_string(in.hardware_threads) +
                    " hardware threads (affinity mask, cgroup quota)"
              : "the machine has " + std::to_string(in.cpu_budget) + " hardware threads";
  if (in.num_workers < in.cpu_budget && !capacity_to_spare) {
    return "raise `num_workers` from " + std::to_string(in.num_workers) + " to " +
           std::to_string(in.cpu_budget) + " (" + cpus +
           (in.gpu ? ")" : "; on a CPU run the model competes for the same cores)") + ".";
  }
  if (capacity_to_spare) {
    return "raise `prefetch_depth` from " + std::to_string(in.prefetch_depth) +
           ": the loader keeps up on average (about " + format_count(v.loader_images_per_s) +
           " img/s) but not at every step.";
  }
  if (v.decode_fraction >= 0.5) {
    return "decode fewer pixels: store the images pre-resized (shorter side about 1.15x the "
           "crop) so DCT scaling and crop-decode skip more, or lower `image_size`.";
  }
  if (v.read_fraction >= 0.5) {
    return "read faster: keep the dataset on a local SSD or in the page cache, or pack small "
           "files into larger ones.";
  }
  if (v.resize_fraction >= 0.5) {
    return "resize less: store the images pre-resized so each crop needs less downscaling.";
  }
  return limited
             ? "more CPUs for this process (" + cpus + "): no single loader stage dominates."
             : "more loader threads (a machine with more cores): no single loader stage dominates.";
}

void explain_input_bound(const VerdictInputs& in, const std::string& stages, Verdict& v) {
  v.bound = Verdict::Bound::kInput;
  v.knob = input_bound_knob(in, v);
  const std::string who = in.gpu ? "GPU" : "model";
  v.text = "Input-bound: the " + who + " waited for data " + percent(v.data_wait_fraction) +
           " of step time. The loader delivers " + format_count(v.delivered_images_per_s) +
           " img/s; the " + (in.gpu ? "model" : "model alone") + " would consume " +
           format_count(v.model_images_per_s) + " img/s (" +
           times(v.model_images_per_s / std::max(v.delivered_images_per_s, 1e-9)) + ")." +
           stages + " Most likely to help: " + v.knob;
}

void explain_compute_bound(const VerdictInputs& in, const std::string& stages, Verdict& v) {
  v.bound = Verdict::Bound::kCompute;
  const int workers = std::max(1, in.num_workers);
  std::string headroom;
  int needed = workers;
  if (v.loader_images_per_s > 0) {
    needed = std::clamp(
        static_cast<int>(std::ceil(workers * v.model_images_per_s / v.loader_images_per_s)), 1,
        workers);
    headroom = "; the loader could deliver about " + format_count(v.loader_images_per_s) +
               " img/s with " + std::to_string(workers) + " thread" + (workers > 1 ? "s" : "") +
               " (" + times(v.loader_images_per_s / v.model_images_per_s) + " headroom)";
  }
  const std::string threads = v.loader_images_per_s > 0
                                  ? " The loader would keep up with about " +
                                        std::to_string(needed) + " of its " +
                                        std::to_string(workers) + " threads."
                                  : "";
  v.knob = in.gpu ? "speed up the step itself: bf16 autocast, channels_last or a larger "
                    "`batch_size`." +
                        threads
                  : "the model's arithmetic on the CPU is the bottleneck: train on a GPU "
                    "(a CUDA device)." +
                        threads;
  const std::string who = in.gpu ? "GPU" : "model";
  v.text = "Compute-bound: the " + who + " waited for data only " + percent(v.data_wait_fraction) +
           " of step time. The model consumes " + format_count(v.model_images_per_s) + " img/s" +
           headroom + "." + stages + " Most likely to help: " + v.knob;
}

}  // namespace

Verdict make_verdict(const VerdictInputs& in) {
  Verdict v;
  const StepBreakdown& s = in.steps;
  if (s.steps == 0 || s.wall_ms <= 0 || s.images == 0) {
    v.text = "No training steps were timed, so there is no verdict.";
    return v;
  }
  measure(in, v);
  const std::string stages = stage_sentence(in, v);
  if (v.data_wait_fraction >= kInputBoundWaitFraction)
    explain_input_bound(in, stages, v);
  else
    explain_compute_bound(in, stages, v);
  return v;
}

// ---- the profiler ----------------------------------------------------------------------------

struct Profiler::Impl {
  ProfileOptions options;
  RunInfo run;
  loader::Loader* loader = nullptr;
  int64_t origin_ns = now_ns();
  bool gpu = false;
  int device_index = -1;  // CUDA device; -1: the CPU
  std::shared_ptr<device::StreamMark> ref_mark;  // GPU clock origin
  int64_t ref_host_ns = 0;

  // Shared with the loader's sample observer: a worker may still be inside the observer when the
  // profiler removes it and goes away.
  std::shared_ptr<TraceRecorder> trace;
  std::unique_ptr<NvmlSampler> nvml;
  std::string nvml_status = "not used (CPU run)";
  std::ofstream metrics;

  // One step, from step_begin until its GPU times are known.
  struct Step {
    int64_t global = 0, epoch = 0, in_epoch = 0, batch_index = 0, images = 0, skipped = 0;
    int64_t begin_ns = 0, ready_ns = 0, fb_ns = 0, ar_ns = 0, opt_ns = 0, end_ns = 0;
    double reported_wait_ms = 0;
    loader::SlotCounts slots;
    std::shared_ptr<const device::StreamMark> copy_begin, copy_end;
    std::shared_ptr<device::StreamMark> m_ready, m_fb, m_ar, m_opt, m_end;
  };
  std::optional<Step> open;
  std::deque<Step> pending;  // ended, GPU times not yet read

  int64_t epoch = 0, global_step = 0, step_in_epoch = 0;
  StepBreakdown window, epoch_sum, run_sum;
  StepBreakdown steady_sum;  // run_sum without the first options.warmup_steps steps
  int64_t window_first_step = 0;
  std::deque<std::array<double, 3>> recent;  // wall_ms, wait_ms, images of the last steps
  double trained_ms = 0;                     // host wall of all steps so far
  loader::LoaderStats loader_start, epoch_loader_start;
  int64_t epoch_decision_start = 0;  // the first num_workers=auto decision of the epoch (its number)
  std::optional<double> last_busy_fraction;
  bool finished = false;

  int64_t mark_ns(const device::StreamMark& m) const {
    return ref_host_ns + static_cast<int64_t>(std::llround(m.ms_since(*ref_mark) * 1e6));
  }

  device::StreamHandle stream() const { return options.current_stream ? options.current_stream() : nullptr; }
  std::shared_ptr<device::StreamMark> mark() const {
    return gpu ? device::record_stream_mark(device_index, stream()) : nullptr;
  }

  void write_record(const nlohmann::json& j) {
    if (!metrics.is_open()) return;
    metrics << json_text(j) << '\n';
    metrics.flush();
  }

  nlohmann::json breakdown_json(const StepBreakdown& b) const {
    const double n = static_cast<double>(std::max<int64_t>(b.steps, 1));
    nlohmann::json j = {
        {"steps", b.steps},
        {"images", b.images},
        {"wall_s", b.wall_ms / 1000.0},
        {"images_per_s", b.images_per_s()},
        {"data_wait_fraction", b.data_wait_fraction()},
        {"step_ms", b.wall_ms / n},
        {"data_wait_ms", b.data_wait_ms / n},
        {"h2d_ms", b.h2d_ms / n},
        {"compute_ms", b.compute_ms / n},
        {"allreduce_ms", b.allreduce_ms / n},
        {"optimizer_ms", b.optimizer_ms / n},
        {"other_ms", nullptr},
        {"timing", b.gpu ? "cuda_events" : "wall_clock"},
        {"slots_ready", b.slots_ready_sum / n},
        {"slots_in_flight", b.slots_in_flight_sum / n},
        {"skipped", b.skipped},
        {"gpu_busy_fraction", nullptr},
        {"gpu_util_percent", nullptr},
    };
    // CPU: the rest of the wall time (loss.item(), accuracy); CUDA phases are GPU time, which
    // does not add up with host time, so there is no "other" there.
    if (!b.gpu) {
      j["other_ms"] = std::max(0.0, (b.wall_ms - b.data_wait_ms - b.h2d_ms - b.compute_ms -
                                     b.allreduce_ms - b.optimizer_ms) /
                                        n);
    }
    if (auto f = b.gpu_busy_fraction()) j["gpu_busy_fraction"] = *f;
    if (auto u = b.gpu_util_percent()) j["gpu_util_percent"] = *u;
    return j;
  }

  // The loader's counters since `from` (decoded_pixels left out), its thread count now and its
  // num_workers=auto decisions numbered `from_decision` and up.
  nlohmann::json loader_json(const loader::LoaderStats& from, int64_t from_decision) const {
    if (!loader) return nullptr;
    const loader::LoaderStats now = loader->stats();
    const loader::LoaderHistograms h = loader->histograms();
    std::vector<loader::ThreadDecision> decisions = loader->thread_decisions();
    std::erase_if(decisions, [&](const loader::ThreadDecision& d) { return d.number < from_decision; });
    nlohmann::json j = fields::to_json(fields::difference(now, from));
    j.erase("decoded_pixels");
    const int workers = loader->options().num_workers;
    j.update({{"num_workers", workers == loader::kAutoNumWorkers ? nlohmann::json("auto") : nlohmann::json(workers)},
              {"threads", loader->num_threads()},
              {"prefetch_depth", loader->prefetch_depth()},
              {"thread_decisions", fields::to_json(decisions)},
              {"read", histogram_json(h.read)},
              {"decode", histogram_json(h.decode)},
              {"resize", histogram_json(h.resize)}});
    return j;
  }

  // NVML readings since the last call: into the sums, the trace's counters and the record.
  void drain_nvml() {
    if (!nvml) return;
    for (const GpuSample& g : nvml->take()) {
      for (StepBreakdown* b : {&window, &epoch_sum, &run_sum, &steady_sum}) {
        if (b == &steady_sum && run_sum.steps < options.warmup_steps) continue;
        b->gpu_util_percent_sum += g.util_percent;
        b->gpu_util_samples += 1;
      }
      if (trace) {
        TraceEvent c;
        c.kind = TraceEvent::Kind::kCounter;
        c.track = kCounterTrack;
        c.begin_ns = g.time_ns;
        c.name = "NVML utilization %";
        c.keys[0] = "gpu";
        c.values[0] = g.util_percent;
        c.keys[1] = "memory";
        c.values[1] = g.mem_util_percent;
        trace->add(c);
        c.name = "GPU memory used (GiB)";
        c.keys[0] = "used";
        c.values[0] = static_cast<double>(g.mem_used_bytes) / (1 << 30);
        c.keys[1] = nullptr;
        trace->add(c);
        c.name = "SM clock (MHz)";
        c.keys[0] = "sm";
        c.values[0] = g.sm_clock_mhz;
        trace->add(c);
      }
    }
  }

  // The step's times are final: account them, trace them, maybe write a "steps" record.
  void complete(const Step& st) {
    StepBreakdown b;
    b.steps = 1;
    b.images = st.images;
    b.skipped = st.skipped;
    b.wall_ms = ms(st.end_ns - st.begin_ns);
    b.slots_ready_sum = st.slots.ready;
    b.slots_in_flight_sum = st.slots.in_flight;
    std::vector<TraceEvent> host, device_spans;
    const auto span = [](std::vector<TraceEvent>& out, int track, const char* name, int64_t from,
                         int64_t to, int64_t id) {
      if (to <= from && id < 0) return;  // zero-length phases (no all-reduce) are not drawn
      TraceEvent e;
      e.name = name;
      e.track = track;
      e.begin_ns = from;
      e.dur_ns = std::max<int64_t>(0, to - from);
      e.id = id;
      out.push_back(e);
    };
    span(host, kHostTrack, "step", st.begin_ns, st.end_ns, st.global);
    if (gpu) {
      b.gpu = true;
      b.data_wait_ms = ms(st.ready_ns - st.begin_ns);
      span(host, kHostTrack, "data wait", st.begin_ns, st.ready_ns, -1);
      const int64_t r = mark_ns(*st.m_ready), f = mark_ns(*st.m_fb), a = mark_ns(*st.m_ar),
                    o = mark_ns(*st.m_opt), e = mark_ns(*st.m_end);
      b.compute_ms = ms(f - r);
      b.allreduce_ms = ms(a - f);
      b.optimizer_ms = ms(o - a);
      b.gpu_busy_ms = ms(e - r);
      span(device_spans, kComputeTrack, "step", r, e, st.global);
      span(device_spans, kComputeTrack, "forward+backward", r, f, -1);
      span(device_spans, kComputeTrack, "all-reduce", f, a, -1);
      span(device_spans, kComputeTrack, "optimizer", a, o, -1);
      if (st.copy_begin && st.copy_end) {
        const int64_t c0 = mark_ns(*st.copy_begin), c1 = mark_ns(*st.copy_end);
        b.h2d_ms = ms(c1 - c0);
        span(device_spans, kCopyTrack, "H2D copy+convert", c0, c1, st.batch_index);
      }
    } else {
      const int64_t next_ns = st.ready_ns - st.begin_ns;
      const auto wait_ns = std::min<int64_t>(next_ns, std::llround(st.reported_wait_ms * 1e6));
      b.data_wait_ms = ms(wait_ns);
      b.h2d_ms = ms(next_ns - wait_ns);
      b.compute_ms = ms(st.fb_ns - st.ready_ns);
      b.allreduce_ms = ms(st.ar_ns - st.fb_ns);
      b.optimizer_ms = ms(st.opt_ns - st.ar_ns);
      span(host, kHostTrack, "data wait", st.begin_ns, st.begin_ns + wait_ns, -1);
      span(host, kHostTrack, "convert", st.begin_ns + wait_ns, st.ready_ns, -1);
    }
    span(host, kHostTrack, "forward+backward", st.ready_ns, st.fb_ns, -1);
    span(host, kHostTrack, "all-reduce", st.fb_ns, st.ar_ns, -1);
    span(host, kHostTrack, "optimizer", st.ar_ns, st.opt_ns, -1);
    span(host, kHostTrack, "metrics+sync", st.opt_ns, st.end_ns, -1);
    if (trace) {
      trace->add_group(host);
      if (!device_spans.empty()) trace->add_group(device_spans);
    }
    if (gpu) last_busy_fraction = b.gpu_busy_fraction();
    window.add(b);
    epoch_sum.add(b);
    if (run_sum.steps >= options.warmup_steps) steady_sum.add(b);
    run_sum.add(b);
    if (window.steps >= options.metrics_every_steps) flush_window();
  }

  void flush_window() {
    drain_nvml();
    if (window.steps == 0) return;
    nlohmann::json j = breakdown_json(window);
    j["type"] = "steps";
    j["epoch"] = epoch;
    j["first_step"] = window_first_step;
    j["last_step"] = window_first_step + window.steps - 1;
    j["t_s"] = ms(now_ns() - origin_ns) / 1000.0;
    write_record(j);
    window_first_step += window.steps;
    window = StepBreakdown{};
  }

  // Reads the GPU times of ended steps; with `block`, waits for all of them.
  void resolve(bool block) {
    while (!pending.empty() && (block || pending.front().m_end->reached())) {
      Step st = std::move(pending.front());
      pending.pop_front();
      complete(st);
    }
  }

  void progress() {
    if (!options.on_progress) return;
    double wall = 0, wait = 0, images = 0;
    for (const auto& r : recent) {
      wall += r[0];
      wait += r[1];
      images += r[2];
    }
    ProgressSnapshot p;
    p.epoch = epoch;
    p.epochs = run.epochs;
    p.step = step_in_epoch;
    p.steps_per_epoch = run.steps_per_epoch;
    p.elapsed_s = trained_ms / 1000.0;
    const double mean_ms = recent.empty() ? 0 : wall / static_cast<double>(recent.size());
    const int64_t left = std::max<int64_t>(
        0, run.epochs * run.steps_per_epoch - (epoch * run.steps_per_epoch + step_in_epoch));
    p.eta_s = mean_ms * static_cast<double>(left) / 1000.0;
    p.images_per_s = wall > 0 ? images / (wall / 1000.0) : 0;
    p.data_wait_fraction = wall > 0 ? wait / wall : 0;
    if (nvml && nvml->available()) {
      if (auto g = nvml->latest()) p.gpu_percent = g->util_percent;
    } else if (last_busy_fraction) {
      p.gpu_percent = 100.0 * *last_busy_fraction;
    }
    options.on_progress(p);
  }

  void name_tracks() {
    trace->name_track(kHostTrack, gpu ? "host: step phases (launch)" : "step phases (wall clock)",
                      0);
    if (gpu) {
      trace->name_track(kComputeTrack, "GPU compute stream", 1);
      trace->name_track(kCopyTrack, "GPU copy stream (H2D)", 2);
    }
    for (int k = 0; k <= std::max(1, run.num_workers); ++k) {
      trace->name_track(kLoaderTrack0 + k, "loader thread " + std::to_string(k), 10 + k);
    }
  }

  void install_observer() {
    if (!loader || !trace) return;
    loader->set_sample_observer([t = trace](const loader::SampleTiming& s) {
      const int track = kLoaderTrack0 + s.thread;
      const int64_t d0 = s.start_ns + s.read_ns, z0 = d0 + s.decode_ns, end = z0 + s.resize_ns;
      TraceEvent ev[4];
      ev[0].name = "sample";
      ev[0].begin_ns = s.start_ns;
      ev[0].dur_ns = end - s.start_ns;
      ev[0].id = s.index;
      ev[1].name = "read";
      ev[1].begin_ns = s.start_ns;
      ev[1].dur_ns = s.read_ns;
      ev[2].name = "decode";
      ev[2].begin_ns = d0;
      ev[2].dur_ns = s.decode_ns;
      ev[3].name = "resize";
      ev[3].begin_ns = z0;
      ev[3].dur_ns = s.resize_ns;
      for (auto& e : ev) e.track = track;
      t->add_group(ev);
    });
  }
};

Profiler::Profiler(ProfileOptions options, RunInfo run, loader::Loader* loader)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.options = std::move(options);
  m.run = std::move(run);
  m.loader = loader;
  m.options.metrics_every_steps = std::max<int64_t>(1, m.options.metrics_every_steps);
  m.device_index = device::parse_device(m.run.device);
  m.gpu = m.device_index >= 0;
  if (m.gpu) {
    const int64_t before = now_ns();
    m.ref_mark = m.mark();
    m.ref_mark->ms_since(*m.ref_mark);  // waits for it: the stream is idle before training
    m.ref_host_ns = before;
    if (m.options.nvml) {
      NvmlOptions no;
      no.library = m.options.nvml_library;
      no.interval_ms = m.options.nvml_interval_ms;
      no.pci_bus_id = device::pci_bus_id(m.device_index);
      m.nvml = std::make_unique<NvmlSampler>(no);
      m.nvml_status =
          m.nvml->available()
              ? "sampled every " + std::to_string(static_cast<int>(no.interval_ms)) + " ms"
              : "unavailable: " + m.nvml->unavailable_reason();
      if (!m.nvml->available()) {
        gpufeed::log_text(LogLevel::kInfo, "profiler: NVML " + m.nvml_status);
        m.nvml.reset();
      }
    } else {
      m.nvml_status = "off";
    }
  }
  if (m.options.metrics_path) {
    if (m.options.metrics_path->has_parent_path()) {
      std::filesystem::create_directories(m.options.metrics_path->parent_path());
    }
    m.metrics.open(*m.options.metrics_path, std::ios::trunc);
    if (!m.metrics) {
      throw std::runtime_error("profiler: cannot write metrics to " +
                               m.options.metrics_path->string());
    }
  }
  if (m.options.trace_path) {
    m.trace = std::make_shared<TraceRecorder>(
        static_cast<size_t>(std::max<int64_t>(2, m.options.trace_max_events)), m.origin_ns);
    m.name_tracks();
    m.install_observer();
  }
  if (m.loader) m.loader_start = m.loader->stats();
  m.write_record({{"type", "run"},
                  {"device", m.run.device},
                  {"model", m.run.model},
                  {"epochs", m.run.epochs},
                  {"steps_per_epoch", m.run.steps_per_epoch},
                  {"batch_size", m.run.batch_size},
                  {"num_workers", m.run.num_workers},
                  {"hardware_threads", m.run.hardware_threads},
                  {"cpu_budget", m.run.cpu_budget},
                  {"prefetch_depth", m.run.prefetch_depth},
                  {"image_size", m.run.image_size},
                  {"metrics_every_steps", m.options.metrics_every_steps},
                  {"timing", m.gpu ? "cuda_events" : "wall_clock"},
                  {"allreduce_measured", m.run.allreduce},
                  {"nvml", m.nvml_status}});
}

Profiler::~Profiler() {
  if (impl_->loader && impl_->trace) impl_->loader->set_sample_observer({});
}

void Profiler::begin_epoch(int64_t epoch) {
  Impl& m = *impl_;
  m.epoch = epoch;
  m.step_in_epoch = 0;
  m.epoch_sum = StepBreakdown{};
  m.recent.clear();
  if (m.loader) {
    m.epoch_loader_start = m.loader->stats();
    const auto d = m.loader->thread_decisions();
    m.epoch_decision_start = d.empty() ? 0 : d.back().number + 1;
  }
}

void Profiler::step_begin() {
  Impl& m = *impl_;
  m.open.emplace();
  m.open->begin_ns = now_ns();
  if (m.loader) m.open->slots = m.loader->slot_counts();
  if (m.trace && m.loader) {
    TraceEvent c;
    c.kind = TraceEvent::Kind::kCounter;
    c.track = kCounterTrack;
    c.name = "loader slots";
    c.begin_ns = m.open->begin_ns;
    c.keys[0] = "ready";
    c.values[0] = m.open->slots.ready;
    c.keys[1] = "in_flight";
    c.values[1] = m.open->slots.in_flight;
    c.keys[2] = "held";
    c.values[2] = m.open->slots.held;
    m.trace->add(c);
  }
}

void Profiler::batch_ready(const ReadyBatch& batch) {
  Impl& m = *impl_;
  if (!m.open) step_begin();
  Impl::Step& st = *m.open;
  st.ready_ns = now_ns();
  st.reported_wait_ms = batch.wait_ms;
  st.batch_index = batch.batch_index;
  st.skipped = batch.skipped;
  st.copy_begin = batch.copy_begin;
  st.copy_end = batch.copy_end;
  st.m_ready = m.mark();
  st.fb_ns = st.ar_ns = st.opt_ns = st.ready_ns;
}

void Profiler::phase_done(Phase phase) {
  Impl& m = *impl_;
  if (!m.open) return;
  Impl::Step& st = *m.open;
  const int64_t t = now_ns();
  switch (phase) {
    case Phase::kForwardBackward:
      st.fb_ns = st.ar_ns = st.opt_ns = t;
      st.m_fb = m.mark();
      break;
    case Phase::kAllReduce:
      if (!m.run.allreduce) break;  // no all-reduce: zero-length, m_ar falls back to m_fb
      st.ar_ns = st.opt_ns = t;
      st.m_ar = m.mark();
      break;
    case Phase::kOptimizer:
      st.opt_ns = t;
      st.m_opt = m.mark();
      break;
  }
}

void Profiler::step_end(int64_t images) {
  Impl& m = *impl_;
  if (!m.open) return;
  Impl::Step st = std::move(*m.open);
  m.open.reset();
  st.end_ns = now_ns();
  st.images = images;
  st.epoch = m.epoch;
  st.global = m.global_step++;
  st.in_epoch = ++m.step_in_epoch;
  if (m.gpu) {
    // Phases the trainer did not mark take no GPU time: they share the previous mark.
    st.m_end = m.mark();
    if (!st.m_ready) st.m_ready = st.m_end;
    if (!st.m_fb) st.m_fb = st.m_ready;
    if (!st.m_ar) st.m_ar = st.m_fb;
    if (!st.m_opt) st.m_opt = st.m_ar;
  }
  const double wall = ms(st.end_ns - st.begin_ns);
  const double wait = m.gpu ? ms(st.ready_ns - st.begin_ns)
                            : std::min(ms(st.ready_ns - st.begin_ns), st.reported_wait_ms);
  m.trained_ms += wall;
  m.recent.push_back({wall, wait, static_cast<double>(images)});
  if (m.recent.size() > 20) m.recent.pop_front();
  if (m.gpu) {
    m.pending.push_back(std::move(st));
    m.resolve(false);
  } else {
    m.complete(st);
  }
  m.progress();
}

StepBreakdown Profiler::end_epoch() {
  Impl& m = *impl_;
  m.open.reset();  // a step_begin whose next() found the epoch's end
  m.resolve(true);
  m.flush_window();
  nlohmann::json j = m.breakdown_json(m.epoch_sum);
  j["type"] = "epoch";
  j["epoch"] = m.epoch;
  j["t_s"] = ms(now_ns() - m.origin_ns) / 1000.0;
  j["loader"] = m.loader_json(m.epoch_loader_start, m.epoch_decision_start);
  m.write_record(j);
  return m.epoch_sum;
}

RunProfile Profiler::finish() {
  Impl& m = *impl_;
  if (m.finished) throw std::logic_error("Profiler::finish called twice");
  m.finished = true;
  m.open.reset();
  m.resolve(true);
  m.flush_window();
  if (m.loader && m.trace) m.loader->set_sample_observer({});

  RunProfile p;
  p.steps = m.run_sum;
  const bool skip_warmup = m.steady_sum.steps > 0 && m.run_sum.steps > 2 * m.options.warmup_steps;
  p.steady = skip_warmup ? m.steady_sum : m.run_sum;
  p.warmup_steps_excluded = p.steps.steps - p.steady.steps;
  p.allreduce_measured = m.run.allreduce;
  p.nvml_status = m.nvml_status;
  VerdictInputs in;
  in.steps = p.steady;
  if (m.loader) {
    p.loader = fields::difference(m.loader->stats(), m.loader_start);
    p.histograms = m.loader->histograms();
    in.loader_samples = p.loader.samples;
    in.loader_read_s = p.loader.read_s;
    in.loader_decode_s = p.loader.decode_s;
    in.loader_resize_s = p.loader.resize_s;
  }
  in.num_workers = m.run.num_workers;
  // num_workers auto: the verdict judges the count the loader ended with.
  if (m.loader && m.loader->options().num_workers == loader::kAutoNumWorkers) in.num_workers = m.loader->num_threads();
  if (m.loader) in.prefetch_depth = m.loader->prefetch_depth();
  in.hardware_threads = m.run.hardware_threads;
  in.cpu_budget = m.run.cpu_budget;
  in.prefetch_depth = m.run.prefetch_depth;
  in.gpu = m.gpu;
  in.allreduce = m.run.allreduce;
  p.verdict = make_verdict(in);

  nlohmann::json j = m.breakdown_json(m.run_sum);
  j["type"] = "summary";
  j["t_s"] = ms(now_ns() - m.origin_ns) / 1000.0;
  j["loader"] = m.loader_json(m.loader_start, 0);
  j["nvml"] = m.nvml_status;
  j["steady"] = m.breakdown_json(p.steady);
  j["warmup_steps_excluded"] = p.warmup_steps_excluded;
  j["allreduce_measured"] = m.run.allreduce;
  const Verdict& v = p.verdict;
  j["verdict"] = fields::to_json(v);
  m.write_record(j);
  if (m.trace) {
    const nlohmann::json info = {{"device", m.run.device},
                                 {"model", m.run.model},
                                 {"verdict", v.text},
                                 {"nvml", m.nvml_status}};
    m.trace->write(*m.options.trace_path, json_text(info));
    p.trace_events = static_cast<int64_t>(m.trace->size());
    p.trace_dropped = m.trace->dropped();
  }
  return p;
}

}  // namespace gpufeed::profiler
