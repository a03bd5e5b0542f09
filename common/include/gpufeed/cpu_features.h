#pragma once
// The x86 CPU features the kernels dispatch on (resize and augment's AVX2/AVX-512 loops, crc32c's
// SSE4.2), read once with CPUID, and XGETBV for whether the OS saves the AVX and AVX-512
// registers: the same answers as GCC's __builtin_cpu_supports. Not that builtin itself: zig's
// compiler-rt, the manylinux wheels' toolchain (cmake/toolchains/zig.cmake), answers it with a
// stub that says no to every feature, which would leave every such build on the scalar kernels.
// Internal to the rooms (not installed). x86 only: elsewhere only the scalar kernels are built.
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

#include <cstdint>

namespace gpufeed::cpu {

struct X86Features {
  bool sse42 = false, fma = false, avx2 = false, avx512f = false, avx512bw = false;
};

inline X86Features read_x86_features() {
  X86Features f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  f.sse42 = (c & bit_SSE4_2) != 0;
  uint64_t xcr0 = 0;
  if ((c & bit_OSXSAVE) != 0) {
    uint32_t lo = 0, hi = 0;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (static_cast<uint64_t>(hi) << 32) | lo;
  }
  const bool ymm = (c & bit_AVX) != 0 && (xcr0 & 0x6) == 0x6;  // XMM and YMM state saved
  const bool zmm = ymm && (xcr0 & 0xe0) == 0xe0;                // opmask and ZMM state saved
  f.fma = ymm && (c & bit_FMA) != 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.avx2 = ymm && (b & bit_AVX2) != 0;
    f.avx512f = zmm && (b & bit_AVX512F) != 0;
    f.avx512bw = zmm && (b & bit_AVX512BW) != 0;
  }
  return f;
}

/// This CPU's features, read on the first call.
inline const X86Features& x86_features() {
  static const X86Features f = read_x86_features();
  return f;
}

}  // namespace gpufeed::cpu
#endif
