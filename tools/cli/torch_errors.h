#pragma once
// For the CLI's torch translation units (train, ckpt): c10::Error's what() carries a C++ stack
// trace ("Exception raised from ... frame #0 ..."), which is noise to a user. Commands built with
// without_backtrace() rethrow it as std::runtime_error with the message alone, which main()
// prints as "gpufeed: error: <message>".
#include <c10/util/Exception.h>

#include <stdexcept>
#include <utility>

#include "commands.h"

namespace gpufeed::tools {

/// Wraps a command so a c10::Error escaping it becomes std::runtime_error(what_without_backtrace()).
template <typename F>
Run without_backtrace(F run) {
  return [run = std::move(run)]() -> int {
    try {
      return run();
    } catch (const c10::Error& e) {
      throw std::runtime_error(e.what_without_backtrace());
    }
  };
}

}  // namespace gpufeed::tools
