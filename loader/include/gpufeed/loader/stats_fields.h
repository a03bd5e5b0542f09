// The field lists (gpufeed/fields.h) of what the loader reports: LoaderStats, SlotCounts,
// ThreadDecision, SkippedSample and EpochSummary. The names are the keys of
// gpufeed.DataLoader.stats() / epoch_summary(), of `gpufeed bench --json` and of the profiler's
// metrics records; the struct comments (loader.h, batch.h, thread_tuner.h) document each field.
#pragma once
#include <tuple>

#include "gpufeed/fields.h"
#include "gpufeed/loader/batch.h"
#include "gpufeed/loader/loader.h"
#include "gpufeed/loader/thread_tuner.h"

namespace gpufeed::fields {

template <>
struct FieldList<loader::LoaderStats> {
  using S = loader::LoaderStats;
  static constexpr auto value = std::tuple{field("samples", &S::samples, "count"),
                                           field("skipped", &S::skipped, "count"),
                                           field("bytes_read", &S::bytes_read, "bytes"),
                                           field("read_s", &S::read_s, "s (thread time)"),
                                           field("decode_s", &S::decode_s, "s (thread time)"),
                                           field("resize_s", &S::resize_s, "s (thread time)"),
                                           field("decoded_pixels", &S::decoded_pixels, "pixels"),
                                           field("decodes", &S::decodes, "count")};
};

template <>
struct FieldList<loader::SlotCounts> {
  using S = loader::SlotCounts;
  static constexpr auto value =
      std::tuple{field("ready", &S::ready, "batches"), field("in_flight", &S::in_flight, "batches"),
                 field("held", &S::held, "batches"), field("free", &S::free, "batches")};
};

/// ThreadDecision::number orders the decisions (the profiler's records report those after a
/// number) and is not itself reported.
template <>
struct FieldList<loader::ThreadDecision> {
  using S = loader::ThreadDecision;
  static constexpr auto value =
      std::tuple{field("epoch", &S::epoch, "epoch"),
                 field("batch", &S::batch, "batch index"),
                 field("from", &S::from, "threads"),
                 field("to", &S::to, "threads"),
                 field("prefetch_depth_from", &S::prefetch_depth_from, "batch slots"),
                 field("prefetch_depth_to", &S::prefetch_depth_to, "batch slots"),
                 field("sample_cost_us", &S::sample_cost_us, "us"),
                 field("demand_per_s", &S::demand_per_s, "samples/s"),
                 field("needed", &S::needed, "threads"),
                 field("wait_fraction", &S::wait_fraction, "0..1"),
                 field("why", &S::why, "")};
};

template <>
struct FieldList<loader::SkippedSample> {
  using S = loader::SkippedSample;
  static constexpr auto value = std::tuple{field("index", &S::index, "dataset index"),
                                           field("replaced_by", &S::replaced_by, "dataset index"),
                                           field("position", &S::position, "epoch position"),
                                           field("path", &S::path, ""),
                                           field("kind", &S::kind, ""),
                                           field("reason", &S::reason, "")};
};

template <>
struct FieldList<loader::EpochSummary> {
  using S = loader::EpochSummary;
  static constexpr auto value =
      std::tuple{field("epoch", &S::epoch, "epoch"),
                 field("batches", &S::batches, "count"),
                 field("samples", &S::samples, "count"),
                 field("skipped", &S::skipped, "count"),
                 field("complete", &S::complete, ""),
                 field("skipped_by_kind", &S::skipped_by_kind, "count per kind"),
                 field("skips", &S::skips, "SkippedSample list"),
                 field("wait_s", &S::wait_s, "s"),
                 field("first_wait_s", &S::first_wait_s, "s")};
};

}  // namespace gpufeed::fields
