#pragma once
#include <cstdint>
#include <vector>

namespace gpufeed::sampler {

/// The permutation torch.randperm(n, generator=torch.Generator().manual_seed(seed)) returns on
/// the CPU, element for element: PyTorch seeds an mt19937 with the low 32 bits of the seed and
/// runs a forward swap loop, swapping r[i] with r[i + random() % (n - i)]. Proven against the
/// venv's PyTorch in tests/test_sampler.cpp. n >= 0; returns [n] indices.
std::vector<int64_t> randperm(int64_t n, uint64_t seed);

}  // namespace gpufeed::sampler
