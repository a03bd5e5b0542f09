#pragma once
// /proc/self/status fields for the CLI's memory reports (bench, index).
#include <cstdint>
#include <fstream>
#include <string>

namespace gpufeed::tools {

/// A field of /proc/self/status in bytes ("VmRSS", "VmHWM"); 0 where unavailable.
inline int64_t proc_status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  }
  return 0;
}

}  // namespace gpufeed::tools
