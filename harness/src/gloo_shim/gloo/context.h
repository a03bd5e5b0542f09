#pragma once
// Declaration-only stand-in (see ../README.md): ProcessGroupGloo.hpp names gloo::Context and
// calls setTimeout in an inline member gpufeed never uses.
#include <chrono>

namespace gloo {
class Context {
 public:
  virtual ~Context();
  void setTimeout(std::chrono::milliseconds timeout);
};
}  // namespace gloo
