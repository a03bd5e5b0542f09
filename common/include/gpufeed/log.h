#pragma once
// The one logger every gpufeed room writes to. Library code never prints to stdout/stderr
// directly; it logs here. The logger is named "gpufeed", writes to stderr by default, and an
// application may register its own spdlog logger under that name before first use to redirect it.

#include <memory>

#include <spdlog/logger.h>

namespace gpufeed {

/// Returns the process-wide "gpufeed" logger, creating a stderr logger on first use if the
/// application has not registered one. Thread-safe.
std::shared_ptr<spdlog::logger> log();

}  // namespace gpufeed
