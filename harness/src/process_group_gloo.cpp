// Compiled with gloo_shim/ on the include path: see gloo_shim/README.md.
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "process_group_backends.h"

namespace gpufeed::harness::internal {

c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size,
                                                    std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create_default(timeout);
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
}

}  // namespace gpufeed::harness::internal
