// Several sources as one dataset (gpufeed/datasets/mixed.h).
#include "gpufeed/datasets/mixed.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "gpufeed/log.h"

namespace gpufeed::datasets {
namespace {

// The source whose class list the mixed dataset reports: the longest, when every other list is
// a prefix of it (sources labelled alike, some missing the last classes); else source 0's, with a
// warning naming the first disagreement (labels are kept as each source gives them).
size_t pick_classes(const std::vector<std::shared_ptr<Dataset>>& sources, const std::vector<std::string>& names) {
  size_t longest = 0;
  for (size_t s = 1; s < sources.size(); ++s)
    if (sources[s]->classes().size() > sources[longest]->classes().size()) longest = s;
  const auto& all = sources[longest]->classes();
  for (size_t s = 0; s < sources.size(); ++s) {
    const auto& mine = sources[s]->classes();
    const auto diff = std::mismatch(mine.begin(), mine.end(), all.begin()).first;
    if (diff == mine.end()) continue;
    const auto label = diff - mine.begin();
    gpufeed::log()->warn(
        "mixed sources: label {} is class '{}' in {} but '{}' in {}; labels are kept as each source gives them "
        "(torch ConcatDataset's rule) and classes are {}'s",
        label, *diff, names[s], all[static_cast<size_t>(label)], names[longest], names[0]);
    return 0;
  }
  return longest;
}

// Each announced order split per source into that source's own indices; a source without a
// reader of its own is read with its Dataset::read.
class MixedReader : public SampleReader {
 public:
  MixedReader(const MixedDataset& mixed, std::vector<std::unique_ptr<SampleReader>> readers)
      : mixed_(mixed), readers_(std::move(readers)) {}

  void announce(uint64_t tag, const std::vector<int64_t>& indices) override {
    const auto& off = mixed_.offsets();
    std::vector<std::vector<int64_t>> per(readers_.size());
    for (const int64_t i : indices) {
      const auto s = static_cast<size_t>(mixed_.source_of(i));
      if (readers_[s]) per[s].push_back(i - off[s]);
    }
    for (size_t s = 0; s < readers_.size(); ++s)
      if (readers_[s] && !per[s].empty()) readers_[s]->announce(tag, per[s]);
  }

  void forget(uint64_t tag) override {
    for (const auto& r : readers_)
      if (r) r->forget(tag);
  }

  void read(uint64_t tag, int64_t index, decode::ByteBuffer& out) override {
    const auto s = static_cast<size_t>(mixed_.source_of(index));
    const int64_t local = index - mixed_.offsets()[s];
    if (readers_[s]) return readers_[s]->read(tag, local, out);
    const Dataset& source = *mixed_.sources()[s];
    source.read(local, source.at(local), out);
  }

 private:
  const MixedDataset& mixed_;
  std::vector<std::unique_ptr<SampleReader>> readers_;  // [S], null for a source without one
};

}  // namespace

MixedDataset::MixedDataset(std::vector<std::shared_ptr<Dataset>> sources, std::vector<std::string> names)
    : sources_(std::move(sources)), names_(std::move(names)) {
  if (sources_.empty()) throw std::invalid_argument("mixed sources: no source given");
  if (names_.size() != sources_.size())
    throw std::invalid_argument(fmt::format("mixed sources: {} names for {} sources", names_.size(), sources_.size()));
  offsets_.assign(1, 0);
  for (size_t s = 0; s < sources_.size(); ++s) {
    if (!sources_[s]) throw std::invalid_argument(fmt::format("mixed sources: source {} is null", s));
    if (sources_[s]->size() == 0)
      throw std::invalid_argument(fmt::format("mixed sources: {} (source {}) has no samples", names_[s], s));
    offsets_.push_back(offsets_.back() + sources_[s]->size());
  }
  classes_from_ = pick_classes(sources_, names_);
}

int64_t MixedDataset::source_of(int64_t i) const {
  if (i < 0 || i >= size())
    throw std::out_of_range(fmt::format("mixed sources: sample {} is out of range (size {})", i, size()));
  return static_cast<int64_t>(std::upper_bound(offsets_.begin(), offsets_.end(), i) - offsets_.begin()) - 1;
}

SampleRef MixedDataset::at(int64_t i) const {
  const auto s = static_cast<size_t>(source_of(i));
  return sources_[s]->at(i - offsets_[s]);
}

void MixedDataset::read(int64_t i, const SampleRef& ref, decode::ByteBuffer& out) const {
  const auto s = static_cast<size_t>(source_of(i));
  sources_[s]->read(i - offsets_[s], ref, out);
}

std::unique_ptr<SampleReader> MixedDataset::reader(ReadOrder order) const {
  std::vector<std::unique_ptr<SampleReader>> readers;
  bool any = false;
  for (const auto& s : sources_) {
    readers.push_back(s->reader(order));
    any = any || readers.back() != nullptr;
  }
  if (!any) return nullptr;
  return std::make_unique<MixedReader>(*this, std::move(readers));
}

std::vector<int64_t> MixedDataset::shard_sizes() const {
  std::vector<int64_t> all;
  for (const auto& s : sources_) {
    const std::vector<int64_t> mine = s->shard_sizes();
    if (mine.empty()) return {};
    all.insert(all.end(), mine.begin(), mine.end());
  }
  return all;
}

bool MixedDataset::remote() const {
  return std::any_of(sources_.begin(), sources_.end(), [](const auto& s) { return s->remote(); });
}

std::vector<std::vector<int64_t>> MixedDataset::source_shard_sizes() const {
  std::vector<std::vector<int64_t>> out;
  for (const auto& s : sources_) out.push_back(s->shard_sizes());
  return out;
}

}  // namespace gpufeed::datasets
