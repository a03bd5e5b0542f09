// GPUFEED_TEST_FAULT (test_faults.h): parsed only in a GPUFEED_FAULT_INJECTION build.
#include "test_faults.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>

#include "gpufeed/harness/torch_file.h"

namespace gpufeed::tools {

bool TrainFaults::any_step_hook(int rank) const {
  if (kill_rank == rank) return true;
  return std::any_of(raises.begin(), raises.end(), [rank](const Raise& r) { return r.rank < 0 || r.rank == rank; });
}

void TrainFaults::after_step(int rank, int64_t step) const {
  if (kill_rank == rank && step + 1 == kill_step) ::kill(::getpid(), SIGKILL);
  for (const auto& r : raises) {
    if ((r.rank < 0 || r.rank == rank) && step + 1 == r.step) {
      if (r.parent) ::kill(::getppid(), r.sig);
      else ::raise(r.sig);
    }
  }
}

void TrainFaults::install_write_fault() const {
  if (abort_write <= 0) return;
  auto writes = std::make_shared<int>(0);
  const int n = abort_write;
  profiler::set_write_fault_hook([writes, n](const std::filesystem::path&, int64_t done, int64_t total) {
    if (done == std::min<int64_t>(total, int64_t{1} << 20) && ++*writes == n) {
      std::cerr << "gpufeed: GPUFEED_TEST_FAULT: aborting in the middle of checkpoint write " << n << "\n";
      std::abort();
    }
  });
}

#ifdef GPUFEED_FAULT_INJECTION
namespace {

TrainFaults::Raise parse_raise(const std::string& item, const char* name, long long step) {
  TrainFaults::Raise r;
  r.parent = item.rfind("signal-launcher=", 0) == 0;
  r.sig = std::string(name) == "INT" ? SIGINT : std::string(name) == "TERM" ? SIGTERM : 0;
  if (r.sig == 0) throw std::invalid_argument("GPUFEED_TEST_FAULT: signal must be INT or TERM");
  r.step = step;
  const auto at = item.find(":rank=");
  if (at != std::string::npos) r.rank = std::stoi(item.substr(at + 6));
  return r;
}

}  // namespace

TrainFaults read_train_faults() {
  TrainFaults f;
  const char* v = std::getenv("GPUFEED_TEST_FAULT");
  if (!v) return f;
  std::stringstream all(v);
  std::string item;
  while (std::getline(all, item, ',')) {
    long long a = 0, b = 0;
    char name[8] = {0};
    if (std::sscanf(item.c_str(), "kill-rank=%lld:step=%lld", &a, &b) == 2) {
      f.kill_rank = static_cast<int>(a);
      f.kill_step = b;
    } else if (std::sscanf(item.c_str(), "signal=%4[A-Z]:step=%lld", name, &b) == 2 ||
               std::sscanf(item.c_str(), "signal-launcher=%4[A-Z]:step=%lld", name, &b) == 2) {
      f.raises.push_back(parse_raise(item, name, b));
    } else if (std::sscanf(item.c_str(), "abort-checkpoint-write=%lld", &a) == 1) {
      f.abort_write = static_cast<int>(a);
    } else {
      throw std::invalid_argument("GPUFEED_TEST_FAULT: cannot parse '" + item + "'");
    }
  }
  return f;
}
#else
TrainFaults read_train_faults() {
  if (std::getenv("GPUFEED_TEST_FAULT") != nullptr) {
    std::cerr << "gpufeed: warning: GPUFEED_TEST_FAULT is set, but this gpufeed was built without "
                 "GPUFEED_FAULT_INJECTION (a test-only CMake option): ignored\n";
  }
  return {};
}
#endif

}  // namespace gpufeed::tools
