#pragma once
// What the decoder makes of files: `gpufeed inspect` and gpufeed.inspect() (Python) both report
// through this, so the CLI and the Python package print the same fields.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "gpufeed/decode/decoder.h"

namespace gpufeed::pack {

/// What inspecting one file found.
struct InspectReport {
  std::string path;
  int64_t bytes = -1;  ///< file size; -1: unreadable
  decode::ImageFormat format = decode::ImageFormat::kUnknown;  ///< sniffed from the bytes
  std::optional<decode::ImageInfo> info;  ///< the header, when probe() accepted it
  bool ok = false;                        ///< the decode succeeded (possibly with warnings)
  int warnings = 0;                       ///< decoder warnings (e.g. corrupt-but-recoverable data)
  std::string error_kind;                 ///< decode::to_string(ErrorKind), when !ok
  std::string reason;                     ///< DecodeError::reason(), when !ok
  int out_width = 0, out_height = 0;      ///< the decoded RGB image's size, when ok
  std::string png;                        ///< the PNG written (InspectOptions::write_png)
};

/// How to inspect.
struct InspectOptions {
  decode::DecodeOptions decode{};  ///< limits, EXIF, strictness (scale/crop ignored)
  bool all_files = false;          ///< in folders, every file, not only image extensions
  /// When not empty, write each decodable file's RGB image under this folder as <name>.png
  /// (a file named directly: its name; files found in a folder keep the folder's layout).
  std::filesystem::path write_png;
};

/// Inspects `paths`: files, and folders searched recursively as ImageFolder walks them (sorted;
/// files with image extensions unless all_files). A path that does not exist is reported as an
/// io error. Throws std::runtime_error naming a folder that cannot be listed, or a PNG that
/// cannot be written. `on_report`, when set, is called with each report as soon as it is made.
std::vector<InspectReport> inspect_paths(const std::vector<std::string>& paths, const InspectOptions& options,
                                         const std::function<void(const InspectReport&)>& on_report = {});

/// `<path>: <format> <bytes> bytes <header> -> ok | ok, N warning(s) | <kind>: <reason> [png]`.
std::string inspect_line(const InspectReport& report);

/// `inspect: N files: K ok, ... ` (a count per result kind).
std::string inspect_summary(const std::vector<InspectReport>& reports);

/// The JSON document `gpufeed inspect --json` prints: {"files": [per-file objects: path, bytes,
/// format, width, height, components, bits_per_sample, subsampling, progressive, arithmetic,
/// lossless, exif_orientation, result ("ok", "warnings", "error"), warnings, output {width,
/// height} or error {kind, reason}, png], "summary": {files, decoded, failed, by_result}}.
std::string inspect_json(const std::vector<InspectReport>& reports, int indent = 2);

/// Files whose decode failed.
int64_t inspect_failures(const std::vector<InspectReport>& reports);

}  // namespace gpufeed::pack
