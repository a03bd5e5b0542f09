// gpufeed launch: start one worker process per device with torchrun's environment contract,
//   gpufeed launch --nproc-per-node N [--nnodes M --node-rank R --master-addr A --master-port P]
//                  -- gpufeed train ...
// Each worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK,
// ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and OMP_NUM_THREADS=1 when unset and N > 1, as
// torchrun does). SIGINT, SIGTERM and SIGHUP are forwarded to every worker (the workers run in
// their own process groups, so a terminal's Ctrl-C reaches them once, through here); a worker
// that stops on a signal of its own gets the others a SIGTERM. Workers get SIGTERM when the
// launcher dies, even by SIGKILL (PR_SET_PDEATHSIG, set in the child after fork, the parent
// re-checked to close the race), and `gpufeed train` honours it at once while it waits in
// rendezvous (before its first step there is nothing to checkpoint). When a
// worker fails (non-zero exit other than 130/143, or killed by a signal) the others get SIGTERM,
// then SIGKILL after
// --stop-timeout seconds; the launcher says which rank failed first and how, and exits with
// that worker's code (128 + signal when it was killed). Torch-free: it never loads LibTorch.
#include <fmt/core.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"

namespace gpufeed::tools {
namespace {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  double stop_timeout_s = 30;
  std::vector<std::string> command;
};

struct Worker {
  int rank = 0, local_rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;  // waitpid status once exited
};

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = strsignal(sig);
    return fmt::format("was killed by signal {} ({})", sig, name ? name : "?");
  }
  return "ended";
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// A free TCP port on this host (for --master-port 0 on a single node).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(std::string("launch: socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    throw std::runtime_error(std::string("launch: cannot find a free port: ") +
                             std::strerror(errno));
  }
  const int port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

// "gpufeed" that is not on PATH means this executable.
std::string resolve_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  if (const char* path = std::getenv("PATH")) {
    std::string dirs = path;
    size_t start = 0;
    while (start <= dirs.size()) {
      const size_t end = dirs.find(':', start);
      const std::string dir =
          dirs.substr(start, end == std::string::npos ? std::string::npos : end - start);
      const std::filesystem::path candidate = std::filesystem::path(dir.empty() ? "." : dir) / name;
      if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
      if (end == std::string::npos) break;
      start = end + 1;
    }
  }
  if (name == "gpufeed") return std::filesystem::read_symlink("/proc/self/exe").string();
  return name;
}

pid_t spawn(const LaunchOptions& o, const std::string& program, const Worker& w, int world,
            const sigset_t& old_mask) {
  const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("launch: fork: ") + std::strerror(errno));
  if (pid > 0) return pid;
  // Child: own process group (a terminal's Ctrl-C reaches the workers through the launcher
  // only), SIGTERM when the launcher dies, the launcher's signal mask undone, then exec.
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != launcher) ::_exit(143);
  ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  auto set = [](const char* k, const std::string& v) { ::setenv(k, v.c_str(), 1); };
  set("RANK", std::to_string(w.rank));
  set("LOCAL_RANK", std::to_string(w.local_rank));
  set("WORLD_SIZE", std::to_string(world));
  set("LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node));
  set("GROUP_RANK", std::to_string(o.node_rank));
  set("ROLE_RANK", std::to_string(w.rank));
  set("ROLE_WORLD_SIZE", std::to_string(world));
  set("MASTER_ADDR", o.master_addr);
  set("MASTER_PORT", std::to_string(o.master_port));
  if (o.nproc_per_node > 1) ::setenv("OMP_NUM_THREADS", "1", /*overwrite=*/0);
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(program.c_str()));
  for (size_t i = 1; i < o.command.size(); ++i)
    argv.push_back(const_cast<char*>(o.command[i].c_str()));
  argv.push_back(nullptr);
  ::execv(program.c_str(), argv.data());
  const std::string msg =
      fmt::format("gpufeed launch: cannot run {}: {}\n", program, std::strerror(errno));
  [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, msg.data(), msg.size());
  ::_exit(127);
}

void check_launch_options(LaunchOptions& o) {
  if (o.command.empty()) throw std::invalid_argument("launch: no command after --");
  if (o.nproc_per_node < 1 || o.nnodes < 1 || o.node_rank < 0 || o.node_rank >= o.nnodes) {
    throw std::invalid_argument(
        "launch: need --nproc-per-node >= 1, --nnodes >= 1, 0 <= --node-rank < --nnodes");
  }
  if (o.master_port == 0) {
    if (o.nnodes > 1)
      throw std::invalid_argument(
          "launch: --master-port 0 (pick a free port) only works on one node");
    o.master_port = free_port();
  }
}

// The launched workers, watched until every one has exited: a failure stops the others (SIGTERM,
// then SIGKILL after the stop timeout), a signal to the launcher is passed on to them.
class Supervisor {
 public:
  using Clock = std::chrono::steady_clock;

  Supervisor(const LaunchOptions& o, std::vector<Worker> workers) : o_(o), workers_(std::move(workers)) {}

  int running() const {
    int n = 0;
    for (const auto& w : workers_) n += w.running ? 1 : 0;
    return n;
  }

  /// SIGINT, SIGTERM or SIGHUP to the launcher: passed on; SIGKILL after 4 stop timeouts.
  void on_signal(int sig) {
    std::cerr << fmt::format("gpufeed launch: got {}, passing it to the workers\n", strsignal(sig)) << std::flush;
    forwarded_ = sig;
    signal_all(sig);
    if (!kill_armed_) arm_kill(o_.stop_timeout_s * 4);
  }

  /// Reaps whatever has exited (SIGCHLD may coalesce: every worker is polled each round).
  void reap() {
    for (auto& w : workers_) {
      if (!w.running) continue;
      int status = 0;
      if (::waitpid(w.pid, &status, WNOHANG) != w.pid) continue;
      w.running = false;
      w.status = status;
      on_exit(w);
    }
  }

  /// Workers still running past the stop deadline: SIGKILL.
  void enforce_deadline() {
    if (kill_armed_ && Clock::now() >= kill_at_ && running() > 0) {
      std::cerr << "gpufeed launch: workers still running after the stop timeout: SIGKILL\n" << std::flush;
      signal_all(SIGKILL);
      kill_armed_ = false;
    }
  }

  /// Every worker's status, then the launcher's exit code.
  int finish() const {
    for (const auto& w : workers_) {
      std::cerr << fmt::format("gpufeed launch: rank {} {}\n", w.rank, describe_status(w.status));
    }
    if (first_failure_ >= 0) {
      const Worker& w = workers_[static_cast<size_t>(first_failure_)];
      std::cerr << fmt::format("gpufeed launch: failed: rank {} {} first\n", w.rank, describe_status(w.status));
      return exit_code_of(w.status);
    }
    if (stopped_code_ != 0 && !forwarded_) return stopped_code_;
    if (forwarded_) {
      // Stopped on request: the workers' own codes (130/143 after a checkpoint), the worst first.
      int code = 0;
      for (const auto& w : workers_) code = std::max(code, exit_code_of(w.status));
      return code == 0 ? 128 + forwarded_ : code;
    }
    return 0;
  }

 private:
  void arm_kill(double seconds) {
    kill_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    kill_armed_ = true;
  }

  void signal_all(int sig) const {
    for (const auto& w : workers_) {
      if (w.running) ::kill(w.pid, sig);
    }
  }

  void on_exit(const Worker& w) {
    const int status = w.status;
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    // 130/143: the worker stopped on SIGINT/SIGTERM after checkpointing (all ranks agree on the
    // step to stop after, so the others are stopping too): not a failure.
    const bool stopped = WIFEXITED(status) && (WEXITSTATUS(status) == 128 + SIGINT ||
                                               WEXITSTATUS(status) == 128 + SIGTERM);
    if (stopped && !forwarded_) {
      // A worker stopped by a signal of its own (e.g. `kill` of one pid): the others stop too,
      // or, before their first step, they would wait in rendezvous for the whole timeout.
      std::cerr << fmt::format("gpufeed launch: rank {} stopped on a signal ({}){}\n", w.rank, describe_status(status),
                               stopped_code_ == 0 && running() > 0 ? "; passing SIGTERM to the other workers" : "")
                << std::flush;
      if (stopped_code_ == 0) signal_all(SIGTERM);
      stopped_code_ = std::max(stopped_code_, WEXITSTATUS(status));
    }
    if (ok || stopped || forwarded_ || first_failure_ >= 0) return;
    first_failure_ = static_cast<int>(&w - workers_.data());
    std::cerr << fmt::format("gpufeed launch: rank {} (local rank {}, pid {}) {}; stopping the other workers "
                             "(SIGTERM, SIGKILL after {} s)\n",
                             w.rank, w.local_rank, w.pid, describe_status(status), o_.stop_timeout_s)
              << std::flush;
    signal_all(SIGTERM);
    arm_kill(o_.stop_timeout_s);
  }

  const LaunchOptions& o_;
  std::vector<Worker> workers_;
  int first_failure_ = -1;                    // index of the first worker that failed
  int forwarded_ = 0;                         // a signal we passed on (the run is being stopped)
  int stopped_code_ = 0;                      // 130/143 of workers that stopped on their own signal
  bool kill_armed_ = false;                   // SIGKILL the stragglers at kill_at_
  Clock::time_point kill_at_{};
};

int run_launch(LaunchOptions o) {
  check_launch_options(o);
  const int world = o.nnodes * o.nproc_per_node;
  const std::string program = resolve_program(o.command[0]);
  std::cerr << fmt::format("gpufeed launch: {} workers on this node (ranks {}..{} of {}), master {}:{}\n",
                           o.nproc_per_node, o.node_rank * o.nproc_per_node, (o.node_rank + 1) * o.nproc_per_node - 1,
                           world, o.master_addr, o.master_port)
            << std::flush;
  // Signals are handled synchronously: blocked here, taken with sigtimedwait.
  sigset_t handled, old_mask;
  sigemptyset(&handled);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&handled, sig);
  ::sigprocmask(SIG_BLOCK, &handled, &old_mask);
  std::vector<Worker> workers(static_cast<size_t>(o.nproc_per_node));
  for (int i = 0; i < o.nproc_per_node; ++i) {
    Worker& w = workers[static_cast<size_t>(i)];
    w.local_rank = i;
    w.rank = o.node_rank * o.nproc_per_node + i;
    w.pid = spawn(o, program, w, world, old_mask);
    w.running = true;
  }
  Supervisor supervisor(o, std::move(workers));
  while (supervisor.running() > 0) {
    timespec timeout{0, 200 * 1000 * 1000};
    siginfo_t info;
    const int sig = ::sigtimedwait(&handled, &info, &timeout);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) supervisor.on_signal(sig);
    supervisor.reap();
    supervisor.enforce_deadline();
  }
  ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  return supervisor.finish();
}

}  // namespace

Run add_launch(CLI::App& app) {
  auto o = std::make_shared<LaunchOptions>();
  app.add_option("--nproc-per-node", o->nproc_per_node,
                 "worker processes on this node (one per device)")
      ->capture_default_str()
      ->check(kAtLeastOne);
  app.add_option("--nnodes", o->nnodes, "nodes in the job")
      ->capture_default_str()
      ->check(kAtLeastOne);
  app.add_option("--node-rank", o->node_rank, "this node's index, 0-based")->capture_default_str();
  app.add_option("--master-addr", o->master_addr, "address of node 0 (rank 0 hosts the TCPStore)")
      ->capture_default_str();
  app.add_option("--master-port", o->master_port, "its port; 0 = pick a free one (single node)")
      ->capture_default_str();
  app.add_option("--stop-timeout", o->stop_timeout_s,
                 "seconds between SIGTERM and SIGKILL when stopping workers after a failure")
      ->capture_default_str();
  app.add_option("command", o->command, "the worker command, after --: gpufeed train ...")
      ->required();
  app.footer("Example: gpufeed launch --nproc-per-node 2 -- gpufeed train --data DIR --device cpu");
  return [o] { return run_launch(*o); };
}

}  // namespace gpufeed::tools
