#include "gpufeed/cpu_budget.h"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include <fmt/format.h>

namespace gpufeed {
namespace fs = std::filesystem;
namespace {

std::optional<std::string> read_text(const fs::path& p) {
  std::ifstream in(p);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (;;) {
    const size_t end = s.find(sep, start);
    out.push_back(s.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) return out;
    start = end + 1;
  }
}

std::optional<int64_t> number(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.remove_suffix(1);
  int64_t v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

// mountinfo escapes ' ', '\t', '\n' and '\\' in paths as \ooo.
std::string unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && s.size() - i >= 4 &&
        std::all_of(s.begin() + static_cast<std::ptrdiff_t>(i) + 1, s.begin() + static_cast<std::ptrdiff_t>(i) + 4,
                    [](char c) { return c >= '0' && c <= '7'; })) {
      out.push_back(static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// A quota read at one level of the hierarchy: cgroup v2's cpu.max, else v1's pair of files.
std::optional<CpuQuota> quota_at(const fs::path& dir, bool v2) {
  CpuQuota q;
  if (v2) {
    q.file = (dir / "cpu.max").string();
    const auto text = read_text(q.file);
    if (!text) return std::nullopt;
    const std::vector<std::string_view> f = split(std::string_view(*text).substr(0, text->find('\n')), ' ');
    if (f.size() != 2 || f[0] == "max") return std::nullopt;
    const auto quota = number(f[0]), period = number(f[1]);
    if (!quota || !period || *quota <= 0 || *period <= 0) return std::nullopt;
    q.quota_us = *quota;
    q.period_us = *period;
    return q;
  }
  q.file = (dir / "cpu.cfs_quota_us").string();
  const auto quota_text = read_text(q.file), period_text = read_text(dir / "cpu.cfs_period_us");
  if (!quota_text || !period_text) return std::nullopt;
  const auto quota = number(*quota_text), period = number(*period_text);
  if (!quota || !period || *quota <= 0 || *period <= 0) return std::nullopt;  // -1: no limit
  q.quota_us = *quota;
  q.period_us = *period;
  return q;
}

bool smaller(const CpuQuota& a, const CpuQuota& b) {
  // a.quota/a.period < b.quota/b.period without rounding (microsecond counts fit easily).
  return static_cast<__int128>(a.quota_us) * b.period_us < static_cast<__int128>(b.quota_us) * a.period_us;
}

int affinity_cpu_count() {
  for (int n = 1024; n <= (1 << 20); n *= 2) {
    cpu_set_t* set = CPU_ALLOC(n);
    if (!set) return 0;
    const size_t size = CPU_ALLOC_SIZE(n);
    CPU_ZERO_S(size, set);
    const int rc = sched_getaffinity(0, size, set);
    const int count = rc == 0 ? CPU_COUNT_S(size, set) : 0;
    const bool too_small = rc != 0 && errno == EINVAL;
    CPU_FREE(set);
    if (!too_small) return count;
  }
  return 0;
}

}  // namespace

int CpuQuota::cpus() const {
  if (period_us <= 0) return 1;
  return static_cast<int>(std::max<int64_t>(1, (quota_us + period_us - 1) / period_us));
}

std::optional<CpuQuota> cgroup_cpu_quota(std::string_view proc_self_cgroup, std::string_view mountinfo,
                                         const fs::path& root) {
  // The process's cgroup in each hierarchy: v2's ("0::/path") and v1's cpu controller's.
  std::optional<std::string> v2_path, v1_path;
  for (const std::string_view line : split(proc_self_cgroup, '\n')) {
    const size_t a = line.find(':'), b = a == std::string_view::npos ? a : line.find(':', a + 1);
    if (b == std::string_view::npos) continue;
    const std::string_view id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1);
    const std::string path(line.substr(b + 1));
    if (id == "0" && controllers.empty()) v2_path = path;
    for (const std::string_view c : split(controllers, ','))
      if (c == "cpu") v1_path = path;
  }
  std::optional<CpuQuota> best;
  for (const std::string_view line : split(mountinfo, '\n')) {
    // "id parent maj:min root mount_point options [optional fields] - fstype source super_options"
    const std::vector<std::string_view> f = split(line, ' ');
    const auto dash = std::find(f.begin(), f.end(), std::string_view("-"));
    if (f.size() < 5 || dash == f.end() || f.end() - dash < 4) continue;
    const std::string_view fstype = dash[1];
    bool v2 = false;
    if (fstype == "cgroup2") {
      v2 = true;
    } else if (fstype == "cgroup") {
      const std::vector<std::string_view> opts = split(dash[3], ',');
      if (std::find(opts.begin(), opts.end(), std::string_view("cpu")) == opts.end()) continue;
    } else {
      continue;
    }
    const std::optional<std::string>& own = v2 ? v2_path : v1_path;
    if (!own) continue;
    const std::string mount_root = unescape(f[3]);
    const fs::path mount_point = root / fs::path(unescape(f[4])).relative_path();
    // The process's cgroup relative to the mount's root; outside it (a container that sees its
    // own cgroup as the root), start at the mount point.
    fs::path relative;
    if (mount_root == "/") {
      relative = fs::path(*own).relative_path();
    } else if (own->compare(0, mount_root.size(), mount_root) == 0 &&
               (own->size() == mount_root.size() || (*own)[mount_root.size()] == '/')) {
      relative = fs::path(own->substr(mount_root.size())).relative_path();
    }
    fs::path dir = mount_point / relative;
    for (;;) {
      if (auto q = quota_at(dir, v2); q && (!best || smaller(*q, *best))) best = std::move(q);
      if (relative.empty()) break;
      relative = relative.parent_path();
      dir = mount_point / relative;
    }
  }
  return best;
}

CpuBudget make_cpu_budget(int hardware_threads, int affinity_cpus, std::optional<CpuQuota> quota) {
  CpuBudget b;
  b.hardware_threads = std::max(0, hardware_threads);
  b.affinity_cpus = std::max(0, affinity_cpus);
  b.quota = std::move(quota);
  int cpus = b.affinity_cpus > 0 ? b.affinity_cpus : b.hardware_threads;
  if (b.quota) cpus = cpus > 0 ? std::min(cpus, b.quota->cpus()) : b.quota->cpus();
  b.cpus = std::max(1, cpus);
  return b;
}

std::string CpuBudget::describe() const {
  std::string affinity;
  if (affinity_cpus <= 0) {
    affinity = "affinity mask unknown";
  } else if (hardware_threads > 0 && affinity_cpus >= hardware_threads) {
    affinity = fmt::format("affinity mask: all {} hardware threads", hardware_threads);
  } else {
    affinity = fmt::format("affinity mask: {} of {} hardware threads", affinity_cpus, hardware_threads);
  }
  const std::string limit =
      quota ? fmt::format("cgroup CPU quota {}/{} us = {:g} CPUs in {}", quota->quota_us, quota->period_us,
                          static_cast<double>(quota->quota_us) / static_cast<double>(quota->period_us), quota->file)
            : std::string("no cgroup CPU quota");
  return fmt::format("{} CPU{} ({}; {})", cpus, cpus == 1 ? "" : "s", affinity, limit);
}

const CpuBudget& cpu_budget_info() {
  static const CpuBudget budget = [] {
    const auto cgroup = read_text("/proc/self/cgroup"), mountinfo = read_text("/proc/self/mountinfo");
    return make_cpu_budget(static_cast<int>(std::thread::hardware_concurrency()), affinity_cpu_count(),
                           cgroup && mountinfo ? cgroup_cpu_quota(*cgroup, *mountinfo) : std::nullopt);
  }();
  return budget;
}

int cpu_budget() { return cpu_budget_info().cpus; }

}  // namespace gpufeed
