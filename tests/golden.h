#pragma once
// Loads golden values that tests/goldens/make_goldens.py computed with the venv's PyTorch and
// torchvision at test time (ctest runs it first as the `make_goldens` fixture).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace gpufeed::test {

inline std::filesystem::path golden_path(const std::string& name) {
  return std::filesystem::path(GPUFEED_GOLDEN_DIR) / name;
}

/// Parses a golden JSON file; fails the test (with the command to make it) when it is missing.
inline nlohmann::json load_golden(const std::string& name) {
  const auto path = golden_path(name);
  std::ifstream in(path);
  if (!in) {
    // GoogleTest reports an escaping exception as a failure of the running test.
    throw std::runtime_error("missing golden file " + path.string() +
                             ": run `ctest -R make_goldens` or " GPUFEED_PYTHON
                             " tests/goldens/make_goldens.py --out " GPUFEED_GOLDEN_DIR);
  }
  return nlohmann::json::parse(in);
}

/// The shared data folder (../shared), or empty when this checkout has none.
inline std::filesystem::path shared_dir() {
  std::filesystem::path p(GPUFEED_SHARED_DIR);
  return std::filesystem::exists(p) ? p : std::filesystem::path();
}

}  // namespace gpufeed::test
