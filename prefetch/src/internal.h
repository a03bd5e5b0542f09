#pragma once
#include "gpufeed/prefetch/prefetcher.h"

namespace gpufeed::prefetch {

/// A DeviceBatch carrying `host`'s metadata, tensors still empty.
DeviceBatch describe(const loader::Batch& host);

std::unique_ptr<Prefetcher> make_cpu_prefetcher(std::shared_ptr<loader::Loader> loader,
                                                const PrefetchOptions& options);
/// Defined in cuda_prefetcher.cpp, or in no_cuda.cpp (throws) when the CUDA path is off.
std::unique_ptr<Prefetcher> make_cuda_prefetcher(std::shared_ptr<loader::Loader> loader,
                                                 const PrefetchOptions& options);

}  // namespace gpufeed::prefetch
