#include "gpufeed/sampler/resume.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

#include "gpufeed/sampler/randperm.h"

namespace gpufeed::sampler {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void check_deal(int64_t total_size, int64_t consumed, int64_t num_replicas, int64_t rank) {
  if (num_replicas < 1) {
    throw std::invalid_argument("resume: num_replicas must be >= 1, got " + std::to_string(num_replicas));
  }
  if (rank < 0 || rank >= num_replicas) {
    throw std::invalid_argument("resume: rank " + std::to_string(rank) + " is not in [0, " +
                                std::to_string(num_replicas) + ")");
  }
  if (consumed < 0 || consumed > total_size) {
    throw std::invalid_argument("resume: " + std::to_string(consumed) +
                                " positions consumed of an epoch list of " +
                                std::to_string(total_size));
  }
}

int64_t batch_count(int64_t samples, int64_t batch_size, bool drop_last) {
  return drop_last ? samples / batch_size : ceil_div(samples, batch_size);
}

}  // namespace

std::vector<int64_t> distributed_epoch_list(int64_t n, const DistributedSamplerOptions& options,
                                            int64_t epoch) {
  DistributedSamplerOptions o = options;
  o.rank = 0;
  const int64_t total = DistributedSampler(n, o).total_size();
  std::vector<int64_t> all;
  if (options.shuffle) {
    all = randperm(n, options.seed + static_cast<uint64_t>(epoch));
  } else {
    all.resize(static_cast<size_t>(n));
    std::iota(all.begin(), all.end(), int64_t{0});
  }
  return fit_to_total_size(std::move(all), total);
}

std::vector<int64_t> fit_to_total_size(std::vector<int64_t> list, int64_t total_size) {
  if (total_size < 0) {
    throw std::invalid_argument("fit_to_total_size: total_size must be >= 0, got " +
                                std::to_string(total_size));
  }
  const auto n = static_cast<int64_t>(list.size());
  if (n >= total_size || n == 0) {
    list.resize(static_cast<size_t>(std::min(n, total_size)));
    return list;
  }
  // Pad by repeating from the start; wraps more than once when n < total_size - n.
  list.reserve(static_cast<size_t>(total_size));
  for (int64_t k = 0; static_cast<int64_t>(list.size()) < total_size; ++k) {
    list.push_back(list[static_cast<size_t>(k % n)]);
  }
  return list;
}

int64_t remaining_count(int64_t total_size, int64_t consumed, int64_t num_replicas, int64_t rank) {
  const int64_t left = total_size - consumed - rank;
  return left <= 0 ? 0 : ceil_div(left, num_replicas);
}

std::vector<int64_t> remaining_for_rank(const std::vector<int64_t>& list, int64_t consumed,
                                        int64_t num_replicas, int64_t rank) {
  const auto total = static_cast<int64_t>(list.size());
  check_deal(total, consumed, num_replicas, rank);
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(remaining_count(total, consumed, num_replicas, rank)));
  for (int64_t k = consumed + rank; k < total; k += num_replicas) {
    mine.push_back(list[static_cast<size_t>(k)]);
  }
  return mine;
}

int64_t consumed_after_batches(int64_t total_size, int64_t consumed, int64_t num_replicas,
                               int64_t rank, int64_t batches_consumed, int64_t batch_size,
                               bool drop_last) {
  check_deal(total_size, consumed, num_replicas, rank);
  if (batch_size < 1) {
    throw std::invalid_argument("resume: batch_size must be >= 1, got " + std::to_string(batch_size));
  }
  const int64_t mine = batch_count(remaining_count(total_size, consumed, num_replicas, rank),
                                   batch_size, drop_last);
  if (batches_consumed < 0 || batches_consumed > mine) {
    throw std::invalid_argument("resume: rank " + std::to_string(rank) + " of " +
                                std::to_string(num_replicas) + " has " + std::to_string(mine) +
                                " batches in this epoch, not " + std::to_string(batches_consumed) +
                                " consumed");
  }
  // Rank 0's share is the longest, so its batch count is every rank's largest.
  const int64_t most = batch_count(remaining_count(total_size, consumed, num_replicas, 0),
                                   batch_size, drop_last);
  if (batches_consumed == most) return total_size;
  if (batches_consumed == mine) {
    throw std::invalid_argument(
        "resume: rank " + std::to_string(rank) + " of " + std::to_string(num_replicas) +
        " received all its " + std::to_string(mine) + " batches but rank 0 has " +
        std::to_string(most) +
        ": its state cannot tell whether the other ranks received their last batch; resume from "
        "rank 0's state");
  }
  return consumed + std::min(batches_consumed * batch_size * num_replicas, total_size - consumed);
}

ResumedDistributedSampler::ResumedDistributedSampler(int64_t n, DistributedSamplerOptions options,
                                                     std::optional<EpochResume> resume)
    : n_(n), plain_(n, options) {
  set_resume(resume);
}

int64_t ResumedDistributedSampler::resumed_total_size() const {
  DistributedSamplerOptions o = plain_.options();
  o.num_replicas = resume_->num_replicas;
  o.rank = 0;
  return DistributedSampler(n_, o).total_size();
}

void ResumedDistributedSampler::set_resume(std::optional<EpochResume> resume) {
  std::optional<EpochResume> old = std::move(resume_);
  resume_ = std::move(resume);
  if (!resume_) return;
  if (resume_->num_replicas < 1) {
    resume_ = std::move(old);
    throw std::invalid_argument("ResumedDistributedSampler: the resumed epoch's num_replicas must be >= 1");
  }
  const int64_t total = resumed_total_size();
  if (resume_->consumed < 0 || resume_->consumed > total) {
    const int64_t consumed = resume_->consumed;
    resume_ = std::move(old);
    throw std::invalid_argument("ResumedDistributedSampler: " + std::to_string(consumed) +
                                " positions consumed of an epoch list of " + std::to_string(total));
  }
}

bool ResumedDistributedSampler::resuming() const {
  return resume_ && resume_->epoch == epoch_ && resume_->consumed > 0;
}

std::vector<int64_t> ResumedDistributedSampler::indices() const {
  if (!resuming()) {
    DistributedSampler plain = plain_;
    plain.set_epoch(epoch_);
    return plain.indices();
  }
  DistributedSamplerOptions o = plain_.options();
  o.num_replicas = resume_->num_replicas;
  return remaining_for_rank(distributed_epoch_list(n_, o, epoch_), resume_->consumed,
                            plain_.options().num_replicas, plain_.options().rank);
}

int64_t ResumedDistributedSampler::size() const {
  if (!resuming()) return plain_.size();
  return remaining_count(resumed_total_size(), resume_->consumed, plain_.options().num_replicas,
                         plain_.options().rank);
}

}  // namespace gpufeed::sampler
