// The CPU budget (gpufeed/cpu_budget.h): the cgroup quota read from fake v1 and v2 trees, the
// budget's arithmetic and text, and, as a process under `taskset -c 0`, the loader's default
// thread count and its warning.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <thread>

#include "gpufeed/cpu_budget.h"
#include "test_util.h"

namespace fs = std::filesystem;
using gpufeed::cgroup_cpu_quota;
using gpufeed::CpuQuota;
using gpufeed::make_cpu_budget;

namespace {

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

// /proc/self/mountinfo lines as a systemd host writes them.
const std::string kV2Mount =
    "25 30 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw\n"
    "30 25 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 "
    "rw,nsdelegate,memory_recursiveprot\n";
const std::string kV1Mount =
    "31 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:10 - cgroup cgroup "
    "rw,cpu,cpuacct\n"
    "32 25 0:28 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,memory\n";

// A quota as one comparable line: "quota/period = N CPUs in FILE", or "none".
std::string seen(const std::optional<CpuQuota>& q) {
  if (!q) return "none";
  return std::to_string(q->quota_us) + "/" + std::to_string(q->period_us) + " = " + std::to_string(q->cpus()) +
         " CPUs in " + q->file;
}

}  // namespace

TEST(CgroupQuota, V2ReadsCpuMaxFromTheProcessCgroupUpToTheRootTakingTheSmallest) {
  gpufeed::test::TempDir tmp("cgroup_v2");
  const fs::path cg = tmp.path / "sys/fs/cgroup";
  const std::string self = "0::/system.slice/job.scope\n";
  const auto quota = [&](const std::string& cgroup) { return seen(cgroup_cpu_quota(cgroup, kV2Mount, tmp.path)); };
  EXPECT_EQ(quota(self), "none");  // no files at all
  write(cg / "system.slice/job.scope/cpu.max", "max 100000\n");
  EXPECT_EQ(quota(self), "none");  // "max": no limit
  // 1.5 CPUs on the parent: 2 CPUs' worth of threads (rounded up).
  write(cg / "system.slice/cpu.max", "150000 100000\n");
  EXPECT_EQ(quota(self), "150000/100000 = 2 CPUs in " + (cg / "system.slice/cpu.max").string());
  // Half a CPU deeper down: the smallest limit wins, and it is at least 1.
  write(cg / "system.slice/job.scope/cpu.max", "50000 100000\n");
  EXPECT_EQ(quota(self), "50000/100000 = 1 CPUs in " + (cg / "system.slice/job.scope/cpu.max").string());
  // A smaller limit on an ancestor caps a larger one below it (4 CPUs under a 3-CPU parent).
  write(cg / "system.slice/job.scope/cpu.max", "400000 100000\n");
  write(cg / "system.slice/cpu.max", "300000 100000\n");
  EXPECT_EQ(quota(self), "300000/100000 = 3 CPUs in " + (cg / "system.slice/cpu.max").string());
  // Garbage is no limit, not an error.
  write(cg / "system.slice/job.scope/cpu.max", "lots\n");
  write(cg / "system.slice/cpu.max", "100000\n");
  EXPECT_EQ(quota(self), "none");
  // A container sees its own cgroup as "/": the limit sits at the mount point itself.
  write(cg / "cpu.max", "200000 100000\n");
  EXPECT_EQ(quota("0::/\n"), "200000/100000 = 2 CPUs in " + (cg / "cpu.max").string());
  // No cgroup2 mount, or no v2 line for the process: nothing is read.
  EXPECT_EQ(seen(cgroup_cpu_quota(self, "", tmp.path)), "none");
  EXPECT_EQ(quota(""), "none");
}

TEST(CgroupQuota, V1ReadsCfsQuotaAndPeriodOfTheCpuController) {
  gpufeed::test::TempDir tmp("cgroup_v1");
  const fs::path cpu = tmp.path / "sys/fs/cgroup/cpu,cpuacct";
  const std::string self = "11:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n";
  const auto quota = [&](const std::string& cgroup) { return seen(cgroup_cpu_quota(cgroup, kV1Mount, tmp.path)); };
  write(cpu / "docker/abc/cpu.cfs_quota_us", "-1\n");  // no limit
  write(cpu / "docker/abc/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(quota(self), "none");
  write(cpu / "docker/abc/cpu.cfs_quota_us", "150000\n");
  EXPECT_EQ(quota(self), "150000/100000 = 2 CPUs in " + (cpu / "docker/abc/cpu.cfs_quota_us").string());
  // The parent's 50000/100000 is smaller.
  write(cpu / "docker/cpu.cfs_quota_us", "50000\n");
  write(cpu / "docker/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(quota(self), "50000/100000 = 1 CPUs in " + (cpu / "docker/cpu.cfs_quota_us").string());
  // A quota without its period is no limit.
  fs::remove(cpu / "docker/cpu.cfs_period_us");
  EXPECT_EQ(quota(self), "150000/100000 = 2 CPUs in " + (cpu / "docker/abc/cpu.cfs_quota_us").string());
  // A memory-only v1 hierarchy is never read for the CPU.
  EXPECT_EQ(quota("11:memory:/docker/abc\n"), "none");
  // Docker without a cgroup namespace: the mount's root is the container's cgroup, so the
  // process's path is taken relative to it.
  gpufeed::test::TempDir ns("cgroup_v1_container");
  const std::string mount =
      "40 35 0:27 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro,nosuid - cgroup cgroup rw,cpu,cpuacct\n";
  const fs::path own = ns.path / "sys/fs/cgroup/cpu,cpuacct";
  write(own / "cpu.cfs_quota_us", "250000\n");
  write(own / "cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(seen(cgroup_cpu_quota("4:cpu,cpuacct:/docker/abc\n", mount, ns.path)),
            "250000/100000 = 3 CPUs in " + (own / "cpu.cfs_quota_us").string());
}

TEST(CgroupQuota, BothHierarchiesTheSmallestWinsAndEscapedMountPointsAreRead) {
  gpufeed::test::TempDir tmp("cgroup_hybrid");
  write(tmp.path / "sys/fs/cgroup/unified/a/cpu.max", "300000 100000\n");
  write(tmp.path / "sys/fs/cgroup/cpu x/a/cpu.cfs_quota_us", "120000\n");
  write(tmp.path / "sys/fs/cgroup/cpu x/a/cpu.cfs_period_us", "100000\n");
  const std::string mounts =
      "30 25 0:26 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
      "31 25 0:27 / /sys/fs/cgroup/cpu\\040x rw shared:3 - cgroup cgroup rw,cpu\n";
  EXPECT_EQ(seen(cgroup_cpu_quota("4:cpu:/a\n0::/a\n", mounts, tmp.path)),
            "120000/100000 = 2 CPUs in " + (tmp.path / "sys/fs/cgroup/cpu x/a/cpu.cfs_quota_us").string());
}

TEST(CpuBudget, IsTheAffinityMaskCappedByTheQuotaAndAtLeastOne) {
  const CpuQuota one_and_a_half{150000, 100000, "/sys/fs/cgroup/cpu.max"};
  const CpuQuota half{50000, 100000, "/q"};
  const CpuQuota ten{1000000, 100000, "/q"};
  EXPECT_EQ(make_cpu_budget(16, 1, std::nullopt).cpus, 1);  // taskset -c 0
  EXPECT_EQ(make_cpu_budget(16, 16, one_and_a_half).cpus, 2);
  EXPECT_EQ(make_cpu_budget(16, 16, half).cpus, 1);
  EXPECT_EQ(make_cpu_budget(4, 4, ten).cpus, 4);  // a quota above the mask changes nothing
  EXPECT_EQ(make_cpu_budget(16, 0, std::nullopt).cpus, 16);  // mask unknown: the machine's count
  EXPECT_EQ(make_cpu_budget(0, 0, std::nullopt).cpus, 1);
  EXPECT_EQ(make_cpu_budget(0, 0, ten).cpus, 10);
  EXPECT_EQ(make_cpu_budget(16, 1, std::nullopt).describe(),
            "1 CPU (affinity mask: 1 of 16 hardware threads; no cgroup CPU quota)");
  EXPECT_EQ(make_cpu_budget(16, 16, one_and_a_half).describe(),
            "2 CPUs (affinity mask: all 16 hardware threads; cgroup CPU quota 150000/100000 us = 1.5 CPUs in "
            "/sys/fs/cgroup/cpu.max)");
  // This process: within the machine's count, and at least 1.
  const gpufeed::CpuBudget& own = gpufeed::cpu_budget_info();
  EXPECT_GE(own.cpus, 1);
  EXPECT_LE(own.cpus, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  EXPECT_EQ(gpufeed::cpu_budget(), own.cpus);
}

// As a process: under `taskset -c 0` the loader's default is one thread, and num_workers 2 warns
// naming the budget and what it is made of.
TEST(CpuBudget, UnderTasksetTheLoadersDefaultIsOneThread) {
  if (std::system("taskset -c 0 true > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "util-linux's taskset is missing (or cannot pin to CPU 0): the process test needs it";
  }
  gpufeed::test::TempDir tmp("cpu_budget_taskset");
  const fs::path data = gpufeed::test::tiny_dataset(tmp.path / "data");
  const std::string probe = gpufeed::test::shell_quote(GPUFEED_CPU_BUDGET_PROBE) + " " +
                            gpufeed::test::shell_quote(data.string());
  const gpufeed::test::Output pinned = gpufeed::test::run_captured("taskset -c 0 " + probe, tmp.path);
  ASSERT_EQ(pinned.code, 0) << pinned.err;
  EXPECT_NE(pinned.out.find("cpu_budget=1\n"), std::string::npos) << pinned.out;
  EXPECT_NE(pinned.out.find("loader_threads=1\n"), std::string::npos) << pinned.out;
  EXPECT_NE(pinned.out.find("budget=1 CPU (affinity mask: 1 of "), std::string::npos) << pinned.out;
  EXPECT_NE(pinned.err.find("loader: num_workers 2 exceeds this process's CPU budget of 1 CPU (affinity mask: 1 of "),
            std::string::npos)
      << pinned.err;
  // Unpinned, the same probe sees this process's own budget (the test's).
  const gpufeed::test::Output unpinned = gpufeed::test::run_captured(probe, tmp.path);
  ASSERT_EQ(unpinned.code, 0) << unpinned.err;
  EXPECT_NE(unpinned.out.find("loader_threads=" + std::to_string(gpufeed::cpu_budget()) + "\n"), std::string::npos)
      << unpinned.out;
}
