// gpufeed inspect PATH...: what the decoder makes of each file: the format sniffed from its bytes,
// the header (size, components, bit depth, chroma subsampling, progressive/arithmetic/lossless,
// EXIF orientation) and the decode's result (ok, ok with warnings, or the error kind and reason),
// then a count per kind. --write-png writes the RGB image each decodable file gives; --json prints
// one JSON object instead of text (loader/inspect.h does the work, shared with gpufeed.inspect()).
// Torch-free (it compiles into gpufeed_cli_objs).

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "gpufeed/decode/decoder.h"
#include "gpufeed/pack/inspect.h"

namespace gpufeed::tools {

Run add_inspect(CLI::App& app) {
  struct Args {
    std::vector<std::string> paths;
    std::string write_png;
    bool json = false;
    bool all_files = false;
    bool apply_exif = false;
    bool strict = false;
    bool allow_truncated = false;
    int64_t max_pixels = decode::DecodeOptions{}.max_pixels;
  };
  auto a = std::make_shared<Args>();
  app.footer(
      "Exit status: 0 when every file decodes (warnings included), 1 when any does not.\n"
      "Folders are searched recursively for files with image extensions (--all-files: every "
      "file); the format always comes from the bytes, never the name.");
  app.add_option("paths", a->paths, "image files and/or folders")->required();
  app.add_option("--write-png", a->write_png,
                 "write the RGB image each decodable file decodes to under this folder, as "
                 "<name>.png (folders keep their layout)");
  app.add_flag("--json", a->json, "print one JSON object instead of text");
  app.add_flag("--all-files", a->all_files, "in folders, inspect every file, not only image extensions");
  app.add_flag("--apply-exif-orientation", a->apply_exif, "apply the EXIF orientation (off by default, as torchvision)");
  app.add_flag("--apply-exif", a->apply_exif)->group("");  // the earlier spelling (hidden)
  app.add_flag("--strict-decode", a->strict, "treat every decoder warning as an error (train's and bench's flag)");
  app.add_flag("--strict", a->strict)->group("");  // the earlier spelling (hidden)
  app.add_flag("--allow-truncated", a->allow_truncated, "accept JPEGs with lost data (grey-filled)");
  app.add_option("--max-pixels", a->max_pixels, "largest width*height accepted")->capture_default_str();
  return [a] {
    pack::InspectOptions options;
    options.decode.apply_exif_orientation = a->apply_exif;
    options.decode.strict = a->strict;
    options.decode.allow_truncated = a->allow_truncated;
    options.decode.max_pixels = a->max_pixels;
    options.all_files = a->all_files;
    options.write_png = a->write_png;
    // Text lines as each file is inspected; JSON as one document at the end.
    const std::vector<pack::InspectReport> reports = pack::inspect_paths(
        a->paths, options, [&](const pack::InspectReport& r) {
          if (!a->json) std::cout << pack::inspect_line(r) << "\n";
        });
    if (a->json)
      std::cout << pack::inspect_json(reports) << "\n";
    else
      std::cout << pack::inspect_summary(reports) << "\n";
    return pack::inspect_failures(reports) > 0 ? 1 : 0;
  };
}

}  // namespace gpufeed::tools
