// Internal: making oneTBB's orderings visible to ThreadSanitizer.
//
// Debian's libtbb is not instrumented, so TSan cannot see the ordering its scheduler provides
// between a parallel_for's start and its chunks, or between its chunks and its return: the first
// reads of a chunk (of data the caller wrote just before) and the caller's first writes after the
// return (freeing what the chunks read) would be reported as races. The annotations below, no-ops
// outside TSan builds, order the start before every chunk and every chunk before the return.
// Use parallel_for_ordered() instead of tbb::parallel_for wherever the body touches the caller's
// data; tools/tsan.supp then only needs to cover TBB's own task objects.
#pragma once

#include <tbb/parallel_for.h>

#if defined(__SANITIZE_THREAD__)
#define GPUFEED_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define GPUFEED_TSAN 1
#endif
#endif

#ifdef GPUFEED_TSAN
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace gpufeed::datasets::detail {

inline void tsan_release([[maybe_unused]] const void* token) {
#ifdef GPUFEED_TSAN
  __tsan_release(const_cast<void*>(token));
#endif
}
inline void tsan_acquire([[maybe_unused]] const void* token) {
#ifdef GPUFEED_TSAN
  __tsan_acquire(const_cast<void*>(token));
#endif
}

// tbb::parallel_for(range, body) with the start ordered before each chunk and each chunk before
// the return, as TSan sees it. The sync addresses are this call's own locals.
template <typename Range, typename Body>
void parallel_for_ordered(const Range& range, const Body& body) {
  const char start = 0, end = 0;
  tsan_release(&start);
  tbb::parallel_for(range, [&](const Range& r) {
    tsan_acquire(&start);
    body(r);
    tsan_release(&end);
  });
  tsan_acquire(&end);
}

}  // namespace gpufeed::datasets::detail
