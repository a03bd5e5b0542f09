#pragma once
// Several datasets (sources) as one, for weighted mixing (gpufeed/sampler/mixing.h,
// docs/DATASETS.md, "Mixing several sources"): their samples concatenated in the order
// torch.utils.data.ConcatDataset numbers them, each read through its own dataset (a remote
// source's reads stay shard-granular: its reader is told its own samples of each announced
// order).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpufeed/datasets/dataset.h"

namespace gpufeed::datasets {

/// Sources concatenated: sample i of source s is sample offset_s + i, offset_s = the sizes of
/// the sources before it (torch.utils.data.ConcatDataset's numbering). Labels are kept as each
/// source gives them (ConcatDataset's rule); classes() is the longest of the sources' class lists
/// when every other is a prefix of it, else source 0's, and a warning at construction names the
/// first pair of sources whose class names differ at the same label. Immutable, as every
/// Dataset.
class MixedDataset : public Dataset {
 public:
  /// `names`: what messages call each source (the path or URL given), one per source. Throws
  /// std::invalid_argument for no sources, a null source, a source without samples, or names not
  /// one per source.
  MixedDataset(std::vector<std::shared_ptr<Dataset>> sources, std::vector<std::string> names);

  int64_t size() const override { return offsets_.back(); }
  /// The source's sample: its path, label, offset and size as that source gives them. Throws
  /// std::out_of_range naming the index and the size.
  SampleRef at(int64_t i) const override;
  const std::vector<std::string>& classes() const override { return sources_[classes_from_]->classes(); }
  /// The source's read of its own sample.
  void read(int64_t i, const SampleRef& ref, decode::ByteBuffer& out) const override;
  /// A reader over the sources' readers (each made with `order`), or null when no source has one.
  /// Each announced order is split per source, in order, into that source's own sample indices;
  /// a source without a reader is read with its Dataset::read.
  std::unique_ptr<SampleReader> reader(ReadOrder order = ReadOrder::kAny) const override;
  /// The sources' shard sizes concatenated when every source is made of shards; empty otherwise
  /// (source_shard_sizes() gives each source's).
  std::vector<int64_t> shard_sizes() const override;
  /// Some source is remote.
  bool remote() const override;

  /// [S] the sources, in order.
  const std::vector<std::shared_ptr<Dataset>>& sources() const { return sources_; }
  /// [S] the sources' names (as given).
  const std::vector<std::string>& names() const { return names_; }
  /// [S + 1] sample offsets: source s holds [offsets()[s], offsets()[s + 1]).
  const std::vector<int64_t>& offsets() const { return offsets_; }
  /// [S] each source's Dataset::shard_sizes() (empty for a source not made of shards).
  std::vector<std::vector<int64_t>> source_shard_sizes() const;
  /// The source holding sample i; throws std::out_of_range outside [0, size()).
  int64_t source_of(int64_t i) const;

 private:
  std::vector<std::shared_ptr<Dataset>> sources_;
  std::vector<std::string> names_;
  std::vector<int64_t> offsets_;
  size_t classes_from_ = 0;
};

}  // namespace gpufeed::datasets
