#include "gpufeed/sampler/randperm.h"

#include <numeric>
#include <random>
#include <stdexcept>
#include <utility>

namespace gpufeed::sampler {

std::vector<int64_t> randperm(int64_t n, uint64_t seed) {
  if (n < 0) throw std::invalid_argument("randperm: n must be >= 0, got " + std::to_string(n));
  std::vector<int64_t> r(static_cast<size_t>(n));
  std::iota(r.begin(), r.end(), int64_t{0});
  // at::mt19937(seed) keeps only the low 32 bits, then initialises exactly as std::mt19937.
  std::mt19937 engine(static_cast<uint32_t>(seed & 0xffffffffu));
  // PyTorch draws 32-bit values while n < 2^32 / 20 and 64-bit values (two draws, high word
  // first) above that; datasets never reach the second regime, but keep it exact.
  const bool small = n < static_cast<int64_t>(std::numeric_limits<uint32_t>::max() / 20);
  for (int64_t i = 0; i + 1 < n; ++i) {
    uint64_t draw;
    if (small) {
      draw = engine();
    } else {
      const uint64_t hi = engine();
      const uint64_t lo = engine();
      draw = (hi << 32) | lo;
    }
    const auto z = static_cast<int64_t>(draw % static_cast<uint64_t>(n - i));
    std::swap(r[i], r[i + z]);
  }
  return r;
}

}  // namespace gpufeed::sampler
