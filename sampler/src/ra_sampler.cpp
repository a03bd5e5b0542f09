#include "gpufeed/sampler/ra_sampler.h"

#include <stdexcept>
#include <string>

#include "gpufeed/sampler/randperm.h"

namespace gpufeed::sampler {

RASampler::RASampler(int64_t n, RASamplerOptions options) : n_(n), options_(options) {
  const int64_t r = options.num_replicas;
  const auto bad = [](const std::string& why) { throw std::invalid_argument("RASampler: " + why); };
  if (n < 0) bad("n must be >= 0");
  if (r < 1) bad("num_replicas must be >= 1, got " + std::to_string(r));
  if (options.rank < 0 || options.rank >= r) {
    bad("invalid rank " + std::to_string(options.rank) + ", rank should be in the interval [0, " +
        std::to_string(r - 1) + "]");
  }
  if (options.repetitions < 1) bad("repetitions (ra_reps) must be >= 1, got " + std::to_string(options.repetitions));
  if (options.selection_multiple < 1) bad("selection_multiple must be >= 1");
  const int64_t repeated = n * options.repetitions;
  total_size_ = (repeated + r - 1) / r * r;
  if (repeated > 0 && total_size_ - repeated > repeated) {
    bad(std::to_string(n) + " indices x " + std::to_string(options.repetitions) + " repetitions cannot be padded to " +
        std::to_string(total_size_) + " for " + std::to_string(r) + " replicas");
  }
  // Python: int(math.floor(len // 256 * 256 / num_replicas)), true division then floor.
  num_selected_ = n / options.selection_multiple * options.selection_multiple / r;
}

std::vector<int64_t> RASampler::indices() const {
  std::vector<int64_t> order;
  if (options_.shuffle) {
    order = randperm(n_, options_.seed + static_cast<uint64_t>(epoch_));
  } else {
    for (int64_t i = 0; i < n_; ++i) order.push_back(i);
  }
  std::vector<int64_t> all;
  all.reserve(static_cast<size_t>(total_size_));
  for (int64_t i : order) all.insert(all.end(), static_cast<size_t>(options_.repetitions), i);
  const int64_t repeated = static_cast<int64_t>(all.size());
  for (int64_t k = 0; k < total_size_ - repeated; ++k) all.push_back(all[static_cast<size_t>(k)]);
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_selected_));
  for (int64_t k = options_.rank; k < total_size_ && static_cast<int64_t>(mine.size()) < num_selected_;
       k += options_.num_replicas) {
    mine.push_back(all[static_cast<size_t>(k)]);
  }
  return mine;
}

}  // namespace gpufeed::sampler
