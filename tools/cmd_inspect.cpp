// gpufeed inspect PATH...: what the decoder makes of each file: the format sniffed from its bytes,
// the header (size, components, bit depth, chroma subsampling, progressive/arithmetic/lossless,
// EXIF orientation) and the decode's result (ok, ok with warnings, or the error kind and reason),
// then a count per kind. --write-png writes the RGB image each decodable file gives; --json prints
// one JSON object instead of text. Torch-free (it compiles into gpufeed_cli_objs).

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "commands.h"
#include "gpufeed/decode/decoder.h"
#include "gpufeed/decode/error.h"
#include "gpufeed/loader/dataset.h"

namespace gpufeed::tools {

namespace {

namespace fs = std::filesystem;
using decode::DecodeError;

/// One file to inspect, and where its PNG goes (relative to --write-png).
struct Target {
  fs::path path;
  fs::path png_name;
};

/// Files named directly, and files under folders (recursively, sorted; with image extensions
/// unless `all_files`). A path that does not exist is still a target: it reports an io error.
std::vector<Target> collect(const std::vector<std::string>& paths, bool all_files) {
  std::vector<Target> targets;
  for (const std::string& arg : paths) {
    const fs::path root(arg);
    std::error_code ec;
    if (!fs::is_directory(root, ec)) {
      targets.push_back({root, fs::path(root.filename().string() + ".png")});
      continue;
    }
    // Folders are walked as ImageFolder walks them (symlink loops listed once; an unreadable
    // folder is an error naming it).
    std::vector<fs::path> found;
    try {
      found = loader::list_files(root, all_files ? std::vector<std::string>{} : loader::default_image_extensions());
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(std::string("inspect: ") + e.what());
    }
    const fs::path base = root.filename().empty() ? root.parent_path().filename() : root.filename();
    for (const fs::path& f : found)
      targets.push_back({f, base / fs::path(fs::relative(f, root).string() + ".png")});
  }
  return targets;
}

/// What inspecting one file found.
struct Report {
  std::string path;
  int64_t bytes = -1;  // -1: unreadable
  decode::ImageFormat format = decode::ImageFormat::kUnknown;
  std::optional<decode::ImageInfo> info;  // the header, when probe() accepted it
  bool ok = false;
  int warnings = 0;
  std::string error_kind;  // decode::to_string(ErrorKind), when !ok
  std::string reason;
  int out_width = 0, out_height = 0;
  std::string png;  // written file, when --write-png
};

std::string header_text(const decode::ImageInfo& i) {
  std::string text = fmt::format("{}x{} {}ch {}bit", i.width, i.height, i.components, i.bits_per_sample);
  if (i.format == decode::ImageFormat::kJpeg) {
    text += fmt::format(" {}", decode::to_string(i.subsampling));
    text += i.lossless ? " lossless" : i.progressive ? " progressive" : " sequential";
    if (i.arithmetic) text += " arithmetic";
  } else if (i.progressive) {
    text += " interlaced";
  }
  if (i.orientation != 1) text += fmt::format(" exif-orientation={}", i.orientation);
  return text;
}

nlohmann::json to_json(const Report& r) {
  nlohmann::json j = {{"path", r.path}, {"bytes", r.bytes},
                      {"format", std::string(decode::to_string(r.format))}};
  if (r.info) {
    const decode::ImageInfo& i = *r.info;
    j["width"] = i.width;
    j["height"] = i.height;
    j["components"] = i.components;
    j["bits_per_sample"] = i.bits_per_sample;
    j["subsampling"] = std::string(decode::to_string(i.subsampling));
    j["progressive"] = i.progressive;
    j["arithmetic"] = i.arithmetic;
    j["lossless"] = i.lossless;
    j["exif_orientation"] = i.orientation;
  }
  j["result"] = !r.ok ? "error" : r.warnings > 0 ? "warnings" : "ok";
  j["warnings"] = r.warnings;
  if (r.ok) {
    j["output"] = {{"width", r.out_width}, {"height", r.out_height}};
  } else {
    j["error"] = {{"kind", r.error_kind}, {"reason", r.reason}};
  }
  if (!r.png.empty()) j["png"] = r.png;
  return j;
}

}  // namespace

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
  app.add_flag("--apply-exif", a->apply_exif, "apply the EXIF orientation (off by default, as torchvision)");
  app.add_flag("--strict", a->strict, "treat every decoder warning as an error");
  app.add_flag("--allow-truncated", a->allow_truncated, "accept JPEGs with lost data (grey-filled)");
  app.add_option("--max-pixels", a->max_pixels, "largest width*height accepted")->capture_default_str();
  return [a] {
    const std::vector<Target> targets = collect(a->paths, a->all_files);
    decode::DecodeOptions options;
    options.apply_exif_orientation = a->apply_exif;
    options.strict = a->strict;
    options.allow_truncated = a->allow_truncated;
    options.max_pixels = a->max_pixels;
    decode::Decoder decoder;
    decode::ImageBuffer image;
    std::vector<uint8_t> bytes;
    std::vector<Report> reports;
    std::map<std::string, int64_t> counts;  // "ok", "warnings", or an error kind
    for (const Target& t : targets) {
      Report r;
      r.path = t.path.string();
      try {
        decode::read_file(t.path, bytes);
        r.bytes = static_cast<int64_t>(bytes.size());
        r.format = decode::sniff(bytes);
        r.info = decode::probe(bytes, r.path);
        const decode::DecodeResult result = decoder.decode(bytes, r.path, options, image);
        r.ok = true;
        r.warnings = result.warnings;
        r.out_width = image.width;
        r.out_height = image.height;
      } catch (const DecodeError& e) {
        r.error_kind = std::string(decode::to_string(e.kind()));
        r.reason = e.reason();
      }
      if (r.ok && !a->write_png.empty()) {
        const fs::path out = fs::path(a->write_png) / t.png_name;
        fs::create_directories(out.parent_path());
        const std::vector<uint8_t> png = decode::encode_png(image.pixels.data(), image.width, image.height);
        std::ofstream file(out, std::ios::binary | std::ios::trunc);
        file.write(reinterpret_cast<const char*>(png.data()), static_cast<std::streamsize>(png.size()));
        if (!file) throw std::runtime_error("inspect: cannot write " + out.string());
        r.png = out.string();
      }
      ++counts[!r.ok ? r.error_kind : r.warnings > 0 ? "warnings" : "ok"];
      if (!a->json) {
        std::string line = r.path + ": " + std::string(decode::to_string(r.format));
        if (r.bytes >= 0) line += fmt::format(" {} bytes", r.bytes);
        if (r.info) line += " " + header_text(*r.info);
        if (r.ok)
          line += r.warnings > 0 ? fmt::format(" -> ok, {} warning(s)", r.warnings) : " -> ok";
        else
          line += " -> " + r.error_kind + ": " + r.reason;
        if (!r.png.empty()) line += " [" + r.png + "]";
        std::cout << line << "\n";
      }
      reports.push_back(std::move(r));
    }
    const int64_t failed = static_cast<int64_t>(reports.size()) - counts["ok"] - counts["warnings"];
    if (a->json) {
      nlohmann::json files = nlohmann::json::array();
      for (const Report& r : reports) files.push_back(to_json(r));
      nlohmann::json by_kind = nlohmann::json::object();
      for (const auto& [kind, n] : counts)
        if (n > 0) by_kind[kind] = n;
      std::cout << nlohmann::json{{"files", files},
                                  {"summary",
                                   {{"files", reports.size()},
                                    {"decoded", counts["ok"] + counts["warnings"]},
                                    {"failed", failed},
                                    {"by_result", by_kind}}}}
                       .dump(2)
                << "\n";
    } else {
      std::string summary = fmt::format("inspect: {} files: {} ok", reports.size(), counts["ok"]);
      if (counts["warnings"] > 0) summary += fmt::format(", {} ok with warnings", counts["warnings"]);
      for (const auto& [kind, n] : counts)
        if (kind != "ok" && kind != "warnings" && n > 0) summary += fmt::format(", {} {}", n, kind);
      std::cout << summary << "\n";
    }
    return failed > 0 ? 1 : 0;
  };
}

}  // namespace gpufeed::tools
