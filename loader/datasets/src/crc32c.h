#pragma once
// CRC-32C (Castagnoli, iSCSI's and S3's x-amz-checksum-crc32c), the checksum of each range the
// local cache of remote shards keeps (remote_cache.h). Internal.
#include <cstddef>
#include <cstdint>

namespace gpufeed::datasets::detail {

/// CRC-32C of `n` bytes, continuing `crc` (0 to start): crc32c(crc32c(0, a), b) is the CRC of a
/// followed by b. The SSE4.2 instruction where the CPU has it (about 10 GB/s), else a table.
uint32_t crc32c(uint32_t crc, const void* data, size_t n);

}  // namespace gpufeed::datasets::detail
