#pragma once
// Files replaced atomically and durably: the write every file gpufeed produces goes through
// (checkpoints, torch.save files, traces). No torch.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <vector>

namespace gpufeed::profiler {

/// Atomically replaces `path` with `bytes` (the write save_torch_file does). A symlink is written
/// through (its target is replaced). Throws std::runtime_error naming the path when it exists and
/// is not a regular file (a device, FIFO or folder: renaming over it would replace the node), or
/// on I/O failure.
void write_file_atomically(const std::filesystem::path& path, const std::vector<char>& bytes);

/// Fault injection for tests: when set, write_file_atomically calls the hook after each chunk
/// (1 MiB) it writes to the temporary file, with the final path and the bytes written so far
/// and in all. A hook that throws makes the write fail as an I/O error would (the temporary file
/// is removed, `path` is untouched); a hook that kills the process models a crash. Pass an
/// empty function to remove it. Not thread-safe with concurrent writes.
using WriteFaultHook = std::function<void(const std::filesystem::path& path, int64_t bytes_written,
                                          int64_t bytes_total)>;
void set_write_fault_hook(WriteFaultHook hook);

}  // namespace gpufeed::profiler
