#pragma once
// glibc's own sin, cos, tan and atan, reached by their symbol versions, for the values that must
// equal what Python's math module computes (torchvision's affine matrix,
// _get_inverse_affine_matrix: math.cos, math.sin, math.tan of the angles, math.atan in the
// auto-augment shears). Python's math calls the C library's libm, glibc's on Linux.
// Not plain std::sin etc. because zig's toolchain (cmake/toolchains/zig.cmake, the manylinux
// wheels') links its compiler-rt into every binary as one object that defines weak, hidden sin,
// cos, tan, sinf, cosf, tanf, exp, log, ... (musl's algorithms); a linker takes any definition in
// an object over a shared library's, so in those builds plain sin/cos/tan never reach libm.so.6.
// musl's sin and cos differ from glibc's in the last bit for some arguments
// (sin(0x1.2aafde81bd50cp-1): glibc -0x1.1a07fdef0b485p-1, compiler-rt ...484p-1), which moved a
// bilinear ShearY pixel by one level. A reference to the versioned name (sin@GLIBC_2.2.5) is
// resolved only by a shared library that defines that version, i.e. glibc's libm.
// Internal to the rooms (not installed). glibc on x86-64 and AArch64 (the versions are each
// architecture's first); elsewhere, and with other C libraries, these are std::sin etc.
#include <cmath>

#if defined(__GLIBC__) && (defined(__x86_64__) || defined(__aarch64__))
#if defined(__x86_64__)
#define GPUFEED_GLIBC_LIBM_VERSION "GLIBC_2.2.5"
#else
#define GPUFEED_GLIBC_LIBM_VERSION "GLIBC_2.17"
#endif
extern "C" {
__attribute__((visibility("default"))) double gpufeed_glibc_sin(double) noexcept;
__attribute__((visibility("default"))) double gpufeed_glibc_cos(double) noexcept;
__attribute__((visibility("default"))) double gpufeed_glibc_tan(double) noexcept;
__attribute__((visibility("default"))) double gpufeed_glibc_atan(double) noexcept;
}
__asm__(".symver gpufeed_glibc_sin, sin@" GPUFEED_GLIBC_LIBM_VERSION);
__asm__(".symver gpufeed_glibc_cos, cos@" GPUFEED_GLIBC_LIBM_VERSION);
__asm__(".symver gpufeed_glibc_tan, tan@" GPUFEED_GLIBC_LIBM_VERSION);
__asm__(".symver gpufeed_glibc_atan, atan@" GPUFEED_GLIBC_LIBM_VERSION);
#undef GPUFEED_GLIBC_LIBM_VERSION

namespace gpufeed::libm {
inline double sin(double x) { return gpufeed_glibc_sin(x); }
inline double cos(double x) { return gpufeed_glibc_cos(x); }
inline double tan(double x) { return gpufeed_glibc_tan(x); }
inline double atan(double x) { return gpufeed_glibc_atan(x); }
}  // namespace gpufeed::libm
#else
namespace gpufeed::libm {
inline double sin(double x) { return std::sin(x); }
inline double cos(double x) { return std::cos(x); }
inline double tan(double x) { return std::tan(x); }
inline double atan(double x) { return std::atan(x); }
}  // namespace gpufeed::libm
#endif
