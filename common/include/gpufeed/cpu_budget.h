#pragma once
// The CPU budget: how many CPUs this process may keep busy at once. Project-wide (it lives in the
// lowest room, beside the logger, so that every room uses the same count): it is what "0" means
// wherever gpufeed picks a thread count by itself (the loader's num_workers, the listing threads,
// pack, bench, the trainer, the Python DataLoader's stats and the profiler's advice).
//
// std::thread::hardware_concurrency() counts the machine's online CPUs and ignores what the
// process is allowed to use; the budget honours both limits Linux puts on a process:
//   * the affinity mask (sched_getaffinity: taskset, numactl, Slurm and container cpusets);
//   * the cgroup CPU quota (docker --cpus, Kubernetes CPU limits, systemd CPUQuota=): quota /
//     period CPUs, the smallest over the process's cgroup and every ancestor up to the cgroup
//     file system's root, cgroup v2 (`cpu.max`: "max 100000" is no limit, "150000 100000" is
//     1.5 CPUs) and v1 (`cpu.cfs_quota_us`, -1 for no limit, over `cpu.cfs_period_us`).
//   budget = max(1, min(CPUs in the affinity mask, ceil(quota / period)))
// Where a part cannot be read (no cgroup file system, files missing or unreadable) it imposes no
// limit; nothing here throws.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace gpufeed {

/// A cgroup CPU quota: `quota_us` microseconds of CPU time per `period_us`, read from `file`.
struct CpuQuota {
  int64_t quota_us = 0;
  int64_t period_us = 0;
  std::string file;
  /// ceil(quota_us / period_us), at least 1.
  int cpus() const;
};

/// The budget and what it is made of.
struct CpuBudget {
  int cpus = 1;              ///< the budget: >= 1
  int hardware_threads = 0;  ///< std::thread::hardware_concurrency() (0: unknown)
  int affinity_cpus = 0;     ///< CPUs in the affinity mask (0: unknown)
  std::optional<CpuQuota> quota;  ///< the smallest cgroup CPU quota, if any
  /// What the budget is made of, for messages: e.g. "1 CPU (affinity mask: 1 of 2 hardware
  /// threads; no cgroup CPU quota)" or "2 CPUs (affinity mask: all 16 hardware threads; cgroup
  /// CPU quota 150000/100000 us = 1.5 CPUs in /sys/fs/cgroup/a/cpu.max)".
  std::string describe() const;
};

/// This process's budget, computed on the first call (affinity mask, /proc/self/cgroup,
/// /proc/self/mountinfo) and cached for the life of the process. Thread-safe. A process that
/// later changes its own affinity keeps the first answer.
const CpuBudget& cpu_budget_info();
/// cpu_budget_info().cpus: the default thread count, >= 1.
int cpu_budget();

/// The parts, with their inputs injected (tests; cpu_budget_info() calls them on the real files).
/// The smallest CPU quota over the cgroup hierarchies that control the CPU: `proc_self_cgroup`
/// is /proc/self/cgroup's text ("0::/user.slice/x" for v2, "4:cpu,cpuacct:/x" for v1),
/// `mountinfo` /proc/self/mountinfo's (where each hierarchy is mounted, and which cgroup is its
/// root); the files are read under `root` + the mount point (root "/" on a real system, a fake
/// tree in tests), from the process's cgroup up to the mount point. nullopt: no quota anywhere.
std::optional<CpuQuota> cgroup_cpu_quota(std::string_view proc_self_cgroup, std::string_view mountinfo,
                                         const std::filesystem::path& root = "/");
/// Combines the parts: max(1, min(affinity_cpus or else hardware_threads, quota->cpus())).
CpuBudget make_cpu_budget(int hardware_threads, int affinity_cpus, std::optional<CpuQuota> quota);

}  // namespace gpufeed
