#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <thread>
#include <chrono>

#include "golden.h"
#include "recorded_draws.h"
#include "gpufeed/cpu_budget.h"
#include "gpufeed/decode/decoder.h"
#include "gpufeed/datasets/dataset.h"
#include "gpufeed/loader/loader.h"
#include "gpufeed/datasets/synthetic.h"
#include "gpufeed/transforms/transform.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace gpufeed::loader;
using namespace gpufeed::datasets;
using namespace gpufeed::transforms;
using gpufeed::test::RecordedDraws;
using gpufeed::sampler::DistributedSampler;
using gpufeed::sampler::DistributedSamplerOptions;
using gpufeed::sampler::SequentialSampler;

namespace {

// A temporary synthetic ImageFolder, written once per test binary.
const fs::path& synthetic_root() {
  static const fs::path root = [] {
    fs::path r = fs::temp_directory_path() / ("gpufeed_test_loader_" + std::to_string(::getpid()));
    SyntheticOptions o;
    o.num_classes = 3;
    o.images_per_class = 7;
    o.min_size = 40;
    o.max_size = 90;
    write_synthetic_image_folder(r, o);
    return r;
  }();
  return root;
}

struct Cleanup {
  ~Cleanup() {
    std::error_code ec;
    fs::remove_all(fs::temp_directory_path() / ("gpufeed_test_loader_" + std::to_string(::getpid())), ec);
  }
} cleanup;

LoaderOptions small_options(int workers) {
  LoaderOptions o;
  o.batch_size = 4;
  o.num_workers = workers;
  o.prefetch_depth = 2;
  o.seed = 7;
  o.transform.rrc.size = 32;
  return o;
}

struct Collected {
  std::vector<std::vector<uint8_t>> images;
  std::vector<std::vector<int64_t>> labels, indices;
};

Collected run_epoch(Loader& loader, int64_t epoch, int64_t start = 0) {
  Collected c;
  loader.start_epoch(epoch, start);
  while (auto b = loader.next()) {
    c.images.emplace_back(b->images, b->images + b->image_bytes());
    c.labels.emplace_back(b->labels, b->labels + b->size);
    c.indices.push_back(b->indices);
  }
  return c;
}

using gpufeed::test::CountingAllocator;

}  // namespace

TEST(RandomResizedCrop, BoxesMatchTorchvisionGivenTheSameDraws) {
  const auto g = gpufeed::test::load_golden("transform.json");
  const auto& cases = g.at("random_resized_crop");
  ASSERT_GT(cases.size(), 1000u);
  int fallbacks = 0;
  for (const auto& c : cases) {
    RandomResizedCropOptions o;
    o.scale_min = c["scale"][0].get<float>();
    o.scale_max = c["scale"][1].get<float>();
    o.ratio_min = c["ratio"][0].get<float>();
    o.ratio_max = c["ratio"][1].get<float>();
    RecordedDraws draws(c["draws"]);
    const CropRect box = random_resized_crop_box(c["width"], c["height"], o, draws);
    const auto& e = c["box"];
    ASSERT_EQ(box, (CropRect{e[0], e[1], e[2], e[3]}))
        << c["width"] << "x" << c["height"] << " draws " << c["draws"].dump();
    EXPECT_EQ(draws.used(), c["draws"].size());
    if (c["draws"].size() == 20) ++fallbacks;
  }
  EXPECT_GT(fallbacks, 0) << "the grid must exercise the center-crop fallback";
}

TEST(ResizeCenterCrop, BoxIsTorchvisionsCropMappedToSourcePixels) {
  const auto g = gpufeed::test::load_golden("transform.json");
  for (const auto& c : g.at("center_crop")) {
    const int w = c["width"], h = c["height"], crop = c["crop"];
    const int new_w = c["resized"][0], new_h = c["resized"][1];
    const CropRect box = center_crop_box(w, h, {c["resize"], crop});
    const double sx = static_cast<double>(w) / new_w, sy = static_cast<double>(h) / new_h;
    // The box edges are torchvision's crop edges in source pixels, rounded to whole pixels.
    EXPECT_NEAR(box.x, c["left"].get<int>() * sx, 0.5 + 1e-9) << c.dump();
    EXPECT_NEAR(box.y, c["top"].get<int>() * sy, 0.5 + 1e-9) << c.dump();
    EXPECT_NEAR(box.x + box.width, (c["left"].get<int>() + crop) * sx, std::max(0.5, sx) + 1e-9) << c.dump();
    EXPECT_NEAR(box.y + box.height, (c["top"].get<int>() + crop) * sy, std::max(0.5, sy) + 1e-9) << c.dump();
    EXPECT_GE(box.width, 1);
    EXPECT_LE(box.x + box.width, w);
    EXPECT_LE(box.y + box.height, h);
  }
}

TEST(ImageFolder, ClassesAndSampleOrderMatchTorchvision) {
  const auto g = gpufeed::test::load_golden("transform.json");
  ASSERT_GE(g.at("image_folder").size(), 1u);
  for (const auto& c : g.at("image_folder")) {
    ImageFolder folder(c["root"].get<std::string>());
    EXPECT_EQ(folder.classes(), c["classes"].get<std::vector<std::string>>());
    ASSERT_EQ(folder.size(), static_cast<int64_t>(c["samples"].size())) << c["root"];
    for (int64_t i = 0; i < folder.size(); ++i) {
      EXPECT_EQ(folder.at(i).path, c["samples"][i][0].get<std::string>());
      EXPECT_EQ(folder.at(i).label, c["samples"][i][1].get<int64_t>());
    }
  }
}

TEST(ImageFolder, MissingRootNamesTheFolder) {
  try {
    ImageFolder("/nonexistent/gpufeed");
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/gpufeed"), std::string::npos);
  }
}

TEST(FileList, ParsesPathsWithSpacesRelativeToRoot) {
  const fs::path dir = fs::temp_directory_path() / "gpufeed_filelist_test";
  fs::create_directories(dir);
  std::ofstream(dir / "list.txt") << "# comment\na/b c.jpg 3\n\n/abs/x.png 0\r\n";
  FileList list(dir / "list.txt", "/data", {}, {.check_files = false});  // parsing only: no /data here
  ASSERT_EQ(list.size(), 2);
  EXPECT_EQ(list.at(0).path, "/data/a/b c.jpg");
  EXPECT_EQ(list.at(0).label, 3);
  EXPECT_EQ(list.at(1).path, "/abs/x.png");
  EXPECT_EQ(list.classes().size(), 4u);
  std::ofstream(dir / "bad.txt") << "a.jpg x\n";
  EXPECT_THROW(FileList(dir / "bad.txt", "/data", {}, {.check_files = false}), std::runtime_error);
  // A huge label would make a billion class names: refused, naming its line.
  std::ofstream(dir / "huge.txt") << "a.jpg 1\nb.jpg 1000000000\n";
  try {
    FileList(dir / "huge.txt", "/data", {}, {.check_files = false});
    ADD_FAILURE() << "a label above kMaxLabel must be an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("huge.txt:2: label 1000000000 is above the largest class index, 16777215"),
              std::string::npos) << e.what();
  }
  std::ofstream(dir / "empty.txt") << "# nothing\n\n";
  try {
    FileList(dir / "empty.txt", "/data");
    ADD_FAILURE() << "an empty list must be an error, as an empty folder is";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("empty.txt lists no samples"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

/// The message of the exception E (std::runtime_error unless named) `f` throws ("" when it
/// throws none).
template <typename E = std::runtime_error, typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

TEST(FileList, SkipsAUtf8ByteOrderMarkWithLfOrCrlf) {
  // A list saved by a Windows editor starts with EF BB BF; the first path must not carry it.
  gpufeed::test::TempDir tmp("filelist_bom");
  std::ofstream(tmp.path / "a b.jpg") << "x";
  std::ofstream(tmp.path / "c.jpg") << "x";
  for (const std::string eol : {"\n", "\r\n"}) {
    std::ofstream(tmp.path / "list.txt", std::ios::binary)
        << "\xEF\xBB\xBF" << "a b.jpg 1" << eol << "# c" << eol << "c.jpg 0" << eol;
    const FileList list(tmp.path / "list.txt", tmp.path);
    ASSERT_EQ(list.size(), 2);
    EXPECT_EQ(list.at(0).path, tmp.path / "a b.jpg");  // not "\xEF\xBB\xBF" "a b.jpg"
    EXPECT_EQ(list.at(0).label, 1);
    EXPECT_EQ(list.at(1).path, tmp.path / "c.jpg");
    std::vector<uint8_t> bytes;
    gpufeed::decode::read_file(list.at(0).path, bytes);  // where the mark used to fail
    EXPECT_EQ(bytes.size(), 1u);
  }
  // A mark-only first line, then samples: still one sample, nothing left of the mark.
  std::ofstream(tmp.path / "list2.txt", std::ios::binary) << "\xEF\xBB\xBF\nc.jpg 0\n";
  EXPECT_EQ(FileList(tmp.path / "list2.txt", tmp.path).at(0).path, tmp.path / "c.jpg");
}

TEST(FileList, Utf16AndUtf32ListsAreErrorsNamingTheEncoding) {
  gpufeed::test::TempDir tmp("filelist_utf16");
  std::ofstream(tmp.path / "a.jpg") << "x";
  // "a.jpg 0\n" in each encoding, with its byte-order mark.
  const auto encode = [](const std::string& ascii, int width, bool big) {
    std::string out;
    for (const char c : ascii) {
      std::string unit(static_cast<size_t>(width), '\0');
      unit[big ? width - 1 : 0] = c;
      out += unit;
    }
    return out;
  };
  const struct {
    std::string bytes;
    const char* name;
  } cases[] = {
      {std::string("\xFF\xFE", 2) + encode("a.jpg 0\n", 2, false), "UTF-16 little-endian"},
      {std::string("\xFE\xFF", 2) + encode("a.jpg 0\n", 2, true), "UTF-16 big-endian"},
      {std::string("\xFF\xFE\0\0", 4) + encode("a.jpg 0\n", 4, false), "UTF-32 little-endian"},
      {std::string("\0\0\xFE\xFF", 4) + encode("a.jpg 0\n", 4, true), "UTF-32 big-endian"},
  };
  for (const auto& c : cases) {
    std::ofstream(tmp.path / "list.txt", std::ios::binary) << c.bytes;
    const std::string what = error_of([&] { FileList(tmp.path / "list.txt", tmp.path); });
    EXPECT_NE(what.find("list.txt is " + std::string(c.name) + " text"), std::string::npos) << what;
    EXPECT_NE(what.find("save it as UTF-8"), std::string::npos) << what;
  }
  // UTF-16 without a mark: NUL bytes in a line, named with the line.
  std::ofstream(tmp.path / "list.txt", std::ios::binary) << "a.jpg 0\n" << encode("a.jpg 0\n", 2, false);
  const std::string what = error_of([&] { FileList(tmp.path / "list.txt", tmp.path); });
  EXPECT_NE(what.find("list.txt:2: the line contains NUL bytes"), std::string::npos) << what;
}

TEST(FileList, AMissingOrUnreadableListedFileIsAnErrorAtStartupNamingItsLine) {
  gpufeed::test::TempDir tmp("filelist_missing");
  std::ofstream(tmp.path / "a.jpg") << "x";
  std::ofstream(tmp.path / "b.jpg") << "x";
  fs::create_directories(tmp.path / "folder.jpg");
  std::ofstream(tmp.path / "list.txt") << "# header\n"
                                       << "a.jpg 0\n"
                                       << "gone.jpg 1\n"  // line 3: the first bad one
                                       << "b.jpg 1\n"
                                       << "folder.jpg 0\n"
                                       << (tmp.path / "also_gone.jpg").string() << " 2\n";
  const std::string what = error_of([&] { FileList(tmp.path / "list.txt", tmp.path); });
  EXPECT_NE(what.find("list.txt:3: cannot read " + (tmp.path / "gone.jpg").string() +
                      ": No such file or directory (and 2 more of the 5 listed files)"),
            std::string::npos)
      << what;
  // Unchecked, the list is read as written (the files may appear later).
  const FileList unchecked(tmp.path / "list.txt", tmp.path, {}, {.check_files = false});
  EXPECT_EQ(unchecked.size(), 5);
  // A folder alone is named as such; a list whose files all exist passes.
  std::ofstream(tmp.path / "list.txt") << "a.jpg 0\nfolder.jpg 0\n";
  EXPECT_NE(error_of([&] { FileList(tmp.path / "list.txt", tmp.path); })
                .find("list.txt:2: cannot read " + (tmp.path / "folder.jpg").string() +
                      ": is a folder, not a file"),
            std::string::npos);
  // open_dataset (the CLI's --data) checks too, in the list's own folder.
  std::ofstream(tmp.path / "list.txt") << "a.jpg 0\nmissing.jpg 0\n";
  EXPECT_NE(error_of([&] { open_dataset(tmp.path / "list.txt"); }).find("list.txt:2: cannot read"),
            std::string::npos);
  std::ofstream(tmp.path / "list.txt") << "a.jpg 0\nb.jpg 1\n";
  EXPECT_EQ(open_dataset(tmp.path / "list.txt")->size(), 2);
}

TEST(ListFiles, StopsAtSymlinkLoopsAndKeepsTorchvisionsOrder) {
  gpufeed::test::TempDir tmp("list_files");
  const fs::path r = tmp.path / "c";
  fs::create_directories(r / "b");
  fs::create_directories(r / "a");
  for (const char* f : {"b/2.jpg", "b/1.JPG", "a/x.png", "top.jpeg", "notes.txt"}) std::ofstream(r / f) << "x";
  fs::create_directory_symlink(r, r / "a" / "loop");        // back to the root: a loop
  fs::create_directory_symlink(r / "b", r / "again");       // a second link to b: followed,
  fs::create_directory_symlink(r / "a", r / "b" / "cross");  // as os.walk(followlinks=True) does
  // sorted((folder, files)) order, as torchvision's make_dataset walks.
  const std::vector<fs::path> want = {r / "top.jpeg",         r / "a" / "x.png",
                                      r / "again" / "1.JPG",  r / "again" / "2.jpg",
                                      r / "again" / "cross" / "x.png",
                                      r / "b" / "1.JPG",      r / "b" / "2.jpg",
                                      r / "b" / "cross" / "x.png"};
  EXPECT_EQ(list_files(r, default_image_extensions()), want);
  // Without following links: the real folders only; with every file kept, notes.txt too.
  EXPECT_EQ(list_files(r, default_image_extensions(), /*follow_symlinks=*/false),
            (std::vector<fs::path>{r / "top.jpeg", r / "a" / "x.png", r / "b" / "1.JPG", r / "b" / "2.jpg"}));
  EXPECT_EQ(list_files(r, {}).size(), want.size() + 1);
  ImageFolder folder(tmp.path);
  EXPECT_EQ(folder.size(), static_cast<int64_t>(want.size()));
}

TEST(ListFiles, AnUnreadableFolderIsAnErrorNamingIt) {
  gpufeed::test::TempDir tmp("list_unreadable");
  fs::create_directories(tmp.path / "c" / "locked");
  std::ofstream(tmp.path / "c" / "ok.jpg") << "x";
  fs::permissions(tmp.path / "c" / "locked", fs::perms::none);
  const auto check = [&]() -> std::string {
    try {
      list_files(tmp.path / "c", default_image_extensions());
      return "no error";
    } catch (const std::runtime_error& e) {
      return e.what();
    }
  };
  if (::geteuid() != 0) {
    EXPECT_NE(check().find("locked: Permission denied"), std::string::npos) << check();
  } else {
    // Root reads anything: check as user nobody in a child process (CI runs as root).
    fs::permissions(tmp.path, fs::perms::all);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
      ::_exit(check().find("locked: Permission denied") != std::string::npos ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    if (WEXITSTATUS(status) == 2) {
      fs::permissions(tmp.path / "c" / "locked", fs::perms::owner_all);
      GTEST_SKIP() << "cannot switch to uid 65534 to test permissions as root";
    }
    EXPECT_EQ(WEXITSTATUS(status), 0) << "as nobody, listing must fail naming the locked folder";
  }
  fs::permissions(tmp.path / "c" / "locked", fs::perms::owner_all);
}

// ---- the sample table and the index cache

std::vector<std::pair<std::string, int64_t>> samples_of(const Dataset& ds) {
  std::vector<std::pair<std::string, int64_t>> out;
  for (int64_t i = 0; i < ds.size(); ++i) out.emplace_back(std::string(ds.at(i).path), ds.at(i).label);
  return out;
}

// Folders and files created by a test are stamped "now": the cache is written only for those
// changed over a second before the listing (DataOptions), so the tests wait that second.
void wait_out_the_racy_window() { std::this_thread::sleep_for(std::chrono::milliseconds(1100)); }

TEST(SampleTable, HoldsPathsInOneArenaAt13BytesPerSampleBeyondThem) {
  SampleTable t;
  t.add("/a/b.jpg", 3);
  t.add_joined("/dir", "x y.png", 0);
  t.add_joined("", "rel.jpg", 7);
  ASSERT_EQ(t.size(), 3);
  EXPECT_EQ(t.path(0), "/a/b.jpg");
  EXPECT_EQ(t.path(1), "/dir/x y.png");
  EXPECT_EQ(t.path(2), "rel.jpg");
  EXPECT_EQ(t.path(1).data()[t.path(1).size()], '\0');  // open() takes it as it is
  EXPECT_EQ(t.label(2), 7);
  t.shrink_to_fit();
  EXPECT_EQ(t.path_bytes(), 8 + 12 + 7);
  EXPECT_EQ(t.memory_bytes(), t.path_bytes() + 13 * 3);
  EXPECT_THROW(t.add("x.jpg", -1), std::invalid_argument);
  EXPECT_THROW(t.add("x.jpg", int64_t{1} << 31), std::invalid_argument);
  EXPECT_THROW(t.add(std::string_view("a\0b", 3), 0), std::invalid_argument);
  // Arrays read back from a cache are checked before they are trusted.
  EXPECT_THROW(t.assign({'a', 'b'}, {0}, {1}), std::runtime_error);            // no NUL
  EXPECT_THROW(t.assign({'a', '\0'}, {0, 1}, {1, 2}), std::runtime_error);     // empty second path
  EXPECT_THROW(t.assign({'a', '\0'}, {0}, {-1}), std::runtime_error);          // negative label
  EXPECT_EQ(t.size(), 3);
}

TEST(IndexCache, ImageFolderReadsItsCacheUntilAFolderChangesAndRebuildsACorruptOne) {
  gpufeed::test::TempDir tmp("index_cache");
  const fs::path root = tmp.path / "train";
  for (const char* f : {"b/2.jpg", "b/1.JPG", "b/sub/z.png", "a/x.png", "a/notes.txt", "c/k.webp"}) {
    fs::create_directories((root / f).parent_path());
    std::ofstream(root / f) << "x";
  }
  const fs::path cache_dir = tmp.path / "cache";
  ImageFolderOptions o;
  o.index_cache = cache_dir.string();
  wait_out_the_racy_window();

  ImageFolder first(root, o);
  EXPECT_FALSE(first.from_cache());
  const std::vector<std::pair<std::string, int64_t>> want = {
      {(root / "a/x.png").string(), 0}, {(root / "b/1.JPG").string(), 1}, {(root / "b/2.jpg").string(), 1},
      {(root / "b/sub/z.png").string(), 1}, {(root / "c/k.webp").string(), 2}};
  EXPECT_EQ(samples_of(first), want);
  ASSERT_EQ(std::distance(fs::directory_iterator(cache_dir), fs::directory_iterator()), 1);
  const fs::path file = fs::directory_iterator(cache_dir)->path();
  EXPECT_EQ(file.extension(), ".gpufeed-index");

  ImageFolder second(root, o);
  EXPECT_TRUE(second.from_cache());
  EXPECT_EQ(samples_of(second), want);
  EXPECT_EQ(second.classes(), (std::vector<std::string>{"a", "b", "c"}));

  // Other listing options: another key, so a listing.
  ImageFolderOptions png_only = o;
  png_only.extensions = {".png", ".webp"};
  ImageFolder pngs(root, png_only);
  EXPECT_FALSE(pngs.from_cache());
  EXPECT_EQ(pngs.size(), 3);

  // Every byte of the file matters: a flipped byte or a cut file is rebuilt, never trusted.
  ImageFolder(root, o);  // rewrites the cache for `o` (the png-only listing replaced it)
  const auto bytes = fs::file_size(file);
  for (const uintmax_t at : {bytes / 2, bytes - 3, uintmax_t{20}}) {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    const char c = static_cast<char>(f.get());
    f.seekp(static_cast<std::streamoff>(at));
    f.put(static_cast<char>(c ^ 0x20));
    f.close();
    ImageFolder rebuilt(root, o);
    EXPECT_FALSE(rebuilt.from_cache()) << "byte " << at;
    EXPECT_EQ(samples_of(rebuilt), want);
    EXPECT_TRUE(ImageFolder(root, o).from_cache()) << "rewritten after byte " << at;
  }
  fs::resize_file(file, bytes - 100);
  EXPECT_FALSE(ImageFolder(root, o).from_cache());
  EXPECT_TRUE(ImageFolder(root, o).from_cache());

  // A new file in a nested folder changes that folder: listed again, and the new file is there.
  std::ofstream(root / "b/sub/y.jpg") << "x";
  ImageFolder changed(root, o);
  EXPECT_FALSE(changed.from_cache());
  ASSERT_EQ(changed.size(), 6);
  EXPECT_EQ(changed.at(3).path, (root / "b/sub/y.jpg").string());
  // A removed class folder changes the root.
  fs::remove_all(root / "c");
  ImageFolder fewer(root, o);
  EXPECT_FALSE(fewer.from_cache());
  EXPECT_EQ(fewer.classes(), (std::vector<std::string>{"a", "b"}));
}

// An environment variable set for one scope (the cache folder's home), restored after.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> old;
  ScopedEnv(std::string n, const std::optional<std::string>& value) : name(std::move(n)) {
    if (const char* v = std::getenv(name.c_str())) old = v;
    if (value) {
      ::setenv(name.c_str(), value->c_str(), 1);
    } else {
      ::unsetenv(name.c_str());
    }
  }
  ~ScopedEnv() {
    if (old) {
      ::setenv(name.c_str(), old->c_str(), 1);
    } else {
      ::unsetenv(name.c_str());
    }
  }
};

// The working folder changed for one scope, restored after.
struct ScopedCwd {
  fs::path old = fs::current_path();
  explicit ScopedCwd(const fs::path& p) { fs::current_path(p); }
  ~ScopedCwd() { fs::current_path(old); }
};

// Every entry (files and folders) under `root`, for "nothing was created here".
std::vector<std::string> entries_under(const fs::path& root) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root)) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

// The index caches in `dir` (none when it does not exist).
std::vector<fs::path> caches_in(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".gpufeed-index") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// Mode 0555 on a tree's folders and 0444 on its files, undone at the end (TempDir removes it).
struct ReadOnlyTree {
  fs::path root;
  explicit ReadOnlyTree(fs::path r) : root(std::move(r)) { set(false); }
  ~ReadOnlyTree() { set(true); }
  void set(bool writable) {
    std::vector<fs::path> all{root};
    for (const auto& e : fs::recursive_directory_iterator(root)) all.push_back(e.path());
    for (const fs::path& p : all) {
      const bool dir = fs::is_directory(p);
      fs::permissions(p, writable ? (dir ? fs::perms(0755) : fs::perms(0644)) : (dir ? fs::perms(0555) : fs::perms(0444)));
    }
  }
};

TEST(IndexCache, InTheUsersCacheFolderByDefaultBesideOnlyWhenAskedNeverWhenOff) {
  gpufeed::test::TempDir tmp("index_where");
  fs::create_directories(tmp.path / "d" / "data" / "k");
  std::ofstream(tmp.path / "d" / "data" / "k" / "a.jpg") << "x";
  std::ofstream(tmp.path / "d" / "list.txt") << "data/k/a.jpg 4\n";
  const fs::path d = tmp.path / "d";
  const ScopedEnv xdg("XDG_CACHE_HOME", (tmp.path / "xdg").string());
  const fs::path home = tmp.path / "xdg" / "gpufeed";
  wait_out_the_racy_window();

  ImageFolderOptions off;
  off.index_cache = "off";
  EXPECT_FALSE(ImageFolder(d / "data", off).from_cache());
  EXPECT_FALSE(FileList(d / "list.txt", d, {.index_cache = "off"}).from_cache());
  EXPECT_FALSE(fs::exists(tmp.path / "xdg"));

  // The default: $XDG_CACHE_HOME/gpufeed, named by the dataset and a hash; nothing beside it.
  const std::vector<std::string> before = entries_under(d);
  EXPECT_FALSE(ImageFolder(d / "data/").from_cache());  // a trailing '/' names the same folder
  EXPECT_TRUE(ImageFolder(d / "data").from_cache());
  const auto list = open_dataset(d / "list.txt");
  EXPECT_FALSE(dynamic_cast<const FileList&>(*list).from_cache());
  const auto again = open_dataset(d / "list.txt");
  EXPECT_TRUE(dynamic_cast<const FileList&>(*again).from_cache());
  EXPECT_EQ(samples_of(*again), (std::vector<std::pair<std::string, int64_t>>{{(d / "data/k/a.jpg").string(), 4}}));
  EXPECT_EQ(again->classes().size(), 5u);
  EXPECT_EQ(entries_under(d), before);
  const std::vector<fs::path> cached = caches_in(home);
  ASSERT_EQ(cached.size(), 2u);
  EXPECT_EQ(cached[0].filename().string().rfind("data-", 0), 0u) << cached[0];
  EXPECT_EQ(cached[0].filename().string().size(), std::string("data-0123456789abcdef.gpufeed-index").size());
  EXPECT_EQ(cached[1].filename().string().rfind("list.txt-", 0), 0u) << cached[1];
  // The list rewritten (another size and time): parsed again.
  std::ofstream(d / "list.txt") << "data/k/a.jpg 1\ndata/k/a.jpg 0\n";
  const auto rewritten = open_dataset(d / "list.txt");
  EXPECT_FALSE(dynamic_cast<const FileList&>(*rewritten).from_cache());
  EXPECT_EQ(rewritten->size(), 2);
  EXPECT_EQ(rewritten->at(0).label, 1);

  // "beside": <parent>/<name>.gpufeed-index, when the folder's mode allows it.
  ImageFolderOptions beside;
  beside.index_cache = "beside";
  EXPECT_FALSE(ImageFolder(d / "data", beside).from_cache());
  EXPECT_TRUE(fs::exists(d / "data.gpufeed-index"));
  EXPECT_TRUE(ImageFolder(d / "data", beside).from_cache());
  fs::create_directories(tmp.path / "ro" / "data" / "k");
  std::ofstream(tmp.path / "ro" / "data" / "k" / "a.jpg") << "x";
  {
    const ReadOnlyTree ro(tmp.path / "ro");  // 0555: never written, even by root
    wait_out_the_racy_window();              // (chmod stamps the folders' ctime)
    EXPECT_FALSE(ImageFolder(tmp.path / "ro" / "data", beside).from_cache());
    EXPECT_FALSE(ImageFolder(tmp.path / "ro" / "data", beside).from_cache());
    EXPECT_EQ(entries_under(tmp.path / "ro"),
              (std::vector<std::string>{(tmp.path / "ro/data").string(), (tmp.path / "ro/data/k").string(),
                                        (tmp.path / "ro/data/k/a.jpg").string()}));
  }

  // Without XDG_CACHE_HOME (or with a relative one, which the XDG rules ignore): $HOME/.cache.
  {
    const ScopedEnv no_xdg("XDG_CACHE_HOME", std::nullopt);
    const ScopedEnv user("HOME", (tmp.path / "user").string());
    EXPECT_FALSE(ImageFolder(d / "data").from_cache());
    EXPECT_EQ(caches_in(tmp.path / "user/.cache/gpufeed").size(), 1u);
    const ScopedEnv relative("XDG_CACHE_HOME", std::string("relative/cache"));
    EXPECT_TRUE(ImageFolder(d / "data").from_cache());
    // No home at all: no cache, no error.
    const ScopedEnv no_home("HOME", std::nullopt);
    EXPECT_FALSE(ImageFolder(d / "data").from_cache());
    EXPECT_EQ(ImageFolder(d / "data").size(), 1);
  }
  // A cache home that cannot be written: listed every time, never an error.
  {
    fs::create_directories(tmp.path / "locked");
    const ReadOnlyTree locked(tmp.path / "locked");
    const ScopedEnv xdg_locked("XDG_CACHE_HOME", (tmp.path / "locked").string());
    EXPECT_FALSE(ImageFolder(d / "data").from_cache());
    EXPECT_FALSE(ImageFolder(d / "data").from_cache());
    EXPECT_TRUE(fs::is_empty(tmp.path / "locked"));
  }
}

// A loader over a read-only (0555) dataset: not a byte written into it, the cache in
// $XDG_CACHE_HOME/gpufeed, read back on the next start.
TEST(IndexCache, AReadOnlyDatasetIsNeverWrittenTheCacheGoesToTheUsersCacheFolder) {
  gpufeed::test::TempDir tmp("index_readonly");
  const fs::path root = gpufeed::test::tiny_dataset(tmp.path / "ro" / "train");
  const ScopedEnv xdg("XDG_CACHE_HOME", (tmp.path / "xdg").string());
  const ReadOnlyTree ro(tmp.path / "ro");
  wait_out_the_racy_window();  // chmod stamps the folders' ctime: the cache is written after a second
  const std::vector<std::string> before = entries_under(tmp.path / "ro");
  ASSERT_EQ(before.size(), 1u + 4u + 32u);  // train, 4 class folders, 32 images
  LoaderOptions o;
  o.batch_size = 8;
  o.num_workers = 2;
  o.transform = TransformOptions::imagenet(TransformOptions::Kind::kEval, 16);
  for (const bool cached : {false, true}) {
    const auto ds = open_dataset(root);
    EXPECT_EQ(dynamic_cast<const ImageFolder&>(*ds).from_cache(), cached);
    Loader loader(ds, std::make_shared<SequentialSampler>(ds->size()), o);
    loader.start_epoch(0);
    int64_t samples = 0;
    while (auto b = loader.next()) samples += b->size;
    EXPECT_EQ(samples, 32);
  }
  EXPECT_EQ(entries_under(tmp.path / "ro"), before);
  const std::vector<fs::path> cached = caches_in(tmp.path / "xdg" / "gpufeed");
  ASSERT_EQ(cached.size(), 1u);
  EXPECT_EQ(cached[0].filename().string().rfind("train-", 0), 0u) << cached[0];
}

// "data", "./data/", the absolute path and a symlink to it are one dataset: one cache entry, and
// the paths read back from it are those a fresh listing through that spelling gives.
TEST(IndexCache, RelativeAbsoluteAndLinkedSpellingsShareOneEntry) {
  gpufeed::test::TempDir tmp("index_spelling");
  const fs::path abs = gpufeed::test::tiny_dataset(tmp.path / "data");
  fs::create_directory_symlink(abs, tmp.path / "link");
  std::ofstream(tmp.path / "list.txt") << "data/class_000/" << fs::directory_iterator(abs / "class_000")->path().filename().string()
                                       << " 3\n/dev/null 1\n";
  const ScopedCwd cwd(tmp.path);
  ImageFolderOptions o;
  o.index_cache = (tmp.path / "cache").string();
  ImageFolderOptions fresh = o;
  fresh.index_cache = "off";
  wait_out_the_racy_window();
  EXPECT_FALSE(ImageFolder("data", o).from_cache());
  for (const fs::path& spelling : {fs::path("data"), fs::path("./data/"), abs, tmp.path / "link", fs::path("link/")}) {
    const ImageFolder cached(spelling, o);
    EXPECT_TRUE(cached.from_cache()) << spelling;
    EXPECT_EQ(samples_of(cached), samples_of(ImageFolder(spelling, fresh))) << spelling;
  }
  EXPECT_EQ(std::string(ImageFolder(abs, o).at(0).path).rfind(abs.string() + "/class_000/", 0), 0u);
  // A file list: relative lines are joined to its folder's spelling ("" for "list.txt").
  const DataOptions lc{.index_cache = (tmp.path / "cache").string()};
  const FileListOptions unchecked{.check_files = false};
  EXPECT_FALSE(FileList("list.txt", "", lc, unchecked).from_cache());
  const FileList rel("list.txt", "", lc, unchecked), full(tmp.path / "list.txt", tmp.path, lc, unchecked);
  EXPECT_TRUE(rel.from_cache());
  EXPECT_TRUE(full.from_cache());
  EXPECT_EQ(samples_of(full), samples_of(FileList(tmp.path / "list.txt", tmp.path, {.index_cache = "off"}, unchecked)));
  EXPECT_EQ(std::string(full.at(0).path).rfind(tmp.path.string() + "/data/class_000/", 0), 0u);
  EXPECT_EQ(full.at(1).path, "/dev/null");
  EXPECT_EQ(std::string(rel.at(0).path).rfind("data/class_000/", 0), 0u);
  // One entry per dataset, whatever the spelling.
  EXPECT_EQ(caches_in(tmp.path / "cache").size(), 2u);
}

TEST(SampleRng, IsAPureFunctionOfSeedEpochAndIndex) {
  SampleRng a(1, 2, 3), b(1, 2, 3), c(1, 2, 4), d(1, 3, 3);
  std::vector<uint32_t> va, vb, vc, vd;
  for (int k = 0; k < 9; ++k) {
    va.push_back(a.next_u32());
    vb.push_back(b.next_u32());
    vc.push_back(c.next_u32());
    vd.push_back(d.next_u32());
  }
  EXPECT_EQ(va, vb);
  EXPECT_NE(va, vc);
  EXPECT_NE(va, vd);
  // Uniform draws cover [0, 1) evenly enough: mean of 20k draws within 1%.
  SampleRng r(0, 0, 0);
  double sum = 0;
  for (int k = 0; k < 20000; ++k) sum += r.uniform(0.0f, 1.0f);
  EXPECT_NEAR(sum / 20000, 0.5, 0.01);
}

TEST(Loader, BatchesAreIdenticalWithOneAndTwoThreads) {
  auto ds = std::make_shared<ImageFolder>(synthetic_root());
  ASSERT_EQ(ds->size(), 21);
  DistributedSamplerOptions so;
  so.seed = 3;
  Loader one(ds, std::make_shared<DistributedSampler>(ds->size(), so), small_options(1));
  Loader two(ds, std::make_shared<DistributedSampler>(ds->size(), so), small_options(2));
  for (int64_t epoch : {0, 1}) {
    const Collected a = run_epoch(one, epoch), b = run_epoch(two, epoch);
    ASSERT_EQ(a.images.size(), 6u);  // ceil(21 / 4)
    EXPECT_EQ(a.indices, b.indices);
    EXPECT_EQ(a.labels, b.labels);
    EXPECT_EQ(a.images, b.images) << "epoch " << epoch;
  }
}

TEST(Loader, YieldsSamplerOrderWithCorrectLabels) {
  auto ds = std::make_shared<ImageFolder>(synthetic_root());
  DistributedSamplerOptions so;
  so.num_replicas = 2;
  so.rank = 1;
  so.seed = 11;
  auto sampler = std::make_shared<DistributedSampler>(ds->size(), so);
  Loader loader(ds, sampler, small_options(2));
  const Collected c = run_epoch(loader, 4);
  sampler->set_epoch(4);
  std::vector<int64_t> flat;
  for (const auto& b : c.indices) flat.insert(flat.end(), b.begin(), b.end());
  EXPECT_EQ(flat, sampler->indices());
  for (size_t b = 0; b < c.indices.size(); ++b) {
    for (size_t k = 0; k < c.indices[b].size(); ++k) {
      EXPECT_EQ(c.labels[b][k], ds->at(c.indices[b][k]).label);
    }
  }
}

TEST(Loader, EpochsDifferAndAugmentationDependsOnEpoch) {
  auto ds = std::make_shared<ImageFolder>(synthetic_root());
  auto opts = small_options(2);
  Loader loader(ds, std::make_shared<SequentialSampler>(ds->size()), opts);
  const Collected e0 = run_epoch(loader, 0), e1 = run_epoch(loader, 1), e0again = run_epoch(loader, 0);
  EXPECT_EQ(e0.indices, e1.indices);  // sequential order
  EXPECT_NE(e0.images, e1.images);    // different crops
  EXPECT_EQ(e0.images, e0again.images);
}

TEST(Loader, ResumeMidEpochGivesTheRemainingBatchesOfAnUninterruptedRun) {
  auto ds = std::make_shared<ImageFolder>(synthetic_root());
  DistributedSamplerOptions so;
  so.seed = 5;
  Loader loader(ds, std::make_shared<DistributedSampler>(ds->size(), so), small_options(2));
  const Collected full = run_epoch(loader, 2);
  const Collected tail = run_epoch(loader, 2, 3);
  ASSERT_EQ(tail.images.size(), full.images.size() - 3);
  for (size_t k = 0; k < tail.images.size(); ++k) {
    EXPECT_EQ(tail.images[k], full.images[k + 3]);
    EXPECT_EQ(tail.indices[k], full.indices[k + 3]);
  }
}

TEST(Loader, AllocatesExactlyPrefetchDepthSlotsUpFront) {
  auto ds = std::make_shared<ImageFolder>(synthetic_root());
  auto alloc = std::make_shared<CountingAllocator>();
  {
    auto opts = small_options(2);
    opts.prefetch_depth = 2;
    Loader loader(ds, std::make_shared<SequentialSampler>(ds->size()), opts, alloc);
    EXPECT_EQ(alloc->live.load(), 2);
    run_epoch(loader, 0);
    run_epoch(loader, 1);
    EXPECT_EQ(alloc->total.load(), 2);
    // Holding every slot and asking for more is a clear error, not a hang.
    loader.start_epoch(2);
    auto a = loader.next();
    auto b = loader.next();
    ASSERT_TRUE(a && b);
    EXPECT_THROW(loader.next(), std::logic_error);
    a.reset();
    EXPECT_TRUE(loader.next().has_value());
  }
  EXPECT_EQ(alloc->live.load(), 0);
}

// Progressive resizing: one loader whose slots hold 64 x 64 samples produces epoch 0 at 32,
// epoch 1 at 64 and epoch 2 at 48, each sample byte-equal to a loader built at that size (same
// seed, epoch, index), for 1 and 2 workers, in the same 2 slots; a resumed epoch has the size set
// before its start_epoch.
TEST(Loader, ImageSizeChangesBetweenEpochsAsAFixedSizeLoaderAtEachSize) {
  auto ds = std::make_shared<ImageFolder>(synthetic_root());
  DistributedSamplerOptions so;
  so.seed = 9;
  const auto fixed_at = [&](int size) {
    auto o = small_options(2);
    o.transform.rrc.size = size;
    return std::make_unique<Loader>(ds, std::make_shared<DistributedSampler>(ds->size(), so), o);
  };
  const std::vector<std::pair<int64_t, int>> schedule{{0, 32}, {1, 64}, {2, 48}};
  std::vector<Collected> expected;
  for (const auto& [epoch, size] : schedule) expected.push_back(run_epoch(*fixed_at(size), epoch));
  for (int workers : {1, 2}) {
    SCOPED_TRACE("num_workers " + std::to_string(workers));
    auto alloc = std::make_shared<CountingAllocator>();
    auto o = small_options(workers);
    o.max_image_size = 64;
    Loader loader(ds, std::make_shared<DistributedSampler>(ds->size(), so), o, alloc);
    EXPECT_EQ(loader.image_size(), 32);
    for (size_t e = 0; e < schedule.size(); ++e) {
      const auto [epoch, size] = schedule[e];
      loader.set_image_size(size);
      loader.start_epoch(epoch);
      EXPECT_EQ(loader.image_size(), size);
      Collected got;
      while (auto b = loader.next()) {
        EXPECT_EQ(b->height, size);
        EXPECT_EQ(b->width, size);
        EXPECT_EQ(b->image_bytes(), b->size * size * size * 3);
        got.images.emplace_back(b->images, b->images + b->image_bytes());
        got.indices.push_back(b->indices);
      }
      ASSERT_EQ(got.images.size(), 6u);  // ceil(21 / 4)
      EXPECT_EQ(got.indices, expected[e].indices) << "epoch " << epoch;
      EXPECT_EQ(got.images, expected[e].images) << "epoch " << epoch << " at " << size;
    }
    EXPECT_EQ(alloc->total.load(), 2);  // the slots of the first epoch, reused at every size
    // Resuming epoch 1 at batch 3 after epoch 2 ran at 48: its schedule's size, 64, set first.
    loader.set_image_size(64);
    const Collected tail = run_epoch(loader, 1, 3);
    ASSERT_EQ(tail.images.size(), 3u);
    for (size_t k = 0; k < tail.images.size(); ++k) EXPECT_EQ(tail.images[k], expected[1].images[k + 3]);
  }
}

// No stall at epoch starts: while a consumer that takes longer per batch than the loader
// finishes epoch e, the loader decodes epoch e + 1's first batches into the free slots, so
// start_epoch(e + 1) finds them ready (wait_ready(0)) and its first next() does not wait at all
// (first_wait_s is exactly 0). Also at a size set during epoch e (progressive resizing); a size
// set after that plan, or another epoch, cancels it. The samples are those of a fresh loader at
// that epoch and size in every case, and a loader restarted on the same epoch (a validation
// loader) plans that epoch again. The slow consumer is played by waiting, with each batch held,
// until the loader has decoded everything it scheduled: what "slower than the loader" means,
// without betting on the machine's speed.
TEST(Loader, TheNextEpochsFirstBatchesAreDecodedWhileTheLastOnesAreConsumed) {
  const fs::path root = fs::temp_directory_path() / ("gpufeed_test_ahead_" + std::to_string(::getpid()));
  SyntheticOptions so;
  so.num_classes = 2;
  so.images_per_class = 8;
  so.min_size = 300;
  so.max_size = 400;
  write_synthetic_image_folder(root, so);
  auto ds = std::make_shared<ImageFolder>(root);
  DistributedSamplerOptions dso;
  dso.seed = 4;
  LoaderOptions o = small_options(2);
  o.prefetch_depth = 3;
  o.max_image_size = 64;
  const auto fresh = [&](int64_t epoch, int size) {
    LoaderOptions f = o;
    f.transform.rrc.size = size;
    f.max_image_size = 0;
    Loader l(ds, std::make_shared<DistributedSampler>(ds->size(), dso), f);
    return run_epoch(l, epoch);
  };
  Loader loader(ds, std::make_shared<DistributedSampler>(ds->size(), dso), o);
  // The consumer: slower than the loader (each batch held until nothing scheduled is still
  // decoding); as the epoch starts, it sets the size of the next one (as the trainer does for
  // progressive resizing). Returns the batches and the epoch's first-batch wait.
  const auto consume = [&](int64_t epoch, int next_size) {
    Collected c;
    loader.set_image_size(next_size);
    while (auto b = loader.next()) {
      c.images.emplace_back(b->images, b->images + b->image_bytes());
      c.indices.push_back(b->indices);
      EXPECT_TRUE(gpufeed::test::eventually([&] { return loader.slot_counts().in_flight == 0; }, 30,
                                            std::chrono::milliseconds(1)))
          << "the loader did not finish its scheduled batches within 30 s";
    }
    const EpochSummary s = loader.epoch_summary();
    EXPECT_EQ(s.epoch, epoch);
    return std::make_pair(c, s.first_wait_s);
  };
  loader.set_image_size(32);
  loader.start_epoch(0);
  const auto e0 = consume(0, 48);
  EXPECT_EQ(e0.first.images, fresh(0, 32).images);
  // Epoch 1 at 48, planned during epoch 0: decoded before its start.
  loader.start_epoch(1);
  EXPECT_TRUE(loader.wait_ready(std::chrono::nanoseconds(0))) << "epoch 1's first batch was not decoded ahead";
  const auto e1 = consume(1, 48);
  EXPECT_EQ(e1.first.images, fresh(1, 48).images);
  EXPECT_EQ(e1.second, 0.0) << "epoch 1's first batch was waited for";
  // Epoch 2 planned at 48, but the size changes to 64 before it starts: planned again, right.
  loader.set_image_size(64);
  loader.start_epoch(2);
  EXPECT_EQ(consume(2, 64).first.images, fresh(2, 64).images);
  // Another epoch than the one planned (3): 5 is planned from scratch, right.
  loader.start_epoch(5);
  EXPECT_EQ(consume(5, 64).first.images, fresh(5, 64).images);
  // The same epoch twice (a validation loader): the second start finds epoch 5 decoded.
  loader.start_epoch(5);
  const auto again = consume(5, 64);
  loader.start_epoch(5);
  EXPECT_TRUE(loader.wait_ready(std::chrono::nanoseconds(0))) << "a repeated epoch was not planned again";
  EXPECT_EQ(again.first.images, fresh(5, 64).images);
  const SlotCounts slots = loader.slot_counts();
  EXPECT_EQ(slots.ready + slots.in_flight + slots.held + slots.free, 3);
  std::error_code ec;
  fs::remove_all(root, ec);
}

// num_workers = auto (gpufeed/loader/thread_tuner.h) changes the thread count between batches;
// the batches are those of one thread whatever it chose. The tuner decides from made-up
// measurements (LoaderOptions::tuner_observation), so its decisions are exact on any machine: a
// sample costs 1 ms of thread time; epoch 0's and epoch 2's consumer takes 25 ms a batch of 4
// (160 samples/s: 0.16 threads, one is plenty, lowered after two windows of 4 batches agree),
// epoch 1's asks again at once (every thread, at the first window's end). The measurements the
// loader hands the seam are its own: the step of an epoch's first batch is unknown (negative),
// every batch's thread time per sample is known (its samples were decoded), and the thread count
// it reports is the one the last decision set.
TEST(Loader, AutoNumWorkersGivesOneThreadsBatchesWhateverItChooses) {
  const fs::path root = fs::temp_directory_path() / ("gpufeed_test_auto_" + std::to_string(::getpid()));
  SyntheticOptions so;
  so.num_classes = 2;
  so.images_per_class = 32;
  so.min_size = 40;
  so.max_size = 80;
  write_synthetic_image_folder(root, so);
  auto ds = std::make_shared<ImageFolder>(root);
  DistributedSamplerOptions dso;
  dso.seed = 3;
  LoaderOptions o = small_options(1);
  // The reference first, its loader gone before the tuned one runs: oneTBB applies the smallest
  // live max_allowed_parallelism, so a live one-thread loader would leave the other one worker.
  std::vector<Collected> reference;
  {
    Loader one(ds, std::make_shared<DistributedSampler>(ds->size(), dso), o);
    for (const int64_t epoch : {0, 1, 2}) reference.push_back(run_epoch(one, epoch));
    EXPECT_TRUE(one.thread_decisions().empty()) << "a fixed count decides nothing";
  }
  o.num_workers = kAutoNumWorkers;
  std::vector<TunerObservation> measured;  // written in next(), on this thread
  o.tuner_observation = [&measured](const TunerObservation& m) {
    measured.push_back(m);
    TunerObservation t = m;
    t.sample_cost_s = 1e-3;
    t.wait_s = 0;
    if (m.consumer_s >= 0) t.consumer_s = m.epoch == 1 ? 0.0 : 0.025;
    return t;
  };
  auto tuned_owner = std::make_unique<Loader>(ds, std::make_shared<DistributedSampler>(ds->size(), dso), o);
  Loader& tuned = *tuned_owner;
  const int budget = gpufeed::cpu_budget();
  EXPECT_EQ(tuned.num_threads(), budget) << "auto starts with the whole CPU budget";
  for (const int64_t epoch : {0, 1, 2}) {
    SCOPED_TRACE("epoch " + std::to_string(epoch));
    const Collected c = run_epoch(tuned, epoch);
    const Collected& want = reference[static_cast<size_t>(epoch)];
    ASSERT_EQ(c.indices.size(), 16u);  // 64 samples, batches of 4
    EXPECT_EQ(c.indices, want.indices);
    EXPECT_EQ(c.labels, want.labels);
    EXPECT_EQ(c.images, want.images);
    EXPECT_EQ(tuned.num_threads(), epoch == 1 ? budget : 1);
  }
  ASSERT_EQ(measured.size(), 48u);
  for (size_t k = 0; k < measured.size(); ++k) {
    const TunerObservation& m = measured[k];
    SCOPED_TRACE("batch " + std::to_string(k));
    EXPECT_EQ(m.epoch, static_cast<int64_t>(k / 16));
    EXPECT_EQ(m.batch, static_cast<int64_t>(k % 16));
    EXPECT_EQ(m.consumer_s < 0, m.batch == 0);
    EXPECT_GE(m.wait_s, 0.0);
    EXPECT_GT(m.sample_cost_s, 0.0);
    EXPECT_EQ(m.prefetch_depth, 2);
    // Down after epoch 0's batch 7, up after epoch 1's batch 3, down after epoch 2's batch 7.
    const int64_t g = static_cast<int64_t>(k);
    const bool all = g <= 7 || (g > 19 && g <= 32 + 7);
    EXPECT_EQ(m.threads, all ? budget : 1);
  }
  const std::vector<ThreadDecision> d = tuned.thread_decisions();
  if (budget < 2) {
    std::printf("[ note ] CPU budget 1: auto has nothing to choose; only the batches are checked\n");
    EXPECT_TRUE(d.empty());
  } else {
    ASSERT_EQ(d.size(), 3u) << "down in epoch 0, up in epoch 1, down in epoch 2";
    const std::vector<std::array<int64_t, 4>> want{{0, 7, budget, 1}, {1, 3, 1, budget}, {2, 7, budget, 1}};
    for (size_t k = 0; k < d.size(); ++k) {
      SCOPED_TRACE("decision " + std::to_string(k));
      EXPECT_EQ(d[k].number, static_cast<int64_t>(k));
      EXPECT_EQ(d[k].epoch, want[k][0]);
      EXPECT_EQ(d[k].batch, want[k][1]);
      EXPECT_EQ(d[k].from, want[k][2]);
      EXPECT_EQ(d[k].to, want[k][3]);
      EXPECT_EQ(d[k].prefetch_depth_from, 2);
      EXPECT_EQ(d[k].prefetch_depth_to, 2);
      EXPECT_DOUBLE_EQ(d[k].sample_cost_us, 1000.0);
      EXPECT_DOUBLE_EQ(d[k].wait_fraction, 0.0);
      EXPECT_FALSE(d[k].why.empty());
    }
    EXPECT_DOUBLE_EQ(d[0].demand_per_s, 160.0);
    EXPECT_DOUBLE_EQ(d[0].needed, 0.16);
    EXPECT_TRUE(std::isinf(d[1].demand_per_s)) << "a consumer that asks at once takes all it gets";
  }
  tuned_owner.reset();  // before its files go: it may be decoding the epoch after
  std::error_code ec;
  fs::remove_all(root, ec);
}

/// Reads of the wrapped dataset block until open(): a loader whose batches are certainly not ready
/// yet, however fast or busy the machine. Open it before the loader is destroyed (its tasks wait
/// for the gate).
class GatedDataset : public Dataset {
 public:
  explicit GatedDataset(std::shared_ptr<const Dataset> inner) : inner_(std::move(inner)) {}
  int64_t size() const override { return inner_->size(); }
  SampleRef at(int64_t i) const override { return inner_->at(i); }
  const std::vector<std::string>& classes() const override { return inner_->classes(); }
  void read(int64_t i, const SampleRef& ref, gpufeed::decode::ByteBuffer& out) const override {
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return open_; });
    }
    inner_->read(i, ref, out);
  }
  void open() {
    {
      std::lock_guard<std::mutex> g(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::shared_ptr<const Dataset> inner_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool open_ = false;
};

// The consumer's wait as the loader counts it includes the blocking wait_ready() slices a
// binding waits in (the Python iterator), not only the wait inside next(). The first batch is
// held back (its reads wait for a gate) through 5 slices of 200 us, so it is not ready in any of
// them: the batch's wait is at least their 1 ms and at most the time the test spent inside its
// wait_ready() calls.
TEST(Loader, WaitReadySlicesCountAsTheConsumersDataWait) {
  auto ds = std::make_shared<GatedDataset>(std::make_shared<ImageFolder>(synthetic_root()));
  LoaderOptions o = small_options(1);
  o.prefetch_next_epoch = false;
  Loader loader(ds, std::make_shared<SequentialSampler>(ds->size()), o);
  loader.start_epoch(0);
  double inside = 0;  // seconds the test spent in wait_ready()
  const auto slice = [&](std::chrono::nanoseconds timeout) {
    const auto t0 = std::chrono::steady_clock::now();
    const bool ready = loader.wait_ready(timeout);
    inside += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return ready;
  };
  for (int k = 0; k < 5; ++k) EXPECT_FALSE(slice(std::chrono::microseconds(200))) << "slice " << k;
  ds->open();
  EXPECT_TRUE(slice(std::chrono::seconds(30))) << "the first batch was not decoded within 30 s";
  ASSERT_TRUE(loader.next());
  const EpochSummary s = loader.epoch_summary();
  EXPECT_GE(s.first_wait_s, 5 * 200e-6);
  EXPECT_LE(s.first_wait_s, inside);
  EXPECT_EQ(s.wait_s, s.first_wait_s);
}

// The choice itself against consumers of known speed, relative to the per-batch decode time T
// of one thread (8 samples a batch at 2 ms of thread time each: T = 16 ms, made up through
// LoaderOptions::tuner_observation, as are the consumer's steps): a consumer taking 3T a batch is
// served by one thread (0.33 threads needed, 0.42 with headroom), one taking 0.6T needs more
// than one (1.67 needed, 2.08 with headroom: 3, or the whole budget below that). The data wait
// the seam reports is what a loader of that many threads would cause (T / threads beyond the
// step), so a count that is too few would show as wait. Decisions come at the end of windows of
// 4 batches (6 an epoch), going down only after two windows agree: at epoch 1's batch 1. The
// batches are one thread's. Whether the chosen count keeps a real consumer's wait under 1% is
// the benchmark's question (tools/bench/bench_autotune.py), not a unit test's.
TEST(AutoNumWorkers, OneThreadForAConsumerThreeTimesSlowerThanADecodeMoreForOneFaster) {
  const int budget = gpufeed::cpu_budget();
  if (budget < 2) GTEST_SKIP() << "CPU budget " << budget << ": no choice to make";
  const fs::path root = fs::temp_directory_path() / ("gpufeed_test_autochoice_" + std::to_string(::getpid()));
  SyntheticOptions so;
  so.num_classes = 2;
  so.images_per_class = 24;
  so.min_size = 40;
  so.max_size = 80;
  write_synthetic_image_folder(root, so);
  auto ds = std::make_shared<ImageFolder>(root);
  LoaderOptions o = small_options(1);
  o.batch_size = 8;
  std::vector<Collected> reference;
  {
    Loader one(ds, std::make_shared<SequentialSampler>(ds->size()), o);
    for (int64_t epoch = 0; epoch < 3; ++epoch) reference.push_back(run_epoch(one, epoch));
  }
  constexpr double kCost = 2e-3, kT = 8 * kCost;
  o.num_workers = kAutoNumWorkers;
  for (const auto& [factor, want] : {std::pair{3.0, 1}, std::pair{0.6, std::min(3, budget)}}) {
    SCOPED_TRACE("consumer " + std::to_string(factor) + " T");
    double waited = 0;
    o.tuner_observation = [&waited, factor = factor](const TunerObservation& m) {
      TunerObservation t = m;
      t.sample_cost_s = kCost;
      const double step = factor * kT;
      if (m.consumer_s >= 0) t.consumer_s = step;
      t.wait_s = std::max(0.0, kT / m.threads - step);
      waited += t.wait_s;
      return t;
    };
    Loader tuned(ds, std::make_shared<SequentialSampler>(ds->size()), o);
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      const Collected c = run_epoch(tuned, epoch);
      EXPECT_EQ(c.indices, reference[static_cast<size_t>(epoch)].indices) << "epoch " << epoch;
      EXPECT_EQ(c.images, reference[static_cast<size_t>(epoch)].images) << "epoch " << epoch;
    }
    EXPECT_EQ(tuned.num_threads(), want);
    EXPECT_EQ(waited, 0.0) << "the chosen counts keep up with the modelled consumer";
    const std::vector<ThreadDecision> d = tuned.thread_decisions();
    if (want == budget) {
      EXPECT_TRUE(d.empty()) << "it starts with the whole budget, which is the count wanted";
    } else {
      ASSERT_EQ(d.size(), 1u);
      EXPECT_EQ(d[0].epoch, 1);
      EXPECT_EQ(d[0].batch, 1);
      EXPECT_EQ(d[0].from, budget);
      EXPECT_EQ(d[0].to, want);
      EXPECT_DOUBLE_EQ(d[0].needed, 8 / (factor * kT) * kCost);
    }
  }
  std::error_code ec;
  fs::remove_all(root, ec);
}

// prefetch_depth = auto (loader.h) against a bursty consumer: it pauses before every 8th batch
// and takes the other 7 at once, so each burst finds only the batches the slots held decoded and
// waits for the rest. The consumer's steps and waits are made up (LoaderOptions::tuner_observation:
// a batch beyond the slots that exist waits 10 ms, the pause is 80 ms, other steps 0.5 ms); the
// other condition for a slot more, that the loader had filled every slot, is made true for real
// by holding each batch until nothing scheduled is still decoding. A window of 4 batches with a
// wait adds a slot: 3 -> 4 -> 5 -> 6 in epoch 0 (after batches 3, 7, 15), 6 -> 7 -> 8 in epoch 1
// (after 7, 15), when a burst's 8 batches fit, and nothing after. The batches are those of a
// fixed-depth loader.
TEST(AutoPrefetchDepth, GrowsForABurstyConsumerUntilItsBurstsAreDecodedAhead) {
  const fs::path root = fs::temp_directory_path() / ("gpufeed_test_autodepth_" + std::to_string(::getpid()));
  SyntheticOptions so;
  so.num_classes = 2;
  so.images_per_class = 32;
  so.min_size = 40;
  so.max_size = 80;
  write_synthetic_image_folder(root, so);
  auto ds = std::make_shared<ImageFolder>(root);
  LoaderOptions o = small_options(1);
  std::vector<Collected> reference;
  {
    Loader fixed(ds, std::make_shared<SequentialSampler>(ds->size()), o);
    for (int64_t epoch = 0; epoch < 4; ++epoch) reference.push_back(run_epoch(fixed, epoch));
  }
  o.prefetch_depth = kAutoPrefetchDepth;
  o.tuner_observation = [](const TunerObservation& m) {
    TunerObservation t = m;
    const int64_t k = m.batch % 8;  // the batch's place in its burst
    if (m.consumer_s >= 0) t.consumer_s = k == 0 ? 0.080 : 0.0005;
    t.wait_s = k >= m.prefetch_depth ? 0.010 : 0.0;
    return t;
  };
  auto owner = std::make_unique<Loader>(ds, std::make_shared<SequentialSampler>(ds->size()), o);
  Loader& loader = *owner;
  EXPECT_EQ(loader.prefetch_depth(), kAutoPrefetchStart);
  for (int64_t epoch = 0; epoch < 4; ++epoch) {
    Collected c;
    loader.start_epoch(epoch);
    while (auto b = loader.next()) {
      c.images.emplace_back(b->images, b->images + b->image_bytes());
      c.indices.push_back(b->indices);
      ASSERT_TRUE(gpufeed::test::eventually(
          [&] {
            const SlotCounts n = loader.slot_counts();
            return n.in_flight == 0 && n.free == 0;
          },
          30, std::chrono::milliseconds(1)))
          << "the loader did not fill its slots within 30 s";
    }
    EXPECT_EQ(c.images, reference[static_cast<size_t>(epoch)].images) << "epoch " << epoch;
    EXPECT_EQ(c.indices, reference[static_cast<size_t>(epoch)].indices) << "epoch " << epoch;
  }
  const auto d = loader.thread_decisions();
  const std::vector<std::array<int64_t, 3>> want{{0, 3, 3}, {0, 7, 4}, {0, 15, 5}, {1, 7, 6}, {1, 15, 7}};
  ASSERT_EQ(d.size(), want.size());
  for (size_t k = 0; k < d.size(); ++k) {
    SCOPED_TRACE("decision " + std::to_string(k));
    EXPECT_EQ(d[k].number, static_cast<int64_t>(k));
    EXPECT_EQ(d[k].epoch, want[k][0]);
    EXPECT_EQ(d[k].batch, want[k][1]);
    EXPECT_EQ(d[k].from, 1);
    EXPECT_EQ(d[k].to, 1);
    EXPECT_EQ(d[k].prefetch_depth_from, want[k][2]);
    EXPECT_EQ(d[k].prefetch_depth_to, want[k][2] + 1);
  }
  EXPECT_EQ(loader.prefetch_depth(), 8);
  const SlotCounts slots = loader.slot_counts();
  EXPECT_EQ(slots.ready + slots.in_flight + slots.held + slots.free, 8);
  owner.reset();
  std::error_code ec;
  fs::remove_all(root, ec);
}

TEST(Loader, AnImageSizeAboveTheSlotsIsRefusedNamingBoth) {
  auto ds = std::make_shared<ImageFolder>(synthetic_root());
  auto o = small_options(1);
  o.max_image_size = 64;
  Loader loader(ds, std::make_shared<SequentialSampler>(ds->size()), o);
  const std::string message = error_of<std::invalid_argument>([&] { loader.set_image_size(65); });
  EXPECT_NE(message.find("set_image_size(65)"), std::string::npos) << message;
  EXPECT_NE(message.find("max_image_size 64"), std::string::npos) << message;
  EXPECT_THROW(loader.set_image_size(0), std::invalid_argument);
  EXPECT_EQ(loader.image_size(), 32);  // unchanged by the refused calls
  loader.set_image_size(64);           // the slots' side itself is fine
  EXPECT_EQ(loader.image_size(), 64);
  // Without max_image_size the slots are the transform's size: nothing larger.
  Loader fixed(ds, std::make_shared<SequentialSampler>(ds->size()), small_options(1));
  EXPECT_THROW(fixed.set_image_size(33), std::invalid_argument);
  // Slots smaller than the first epoch's size, and an eval transform's size, are refused.
  o.max_image_size = 16;
  EXPECT_NE(error_of<std::invalid_argument>([&] { Loader l(ds, std::make_shared<SequentialSampler>(ds->size()), o); })
                .find("max_image_size 16 is below the transform's output size 32"),
            std::string::npos);
  auto eval = small_options(1);
  eval.transform = TransformOptions::imagenet(TransformOptions::Kind::kEval, 32);
  eval.max_image_size = 64;
  Loader evaluating(ds, std::make_shared<SequentialSampler>(ds->size()), eval);
  EXPECT_THROW(evaluating.set_image_size(48), std::invalid_argument);
}

TEST(Loader, NumWorkersOutsideZeroToTheMaximumIsRefusedBeforeAnyThreadStarts) {
  // 100000 threads made pthread_create fail inside oneTBB and the process abort (field report).
  auto ds = std::make_shared<ImageFolder>(synthetic_root());
  for (const int n : {-2, kMaxNumWorkers + 1, 100000}) {  // -1 is kAutoNumWorkers
    auto o = small_options(1);
    o.num_workers = n;
    EXPECT_NE(error_of<std::invalid_argument>([&] { Loader l(ds, std::make_shared<SequentialSampler>(ds->size()), o); })
                  .find("num_workers " + std::to_string(n) + " must be in 0..1024"),
              std::string::npos) << n;
  }
}

TEST(Loader, BatchOutlivingTheLoaderKeepsItsMemory) {
  auto ds = std::make_shared<ImageFolder>(synthetic_root());
  auto alloc = std::make_shared<CountingAllocator>();
  std::optional<Batch> kept;
  {
    Loader loader(ds, std::make_shared<SequentialSampler>(ds->size()), small_options(2), alloc);
    loader.start_epoch(0);
    kept = loader.next();
    // Destroyed mid-epoch with work in flight: must return promptly and not free a held slot.
  }
  ASSERT_TRUE(kept);
  EXPECT_EQ(alloc->live.load(), 2);
  uint64_t sum = std::accumulate(kept->images, kept->images + kept->image_bytes(), uint64_t{0});
  EXPECT_GT(sum, 0u);
  kept.reset();
  EXPECT_EQ(alloc->live.load(), 0);
}

TEST(Loader, RaisePolicyNamesTheBadFile) {
  const fs::path root = fs::temp_directory_path() / ("gpufeed_bad_" + std::to_string(::getpid()));
  fs::create_directories(root / "a");
  fs::copy_file(synthetic_root() / "class_000" / "img_00000.jpg", root / "a" / "good.jpg",
                fs::copy_options::overwrite_existing);
  std::ofstream(root / "a" / "broken.jpg") << "this is not a jpeg";
  auto ds = std::make_shared<ImageFolder>(root);
  Loader loader(ds, std::make_shared<SequentialSampler>(ds->size()), small_options(2));
  loader.start_epoch(0);
  try {
    loader.next();
    FAIL() << "expected a decode error";
  } catch (const gpufeed::decode::DecodeError& e) {
    EXPECT_NE(std::string(e.what()).find("broken.jpg"), std::string::npos) << e.what();
  }
  // Skip policy: the same epoch completes, the bad file is reported and replaced.
  auto opts = small_options(2);
  opts.error_policy = ErrorPolicy::kSkip;
  Loader skipping(ds, std::make_shared<SequentialSampler>(ds->size()), opts);
  skipping.start_epoch(0);
  auto b = skipping.next();
  ASSERT_TRUE(b);
  EXPECT_EQ(b->size, 2);
  ASSERT_EQ(b->skipped.size(), 1u);
  EXPECT_NE(b->skipped[0].path.find("broken.jpg"), std::string::npos);
  EXPECT_EQ(skipping.epoch_skips(), 1);
  fs::remove_all(root);
}

// The next epoch decoded ahead meets the bad file again, but only a started epoch's handed-out
// batches count a skip: stats().skipped is 1 after epoch 0 however far epoch 1 got, 2 after it.
TEST(Loader, SkipsOfAnEpochDecodedAheadCountOnlyOnceItIsHandedOut) {
  const fs::path root = fs::temp_directory_path() / ("gpufeed_ahead_skip_" + std::to_string(::getpid()));
  fs::create_directories(root / "a");
  for (int i = 0; i < 5; ++i)
    fs::copy_file(synthetic_root() / "class_000" / "img_00000.jpg", root / "a" / ("ok" + std::to_string(i) + ".jpg"),
                  fs::copy_options::overwrite_existing);
  std::ofstream(root / "a" / "broken.jpg") << "this is not a jpeg";
  auto ds = std::make_shared<ImageFolder>(root);
  auto opts = small_options(1);
  opts.error_policy = ErrorPolicy::kSkip;
  opts.prefetch_depth = 4;  // 2 batches an epoch: epoch 1 fits in the slots epoch 0 leaves free
  {  // the loader goes before its files: it decodes epoch 2 ahead while epoch 1 ends
  Loader loader(ds, std::make_shared<SequentialSampler>(ds->size()), opts);
  run_epoch(loader, 0);
  EXPECT_EQ(loader.epoch_summary().skipped, 1);
  // Wait until epoch 1's batches (planned ahead) are decoded: nothing left in flight.
  for (int i = 0; i < 500 && (loader.slot_counts().in_flight > 0 || loader.slot_counts().ready < 2); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(loader.slot_counts().ready, 2) << "epoch 1 was not decoded ahead";
  EXPECT_EQ(loader.stats().samples, 12) << "epoch 1 decoded ahead: 6 samples each";
  EXPECT_EQ(loader.stats().skipped, 1);
  run_epoch(loader, 1);
  EXPECT_EQ(loader.epoch_summary().skipped, 1);
  EXPECT_EQ(loader.stats().skipped, 2);
  }
  fs::remove_all(root);
}

TEST(Loader, EvalTransformIsCloseToTorchvisionPixels) {
  const auto g = gpufeed::test::load_golden("transform.json");
  const auto& cases = g.at("pixels");
  ASSERT_GE(cases.size(), 1u);
  LoaderOptions o;
  o.transform.kind = TransformOptions::Kind::kEval;
  for (const auto& c : cases) {
    const fs::path list = fs::temp_directory_path() / "gpufeed_pixels.txt";
    std::ofstream(list) << c["path"].get<std::string>() << " 0\n";
    FileList ds(list, "/");
    std::vector<uint8_t> ours(224 * 224 * 3);
    load_sample(ds, 0, 0, o, ours.data());
    std::ifstream ref_in(c["reference"].get<std::string>(), std::ios::binary);
    std::vector<uint8_t> ref((std::istreambuf_iterator<char>(ref_in)), std::istreambuf_iterator<char>());
    ASSERT_EQ(ref.size(), ours.size());
    double diff = 0;
    for (size_t k = 0; k < ref.size(); ++k) diff += std::abs(int(ref[k]) - int(ours[k]));
    diff /= static_cast<double>(ref.size());
    EXPECT_LE(diff, 3.0) << c["path"];
  }
}

TEST(Loader, LoadsTheRealHymenopteraFolderIncludingGifAndSpaces) {
  const fs::path shared = gpufeed::test::shared_dir();
  if (shared.empty() || !fs::exists(shared / "data/hymenoptera/train")) {
    GTEST_SKIP() << "../shared/data/hymenoptera is absent in this checkout";
  }
  auto ds = std::make_shared<ImageFolder>(shared / "data/hymenoptera/train");
  EXPECT_EQ(ds->size(), 245);
  LoaderOptions o;
  o.batch_size = 64;
  o.num_workers = 2;
  o.transform.rrc.size = 64;
  o.prefetch_next_epoch = false;  // every sample decoded counts in stats(): this epoch's alone
  Loader loader(ds, std::make_shared<SequentialSampler>(ds->size()), o);
  loader.start_epoch(0);
  int64_t n = 0;
  while (auto b = loader.next()) n += b->size;
  EXPECT_EQ(n, 245);
  EXPECT_EQ(loader.stats().samples, 245);
}

TEST(OpenDataset, FlatFolderTakesTheClassFromTheFileNamePrefix) {
  const fs::path root = fs::temp_directory_path() / ("gpufeed_flat_" + std::to_string(::getpid()));
  fs::create_directories(root);
  for (const char* n : {"n02_b.JPEG", "n01_tench.JPEG", "n02_a.jpg", "plain.png", "notes.txt"}) {
    std::ofstream(root / n) << "x";
  }
  auto ds = open_dataset(root);
  ASSERT_EQ(ds->size(), 4);
  EXPECT_EQ(ds->classes(), (std::vector<std::string>{"n01", "n02", "plain"}));
  EXPECT_EQ(fs::path(ds->at(0).path).filename(), "n01_tench.JPEG");
  EXPECT_EQ(ds->at(0).label, 0);
  EXPECT_EQ(fs::path(ds->at(1).path).filename(), "n02_a.jpg");
  EXPECT_EQ(ds->at(2).label, 1);
  EXPECT_EQ(ds->at(3).label, 2);
  // A folder with class subfolders is an ImageFolder; a file is a FileList.
  EXPECT_NE(dynamic_cast<ImageFolder*>(open_dataset(synthetic_root()).get()), nullptr);
  std::ofstream(root / "list.txt") << "n01_tench.JPEG 5\n";
  auto list = open_dataset(root / "list.txt");
  EXPECT_EQ(list->at(0).path, (root / "n01_tench.JPEG").string());
  EXPECT_EQ(list->at(0).label, 5);
  fs::remove_all(root);
}
