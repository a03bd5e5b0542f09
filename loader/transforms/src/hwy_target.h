#pragma once
// Google Highway's headers with one 128-bit target per build, for the Highway kernels
// (resize_hwy.cpp, colour_hwy.cpp; header-only: static dispatch, nothing of libhwy is linked).
// Include once, first of Highway, in a .cpp that puts its kernels in HWY_NAMESPACE between
// HWY_BEFORE_NAMESPACE() and HWY_AFTER_NAMESPACE() under #if GPUFEED_HWY_128:
//  - aarch64: HWY_STATIC_TARGET, NEON (the baseline of every aarch64 CPU, Grace included);
//  - x86: HWY_SSE4, compiled under Highway's own target pragmas and run only where CPUID reports
//    SSE4.2. Highway 1.0.3's static target for the x86-64 baseline is HWY_SCALAR (one lane: it has
//    no SSE2 target, and it turns EMU128 off for GCC < 12.3), which would not run the 128-bit
//    code that aarch64 runs; SSE4 does, so x86 machines test these kernels natively. The x86
//    auto choices stay the hand-written AVX2/AVX-512 kernels.
// Elsewhere (another architecture) GPUFEED_HWY_128 is 0 and the kernels are not built.

#if defined(__x86_64__) || defined(__i386__)
#include "gpufeed/cpu_features.h"
// SSE4 without PCLMUL and AES (the kernels use neither): the CPU check is SSE4.2 alone.
#define HWY_DISABLE_PCLMUL_AES 1
#endif

#include <hwy/highway.h>

#if HWY_ARCH_X86
// Highway's headers again for its SSE4 target, as hwy/foreach_target.h includes them per target.
#undef HWY_TARGET
#define HWY_TARGET HWY_SSE4
#ifdef HWY_TARGET_TOGGLE
#undef HWY_TARGET_TOGGLE
#else
#define HWY_TARGET_TOGGLE
#endif
#include <hwy/highway.h>
#endif

#if HWY_TARGET == HWY_NEON || HWY_TARGET == HWY_SSE4
#define GPUFEED_HWY_128 1
#else
#define GPUFEED_HWY_128 0
#endif

namespace gpufeed::transforms {

/// Whether this build has the 128-bit Highway kernels (aarch64, x86) and this CPU runs them
/// (x86: SSE4.2).
inline bool hwy_128_available() {
#if !GPUFEED_HWY_128
  return false;
#elif HWY_ARCH_X86
  return gpufeed::cpu::x86_features().sse42;
#else
  return true;
#endif
}

}  // namespace gpufeed::transforms
