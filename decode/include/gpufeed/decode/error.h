#pragma once
// Typed decode errors. Every failure to turn bytes into pixels is a DecodeError that names the
// source (file path or a caller-chosen label) and the reason, with a machine-readable kind.

#include <stdexcept>
#include <string>
#include <string_view>

namespace gpufeed::decode {

/// Why a decode failed. Stable names (see to_string) are used in reports and skip summaries.
enum class ErrorKind {
  kEmpty,        ///< zero bytes
  kTruncated,    ///< data ends before the image does (e.g. JPEG without EOI, premature end of data)
  kCorrupt,      ///< malformed header or entropy data, zero sizes, bad CRC
  kUnsupported,  ///< recognised but not decodable here (unknown format, 12-bit, lossless, ...)
  kTooLarge,     ///< header announces more pixels than DecodeOptions::max_pixels (checked before allocation)
  kIo,           ///< the file could not be read (missing, unreadable, changed under us)
};

/// "empty", "truncated", "corrupt", "unsupported", "too_large", "io".
std::string_view to_string(ErrorKind kind);

/// Thrown by probe() and decode(). what() reads "<source>: <kind>: <reason>".
class DecodeError : public std::runtime_error {
 public:
  DecodeError(ErrorKind kind, std::string source, std::string reason);

  /// The error's kind.
  ErrorKind kind() const noexcept { return kind_; }
  /// The file path or label the caller passed as `source`.
  const std::string& source() const noexcept { return source_; }
  /// Human-readable reason, without the source and kind prefix.
  const std::string& reason() const noexcept { return reason_; }

 private:
  ErrorKind kind_;
  std::string source_;
  std::string reason_;
};

}  // namespace gpufeed::decode
