#include "fork_guard.h"

#include <pthread.h>
#include <unistd.h>
#include <tbb/global_control.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <new>
#include <stdexcept>

namespace gpufeed::loader::detail {
namespace {

// Guarded by state_mutex(), which the prepare handler holds across fork() so that no ForkGuard is
// made or destroyed half-way through it.
struct ForkState {
  int live = 0;                 // ForkGuards alive
  bool pool_running = false;    // oneTBB's pool was started by a loader and not shut down since
  bool inherited_pool = false;  // this process is a fork() child of a process with a running pool
};

std::mutex& state_mutex() {
  static std::mutex m;
  return m;
}

ForkState& state() {
  static ForkState s;
  return s;
}

void before_fork() {
  state_mutex().lock();
  ForkState& s = state();
  if (s.pool_running && s.live == 0) {
    // Every loader (and with it every arena and global_control of ours) is gone: wait for the
    // idle workers to exit. Fails, harmlessly, when someone else still holds the pool.
    tbb::task_scheduler_handle handle{tbb::attach{}};
    if (tbb::finalize(handle, std::nothrow)) s.pool_running = false;
  }
}

void after_fork_in_parent() { state_mutex().unlock(); }

// The end of a child that inherited a running pool: the exit handlers still to run include oneTBB's
// (libtbbmalloc's cleanup), which can spin forever on a lock that a worker of the parent held at
// the fork. Its exit status is kept; stdio is flushed; the rest of the handlers are skipped.
void leave_without_tbb_handlers(int status, void*) {
  std::fflush(nullptr);
  ::_exit(status);
}

void after_fork_in_child() {
  ForkState& s = state();
  if (s.pool_running) {
    s.inherited_pool = true;
    ::on_exit(leave_without_tbb_handlers, nullptr);
  }
  state_mutex().unlock();
}

}  // namespace

ForkGuard::ForkGuard() : pid_(static_cast<long>(::getpid())) {
  static std::once_flag handlers;
  std::call_once(handlers, [] { pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child); });
  std::lock_guard<std::mutex> lk(state_mutex());
  ++state().live;
  state().pool_running = true;
}

ForkGuard::~ForkGuard() {
  std::lock_guard<std::mutex> lk(state_mutex());
  --state().live;
}

bool ForkGuard::in_forked_child() const { return static_cast<long>(::getpid()) != pid_; }

void ForkGuard::check_usable() const {
  if (in_forked_child()) {
    throw std::runtime_error(
        "Loader: this loader was made before fork() (os.fork(), multiprocessing's 'fork' start "
        "method), in the parent process; its threads (oneTBB) stayed there, so it cannot run in the "
        "child: make the loader in the child, started with the 'spawn' or 'forkserver' method");
  }
}

void check_fork_safe() {
  std::lock_guard<std::mutex> lk(state_mutex());
  if (state().inherited_pool) {
    throw std::runtime_error(
        "Loader: this process was forked (os.fork(), multiprocessing's 'fork' start method) while a "
        "gpufeed loader was alive in its parent, and the loader's thread pool (oneTBB) does not "
        "survive fork(): no loader can run here. Use the 'spawn' or 'forkserver' start method "
        "(multiprocessing.set_start_method('spawn'); torch.multiprocessing alike), or release every "
        "loader, and the batches that hold its slots, before forking");
  }
}

}  // namespace gpufeed::loader::detail
