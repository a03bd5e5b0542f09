// The field list (gpufeed/fields.h) of RemoteStats: the keys of
// gpufeed.DataLoader.stats()["remote"]; remote.h documents each field.
#pragma once
#include <tuple>

#include "gpufeed/fields.h"
#include "gpufeed/datasets/remote.h"

namespace gpufeed::fields {

template <>
struct FieldList<datasets::RemoteStats> {
  using S = datasets::RemoteStats;
  static constexpr auto value =
      std::tuple{field("requests", &S::requests, "count"),
                 field("bytes_fetched", &S::bytes_fetched, "bytes"),
                 field("cache_hits", &S::cache_hits, "samples"),
                 field("cache_hit_bytes", &S::cache_hit_bytes, "bytes"),
                 field("cache_checksum_failures", &S::cache_checksum_failures, "samples"),
                 field("cache_read_errors", &S::cache_read_errors, "samples"),
                 field("dataset_bytes", &S::dataset_bytes, "bytes"),
                 field("chunks_fetched", &S::chunks_fetched, "count"),
                 field("chunks_refetched", &S::chunks_refetched, "count"),
                 field("peak_held_bytes", &S::peak_held_bytes, "bytes")};
};

}  // namespace gpufeed::fields
