# LibTorch from the venv's PyPI wheel, found through torch.utils.cmake_prefix_path.
set(GPUFEED_PYTHON_FOR_TORCH "${PROJECT_SOURCE_DIR}/.venv/bin/python" CACHE FILEPATH
    "Python whose torch package provides LibTorch")
execute_process(
  COMMAND ${GPUFEED_PYTHON_FOR_TORCH} -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
  OUTPUT_VARIABLE GPUFEED_TORCH_PREFIX OUTPUT_STRIP_TRAILING_WHITESPACE
  RESULT_VARIABLE _torch_rc)
if(NOT _torch_rc EQUAL 0)
  message(FATAL_ERROR "Cannot import torch from ${GPUFEED_PYTHON_FOR_TORCH}: run ./setup.sh first")
endif()
list(APPEND CMAKE_PREFIX_PATH "${GPUFEED_TORCH_PREFIX}")

# The wheel is built for CUDA 13.0; its TorchConfig needs the toolkit at configure time (no GPU).
# Build kernels for Ampere and Hopper (the H200) only, not every architecture.
if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "8.0;9.0")
endif()
find_package(Torch REQUIRED)

# The torch side of the CUDA path (prefetch/'s CUDA prefetcher, the harness's CUDA code): the
# device room's CUDA path and a CUDA LibTorch.
set(GPUFEED_TORCH_CUDA OFF)
if(GPUFEED_CUDA_ENABLED AND TORCH_CUDA_LIBRARIES)
  set(GPUFEED_TORCH_CUDA ON)
endif()
message(STATUS "gpufeed: LibTorch ${Torch_VERSION} from ${GPUFEED_TORCH_PREFIX}; CUDA path: ${GPUFEED_TORCH_CUDA}")

# TORCH_LIBRARIES carries torch's own flags; expose one interface target for our rooms.
# libtorch.so exports its own, statically linked copy of std::filesystem (64 symbols); when it
# precedes libstdc++ in an executable's DT_NEEDED list those copies interpose the system's, and
# its remove_all jumps through a null pointer. Naming libstdc++ first makes the dynamic linker
# resolve std::filesystem to the system library, for our code and for torch's.
add_library(gpufeed_torch INTERFACE)
target_link_libraries(gpufeed_torch INTERFACE stdc++ ${TORCH_LIBRARIES})
target_include_directories(gpufeed_torch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
if(GPUFEED_TORCH_CUDA)
  target_compile_definitions(gpufeed_torch INTERFACE GPUFEED_WITH_CUDA=1)
endif()
