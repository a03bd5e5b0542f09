#pragma once
#include <cuda_runtime_api.h>

/// Enqueues one kernel that busy-waits about `ms` milliseconds at an SM clock of `clock_khz`
/// (cudaDevAttrClockRate) on `stream`.
cudaError_t launch_spin(double ms, int clock_khz, cudaStream_t stream);
