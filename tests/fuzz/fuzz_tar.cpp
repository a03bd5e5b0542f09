// libFuzzer target: the tar shard indexer (loader/datasets/src/shards.cpp) over arbitrary bytes as one
// shard. It must return samples whose byte ranges lie inside the input, or throw ShardError;
// anything else (a crash, a sanitizer report, another exception, a hang) is a finding.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "gpufeed/datasets/shards.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gpufeed::datasets;
  const ReadAt read = [&](int64_t offset, void* buf, size_t n) -> size_t {
    if (offset < 0 || static_cast<uint64_t>(offset) >= size) return 0;
    const size_t k = std::min(n, size - static_cast<size_t>(offset));
    std::memcpy(buf, data + offset, k);
    return k;
  };
  try {
    for (const ShardSample& s : index_shard(read, static_cast<int64_t>(size), "fuzz.tar")) {
      if (s.offset < 0 || s.size < 0 || static_cast<uint64_t>(s.offset + s.size) > size || s.member.empty() ||
          s.label < 0)
        std::abort();
    }
  } catch (const ShardError&) {
  }
  return 0;
}
