#include "crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#include "gpufeed/cpu_features.h"
#define GPUFEED_CRC32C_X86 1
#endif

namespace gpufeed::datasets::detail {
namespace {

constexpr uint32_t kPoly = 0x82f63b78;  // CRC-32C, reflected

constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kTable = make_table();

uint32_t crc32c_table(uint32_t crc, const uint8_t* p, size_t n) {
  crc = ~crc;
  while (n--) crc = kTable[(crc ^ *p++) & 0xff] ^ (crc >> 8);
  return ~crc;
}

#ifdef GPUFEED_CRC32C_X86
// Newer clang (zig's: cmake/toolchains/zig.cmake) keeps the CRC32 instruction apart from SSE4.2.
#if defined(__clang__)
#define GPUFEED_CRC32C_TARGET __attribute__((target("sse4.2,crc32")))
#else
#define GPUFEED_CRC32C_TARGET __attribute__((target("sse4.2")))
#endif
GPUFEED_CRC32C_TARGET uint32_t crc32c_sse42(uint32_t crc, const uint8_t* p, size_t n) {
  uint64_t c = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
  }
  auto c32 = static_cast<uint32_t>(c);
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return ~c32;
}
#endif

}  // namespace

uint32_t crc32c(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
#ifdef GPUFEED_CRC32C_X86
  static const bool sse42 = gpufeed::cpu::x86_features().sse42;
  if (sse42) return crc32c_sse42(crc, p, n);
#endif
  return crc32c_table(crc, p, n);
}

}  // namespace gpufeed::datasets::detail
