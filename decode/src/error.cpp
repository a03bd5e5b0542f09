#include "gpufeed/decode/error.h"

#include <utility>

namespace gpufeed::decode {

std::string_view to_string(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kEmpty:
      return "empty";
    case ErrorKind::kTruncated:
      return "truncated";
    case ErrorKind::kCorrupt:
      return "corrupt";
    case ErrorKind::kUnsupported:
      return "unsupported";
    case ErrorKind::kTooLarge:
      return "too_large";
    case ErrorKind::kIo:
      return "io";
  }
  return "unknown";
}

namespace {

std::string compose_what(ErrorKind kind, const std::string& source, const std::string& reason) {
  std::string what;
  what.reserve(source.size() + reason.size() + 16);
  what.append(source).append(": ").append(to_string(kind)).append(": ").append(reason);
  return what;
}

}  // namespace

DecodeError::DecodeError(ErrorKind kind, std::string source, std::string reason)
    : std::runtime_error(compose_what(kind, source, reason)),
      kind_(kind),
      source_(std::move(source)),
      reason_(std::move(reason)) {}

}  // namespace gpufeed::decode
