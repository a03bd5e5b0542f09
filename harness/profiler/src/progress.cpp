#include "gpufeed/profiler/progress.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace gpufeed::profiler {

ProgressMode parse_progress_mode(const std::string& text) {
  if (text == "auto") return ProgressMode::kAuto;
  if (text == "bar") return ProgressMode::kBar;
  if (text == "lines" || text == "plain") return ProgressMode::kLines;
  if (text == "off" || text == "none") return ProgressMode::kOff;
  throw std::invalid_argument("progress mode must be auto, bar, lines or off, not '" + text + "'");
}

ProgressPrinter::ProgressPrinter(std::ostream& out, ProgressMode mode, bool is_terminal,
                                 double line_interval_s, double bar_interval_s)
    : out_(out),
      mode_(mode == ProgressMode::kAuto ? (is_terminal ? ProgressMode::kBar : ProgressMode::kLines)
                                        : mode),
      line_interval_s_(line_interval_s),
      bar_interval_s_(bar_interval_s) {}

std::string ProgressPrinter::format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) seconds = 0;
  const auto total = static_cast<long long>(std::llround(seconds));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", total / 3600, total / 60 % 60, total % 60);
  return buf;
}

std::string ProgressPrinter::format(const ProgressSnapshot& s, int bar_width) {
  std::string bar;
  if (bar_width > 0) {
    const double done =
        s.steps_per_epoch > 0
            ? std::clamp(static_cast<double>(s.step) / static_cast<double>(s.steps_per_epoch), 0.0,
                         1.0)
            : 0.0;
    const int filled = static_cast<int>(done * bar_width);
    bar = " [" + std::string(static_cast<size_t>(filled), '#') +
          std::string(static_cast<size_t>(bar_width - filled), '.') + "]";
  }
  char head[96];
  std::snprintf(head, sizeof head, "epoch %lld/%lld", static_cast<long long>(s.epoch + 1),
                static_cast<long long>(s.epochs));
  const std::string gpu =
      s.gpu_percent ? std::to_string(static_cast<int>(std::lround(*s.gpu_percent))) + "%" : "n/a";
  char tail[192];
  std::snprintf(tail, sizeof tail, " %lld/%lld  ETA %s  %.1f img/s  data-wait %.0f%%  GPU %s",
                static_cast<long long>(s.step), static_cast<long long>(s.steps_per_epoch),
                format_duration(s.eta_s).c_str(), s.images_per_s, 100.0 * s.data_wait_fraction,
                gpu.c_str());
  return head + bar + tail;
}

void ProgressPrinter::update(const ProgressSnapshot& s) {
  if (mode_ == ProgressMode::kOff) return;
  const bool epoch_end = s.steps_per_epoch > 0 && s.step >= s.steps_per_epoch;
  const double interval = mode_ == ProgressMode::kBar ? bar_interval_s_ : line_interval_s_;
  if (!epoch_end && s.elapsed_s - last_drawn_s_ < interval) return;
  last_drawn_s_ = s.elapsed_s;
  if (mode_ == ProgressMode::kBar) {
    out_ << '\r' << format(s) << "\x1b[K" << std::flush;
    bar_open_ = true;
  } else {
    out_ << format(s, 0) << '\n' << std::flush;
  }
}

void ProgressPrinter::break_line() {
  if (bar_open_) {
    out_ << '\n' << std::flush;
    bar_open_ = false;
  }
}

}  // namespace gpufeed::profiler
