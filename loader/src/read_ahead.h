#pragma once
// The loader's side of a dataset's read-ahead (private to loader/src): the dataset's SampleReader
// (remote data: fetches ahead in the order announced; null for local data), the tags that name
// the epoch plans to it, and the two moments the loader talks to it: announce (what a schedule
// will read) and forget (a cancelled plan). Called under the loader's mutex; read() is the
// workers', through reader().

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "epoch_schedule.h"
#include "gpufeed/datasets/dataset.h"

namespace gpufeed::loader::detail {

class ReadAhead {
 public:
  ReadAhead(const datasets::Dataset& dataset, datasets::ReadOrder order)
      : reader_(dataset.reader(order)) {}

  /// The reader the workers read through, or null (they call Dataset::read).
  datasets::SampleReader* reader() const { return reader_.get(); }

  /// A new plan's tag (every plan gets one, with or without a reader).
  uint64_t next_tag() { return ++tags_; }

  /// Schedule `s` runs from batch `first_batch` on: the reader is told the rest of its order.
  void announce_rest(EpochSchedule& s, int64_t first_batch) {
    const EpochPlan& p = *s.plan;
    s.announced = s.total();
    if (!reader_) return;
    const auto from = static_cast<size_t>(std::min<int64_t>(first_batch * p.options.batch_size,
                                                            static_cast<int64_t>(p.order.size())));
    if (from == p.order.size()) return;
    reader_->announce(p.tag, from == 0 ? p.order
                                       : std::vector<int64_t>(p.order.begin() + static_cast<std::ptrdiff_t>(from),
                                                              p.order.end()));
  }

  /// Batch s.next_submit of `s`, `indices`, is being scheduled: announced unless it already was
  /// (an epoch planned ahead is announced one scheduled batch at a time).
  void announce_scheduled(EpochSchedule& s, const std::vector<int64_t>& indices) {
    if (!reader_ || s.next_submit < s.announced) return;
    reader_->announce(s.plan->tag, indices);
    s.announced = s.next_submit + 1;
  }

  /// Plan `p` is cancelled: its announced reads are dropped and the tasks waiting for them woken.
  void forget(const EpochPlan& p) {
    if (reader_) reader_->forget(p.tag);
  }

 private:
  std::unique_ptr<datasets::SampleReader> reader_;
  uint64_t tags_ = 0;  // the last tag given
};

}  // namespace gpufeed::loader::detail
