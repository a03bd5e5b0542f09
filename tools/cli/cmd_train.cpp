// gpufeed train: a ResNet on an ImageFolder, fed by gpufeed, with per-epoch reports. Runs as one
// process, as one rank of a distributed job (gpufeed launch, torchrun, srun), or DataParallel.
// SIGINT/SIGTERM: before the first training step (e.g. waiting in rendezvous), exit 130/143 at
// once; after it, finish the current step, write the training checkpoint, exit 130/143; a second
// SIGINT exits at once.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>

#include "commands.h"
#include "schema_cli.h"
#include "gpufeed/option.h"
#include "test_faults.h"
#include "torch_errors.h"
#include "gpufeed/harness/torch_file.h"
#include "gpufeed/harness/trainer.h"

namespace gpufeed::tools {
namespace {

// printf-style formatting: fmt is off limits in torch translation units (see CMakeLists.txt).
std::string format(const char* f, ...) {
  char buf[512];
  va_list args;
  va_start(args, f);
  std::vsnprintf(buf, sizeof buf, f, args);
  va_end(args);
  return buf;
}

std::atomic<int> g_stop_signal{0};
// Set by the trainer just before its first step (TrainOptions::steps_started). Until then
// (rendezvous with a master that may never come, dataset listing, model setup) there is nothing
// to checkpoint, so a stop signal ends the process at once instead of waiting for a step.
std::atomic<bool> g_steps_started{false};
static_assert(std::atomic<bool>::is_always_lock_free, "read in a signal handler");

// Before the first step: exit 128 + signal now. Then: the first SIGINT/SIGTERM asks the trainer
// to stop after this step (checkpoint, exit 128 + signal); a second SIGINT leaves at once.
extern "C" void on_stop_signal(int sig) {
  if (!g_steps_started.load()) {
    static const char int_msg[] = "gpufeed: SIGINT before the first training step: exiting now (nothing to checkpoint yet)\n";
    static const char term_msg[] = "gpufeed: SIGTERM before the first training step: exiting now (nothing to checkpoint yet)\n";
    const bool is_int = sig == SIGINT;
    [[maybe_unused]] ssize_t w = ::write(STDERR_FILENO, is_int ? int_msg : term_msg,
                                         (is_int ? sizeof int_msg : sizeof term_msg) - 1);
    ::_exit(128 + sig);
  }
  int expected = 0;
  if (!g_stop_signal.compare_exchange_strong(expected, sig) && sig == SIGINT) {
    static const char msg[] = "gpufeed: second SIGINT, exiting now (no further checkpoint is written)\n";
    [[maybe_unused]] ssize_t w = ::write(STDERR_FILENO, msg, sizeof msg - 1);
    ::_exit(128 + SIGINT);
  }
}

void install_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  // A peer that exits closes its sockets; writing to them must fail with EPIPE, not kill us
  // (Python ignores SIGPIPE at startup for the same reason).
  signal(SIGPIPE, SIG_IGN);
}

// The step breakdown and the verdict, printed at the end of a run.
std::string profile_report(const profiler::RunProfile& p, const harness::TrainOptions& o) {
  const profiler::StepBreakdown& s = p.steps;
  const double n = static_cast<double>(std::max<int64_t>(1, s.steps));
  std::string out = format(
      "steps: %lld, per step %.1f ms: data wait %.1f ms, %s %.2f ms, forward+backward %.1f ms, "
      "all-reduce %.1f ms%s, optimizer %.1f ms (%s)\n",
      static_cast<long long>(s.steps), s.wall_ms / n, s.data_wait_ms / n,
      s.gpu ? "H2D copy" : "convert", s.h2d_ms / n, s.compute_ms / n, s.allreduce_ms / n,
      p.allreduce_measured ? "" : " (single process)", s.optimizer_ms / n,
      s.gpu ? "GPU times from CUDA events" : "wall clock");
  if (p.warmup_steps_excluded > 0) {
    const profiler::StepBreakdown& w = p.steady;
    const double m = static_cast<double>(std::max<int64_t>(1, w.steps));
    out += format("steady state (the %lld steps after the first %lld): per step %.1f ms, data wait %.1f ms, "
                  "%.0f img/s\n",
                  static_cast<long long>(w.steps), static_cast<long long>(p.warmup_steps_excluded),
                  w.wall_ms / m, w.data_wait_ms / m, w.images_per_s());
  }
  if (auto busy = s.gpu_busy_fraction()) {
    out += format("gpu: busy %.0f%% of step time (CUDA events)", 100 * *busy);
    if (auto util = s.gpu_util_percent()) out += format(", NVML utilization %.0f%%", *util);
    out += format("; NVML %s\n", p.nvml_status.c_str());
  }
  out += "verdict: " + options::spell_options(p.verdict.text, options::Front::kCli) + "\n";
  if (o.profile.metrics_path) out += "metrics: " + o.profile.metrics_path->string() + "\n";
  if (o.profile.trace_path) {
    out += format("trace: %s (%lld events", o.profile.trace_path->string().c_str(),
                  static_cast<long long>(p.trace_events));
    if (p.trace_dropped > 0) out += format(", %lld dropped", static_cast<long long>(p.trace_dropped));
    out += ")\n";
  }
  return out;
}

// The presets of --recipe: each published recipe as gpufeed train flags (torchvision's and
// FFCV's names mapped to ours; lr per 256 images, so the references' absolute rate is divided
// by their global batch / 256). Documented in docs/CLI.md ("Recipes").
struct Recipe {
  const char* name;
  const char* source;
  std::vector<std::pair<std::string, std::string>> flags;  // flag, value ("" for a switch)
  const char* not_covered;
};

const std::vector<Recipe>& recipes() {
  static const std::vector<Recipe> all = {
      {"torchvision-v2",
       "torchvision's classification references, the ResNet-50 \"new training recipe\" (V2 weights): "
       "8 GPUs x batch 128, lr 0.5",
       {{"--arch", "resnet50"}, {"--epochs", "600"}, {"--batch-size", "128"}, {"--lr", "0.125"},
        {"--momentum", "0.9"}, {"--lr-schedule", "cosine"}, {"--warmup-epochs", "5"},
        {"--warmup-start-factor", "0.01"}, {"--weight-decay", "2e-05"}, {"--norm-weight-decay", "0"},
        {"--label-smoothing", "0.1"}, {"--mixup-alpha", "0.2"}, {"--cutmix-alpha", "1.0"},
        {"--train-crop-size", "176"}, {"--val-resize-size", "232"}, {"--val-crop-size", "224"},
        {"--ra-sampler", ""}, {"--ra-reps", "4"}, {"--model-ema", ""}, {"--model-ema-steps", "32"},
        {"--model-ema-decay", "0.99998"}, {"--auto-augment", "ta_wide"}, {"--augment-interpolation", "bilinear"},
        {"--random-erase", "0.1"}},
       "nothing of the recipe's flags (the references' --interpolation bilinear is gpufeed's antialiased "
       "bilinear resize and --augment-interpolation bilinear); AMP is not part of a preset (pass --precision)"},
      {"ffcv-rn50",
       "FFCV's ImageNet ResNet-50 (ffcv-imagenet rn50_88_epochs.yaml): 8 GPUs x batch 512, lr 1.7",
       {{"--arch", "resnet50"}, {"--epochs", "88"}, {"--batch-size", "512"}, {"--lr", "0.10625"},
        {"--momentum", "0.9"}, {"--lr-schedule", "triangular"}, {"--lr-peak-epoch", "2"},
        {"--weight-decay", "1e-4"}, {"--norm-weight-decay", "0"}, {"--label-smoothing", "0.1"},
        // Progressive resizing: rn50_88_epochs.yaml's resolution section (min_res 160, max_res
        // 192, start_ramp 65, end_ramp 76; 0-based epochs as train_imagenet.py's get_resolution).
        {"--min-res", "160"}, {"--max-res", "192"}, {"--start-ramp", "65"}, {"--end-ramp", "76"},
        {"--val-crop-size", "256"}, {"--val-flip-average", ""}, {"--channels-last", ""}},
       "BlurPool, fp16 autocast (pass --precision), bn_wd's name match ('bn' in the name, which leaves "
       "downsample BatchNorms decayed); the ramp is the 88-epoch config's: with another --epochs pass "
       "that config's --start-ramp/--end-ramp"},
  };
  return all;
}

std::string recipe_names() {
  std::string names;
  for (const Recipe& r : recipes()) names += (names.empty() ? "" : ", ") + std::string(r.name);
  return names;
}

// Sets every flag of the recipe the command line did not give, through the flag's own parser
// and checks, and prints what it set.
void apply_recipe(CLI::App& app, const std::string& name) {
  const auto it = std::find_if(recipes().begin(), recipes().end(), [&](const Recipe& r) { return name == r.name; });
  if (it == recipes().end()) {
    throw std::invalid_argument("--recipe: unknown recipe '" + name + "' (known: " + recipe_names() + ")");
  }
  std::string set, kept;
  for (const auto& [flag, value] : it->flags) {
    CLI::Option* opt = app.get_option(flag);
    const std::string shown = value.empty() ? flag : flag + " " + value;
    if (opt->count() > 0) {
      kept += " " + flag + (opt->results().empty() ? "" : " " + opt->results().back());
      continue;
    }
    opt->clear();
    opt->add_result(value.empty() ? std::string("true") : value);
    opt->run_callback();
    set += " " + shown;
  }
  std::cout << "recipe " << it->name << " (" << it->source << "):" << set << "\n";
  if (!kept.empty()) std::cout << "  given explicitly, kept:" << kept << "\n";
  std::cout << "  not covered: " << it->not_covered << "\n" << std::flush;
}

// --log-samples: this rank's file ("{rank}" replaced), or none (no option, or a rank other than 0
// when the path has no "{rank}"). A header line names the columns.
std::shared_ptr<std::ofstream> open_sample_log(const std::string& given, int rank) {
  if (given.empty()) return nullptr;
  const std::optional<std::filesystem::path> path = harness::path_for_rank(given, rank);
  if (!path) return nullptr;
  auto out = std::make_shared<std::ofstream>(*path);
  if (!*out) throw std::runtime_error("train: cannot write --log-samples file " + path->string());
  *out << "# epoch\tstep\tindex (rank " << rank << ")\n";
  return out;
}

// The train command's flags: TrainOptions' rows and the loader's, index cache's and schedule's
// schema options (with this command's defaults), and the command's own (data, hooks, display).
struct TrainFlags {
  harness::TrainOptions o;
  SchemaFlags loader_flags, cache_flags, schedule_flags, train_flags;
  std::string data, val_data, log_samples, progress = "auto", recipe;
};

void add_data_flags(CLI::App& app, TrainFlags& f) {
  app.add_option("--data", f.data, "training set: ImageFolder root, flat folder of <class>_*.jpg, file list, or "
                 "WebDataset tar shards ('dir/train-{000000..000146}.tar', a folder of .tar files, a list of .tar "
                 "paths)")->required();
  app.add_option("--val-data", f.val_data, "validation set, same classes (evaluated after every epoch)");
  // The loader's flags (--batch-size, --num-workers, --image-size, --on-error, --auto-augment, ...),
  // from its schema (gpufeed/loader/loader.h), into TrainOptions::loader with its defaults (a batch
  // of 64 per process and micro-batch); the eval transform's are --val-resize-size and
  // --val-crop-size, the train crop's schedule --min-res/--max-res.
  f.loader_flags = add_schema_options(app, loader::loader_options_schema(), f.o.loader,
                                      {"train", "scale", "ratio", "resize_size", "max_image_size", "mean", "std"});
  f.cache_flags = add_schema_options(app, datasets::data_options_schema(), f.o.index_cache);
}

// TrainOptions' own flags (--arch, --epochs, --lr, ..., --resume: train_options_schema(),
// harness/src/train_options.cpp), the schedule's (--lr-schedule, --warmup-epochs, ...,
// --min-res: schedule_options.h), and --init-weights-exclude, a repeatable list.
void add_training_flags(CLI::App& app, TrainFlags& f) {
  f.schedule_flags = add_schema_options(app, harness::schedule_options_schema(), f.o.schedule);
  f.train_flags = add_schema_options(app, harness::train_options_schema(), f.o);
  app.add_option("--init-weights-exclude", f.o.init_weights_exclude,
                 "with --init-weights: keys left at their fresh initialisation, e.g. fc for a new "
                 "head (the key, a module prefix, or a whole-key regex); repeatable")
      ->take_all();
}

void add_command_flags(CLI::App& app, TrainFlags& f) {
  static const std::string recipe_help =
      "expand a published recipe's flags first (explicit flags override): " + recipe_names();
  app.add_option("--recipe", f.recipe, recipe_help);
  app.add_option("--log-samples", f.log_samples, "write the dataset index of every sample each optimizer step "
                 "consumed, as 'epoch<TAB>step<TAB>index' lines ({rank} in the path: every rank writes its own "
                 "file; without it only rank 0 writes); for checking sharding and reproducing a run");
  app.add_option("--progress", f.progress, "progress display: auto, bar, lines or off")
      ->capture_default_str()->check(CLI::IsMember({"auto", "bar", "lines", "plain", "off"}));
}

// Progressive resizing sets the train crop side of every epoch: a fixed --image-size beside it
// would be ignored, so both are refused.
void check_resolution_schedule(const TrainFlags& f) {
  if (f.o.schedule.resolution && f.loader_flags.given->count("image_size") > 0) {
    throw std::invalid_argument("--image-size/--train-crop-size and progressive resizing (--min-res, "
                                "--max-res, --end-ramp) both given: for a fixed size pass --min-res and "
                                "--max-res equal");
  }
}

// The parsed flags into f.o: the schema options (the training rows last: their finisher checks
// TrainOptions whole, TrainOptions::validate), the data paths, the stop checkpoint's default.
void resolve_options(TrainFlags& f) {
  f.loader_flags.apply();
  f.cache_flags.apply();
  f.schedule_flags.apply();
  check_resolution_schedule(f);
  harness::TrainOptions& o = f.o;
  o.data = f.data;
  if (!f.val_data.empty()) o.val_data = f.val_data;
  f.train_flags.apply();
  if (!o.save_checkpoint) {
    // A stopped run always leaves a checkpoint to resume from.
    o.save_checkpoint = o.checkpoint ? std::filesystem::path(o.checkpoint->string() + ".train.pt")
                                     : std::filesystem::path("gpufeed_train_checkpoint.pt");
    o.save_checkpoint_only_on_stop = true;
  }
}

// Each step: its samples into --log-samples, then the test hooks.
void set_step_hooks(harness::Trainer& trainer, const TrainFaults& faults, const std::string& log_samples) {
  const int rank = trainer.rank();
  const std::shared_ptr<std::ofstream> sample_log = open_sample_log(log_samples, rank);
  if (!faults.any_step_hook(rank) && !sample_log) return;
  trainer.set_step_callback([faults, rank, sample_log](const harness::StepStats& st) {
    if (sample_log) {
      for (const int64_t index : st.indices) *sample_log << st.epoch << '\t' << st.step << '\t' << index << '\n';
      sample_log->flush();
    }
    faults.after_step(rank, st.step);
  });
}

void print_setup(const harness::Trainer& trainer, const harness::TrainOptions& o) {
  std::cout << format("train: %s on %s, %lld classes, world %d, global batch %lld "
                      "(%lld x %lld accum x %d), lr %.4g (%g per 256)\n",
                      o.arch.c_str(), trainer.device().c_str(), static_cast<long long>(trainer.num_classes()),
                      trainer.world_size(), static_cast<long long>(trainer.global_batch()),
                      static_cast<long long>(o.loader.batch_size), static_cast<long long>(o.accum_steps),
                      trainer.world_size(), trainer.scaled_lr(), o.lr)
            << std::flush;
}

void print_epoch(const harness::EpochStats& st, int64_t epochs) {
  std::string line = format(
      "epoch %lld/%lld  image size %d  loss %.4f  top1 %.1f%%  images/s %.1f  data_wait %.1f%%  "
      "lr %.4g  time %.1fs",
      static_cast<long long>(st.epoch + 1), static_cast<long long>(epochs), st.image_size, st.loss,
      100 * st.top1, st.images_per_s, 100 * st.data_wait_fraction, st.lr, st.seconds);
  line += format("  threads %d", st.loader_threads);
  if (st.auto_threads) {
    line += format(" (auto, %lld change%s so far)", static_cast<long long>(st.thread_decisions),
                   st.thread_decisions == 1 ? "" : "s");
  }
  if (st.skipped_steps > 0) line += format("  skipped_steps %lld", static_cast<long long>(st.skipped_steps));
  if (st.skipped_samples > 0) line += format("  skipped_samples %lld", static_cast<long long>(st.skipped_samples));
  if (st.val_top1) {
    line += format("  val_loss %.4f  val_top1 %.1f%%  val_top5 %.1f%%", *st.val_loss, 100 * *st.val_top1,
                   100 * *st.val_top5);
  }
  std::cout << line << "\n";
  if (st.ema_val_top1) {
    std::cout << format("epoch %lld/%lld  EMA  val_loss %.4f  val_top1 %.1f%%  val_top5 %.1f%%\n",
                        static_cast<long long>(st.epoch + 1), static_cast<long long>(epochs), *st.ema_val_loss,
                        100 * *st.ema_val_top1, 100 * *st.ema_val_top5);
  }
  std::cout << std::flush;
}

// Trains with the resolved options; the exit code (128 + signal when stopped by one).
int run_train(TrainFlags& f) {
  harness::TrainOptions& o = f.o;
  // Ctrl-C / SIGTERM: finish the step, checkpoint, exit 128 + signal.
  install_signal_handlers();
  o.stop_flag = &g_stop_signal;
  o.steps_started = &g_steps_started;
  const TrainFaults faults = read_train_faults();
  faults.install_write_fault();
  auto main_rank = std::make_shared<bool>(false);
  auto printer = std::make_shared<profiler::ProgressPrinter>(
      std::cout, profiler::parse_progress_mode(f.progress), ::isatty(::fileno(stdout)) != 0);
  o.profile.on_progress = [printer, main_rank](const profiler::ProgressSnapshot& snap) {
    if (*main_rank) printer->update(snap);
  };
  harness::Trainer trainer(o);
  *main_rank = trainer.rank() == 0;
  set_step_hooks(trainer, faults, f.log_samples);
  if (*main_rank) print_setup(trainer, o);
  trainer.fit([&](const harness::EpochStats& st) {
    if (!*main_rank) return;
    printer->break_line();
    print_epoch(st, o.epochs);
  });
  if (const int sig = trainer.stopped(); sig != 0) {
    if (*main_rank) {
      std::cout << "stopped by signal " << sig << "; training checkpoint: " << trainer.last_checkpoint().string()
                << " (resume with --resume " << trainer.last_checkpoint().string() << ")\n" << std::flush;
    }
    return 128 + sig;
  }
  if (*main_rank) {
    if (o.checkpoint) std::cout << "checkpoint: " << o.checkpoint->string() << "\n";
    std::cout << profile_report(trainer.profile(), o) << std::flush;
  }
  return 0;
}

}  // namespace

Run add_train(CLI::App& app) {
  auto f = std::make_shared<TrainFlags>();
  add_data_flags(app, *f);
  add_training_flags(app, *f);
  add_command_flags(app, *f);
  return without_backtrace([f, &app] {
    if (!f->recipe.empty()) apply_recipe(app, f->recipe);  // before reading any flag
    resolve_options(*f);
    return run_train(*f);
  });
}

}  // namespace gpufeed::tools
