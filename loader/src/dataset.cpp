#include "gpufeed/loader/dataset.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <utility>

#include <sys/stat.h>

#include "gpufeed/log.h"

namespace gpufeed::loader {
namespace fs = std::filesystem;
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

bool has_extension(const fs::path& p, const std::vector<std::string>& exts) {
  // torchvision: filename.lower().endswith(extensions)
  const std::string name = lower(p.filename().string());
  return std::any_of(exts.begin(), exts.end(), [&](const std::string& e) {
    return name.size() >= e.size() && name.compare(name.size() - e.size(), e.size(), e) == 0;
  });
}

void walk(const fs::path& dir, const std::vector<std::string>& extensions, bool follow_symlinks,
          std::set<std::pair<dev_t, ino_t>>& seen,
          std::vector<std::pair<std::string, std::string>>& found) {
  const auto cannot = [](const fs::path& d, const std::error_code& ec) {
    return std::runtime_error("cannot list " + d.string() + ": " + ec.message());
  };
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) throw cannot(dir, ec);
  std::vector<fs::path> subdirs;
  for (const fs::directory_iterator end; it != end; it.increment(ec)) {
    std::error_code sec;
    if (it->is_directory(sec)) {  // follows a symlink
      if (follow_symlinks || !it->is_symlink(sec)) subdirs.push_back(it->path());
      continue;
    }
    if (extensions.empty() || has_extension(it->path(), extensions))
      found.emplace_back(dir.string(), it->path().filename().string());
  }
  if (ec) throw cannot(dir, ec);
  for (const fs::path& sub : subdirs) {
    struct stat st {};
    if (::stat(sub.c_str(), &st) != 0) throw cannot(sub, std::error_code(errno, std::generic_category()));
    const std::pair<dev_t, ino_t> id{st.st_dev, st.st_ino};
    if (seen.count(id)) {
      gpufeed::log()->warn("{}: links back to a folder above it (a symlink loop): not descended into",
                           sub.string());
      continue;
    }
    seen.insert(id);  // `seen` holds the folders from the root down to this one
    walk(sub, extensions, follow_symlinks, seen, found);
    seen.erase(id);
  }
}

}  // namespace

const std::vector<std::string>& default_image_extensions() {
  static const std::vector<std::string> exts = {".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm",
                                                ".tif", ".tiff", ".webp", ".gif"};
  return exts;
}

std::vector<fs::path> list_files(const fs::path& dir, const std::vector<std::string>& extensions,
                                bool follow_symlinks) {
  std::set<std::pair<dev_t, ino_t>> seen;
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0) seen.emplace(st.st_dev, st.st_ino);
  std::vector<std::pair<std::string, std::string>> found;  // (folder, file name)
  walk(dir, extensions, follow_symlinks, seen, found);
  std::sort(found.begin(), found.end());
  std::vector<fs::path> out;
  out.reserve(found.size());
  for (auto& [folder, name] : found) out.push_back(fs::path(folder) / name);
  return out;
}

ImageFolder::ImageFolder(const fs::path& root, ImageFolderOptions options) : root_(root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    throw std::runtime_error("ImageFolder: " + root.string() + " is not a folder");
  }
  for (const auto& entry : fs::directory_iterator(root)) {
    if (entry.is_directory()) classes_.push_back(entry.path().filename().string());
  }
  std::sort(classes_.begin(), classes_.end());
  if (classes_.empty()) {
    throw std::runtime_error("ImageFolder: couldn't find any class folder in " + root.string());
  }
  for (size_t label = 0; label < classes_.size(); ++label) {
    std::vector<fs::path> files;
    try {
      files = list_files(root / classes_[label], options.extensions, options.follow_symlinks);
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(std::string("ImageFolder: ") + e.what());
    }
    if (files.empty()) {
      throw std::runtime_error("ImageFolder: found no valid file for the class " + classes_[label] +
                               " in " + (root / classes_[label]).string());
    }
    for (const auto& f : files) samples_.push_back({f, static_cast<int64_t>(label)});
  }
}

const SampleRef& SampleList::at(int64_t i) const {
  if (i < 0 || i >= size()) {
    throw std::out_of_range("dataset index " + std::to_string(i) + " out of range [0, " +
                            std::to_string(size()) + ")");
  }
  return samples_[static_cast<size_t>(i)];
}

FileList::FileList(const fs::path& list_file, const fs::path& root) {
  std::ifstream in(list_file);
  if (!in) throw std::runtime_error("FileList: cannot open " + list_file.string());
  std::string line;
  int64_t max_label = -1;
  for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
    while (!line.empty() && (line.back() == '\r' || std::isspace(static_cast<unsigned char>(line.back())))) {
      line.pop_back();
    }
    size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos || line[start] == '#') continue;
    const size_t split = line.find_last_of(" \t");
    const auto where = [&] { return list_file.string() + ":" + std::to_string(lineno); };
    if (split == std::string::npos || split <= start) {
      throw std::runtime_error("FileList: " + where() + ": expected '<path> <label>', got '" + line + "'");
    }
    std::string path_part = line.substr(start, split - start);
    while (!path_part.empty() && std::isspace(static_cast<unsigned char>(path_part.back()))) path_part.pop_back();
    const std::string label_part = line.substr(split + 1);
    int64_t label = 0;
    try {
      size_t used = 0;
      label = std::stoll(label_part, &used);
      if (used != label_part.size()) throw std::invalid_argument(label_part);
    } catch (const std::exception&) {
      throw std::runtime_error("FileList: " + where() + ": label '" + label_part + "' is not an integer");
    }
    if (label < 0) throw std::runtime_error("FileList: " + where() + ": negative label " + label_part);
    fs::path p(path_part);
    samples_.push_back({p.is_absolute() ? p : root / p, label});
    max_label = std::max(max_label, label);
  }
  if (samples_.empty()) throw std::runtime_error("FileList: " + list_file.string() + " lists no samples");
  for (int64_t c = 0; c <= max_label; ++c) classes_.push_back(std::to_string(c));
}

FlatFolder::FlatFolder(const fs::path& root, ImageFolderOptions options) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    std::error_code sec;
    if (entry.is_regular_file(sec) && has_extension(entry.path(), options.extensions)) {
      names.push_back(entry.path().filename().string());
    }
  }
  if (ec) throw std::runtime_error("FlatFolder: cannot list " + root.string() + ": " + ec.message());
  if (names.empty()) throw std::runtime_error("FlatFolder: no image file in " + root.string());
  std::sort(names.begin(), names.end());
  auto class_of = [](const std::string& name) {
    const size_t us = name.find('_');
    return us != std::string::npos ? name.substr(0, us) : fs::path(name).stem().string();
  };
  for (const auto& n : names) classes_.push_back(class_of(n));
  std::sort(classes_.begin(), classes_.end());
  classes_.erase(std::unique(classes_.begin(), classes_.end()), classes_.end());
  for (const auto& n : names) {
    const auto it = std::lower_bound(classes_.begin(), classes_.end(), class_of(n));
    samples_.push_back({root / n, static_cast<int64_t>(it - classes_.begin())});
  }
}

std::shared_ptr<Dataset> open_dataset(const fs::path& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) {
    return std::make_shared<FileList>(path, path.parent_path());
  }
  if (!fs::is_directory(path, ec)) {
    throw std::runtime_error("open_dataset: " + path.string() + " is neither a file list nor a folder");
  }
  for (const auto& entry : fs::directory_iterator(path)) {
    std::error_code sec;
    if (entry.is_directory(sec)) return std::make_shared<ImageFolder>(path);
  }
  return std::make_shared<FlatFolder>(path);
}

}  // namespace gpufeed::loader
