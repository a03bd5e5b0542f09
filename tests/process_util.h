#pragma once
// Running commands (the built `gpufeed` CLI above all) as processes in tests: exit codes, output
// to a log or captured per stream. Header-only and dependency-free, so any test can use it
// (test_util.h includes it; test_inspect.cpp, which links no loader, includes it alone).
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace gpufeed::test {

/// The whole file as text ("" when it cannot be opened).
inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// `s` single-quoted for sh (any byte but NUL survives).
inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (const char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

/// How a process ended: its exit code, or 128 + the signal that killed it (as a shell says).
inline int code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

/// Runs `cmd` with a shell, output (both streams) to `log`. Returns code_of(status).
inline int run(const std::string& cmd, const std::filesystem::path& log) {
  const std::string full = cmd + " > " + shell_quote(log.string()) + " 2>&1";
  return code_of(std::system(full.c_str()));
}

/// What a command printed, per stream, and how it ended (code_of()).
struct Output {
  int code = -1;
  std::string out, err;
};

/// Runs `cmd` with a shell, stdout and stderr captured separately through files in `scratch`
/// (`stdout.txt`, `stderr.txt`, overwritten by the next call).
inline Output run_captured(const std::string& cmd, const std::filesystem::path& scratch) {
  const std::filesystem::path o = scratch / "stdout.txt", e = scratch / "stderr.txt";
  Output r;
  r.code = code_of(std::system((cmd + " >" + shell_quote(o.string()) + " 2>" + shell_quote(e.string())).c_str()));
  r.out = read_text(o);
  r.err = read_text(e);
  return r;
}

}  // namespace gpufeed::test
