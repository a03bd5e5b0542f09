#include "gpufeed/profiler/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>

#include "gpufeed/unique_fd.h"

namespace gpufeed::profiler {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const std::string& name, const std::string& why) {
  throw std::runtime_error(name + ": " + why);
}

std::mutex g_hook_mutex;
WriteFaultHook g_write_hook;

void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

void set_write_fault_hook(WriteFaultHook hook) {
  std::lock_guard<std::mutex> lock(g_hook_mutex);
  g_write_hook = std::move(hook);
}

void write_file_atomically(const fs::path& requested, const std::vector<char>& bytes) {
  // A symlink is written through (its target is replaced, the link stays), as torch.save's
  // open() would. Anything that exists and is not a regular file (a device such as /dev/null, a
  // FIFO, a folder) is refused: the rename below would replace the node itself with a file.
  std::error_code ec;
  fs::path path = requested;
  if (fs::is_symlink(fs::symlink_status(requested, ec))) {
    fs::path target = fs::weakly_canonical(requested, ec);
    if (!ec) path = std::move(target);  // else: rename over the link, as before
  }
  const fs::file_status st = fs::status(path, ec);
  if (fs::exists(st) && !fs::is_regular_file(st)) {
    fail(requested.string(),
         "exists and is not a regular file: the write goes to a temporary file renamed into "
         "place, which would replace it; name a regular file");
  }
  if (!path.parent_path().empty()) fs::create_directories(path.parent_path());
  const fs::path tmp = path.string() + ".tmp." + std::to_string(::getpid());
  WriteFaultHook hook;
  {
    std::lock_guard<std::mutex> lock(g_hook_mutex);
    hook = g_write_hook;
  }
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(tmp.string(), std::string("cannot create: ") + std::strerror(errno));
  gpufeed::UniqueFd owner(fd);  // closed on every way out but the checked close below
  auto cleanup = [&](const std::string& why) {
    owner.reset();
    std::error_code ec;
    fs::remove(tmp, ec);
    fail(path.string(), why);
  };
  constexpr size_t kChunk = size_t{1} << 20;
  size_t done = 0;
  while (done < bytes.size()) {
    const size_t n = std::min(kChunk, bytes.size() - done);
    const ssize_t w = ::write(fd, bytes.data() + done, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      cleanup(std::string("write failed: ") + std::strerror(errno));
    }
    done += static_cast<size_t>(w);
    if (hook) {
      try {
        hook(path, static_cast<int64_t>(done), static_cast<int64_t>(bytes.size()));
      } catch (const std::exception& e) {
        cleanup(std::string("write failed: ") + e.what());
      }
    }
  }
  if (::fsync(fd) != 0) cleanup(std::string("fsync failed: ") + std::strerror(errno));
  if (::close(owner.release()) != 0) {
    std::error_code ec;
    fs::remove(tmp, ec);
    fail(path.string(), std::string("close failed: ") + std::strerror(errno));
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    fail(path.string(), "cannot rename the temporary file into place: " + ec.message());
  }
  fsync_dir(path.parent_path());
}

}  // namespace gpufeed::profiler
