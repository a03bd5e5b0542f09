#include "gpufeed/pack/inspect.h"

#include <fmt/format.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <system_error>

#include "gpufeed/decode/error.h"
#include "gpufeed/json_text.h"
#include "gpufeed/datasets/dataset.h"

namespace gpufeed::pack {

namespace {

namespace fs = std::filesystem;
using decode::DecodeError;

/// One file to inspect, and where its PNG goes (relative to write_png).
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
      found = datasets::list_files(root, all_files ? std::vector<std::string>{} : datasets::default_image_extensions());
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(std::string("inspect: ") + e.what());
    }
    const fs::path base = root.filename().empty() ? root.parent_path().filename() : root.filename();
    for (const fs::path& f : found)
      targets.push_back({f, base / fs::path(fs::relative(f, root).string() + ".png")});
  }
  return targets;
}

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

nlohmann::json to_json(const InspectReport& r) {
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

/// "ok", "warnings", or an error kind, per report.
std::map<std::string, int64_t> count_results(const std::vector<InspectReport>& reports) {
  std::map<std::string, int64_t> counts;
  for (const InspectReport& r : reports) ++counts[!r.ok ? r.error_kind : r.warnings > 0 ? "warnings" : "ok"];
  return counts;
}

}  // namespace

std::vector<InspectReport> inspect_paths(const std::vector<std::string>& paths, const InspectOptions& options,
                                         const std::function<void(const InspectReport&)>& on_report) {
  const std::vector<Target> targets = collect(paths, options.all_files);
  decode::Decoder decoder;
  decode::ImageBuffer image;
  std::vector<uint8_t> bytes;
  std::vector<InspectReport> reports;
  for (const Target& t : targets) {
    InspectReport r;
    r.path = t.path.string();
    try {
      decode::read_file(t.path, bytes);
      r.bytes = static_cast<int64_t>(bytes.size());
      r.format = decode::sniff(bytes);
      r.info = decode::probe(bytes, r.path);
      const decode::DecodeResult result = decoder.decode(bytes, r.path, options.decode, image);
      r.ok = true;
      r.warnings = result.warnings;
      r.out_width = image.width;
      r.out_height = image.height;
    } catch (const DecodeError& e) {
      r.error_kind = std::string(decode::to_string(e.kind()));
      r.reason = e.reason();
    }
    if (r.ok && !options.write_png.empty()) {
      const fs::path out = options.write_png / t.png_name;
      fs::create_directories(out.parent_path());
      const std::vector<uint8_t> png = decode::encode_png(image.pixels.data(), image.width, image.height);
      std::ofstream file(out, std::ios::binary | std::ios::trunc);
      file.write(reinterpret_cast<const char*>(png.data()), static_cast<std::streamsize>(png.size()));
      if (!file) throw std::runtime_error("inspect: cannot write " + out.string());
      r.png = out.string();
    }
    if (on_report) on_report(r);
    reports.push_back(std::move(r));
  }
  return reports;
}

std::string inspect_line(const InspectReport& r) {
  std::string line = fmt::format("{}: {}", r.path, decode::to_string(r.format));
  if (r.bytes >= 0) line += fmt::format(" {} bytes", r.bytes);
  if (r.info) line += fmt::format(" {}", header_text(*r.info));
  if (r.ok)
    line += r.warnings > 0 ? fmt::format(" -> ok, {} warning(s)", r.warnings) : " -> ok";
  else
    line += fmt::format(" -> {}: {}", r.error_kind, r.reason);
  if (!r.png.empty()) line += fmt::format(" [{}]", r.png);
  return line;
}

int64_t inspect_failures(const std::vector<InspectReport>& reports) {
  int64_t failed = 0;
  for (const InspectReport& r : reports) failed += r.ok ? 0 : 1;
  return failed;
}

std::string inspect_summary(const std::vector<InspectReport>& reports) {
  std::map<std::string, int64_t> counts = count_results(reports);
  std::string summary = fmt::format("inspect: {} files: {} ok", reports.size(), counts["ok"]);
  if (counts["warnings"] > 0) summary += fmt::format(", {} ok with warnings", counts["warnings"]);
  for (const auto& [kind, n] : counts)
    if (kind != "ok" && kind != "warnings" && n > 0) summary += fmt::format(", {} {}", n, kind);
  return summary;
}

std::string inspect_json(const std::vector<InspectReport>& reports, int indent) {
  nlohmann::json files = nlohmann::json::array();
  for (const InspectReport& r : reports) files.push_back(to_json(r));
  std::map<std::string, int64_t> counts = count_results(reports);
  nlohmann::json by_kind = nlohmann::json::object();
  for (const auto& [kind, n] : counts)
    if (n > 0) by_kind[kind] = n;
  return json_text(nlohmann::json{{"files", files},
                                  {"summary",
                                   {{"files", reports.size()},
                                    {"decoded", counts["ok"] + counts["warnings"]},
                                    {"failed", inspect_failures(reports)},
                                    {"by_result", by_kind}}}},
                   indent);
}

}  // namespace gpufeed::pack
