// oneTBB and fork(): a child made by fork() inherits oneTBB's scheduler state but none of its
// worker threads, so a task enqueued there never runs and a loader created in the child would wait
// forever for its first batch. ForkGuard keeps the two cases apart:
//
// - No loader alive at the fork (the parent iterated loaders and released them, batches
//   included): the fork's prepare handler shuts oneTBB's pool down (tbb::finalize, which waits for
//   its idle workers to exit), so the child (and the parent, on its next loader) starts a fresh one.
// - A loader alive at the fork (its arena holds the pool): the child is marked, and every Loader
//   constructed in it throws at once, saying to use the spawn/forkserver start method.
//
// A child that only decodes (gpufeed.decode_image, load_sample: no oneTBB) works either way.
// A loader the child inherited from its parent cannot run there (its workers, and maybe its
// mutex's owner, stayed behind): its methods throw (ForkGuard::check_usable) and its destruction
// and its batches' leases leave its state alone (never waiting on the parent's threads), and the
// child's exit skips oneTBB's own exit handlers (which may wait on them too), so it exits cleanly.
#pragma once

namespace gpufeed::loader::detail {

/// One per live Loader (a member of its state): counts the users of oneTBB's pool and installs
/// the pthread_atfork handlers once per process.
class ForkGuard {
 public:
  ForkGuard();
  ~ForkGuard();
  ForkGuard(const ForkGuard&) = delete;
  ForkGuard& operator=(const ForkGuard&) = delete;

  /// True in a fork() child of the process that made this guard.
  bool in_forked_child() const;
  /// Throws std::runtime_error in a fork() child (the loader was inherited and cannot run).
  void check_usable() const;

 private:
  long pid_;  // the process that made the guard
};

/// Throws std::runtime_error when this process was forked from one whose oneTBB pool was running
/// a loader at the time of the fork (loaders cannot run here; see above).
void check_fork_safe();

}  // namespace gpufeed::loader::detail
