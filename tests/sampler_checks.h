#pragma once
// Checks shared by the sampler tests. expect_elastic_resume, for the orders whose ranks read
// contiguous runs of one list (ShardAwareSampler, MixingSampler; ContiguousRunSampler): run `from`
// ranks for k lockstep batches, resume the rest on `to` ranks; what the old ranks consumed plus
// what the new ranks deliver is the old world's lockstep list, position for position (compared as
// multisets: a mixed epoch repeats samples), and the next epoch is the new world's own order.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpufeed/sampler/resume.h"

namespace gpufeed::test {

/// What `make()` throws as std::invalid_argument, or "(nothing thrown)".
template <class Make>
std::string invalid_argument_message(Make&& make) {
  try {
    make();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

/// make(world, rank, resume): that rank's sampler; lockstep(world): the epoch's lockstep list for
/// that world size. Returns every index delivered in the epoch (old ranks', then new ranks').
inline std::vector<int64_t> expect_elastic_resume(
    const std::function<std::unique_ptr<sampler::ResumableSampler>(
        int64_t, int64_t, std::optional<sampler::EpochResume>)>& make,
    const std::function<std::vector<int64_t>(int64_t)>& lockstep, int64_t from, int64_t to,
    int64_t k, int64_t batch, int64_t epoch) {
  auto sorted = [](std::vector<int64_t> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  const std::vector<int64_t> list = lockstep(from);
  std::vector<int64_t> delivered;
  for (int64_t r = 0; r < from; ++r) {
    auto s = make(from, r, std::nullopt);
    s->set_epoch(epoch);
    const std::vector<int64_t> mine = s->indices();
    const auto take = std::min<size_t>(static_cast<size_t>(k * batch), mine.size());
    delivered.insert(delivered.end(), mine.begin(),
                     mine.begin() + static_cast<std::ptrdiff_t>(take));
  }
  const int64_t consumed = sampler::consumed_after_batches(static_cast<int64_t>(list.size()), 0,
                                                           from, 0, k, batch, false);
  EXPECT_EQ(sorted(delivered), sorted(std::vector<int64_t>(list.begin(), list.begin() + consumed)))
      << from << "->" << to << " k=" << k;
  for (int64_t r = 0; r < to; ++r) {
    auto s = make(to, r, sampler::EpochResume{epoch, from, consumed});
    s->set_epoch(epoch);
    const std::vector<int64_t> mine = s->indices();
    EXPECT_EQ(static_cast<int64_t>(mine.size()), s->size());
    delivered.insert(delivered.end(), mine.begin(), mine.end());
    s->set_epoch(epoch + 1);
    auto fresh = make(to, r, std::nullopt);
    fresh->set_epoch(epoch + 1);
    EXPECT_EQ(s->indices(), fresh->indices()) << from << "->" << to << " rank " << r;
  }
  // Nothing consumed: the epoch is the new world's own list (its padding, not the old one's).
  EXPECT_EQ(sorted(delivered), sorted(consumed > 0 ? list : lockstep(to)))
      << from << "->" << to << " k=" << k;
  return delivered;
}

}  // namespace gpufeed::test
