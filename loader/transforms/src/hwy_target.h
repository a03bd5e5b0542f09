#pragma once
// Google Highway's headers with one 128-bit target per build, for the Highway kernels
// (resize_hwy.cpp, colour_hwy.cpp, augment_hwy.cpp; header-only: static dispatch, nothing of libhwy
// is linked). Include once, first of Highway, in a .cpp that puts its kernels in HWY_NAMESPACE
// between HWY_BEFORE_NAMESPACE() and HWY_AFTER_NAMESPACE() under #if GPUFEED_HWY_128:
//  - aarch64: HWY_STATIC_TARGET, NEON (the baseline of every aarch64 CPU, Grace included);
//  - x86: HWY_SSE4, compiled under Highway's own target pragmas and run only where CPUID reports
//    SSE4.2. Highway 1.0.3's static target for the x86-64 baseline is HWY_SCALAR (one lane: it has
//    no SSE2 target, and it turns EMU128 off for GCC < 12.3), which would not run the 128-bit
//    code that aarch64 runs; SSE4 does, so x86 machines test these kernels natively. The x86
//    auto choices stay the hand-written AVX2/AVX-512 kernels.
//  - x86, in a .cpp that defines GPUFEED_HWY_FUSED before including this header: HWY_AVX2
//    instead, run only where CPUID reports AVX2 and FMA. Its kernels need MulAdd fused (rounded
//    once, as std::fma and NEON's fmla), and SSE4's MulAdd is Mul then Add; AVX2's is vfmadd. The
//    kernels still use Full128 tags, so x86 runs the lane count and operations NEON runs.
//    (Highway's AVX2 target also lets the compiler use BMI2 and F16C; every CPU with AVX2 and FMA
//    has BMI2, and F16C came before FMA.)
// Elsewhere (another architecture) GPUFEED_HWY_128 is 0 and the kernels are not built.

#if defined(__x86_64__) || defined(__i386__)
#include "gpufeed/cpu_features.h"
// SSE4 and AVX2 without PCLMUL and AES (the kernels use neither): the CPU checks are SSE4.2
// alone, and AVX2 and FMA.
#define HWY_DISABLE_PCLMUL_AES 1
#endif

#include <hwy/highway.h>

#ifdef GPUFEED_HWY_FUSED
#define GPUFEED_HWY_X86_TARGET HWY_AVX2
#else
#define GPUFEED_HWY_X86_TARGET HWY_SSE4
#endif

#if HWY_ARCH_X86
// Highway's headers again for the x86 target, as hwy/foreach_target.h includes them per target.
#undef HWY_TARGET
#define HWY_TARGET GPUFEED_HWY_X86_TARGET
#ifdef HWY_TARGET_TOGGLE
#undef HWY_TARGET_TOGGLE
#else
#define HWY_TARGET_TOGGLE
#endif
#include <hwy/highway.h>
#endif

#if HWY_TARGET == HWY_NEON || (HWY_ARCH_X86 && HWY_TARGET == GPUFEED_HWY_X86_TARGET)
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

#ifdef GPUFEED_HWY_FUSED
/// The same for the kernels of a GPUFEED_HWY_FUSED file (x86: AVX2 and FMA). A function of its
/// own: an inline function's body must not depend on the file that includes it.
inline bool hwy_128_fused_available() {
#if !GPUFEED_HWY_128
  return false;
#elif HWY_ARCH_X86
  return gpufeed::cpu::x86_features().avx2 && gpufeed::cpu::x86_features().fma;
#else
  return true;
#endif
}
#endif

}  // namespace gpufeed::transforms
