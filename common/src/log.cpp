#include "gpufeed/log.h"

#include <mutex>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace gpufeed {

std::shared_ptr<spdlog::logger> log() {
  // Looked up on every call (not cached) so an application that registers its own "gpufeed"
  // logger, or drops ours, is always honoured; logging is off the hot path.
  if (auto logger = spdlog::get("gpufeed")) return logger;
  // Two threads may miss at once; the mutex makes exactly one create it. An application could
  // still register its own in between, in which case registration throws and we use theirs.
  static std::mutex create_mutex;
  std::lock_guard lock(create_mutex);
  if (auto logger = spdlog::get("gpufeed")) return logger;
  try {
    return spdlog::stderr_color_mt("gpufeed");
  } catch (const spdlog::spdlog_ex&) {
    if (auto logger = spdlog::get("gpufeed")) return logger;
    throw;
  }
}

}  // namespace gpufeed

#include "gpufeed/log_text.h"

namespace gpufeed {
namespace {

spdlog::level::level_enum to_spdlog(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace: return spdlog::level::trace;
    case LogLevel::kDebug: return spdlog::level::debug;
    case LogLevel::kInfo: return spdlog::level::info;
    case LogLevel::kWarn: return spdlog::level::warn;
    case LogLevel::kError: return spdlog::level::err;
  }
  return spdlog::level::info;
}

}  // namespace

void log_text(LogLevel level, const std::string& message) {
  log()->log(to_spdlog(level), "{}", message);
}

}  // namespace gpufeed
