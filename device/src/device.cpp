// The parts of gpufeed/device/cuda.h and normalize.h that need no CUDA runtime.
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "gpufeed/device/cuda.h"
#include "gpufeed/device/normalize.h"

namespace gpufeed::device {

int current_device_or_throw();  // cuda.cpp, or no_cuda.cpp (throws)

int parse_device(const std::string& name) {
  if (name == "cpu") return -1;
  if (name == "cuda") return current_device_or_throw();
  if (name.rfind("cuda:", 0) == 0 && name.size() > 5 && name.size() <= 9) {
    const std::string digits = name.substr(5);
    if (digits.find_first_not_of("0123456789") == std::string::npos) return std::stoi(digits);
  }
  throw std::invalid_argument("device must be 'cpu', 'cuda' or 'cuda:N', not '" + name + "'");
}

int64_t element_size(OutputType type) {
  switch (type) {
    case OutputType::kUInt8:
      return 1;
    case OutputType::kFloat32:
      return 4;
    case OutputType::kBFloat16:
    case OutputType::kFloat16:
      return 2;
  }
  throw std::invalid_argument("element_size: unknown OutputType");
}

NormalizeConstants normalize_constants(const NormalizeOptions& n) {
  NormalizeConstants c{};
  for (size_t i = 0; i < 3; ++i) {
    c.scale[i] = 1.0f / (255.0f * n.std[i]);
    c.shift[i] = n.mean[i] / n.std[i];
  }
  return c;
}

}  // namespace gpufeed::device
