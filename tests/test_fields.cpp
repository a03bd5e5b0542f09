// The reported structs' field lists (gpufeed/fields.h, gpufeed/loader/stats_fields.h): the names
// every front reports (gpufeed.DataLoader.stats(), `gpufeed bench --json`, the profiler's
// metrics), the JSON emitter's values and types, difference(), and a field of the struct that no
// list names.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "gpufeed/fields.h"
#include "gpufeed/fields_json.h"
#include "gpufeed/datasets/remote_fields.h"
#include "gpufeed/loader/stats_fields.h"

namespace fields = gpufeed::fields;
namespace loader = gpufeed::loader;
namespace datasets = gpufeed::datasets;
using Names = std::vector<std::string_view>;

namespace {

// Converts to any member type: counts an aggregate's members by the longest brace list it takes.
struct AnyMember {
  template <class U>
  operator U() const;  // NOLINT(google-explicit-constructor): declared only, for unevaluated use
};

template <class T, class... A>
constexpr int member_count() {
  if constexpr (requires { T{A{}..., AnyMember{}}; })
    return member_count<T, A..., AnyMember>();
  else
    return static_cast<int>(sizeof...(A));
}

// A member added to a struct without an entry in its list fails here (ThreadDecision::number is
// the one member no front reports).
static_assert(member_count<loader::LoaderStats>() == 8);
static_assert(member_count<loader::SlotCounts>() == 4);
static_assert(member_count<loader::ThreadDecision>() == 12);
static_assert(member_count<loader::SkippedSample>() == 6);
static_assert(member_count<loader::EpochSummary>() == 9);
static_assert(member_count<datasets::RemoteStats>() == 10);

// Each counter k times a base of its own (exact in binary for the times), so two differ by
// stats_times of the difference of their k.
loader::LoaderStats stats_times(int64_t k) {
  const auto x = static_cast<double>(k);
  return {.samples = 20 * k,
          .skipped = k,
          .bytes_read = 1000 * k,
          .read_s = 0.5 * x,
          .decode_s = 1.0 * x,
          .resize_s = 0.25 * x,
          .decoded_pixels = 30000 * k,
          .decodes = 19 * k};
}

}  // namespace

TEST(Fields, NamesAreTheReportedKeysInOrder) {
  EXPECT_EQ(fields::field_names<loader::LoaderStats>(),
            (Names{"samples", "skipped", "bytes_read", "read_s", "decode_s", "resize_s",
                   "decoded_pixels", "decodes"}));
  EXPECT_EQ(fields::field_names<loader::SlotCounts>(),
            (Names{"ready", "in_flight", "held", "free"}));
  EXPECT_EQ(fields::field_names<loader::ThreadDecision>(),
            (Names{"epoch", "batch", "from", "to", "prefetch_depth_from", "prefetch_depth_to",
                   "sample_cost_us", "demand_per_s", "needed", "wait_fraction", "why"}));
  EXPECT_EQ(fields::field_names<loader::SkippedSample>(),
            (Names{"index", "replaced_by", "position", "path", "kind", "reason"}));
  EXPECT_EQ(fields::field_names<loader::EpochSummary>(),
            (Names{"epoch", "batches", "samples", "skipped", "complete", "skipped_by_kind", "skips",
                   "wait_s", "first_wait_s"}));
  EXPECT_EQ(fields::field_names<datasets::RemoteStats>(),
            (Names{"requests", "bytes_fetched", "cache_hits", "cache_hit_bytes",
                   "cache_checksum_failures", "cache_read_errors", "dataset_bytes", "chunks_fetched",
                   "chunks_refetched", "peak_held_bytes"}));
}

TEST(Fields, JsonKeepsIntegersIntegralAndNestsLists) {
  const loader::ThreadDecision d{.number = 5,
                                 .epoch = 2,
                                 .batch = 7,
                                 .from = 3,
                                 .to = 4,
                                 .prefetch_depth_from = 6,
                                 .prefetch_depth_to = 6,
                                 .sample_cost_us = 2.5,
                                 .demand_per_s = 400,
                                 .needed = 1.0,
                                 .wait_fraction = 0.25,
                                 .why = "one more"};
  const nlohmann::json j = fields::to_json(d);
  EXPECT_EQ(j, (nlohmann::json{{"epoch", 2},
                               {"batch", 7},
                               {"from", 3},
                               {"to", 4},
                               {"prefetch_depth_from", 6},
                               {"prefetch_depth_to", 6},
                               {"sample_cost_us", 2.5},
                               {"demand_per_s", 400.0},
                               {"needed", 1.0},
                               {"wait_fraction", 0.25},
                               {"why", "one more"}}));
  EXPECT_TRUE(j["from"].is_number_integer());
  EXPECT_TRUE(j["demand_per_s"].is_number_float());  // a whole double stays a float (400.0)
  EXPECT_TRUE(j["needed"].is_number_float());
  EXPECT_FALSE(j.contains("number"));

  loader::EpochSummary s;
  s.epoch = 1;
  s.batches = 3;
  s.samples = 12;
  s.skipped = 1;
  s.complete = true;
  s.skipped_by_kind = {{"corrupt", 1}};
  s.skips = {{.index = 4,
              .replaced_by = 5,
              .position = 4,
              .path = "a.jpg",
              .kind = "corrupt",
              .reason = "bad"}};
  s.wait_s = 0.5;
  s.first_wait_s = 0.125;
  EXPECT_EQ(
      fields::to_json(s).dump(),
      R"({"batches":3,"complete":true,"epoch":1,"first_wait_s":0.125,"samples":12,"skipped":1,)"
      R"("skipped_by_kind":{"corrupt":1},"skips":[{"index":4,"kind":"corrupt","path":"a.jpg",)"
      R"("position":4,"reason":"bad","replaced_by":5}],"wait_s":0.5})");
}

TEST(Fields, DifferenceSubtractsEveryCounter) {
  const loader::LoaderStats d = fields::difference(stats_times(5), stats_times(2));
  const loader::LoaderStats want = stats_times(3);
  EXPECT_EQ(d.samples, want.samples);
  EXPECT_EQ(d.skipped, want.skipped);
  EXPECT_EQ(d.bytes_read, want.bytes_read);
  EXPECT_EQ(d.read_s, want.read_s);
  EXPECT_EQ(d.decode_s, want.decode_s);
  EXPECT_EQ(d.resize_s, want.resize_s);
  EXPECT_EQ(d.decoded_pixels, want.decoded_pixels);
  EXPECT_EQ(d.decodes, want.decodes);

  // Text and flags are not counters: they keep `now`'s values.
  loader::EpochSummary a, b;
  a.complete = true;
  a.samples = 9;
  b.samples = 4;
  a.skips.resize(1);
  const loader::EpochSummary e = fields::difference(a, b);
  EXPECT_TRUE(e.complete);
  EXPECT_EQ(e.samples, 5);
  EXPECT_EQ(e.skips.size(), 1u);
}
