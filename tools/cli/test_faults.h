#pragma once
// Test hooks of `gpufeed train`, from the GPUFEED_TEST_FAULT environment variable, for
// tests/test_distributed.cpp. Only a binary built with GPUFEED_FAULT_INJECTION (a CMake option,
// on when the tests are built) parses it (test_faults.cpp); any other build ignores the variable
// with a warning. Items, comma-separated:
//   kill-rank=R:step=K            rank R sends itself SIGKILL after optimizer step K (1-based);
//   signal=INT|TERM:step=K[:rank=R]   raise the signal after step K (on rank R, default all);
//                                 repeat the item to raise it twice;
//   signal-launcher=INT|TERM:step=K:rank=R   rank R sends the signal to its parent (the launcher);
//   abort-checkpoint-write=N      the N-th file write aborts the process after its first chunk.
#include <cstdint>
#include <vector>

namespace gpufeed::tools {

struct TrainFaults {
  struct Raise {
    int sig = 0;
    int64_t step = 0;
    int rank = -1;        // -1: every rank
    bool parent = false;  // send it to the parent process instead
  };
  int kill_rank = -1;
  int64_t kill_step = 0;
  std::vector<Raise> raises;
  int abort_write = 0;

  /// Whether rank `rank` has a hook to run after each step.
  bool any_step_hook(int rank) const;
  /// Runs rank `rank`'s hooks after optimizer step `step` (0-based).
  void after_step(int rank, int64_t step) const;
  /// Installs the checkpoint-write abort (abort_write > 0) in the harness's file writer.
  void install_write_fault() const;
};

/// GPUFEED_TEST_FAULT's hooks (none when unset). Throws std::invalid_argument for an item it
/// cannot parse.
TrainFaults read_train_faults();

}  // namespace gpufeed::tools
