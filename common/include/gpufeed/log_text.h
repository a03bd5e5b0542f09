#pragma once
// Logging for translation units that must not see spdlog or fmt: LibTorch bundles its own, newer
// fmt headers, which shadow Debian's fmt that spdlog 1.10 is built against. prefetch/, harness/
// and the torch-using tools log through these functions; they reach the same "gpufeed" logger as
// gpufeed::log() (gpufeed/log.h).

#include <string>

namespace gpufeed {

/// Severity, as spdlog's levels.
enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError };

/// Writes a preformatted message to the "gpufeed" logger at `level`. Thread-safe.
void log_text(LogLevel level, const std::string& message);

}  // namespace gpufeed
