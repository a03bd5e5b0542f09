#pragma once
// The loader's slots and what it schedules into them (private to loader/src):
//   SlotRing      exactly prefetch_depth batch slots from the HostAllocator, and the free list;
//   EpochPlan     one epoch as planned at its start: its options, batches and flattened order;
//   InFlight      one batch being assembled in one slot, from scheduling until next() hands it out;
//   EpochSchedule the in-order hand-out of one epoch: its plan, the batches scheduled and not yet
//                 handed out, and the cursors a checkpoint needs.
// None of them locks: the loader's mutex guards the ring and the schedules (InFlight::mu guards a
// batch's error and skips, which its samples' workers write).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

#include "gpufeed/loader/host_allocator.h"
#include "gpufeed/loader/loader.h"

namespace gpufeed::loader::detail {

struct Slot {
  void* base = nullptr;
  size_t bytes = 0;
  uint8_t* images = nullptr;  // batch_size samples of up to the ring's sample bytes (EpochPlan::views)
  int64_t* labels = nullptr;  // [batch_size] int64, 64-byte aligned after the images
  std::vector<DeferredSample> deferred;  // [batch_size] under decode_device gpu/auto, else empty
};

// The slot ring: `depth` slots of batch_size samples of up to `sample_bytes` each (side^2 x 3, or
// the views' sum), allocated up front.
// A slot is taken when its batch is scheduled and comes back when the consumer's last Batch copy
// (its lease) is gone, or when an unfinished batch is cancelled.
class SlotRing {
 public:
  /// Throws std::runtime_error naming the sizes when the allocator refuses one of the slots.
  SlotRing(HostAllocator& allocator, int depth, int64_t batch_size, int64_t sample_bytes);
  ~SlotRing() { deallocate_all(); }
  SlotRing(const SlotRing&) = delete;
  SlotRing& operator=(const SlotRing&) = delete;

  /// One slot more (prefetch_depth auto), free at once; false when the allocator refuses it.
  /// Slots live in a deque: a slot's address never moves while batches point into it.
  bool grow();
  size_t slot_bytes() const { return bytes_; }
  /// A free slot, or nullptr when every slot is busy.
  Slot* acquire() {
    if (free_.empty()) return nullptr;
    Slot* s = free_.back();
    free_.pop_back();
    return s;
  }
  void release(Slot* slot) { free_.push_back(slot); }
  int free_count() const { return static_cast<int>(free_.size()); }
  int size() const { return static_cast<int>(slots_.size()); }

 private:
  void deallocate_all();
  HostAllocator& allocator_;
  size_t label_offset_, bytes_;
  std::deque<Slot> slots_;
  std::vector<Slot*> free_;
};

// One epoch as planned when it is started (or planned ahead, see Loader::Impl::plan_ahead): fixed
// once made, read by its tasks without the loader's lock. `cancelled` stops its queued samples.
struct EpochPlan {
  int64_t epoch = 0;
  // The epoch's options: the loader's, with rrc.size = the epoch's image size.
  LoaderOptions options;
  int64_t sample_bytes = 0;                   // S * S * 3, or the views' sum
  // With views: view k's [batch_size, S_k, S_k, 3] starts at view_offsets[k] bytes into the slot,
  // its row bytes view_bytes[k] = S_k * S_k * 3. Empty without views.
  std::vector<int64_t> view_offsets, view_bytes;
  std::vector<std::vector<int64_t>> batches;  // this rank's, sampler order
  std::vector<int64_t> order;                 // the batches, flattened
  uint64_t tag = 0;                           // the plan's name for the dataset's SampleReader
  mutable std::atomic<bool> cancelled{false};

  int64_t total() const { return static_cast<int64_t>(batches.size()); }
  // The output side: the transform's, or view 0's.
  int side() const { return options.views.empty() ? options.transform.output_size() : options.views.views[0].rrc.size; }
};

/// Epoch `epoch`'s plan under `options` at output side `size` (the train transform's; the eval
/// transform keeps its own), named `tag`: its batches of `options.batch_size` in the sampler's
/// order `indices` (a short last one dropped under drop_last).
std::shared_ptr<const EpochPlan> make_epoch_plan(const LoaderOptions& options, int size, uint64_t tag, int64_t epoch,
                                                 const std::vector<int64_t>& indices);

inline bool cancelled(const EpochPlan& p) { return p.cancelled.load(std::memory_order_relaxed); }

struct InFlight {
  std::shared_ptr<const EpochPlan> plan;  // the epoch it belongs to
  int64_t batch_index = 0;
  Slot* slot = nullptr;
  std::vector<int64_t> indices;
  bool done = false;                 // guarded by the loader's mutex
  std::mutex mu;                     // guards error, error_k and skipped
  std::exception_ptr error;          // of the failing sample first in sampler order (error_k)
  size_t error_k = SIZE_MAX;
  std::vector<SkippedSample> skipped;

  // Keeps the error of the sample earliest in the batch, so which error next() throws does not
  // depend on which thread finished first.
  void fail(size_t k, std::exception_ptr e) {
    std::lock_guard<std::mutex> g(mu);
    if (k < error_k) {
      error_k = k;
      error = std::move(e);
    }
  }
  void add_skip(SkippedSample skip) {
    std::lock_guard<std::mutex> g(mu);
    skipped.push_back(std::move(skip));
  }
};

// The in-order hand-out of one epoch: its plan, the batches scheduled and not yet handed out
// (front = the next one next() returns, whatever order their samples finish in), and the two
// cursors a checkpoint needs. Guarded by the loader's mutex.
struct EpochSchedule {
  std::shared_ptr<const EpochPlan> plan;  // null before the first start_epoch
  std::deque<std::shared_ptr<InFlight>> pending;
  int64_t next_submit = 0;  // next batch to schedule
  int64_t consumed = 0;     // batches handed out (or dropped by a raise), resume point included
  // Batches whose samples the dataset's reader was told (announce), counted from next_submit's
  // start: the whole rest of a started epoch; of an epoch planned ahead, only the batches
  // scheduled into free slots, so a remote reader never fetches ahead into an epoch that may
  // never start beyond what the slots decode.
  int64_t announced = 0;

  int64_t epoch() const { return plan ? plan->epoch : 0; }
  int64_t total() const { return plan ? plan->total() : 0; }
  bool more_to_schedule() const { return next_submit < total(); }
};

/// Whether every slot but those the consumer holds holds a decoded batch while `current` or
/// `ahead` has more to schedule: the loader idles for want of a slot. Under the loader's mutex.
bool idle_for_slots(const SlotRing& ring, const EpochSchedule& current, const EpochSchedule& ahead);

}  // namespace gpufeed::loader::detail
