#include "gpufeed/sampler/sampler.h"

#include <numeric>
#include <stdexcept>
#include <string>

#include "gpufeed/sampler/randperm.h"
#include "gpufeed/sampler/resume.h"

namespace gpufeed::sampler {
namespace {

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), int64_t{0});
  return v;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

SequentialSampler::SequentialSampler(int64_t n) : n_(n) {
  if (n < 0) throw std::invalid_argument("SequentialSampler: n must be >= 0");
}

std::vector<int64_t> SequentialSampler::indices() const { return iota(n_); }

RandomSampler::RandomSampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) {
  if (n < 0) throw std::invalid_argument("RandomSampler: n must be >= 0");
}

std::vector<int64_t> RandomSampler::indices() const {
  return randperm(n_, seed_ + static_cast<uint64_t>(epoch_));
}

DistributedSampler::DistributedSampler(int64_t n, DistributedSamplerOptions options)
    : n_(n), options_(options) {
  const int64_t r = options.num_replicas;
  if (n < 0) throw std::invalid_argument("DistributedSampler: n must be >= 0");
  if (r < 1) {
    throw std::invalid_argument("DistributedSampler: num_replicas must be >= 1, got " +
                                std::to_string(r));
  }
  if (options.rank < 0 || options.rank >= r) {
    throw std::invalid_argument("DistributedSampler: invalid rank " + std::to_string(options.rank) +
                                ", rank should be in the interval [0, " + std::to_string(r - 1) +
                                "]");
  }
  // Python: math.ceil((len - R) / R) with true division, which is negative-safe only for
  // len >= R; for len < R it gives ceil(negative) = 0 or a negative number clamped by slicing.
  if (options.drop_last && n % r != 0) {
    const int64_t num = n - r;
    // ceil of a possibly negative quotient, as math.ceil does.
    num_samples_ = num >= 0 ? ceil_div(num, r) : -((-num) / r);
    if (num_samples_ < 0) num_samples_ = 0;
  } else {
    num_samples_ = ceil_div(n, r);
  }
}

std::vector<int64_t> DistributedSampler::indices() const {
  return remaining_for_rank(distributed_epoch_list(n_, options_, epoch_), 0, options_.num_replicas,
                            options_.rank);
}

BatchSampler::BatchSampler(std::shared_ptr<Sampler> sampler, int64_t batch_size, bool drop_last)
    : sampler_(std::move(sampler)), batch_size_(batch_size), drop_last_(drop_last) {
  if (!sampler_) throw std::invalid_argument("BatchSampler: sampler is null");
  if (batch_size < 1) {
    throw std::invalid_argument("BatchSampler: batch_size must be >= 1, got " +
                                std::to_string(batch_size));
  }
}

std::vector<std::vector<int64_t>> BatchSampler::batches() const {
  const std::vector<int64_t> idx = sampler_->indices();
  std::vector<std::vector<int64_t>> out;
  out.reserve(static_cast<size_t>(size()));
  for (size_t start = 0; start < idx.size(); start += static_cast<size_t>(batch_size_)) {
    const size_t end = std::min(idx.size(), start + static_cast<size_t>(batch_size_));
    if (drop_last_ && end - start < static_cast<size_t>(batch_size_)) break;
    out.emplace_back(idx.begin() + static_cast<std::ptrdiff_t>(start),
                     idx.begin() + static_cast<std::ptrdiff_t>(end));
  }
  return out;
}

int64_t BatchSampler::size() const {
  const int64_t n = sampler_->size();
  return drop_last_ ? n / batch_size_ : ceil_div(n, batch_size_);
}

}  // namespace gpufeed::sampler
