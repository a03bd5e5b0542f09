#include "epoch_schedule.h"

#include <algorithm>
#include <new>
#include <stdexcept>

#include <fmt/format.h>

namespace gpufeed::loader::detail {

SlotRing::SlotRing(HostAllocator& allocator, int depth, int64_t batch_size, int64_t sample_bytes)
    : allocator_(allocator),
      label_offset_((static_cast<size_t>(sample_bytes * batch_size) + 63) / 64 * 64),
      bytes_(label_offset_ + static_cast<size_t>(batch_size) * sizeof(int64_t)) {
  for (int k = 0; k < depth; ++k) {
    if (!grow()) {
      deallocate_all();
      throw std::runtime_error(fmt::format(
          "Loader: cannot allocate {} batch slot(s) of {:.1f} MiB (batch_size {} x {} bytes of "
          "uint8 pixels per sample): lower batch_size, the image size or prefetch_depth",
          depth, static_cast<double>(bytes_) / (1 << 20), batch_size, sample_bytes));
    }
  }
}

bool SlotRing::grow() {
  Slot slot;
  try {
    slot.base = allocator_.allocate(bytes_);
  } catch (const std::bad_alloc&) {
    return false;
  }
  slot.bytes = bytes_;
  slot.images = static_cast<uint8_t*>(slot.base);
  slot.labels = reinterpret_cast<int64_t*>(static_cast<uint8_t*>(slot.base) + label_offset_);
  slots_.push_back(slot);
  free_.push_back(&slots_.back());
  return true;
}

void SlotRing::deallocate_all() {
  for (Slot& s : slots_)
    if (s.base) allocator_.deallocate(s.base, s.bytes);
}

std::shared_ptr<const EpochPlan> make_epoch_plan(const LoaderOptions& options, int size, uint64_t tag, int64_t epoch,
                                                 const std::vector<int64_t>& indices) {
  auto p = std::make_shared<EpochPlan>();
  p->epoch = epoch;
  p->tag = tag;
  p->options = options;
  if (p->options.transform.kind == transforms::TransformOptions::Kind::kTrain) p->options.transform.rrc.size = size;
  p->sample_bytes = loader::sample_bytes(p->options);
  int64_t offset = 0;
  for (const transforms::ViewOptions& v : p->options.views.views) {
    p->view_offsets.push_back(offset);
    p->view_bytes.push_back(int64_t{v.rrc.size} * v.rrc.size * 3);
    offset += p->view_bytes.back() * options.batch_size;
  }
  const auto n = static_cast<int64_t>(indices.size());
  for (int64_t start = 0; start < n; start += options.batch_size) {
    const int64_t end = std::min(n, start + options.batch_size);
    if (end - start < options.batch_size && options.drop_last) break;
    p->batches.emplace_back(indices.begin() + start, indices.begin() + end);
  }
  p->order = indices;
  p->order.resize(static_cast<size_t>(std::min<int64_t>(n, p->total() * options.batch_size)));
  return p;
}

bool idle_for_slots(const SlotRing& ring, const EpochSchedule& current, const EpochSchedule& ahead) {
  if (ring.free_count() > 0 || !(current.more_to_schedule() || ahead.more_to_schedule())) return false;
  for (const EpochSchedule* s : {&current, &ahead}) {
    for (const auto& f : s->pending)
      if (!f->done) return false;
  }
  return true;
}

}  // namespace gpufeed::loader::detail
