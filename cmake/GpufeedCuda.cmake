# The CUDA path of the device room (and, with a CUDA LibTorch, of prefetch/ and harness/): on when
# GPUFEED_WITH_CUDA and the toolkit (nvcc) is found; no GPU is needed to build it.
set(GPUFEED_CUDART "shared" CACHE STRING
    "How gpufeed_device links the CUDA runtime: shared (libcudart.so, as LibTorch does) or static (the wheel)")
set_property(CACHE GPUFEED_CUDART PROPERTY STRINGS shared static)
set(GPUFEED_CUDA_ENABLED OFF)
if(GPUFEED_WITH_CUDA)
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    include(CheckLanguage)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      # Kernels for Ampere and Hopper (the H200), each as SASS and PTX (newer GPUs JIT the PTX).
      if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
        set(CMAKE_CUDA_ARCHITECTURES "80;90")
      endif()
      enable_language(CUDA)
      set(CMAKE_CUDA_STANDARD 17)  # CMake 3.25 knows no CUDA20 flags for nvcc
      set(GPUFEED_CUDA_ENABLED ON)
    endif()
  endif()
endif()
message(STATUS "gpufeed: CUDA path: ${GPUFEED_CUDA_ENABLED} (runtime ${GPUFEED_CUDART})")
