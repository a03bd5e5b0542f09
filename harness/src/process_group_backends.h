#pragma once
// The c10d backends behind ProcessGroup, each in its own translation unit: Gloo's header needs
// the declaration-only gloo stand-ins (gloo_shim/), NCCL's needs nccl.h and a CUDA build.
#include <chrono>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace gpufeed::harness::internal {

/// c10d::ProcessGroupGloo over `store` with its default device (GLOO_SOCKET_IFNAME, or this
/// host's name, or the loopback address).
c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size,
                                                    std::chrono::milliseconds timeout);

/// c10d::ProcessGroupNCCL over `store`. Throws std::runtime_error in a build without CUDA.
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size,
                                                    std::chrono::milliseconds timeout);

/// True when make_nccl_backend can work in this build.
bool nccl_built();

}  // namespace gpufeed::harness::internal
