#pragma once
// The console progress display of `gpufeed train`: a bar that redraws in place on a terminal, and
// plain periodic lines when the output is a file or a pipe (CI, logs).

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

namespace gpufeed::profiler {

/// Where training stands after a step, as the progress display shows it.
struct ProgressSnapshot {
  int64_t epoch = 0;  ///< 0-based
  int64_t epochs = 1;
  int64_t step = 0;  ///< steps done in this epoch (1-based after the first step)
  int64_t steps_per_epoch = 0;
  double elapsed_s = 0;           ///< training time so far (all epochs, evaluation excluded)
  double eta_s = 0;               ///< estimated training time left (all epochs)
  double images_per_s = 0;        ///< over the recent steps
  double data_wait_fraction = 0;  ///< over the recent steps, 0..1
  /// GPU utilization 0..100 (NVML, or the event-based busy fraction); absent on the CPU.
  std::optional<double> gpu_percent;
};

/// How the display draws.
enum class ProgressMode {
  kAuto,   ///< kBar when the stream is a terminal, else kLines
  kBar,    ///< one line redrawn in place ("\r" and erase-to-end-of-line)
  kLines,  ///< a plain line every `line_interval_s` seconds of training and at each epoch's end
  kOff,    ///< nothing
};

/// Parses "auto", "bar", "lines" (or "plain") and "off"; throws std::invalid_argument otherwise.
ProgressMode parse_progress_mode(const std::string& text);

/// Draws ProgressSnapshots on a stream. Not thread-safe; call from the training thread.
class ProgressPrinter {
 public:
  /// `is_terminal` decides kAuto (pass isatty(fileno(stdout)) for std::cout). Bars redraw at most
  /// every `bar_interval_s` and lines are printed every `line_interval_s`, both measured in the
  /// snapshots' elapsed_s (so output depends only on the snapshots, never on a clock).
  ProgressPrinter(std::ostream& out, ProgressMode mode, bool is_terminal,
                  double line_interval_s = 10.0, double bar_interval_s = 0.1);
  /// Shows `s` if it is time to (always at an epoch's last step).
  void update(const ProgressSnapshot& s);
  /// Ends a bar's line so that other output can follow (no-op for lines, or when nothing is drawn).
  void break_line();
  /// The mode in force after resolving kAuto.
  ProgressMode mode() const { return mode_; }

  /// The one-line text of a snapshot, e.g.
  /// "epoch 1/3 [#######.........] 12/40  ETA 0:01:05  512.3 img/s  data-wait 37%  GPU 61%".
  static std::string format(const ProgressSnapshot& s, int bar_width = 20);
  /// Seconds as H:MM:SS.
  static std::string format_duration(double seconds);

 private:
  std::ostream& out_;
  ProgressMode mode_;
  double line_interval_s_, bar_interval_s_;
  double last_drawn_s_ = -1e300;
  bool bar_open_ = false;
};

}  // namespace gpufeed::profiler
