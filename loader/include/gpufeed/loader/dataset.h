#pragma once
// Datasets: an ordered list of (file, label) pairs. Pixels are never touched here; the loader
// reads and decodes on its worker pool.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace gpufeed::loader {

/// One sample: where its bytes are and its class index.
struct SampleRef {
  std::filesystem::path path;
  int64_t label = 0;
};

/// A fixed, ordered list of samples. Implementations are immutable after construction, so any
/// thread may read them.
class Dataset {
 public:
  virtual ~Dataset() = default;
  /// Number of samples (torch's len(dataset)).
  virtual int64_t size() const = 0;
  /// Sample i, 0 <= i < size(). Throws std::out_of_range otherwise.
  virtual const SampleRef& at(int64_t i) const = 0;
  /// Class names, index = label.
  virtual const std::vector<std::string>& classes() const = 0;
};

/// A Dataset held as an in-memory list, filled by its subclass's constructor.
class SampleList : public Dataset {
 public:
  int64_t size() const override { return static_cast<int64_t>(samples_.size()); }
  /// Throws std::out_of_range naming the index and the size.
  const SampleRef& at(int64_t i) const override;
  const std::vector<std::string>& classes() const override { return classes_; }

 protected:
  std::vector<std::string> classes_;
  std::vector<SampleRef> samples_;
};

/// torchvision.datasets.folder.IMG_EXTENSIONS plus ".gif" (gpufeed decodes GIF through giflib;
/// torchvision's list leaves it out, which would silently drop such files). Lower case.
const std::vector<std::string>& default_image_extensions();

/// Files under `dir`, recursively, in torchvision's ImageFolder order (folders sorted by path,
/// then file names sorted, byte order), keeping those whose name ends with one of `extensions`
/// (compared case-insensitively; empty keeps every file). Symlinked folders are followed when
/// `follow_symlinks` (torchvision's os.walk(followlinks=True)), except a link back to a folder
/// above it (same device and inode: a symlink loop), which is not descended into, with a warning
/// naming it, where os.walk would descend until the path grows too long. Throws
/// std::runtime_error naming the folder that cannot be listed and why (e.g. permission denied),
/// where os.walk would skip it silently.
std::vector<std::filesystem::path> list_files(const std::filesystem::path& dir,
                                              const std::vector<std::string>& extensions,
                                              bool follow_symlinks = true);

/// Options of ImageFolder.
struct ImageFolderOptions {
  /// File extensions accepted, compared case-insensitively, with the dot.
  std::vector<std::string> extensions = default_image_extensions();
  /// Follow symlinked folders, as torchvision's os.walk(followlinks=True) does.
  bool follow_symlinks = true;
};

/// torchvision.datasets.ImageFolder's layout: root/<class>/**/<file>. Classes are the sorted
/// names of root's subfolders (label = position); within a class, files are found recursively and
/// ordered as torchvision orders them (folders sorted, then file names sorted, byte order).
/// Files are found by list_files (symlink loops listed once; an unreadable folder is an error).
/// Throws std::runtime_error naming the folder when root is missing, has no class folders, a
/// folder cannot be listed, or a class folder has no file with an accepted extension
/// (torchvision raises FileNotFoundError).
class ImageFolder : public SampleList {
 public:
  explicit ImageFolder(const std::filesystem::path& root, ImageFolderOptions options = {});
  const std::filesystem::path& root() const { return root_; }

 private:
  std::filesystem::path root_;
};

/// A text file of "<path> <label>" lines; the path is relative to `root` (or absolute) and may
/// contain spaces (the label is the last field). Blank lines and lines starting with '#' are
/// ignored. Classes are named by their label number, "0".."max". Throws std::runtime_error naming
/// the list file and line for a malformed line or a negative label, and when the list is missing
/// or lists no sample.
class FileList : public SampleList {
 public:
  FileList(const std::filesystem::path& list_file, const std::filesystem::path& root);
};

/// A flat folder of images whose class is named by the file name's prefix up to the first '_'
/// (ImageNet's "n01440764_tench.JPEG" -> class "n01440764"; a name without '_' is its own class
/// by stem). Files are those directly in root with an accepted extension, sorted by name; classes
/// are the sorted distinct prefixes. Throws std::runtime_error naming root when it has no image.
class FlatFolder : public SampleList {
 public:
  explicit FlatFolder(const std::filesystem::path& root, ImageFolderOptions options = {});
};

/// Opens `path` as the dataset it looks like: a regular file is a FileList (paths relative to
/// the file's folder); a folder with class subfolders is an ImageFolder; a folder of images
/// only is a FlatFolder. Throws std::runtime_error naming the path when it is none of these.
std::shared_ptr<Dataset> open_dataset(const std::filesystem::path& path);

}  // namespace gpufeed::loader
