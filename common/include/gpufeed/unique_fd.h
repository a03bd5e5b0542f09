#pragma once
// POSIX file descriptors for the rooms' file code (internal, not installed): UniqueFd, the one
// owner that closes a descriptor on every way out of a scope, and pread_full, the EINTR-safe
// positioned read loop.

#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <utility>

namespace gpufeed {

/// Owns one file descriptor (-1: none) and closes it when destroyed or reset. Move-only. The
/// destructor ignores close()'s result, which is right for a file only read, or one whose write
/// already failed; where a written file's close must be checked, call ::close(fd.release())
/// and check that.
class UniqueFd {
 public:
  UniqueFd() noexcept = default;
  /// Takes ownership of `fd`; a negative one (a failed open()) is held as none.
  explicit UniqueFd(int fd) noexcept : fd_(fd < 0 ? -1 : fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  /// The descriptor, still owned; -1 when none.
  int get() const noexcept { return fd_; }
  /// Whether a descriptor is held.
  explicit operator bool() const noexcept { return fd_ >= 0; }
  /// Gives the descriptor up without closing it (-1 when none): the caller now owns it.
  int release() noexcept { return std::exchange(fd_, -1); }
  /// Closes the held descriptor, if any, and holds `fd` instead.
  void reset(int fd = -1) noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd < 0 ? -1 : fd;
  }

 private:
  int fd_ = -1;
};

/// What pread_full read: `bytes` (fewer than asked when the file ends first, or on an error),
/// and `error`, errno of the failed pread (0: none).
struct PreadResult {
  size_t bytes = 0;
  int error = 0;
};

/// Reads `n` bytes of `fd` at `offset` into `buf`, retrying pread where a signal interrupts it
/// (EINTR) or it returns fewer bytes; stops at the end of the file or at the first other error.
inline PreadResult pread_full(int fd, void* buf, size_t n, int64_t offset) noexcept {
  PreadResult r;
  while (r.bytes < n) {
    const ssize_t got = ::pread(fd, static_cast<char*>(buf) + r.bytes, n - r.bytes,
                                static_cast<off_t>(offset) + static_cast<off_t>(r.bytes));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      r.error = errno;
      break;
    }
    if (got == 0) break;
    r.bytes += static_cast<size_t>(got);
  }
  return r;
}

}  // namespace gpufeed
