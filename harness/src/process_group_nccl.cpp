// NCCL backend: built only with the CUDA path (nccl.h from the venv's nvidia-nccl wheel).
#include "process_group_backends.h"

#ifdef GPUFEED_WITH_CUDA
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <stdexcept>

namespace gpufeed::harness::internal {

#ifdef GPUFEED_WITH_CUDA
bool nccl_built() { return true; }

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size,
                                                    std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
}
#else
bool nccl_built() { return false; }

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>&, int,
                                                    int, std::chrono::milliseconds) {
  throw std::runtime_error("the NCCL backend needs gpufeed built with CUDA (GPUFEED_WITH_CUDA)");
}
#endif

}  // namespace gpufeed::harness::internal
