// WebDataset tar shards: the order and labels webdataset reads (goldens/gen_shards.py), the
// loader's batches over shards equal to its batches over the same files in a folder (sampler
// order, augmentation, skip policy, resume), the member-index cache, and hostile archives.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

#include "golden.h"
#include "gpufeed/decode/decoder.h"
#include "gpufeed/datasets/dataset.h"
#include "gpufeed/loader/loader.h"
#include "gpufeed/datasets/shards.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace gpufeed::loader;
using namespace gpufeed::datasets;
using namespace gpufeed::transforms;
using gpufeed::sampler::DistributedSampler;
using gpufeed::sampler::DistributedSamplerOptions;

namespace {

// ---- a tar writer for hand-made (and hostile) archives

struct Tar {
  std::string bytes;

  // One 512-byte ustar header. `size_field` replaces the octal size text when given.
  void header(const std::string& name, int64_t size, char type = '0', const std::string& size_field = "",
              const std::string& prefix = "", bool fix_checksum = true) {
    char h[512] = {};
    std::memcpy(h, name.data(), std::min<size_t>(name.size(), 100));
    std::memcpy(h + 100, "0000644", 7);
    std::memcpy(h + 108, "0000000", 7);
    std::memcpy(h + 116, "0000000", 7);
    const std::string sz = size_field.empty() ? fmt_octal(size, 11) : size_field;
    std::memcpy(h + 124, sz.data(), std::min<size_t>(sz.size(), 12));
    std::memcpy(h + 136, "00000000000", 11);
    h[156] = type;
    std::memcpy(h + 257, "ustar", 6);
    std::memcpy(h + 263, "00", 2);
    std::memcpy(h + 345, prefix.data(), std::min<size_t>(prefix.size(), 155));
    std::memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (const char c : h) sum += static_cast<unsigned char>(c);
    if (!fix_checksum) sum += 1;
    const std::string cs = fmt_octal(sum, 6);
    std::memcpy(h + 148, cs.data(), 6);
    h[154] = '\0';
    bytes.append(h, 512);
  }
  void data(const std::string& d) {
    bytes += d;
    bytes.append((512 - d.size() % 512) % 512, '\0');
  }
  void member(const std::string& name, const std::string& d, char type = '0') {
    header(name, static_cast<int64_t>(d.size()), type);
    data(d);
  }
  void pax(const std::string& key, const std::string& value) {
    std::string rec = " " + key + "=" + value + "\n";
    size_t len = rec.size() + 1;
    while (std::to_string(len).size() + rec.size() != len) ++len;
    member("PaxHeader", std::to_string(len) + rec, 'x');
  }
  void end() { bytes.append(1024, '\0'); }

  static std::string fmt_octal(uint64_t v, int width) {
    std::string s(static_cast<size_t>(width), '0');
    for (int i = width - 1; i >= 0 && v; --i, v >>= 3) s[static_cast<size_t>(i)] = static_cast<char>('0' + (v & 7));
    return s;
  }
};

ReadAt reader_of(const std::string& bytes) {
  return [&bytes](int64_t offset, void* buf, size_t n) -> size_t {
    if (offset < 0 || static_cast<size_t>(offset) >= bytes.size()) return 0;
    const size_t k = std::min(n, bytes.size() - static_cast<size_t>(offset));
    std::memcpy(buf, bytes.data() + offset, k);
    return k;
  };
}

std::vector<ShardSample> index_bytes(const std::string& bytes) {
  return index_shard(reader_of(bytes), static_cast<int64_t>(bytes.size()), "mem.tar");
}

// The ShardError's message for `bytes`, or "no error".
std::string error_of(const std::string& bytes) {
  try {
    index_bytes(bytes);
    return "no error";
  } catch (const ShardError& e) {
    return e.what();
  }
}

std::vector<uint8_t> read_bytes(const SampleRef& s) {
  std::vector<uint8_t> out;
  read_sample(s, out);
  return out;
}

std::vector<uint8_t> file_bytes(const fs::path& p) {
  std::vector<uint8_t> out;
  gpufeed::decode::read_file(p, out);
  return out;
}

}  // namespace

TEST(TarIndex, ReadsUstarPrefixPaxAndGnuLongNamesAndSkipsWhatIsNotAFile) {
  Tar t;
  t.member("a.jpg", "JPEGDATA");
  t.member("a.cls", " 7\n");
  t.member("a.json", "{}");
  t.member("dir", "", '5');
  t.member("link.jpg", "", '2');
  t.header("b.jpg", 3, '0', "", "deep/folder");  // ustar prefix: deep/folder/b.jpg
  t.data("xyz");
  t.member("deep/folder/b.cls", "0");
  const std::string long_name = std::string(150, 'n') + ".png";
  t.pax("path", long_name);
  t.member("ignored-short-name.png", "PNG");
  t.pax("path", std::string(150, 'n') + ".cls");
  t.member("short.cls", "12");
  t.member("././@LongLink", std::string(120, 'g') + ".webp", 'L');
  t.member("cut.webp", "W");
  t.member("././@LongLink", std::string(120, 'g') + ".cls", 'L');
  t.member("cut.cls", "3");
  t.member("README", "no key.extension: skipped");
  t.member("__meta__", "webdataset metadata: skipped");
  t.end();
  const std::vector<ShardSample> s = index_bytes(t.bytes);
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s[0].member, "a.jpg");
  EXPECT_EQ(s[0].label, 7);
  EXPECT_EQ(t.bytes.substr(static_cast<size_t>(s[0].offset), static_cast<size_t>(s[0].size)), "JPEGDATA");
  EXPECT_EQ(s[1].member, "deep/folder/b.jpg");
  EXPECT_EQ(s[1].label, 0);
  EXPECT_EQ(t.bytes.substr(static_cast<size_t>(s[1].offset), 3), "xyz");
  EXPECT_EQ(s[2].member, long_name);
  EXPECT_EQ(s[2].label, 12);
  EXPECT_EQ(s[3].member, std::string(120, 'g') + ".webp");
  EXPECT_EQ(s[3].label, 3);
  EXPECT_EQ(t.bytes.substr(static_cast<size_t>(s[3].offset), 1), "W");
}

TEST(TarIndex, HostileArchivesFailNamingTheShardTheMemberAndWhy) {
  const auto good = [](Tar& t) {
    t.member("k.jpg", "J");
    t.member("k.cls", "1");
  };
  const auto expect = [](const std::string& what, const std::vector<std::string>& parts) {
    for (const std::string& p : parts) EXPECT_NE(what.find(p), std::string::npos) << "'" << p << "' not in: " << what;
  };
  {  // cut inside a member's data
    Tar t;
    good(t);
    t.member("m.jpg", std::string(3000, 'x'));
    t.end();
    expect(error_of(t.bytes.substr(0, 512 * 4 + 700)), {"mem.tar", "'m.jpg'", "size 3000 runs past the end"});
    // cut inside a header, and right after the last member (no end-of-archive block)
    expect(error_of(t.bytes.substr(0, 512 * 4 + 100)), {"mem.tar", "header at offset 2048 is cut short"});
    expect(error_of(t.bytes.substr(0, 512 * 11)), {"mem.tar", "ends at offset 5632 without the end-of-archive block"});
    expect(error_of(""), {"mem.tar", "empty file"});
  }
  {  // a size field past the end, and one that is not a number
    Tar t;
    t.header("big.jpg", int64_t{1} << 32);
    t.end();
    expect(error_of(t.bytes), {"'big.jpg'", "size 4294967296 runs past the end of the archive"});
    Tar u;
    u.header("nan.jpg", 0, '0', "12abc");
    u.end();
    expect(error_of(u.bytes), {"'nan.jpg'", "size field '12abc", "is not an octal number"});
    Tar v;
    v.pax("size", "9x");
    v.member("p.jpg", "P");
    v.end();
    expect(error_of(v.bytes), {"mem.tar", "pax size '9x' is not a number"});
  }
  {  // names that would escape a folder: refused, never used
    Tar t;
    t.member("../evil.jpg", "J");
    t.end();
    expect(error_of(t.bytes), {"'../evil.jpg'", "'..' in the member name"});
    Tar u;
    u.member("a/../../b.jpg", "J");
    u.end();
    expect(error_of(u.bytes), {"'a/../../b.jpg'", "'..'"});
    Tar v;
    v.member("/etc/x.jpg", "J");
    v.end();
    expect(error_of(v.bytes), {"'/etc/x.jpg'", "absolute member name"});
    Tar w;  // "..." is a name, not a parent
    w.member("a/...jpg", "J");
    w.end();
    EXPECT_EQ(error_of(w.bytes), "no error");
  }
  {  // duplicate keys, duplicate members, two images
    Tar t;
    good(t);
    t.member("b.jpg", "J");
    t.member("b.cls", "0");
    t.member("k.png", "P");
    t.end();
    expect(error_of(t.bytes), {"'k.png'", "duplicate key 'k'"});
    Tar u;
    u.member("k.jpg", "J");
    u.member("k.JPG", "J");
    u.end();
    expect(error_of(u.bytes), {"'k.JPG'", "duplicate member", "'.jpg'"});
    Tar v;
    v.member("k.jpg", "J");
    v.member("k.png", "P");
    v.member("k.cls", "0");
    v.end();
    expect(error_of(v.bytes), {"'k.png'", "a second image for the key 'k'"});
  }
  {  // labels: missing, without an image, not a number
    Tar t;
    good(t);
    t.member("n.jpg", "J");
    t.member("n.txt", "caption");
    t.end();
    expect(error_of(t.bytes), {"'n.jpg'", "no label", "'n.cls'"});
    Tar u;
    u.member("o.cls", "1");
    u.end();
    expect(error_of(u.bytes), {"'o.cls'", "a label without an image"});
    Tar v;
    v.member("q.jpg", "J");
    v.member("q.cls", "cat");
    v.end();
    expect(error_of(v.bytes), {"'q.cls'", "'cat' is not a class index"});
    Tar w;
    w.member("q.jpg", "J");
    w.member("q.cls", "-1");
    w.end();
    expect(error_of(w.bytes), {"'q.cls'", "'-1' is not a class index"});
    // A huge label (the class count is the largest + 1) is refused before anything is allocated
    // for it; the largest class index itself is accepted.
    Tar x;
    x.member("q.jpg", "J");
    x.member("q.cls", "1000000000");
    x.end();
    expect(error_of(x.bytes), {"'q.cls'", "label 1000000000 is above the largest class index, 16777215"});
    Tar y;
    y.member("q.jpg", "J");
    y.member("q.cls", "16777215");
    y.end();
    EXPECT_EQ(error_of(y.bytes), "no error");
  }
  {  // not a tar at all, a corrupted header, a sparse member
    expect(error_of(std::string(2048, 'z')), {"mem.tar", "checksum"});
    Tar t;
    t.header("c.jpg", 1, '0', "", "", /*fix_checksum=*/false);
    t.data("J");
    t.end();
    expect(error_of(t.bytes), {"'c.jpg'", "header checksum mismatch"});
    Tar u;
    u.member("s.jpg", "", 'S');
    u.end();
    expect(error_of(u.bytes), {"'s.jpg'", "sparse"});
  }
}

TEST(TarIndex, BraceRangesExpandAsBraceexpandDoes) {
  EXPECT_EQ(expand_braces("s/train-{000008..000011}.tar"),
            (std::vector<std::string>{"s/train-000008.tar", "s/train-000009.tar", "s/train-000010.tar",
                                      "s/train-000011.tar"}));
  EXPECT_EQ(expand_braces("{a,b}-{1..2}.tar"), (std::vector<std::string>{"a-1.tar", "a-2.tar", "b-1.tar", "b-2.tar"}));
  EXPECT_EQ(expand_braces("plain.tar"), std::vector<std::string>{"plain.tar"});
  EXPECT_THROW(expand_braces("x-{1..3.tar"), std::invalid_argument);
  EXPECT_THROW(expand_braces("x-{3..1}.tar"), std::invalid_argument);
  EXPECT_THROW(expand_braces("x-1}.tar"), std::invalid_argument);
}

TEST(TarShards, SameSamplesInTheSameOrderAsTheWebdatasetPackage) {
  const auto g = gpufeed::test::load_golden("shards.json");
  const auto ds = open_dataset(g["urls"].get<std::string>(), {.index_cache = "off"});
  const auto* shards = dynamic_cast<const TarShards*>(ds.get());
  ASSERT_NE(shards, nullptr);
  EXPECT_EQ(shards->shards().size(), 3u);
  ASSERT_EQ(ds->size(), static_cast<int64_t>(g["samples"].size()));
  EXPECT_EQ(ds->classes(), (std::vector<std::string>{"0", "1", "2"}));
  const fs::path folder = g["folder"].get<std::string>();
  for (int64_t i = 0; i < ds->size(); ++i) {
    const auto& want = g["samples"][static_cast<size_t>(i)];
    const SampleRef s = ds->at(i);
    const std::string key = want["key"].get<std::string>();
    EXPECT_EQ(s.member, key + ".jpg") << i;
    EXPECT_EQ(s.label, want["label"].get<int64_t>()) << i;
    EXPECT_EQ(s.size, want["bytes"].get<int64_t>()) << i;
    EXPECT_EQ(s.source(), std::string(s.path) + ":" + key + ".jpg");
    // One positioned read gives exactly the bytes webdataset handed out (the folder's file).
    EXPECT_EQ(read_bytes(s), file_bytes(folder / (key + ".jpg"))) << i;
  }
  // The same set named as a folder of .tar files and as a list file.
  const fs::path dir = fs::path(g["urls"].get<std::string>()).parent_path();
  const auto as_folder = open_dataset(dir, {.index_cache = "off"});
  ASSERT_EQ(as_folder->size(), ds->size());
  EXPECT_EQ(as_folder->at(26).member, ds->at(26).member);
  gpufeed::test::TempDir tmp("shard_list");
  std::ofstream(tmp.path / "shards.txt") << "# train\n" << (dir / "train-000002.tar").string() << "\n"
                                          << (dir / "train-000000.tar").string() << "\n";
  const auto listed = open_dataset(tmp.path / "shards.txt", {.index_cache = "off"});
  ASSERT_EQ(listed->size(), 17);
  EXPECT_EQ(listed->at(0).member, ds->at(20).member);
  EXPECT_EQ(listed->at(7).member, ds->at(0).member);
  EXPECT_THROW(open_dataset((dir / "train-{000000..000003}.tar").string(), {.index_cache = "off"}), std::runtime_error);
}

TEST(TarShards, LoaderBatchesEqualTheFoldersSkipsAndResumeIncluded) {
  const auto g = gpufeed::test::load_golden("shards.json");
  const auto shards = open_dataset(g["urls"].get<std::string>(), {.index_cache = "off"});
  ImageFolderOptions fo;
  fo.index_cache = "off";
  const auto folder = std::make_shared<ImageFolder>(g["folder"].get<std::string>(), fo);
  ASSERT_EQ(folder->size(), shards->size());
  LoaderOptions o;
  o.batch_size = 4;
  o.num_workers = 2;
  o.prefetch_depth = 2;
  o.seed = 5;
  o.error_policy = ErrorPolicy::kSkip;
  o.transform = TransformOptions::imagenet(TransformOptions::Kind::kTrain, 32);
  DistributedSamplerOptions so;
  so.num_replicas = 2;
  so.rank = 1;
  so.seed = 5;
  struct Seen {
    std::vector<std::vector<uint8_t>> images;
    std::vector<std::vector<int64_t>> labels, indices;
    std::vector<std::vector<std::pair<int64_t, int64_t>>> skips;  // (index, replaced_by)
    std::vector<std::string> skipped_sources;
  };
  const auto run = [&](std::shared_ptr<Dataset> ds, int64_t epoch, int64_t start_batch) {
    Loader loader(ds, std::make_shared<DistributedSampler>(ds->size(), so), o);
    loader.start_epoch(epoch, start_batch);
    Seen seen;
    while (auto b = loader.next()) {
      seen.images.emplace_back(b->images, b->images + b->image_bytes());
      seen.labels.emplace_back(b->labels, b->labels + b->size);
      seen.indices.push_back(b->indices);
      seen.skips.emplace_back();
      for (const SkippedSample& s : b->skipped) {
        seen.skips.back().emplace_back(s.index, s.replaced_by);
        seen.skipped_sources.push_back(s.path);
      }
    }
    return seen;
  };
  int64_t skipped = 0;
  for (const int64_t epoch : {0, 1}) {
    const Seen a = run(folder, epoch, 0), b = run(shards, epoch, 0);
    ASSERT_EQ(a.images.size(), 4u);  // ceil(ceil(27 / 2) / 4)
    EXPECT_EQ(a.images, b.images) << "epoch " << epoch;
    EXPECT_EQ(a.labels, b.labels);
    EXPECT_EQ(a.indices, b.indices);
    EXPECT_EQ(a.skips, b.skips);
    for (const std::string& s : b.skipped_sources) EXPECT_NE(s.find(".tar:bee/004.jpg"), std::string::npos) << s;
    skipped += static_cast<int64_t>(b.skipped_sources.size());
    // Resuming mid-epoch gives the tail of the same epoch.
    const Seen r = run(shards, epoch, 2);
    ASSERT_EQ(r.images.size(), 2u);
    EXPECT_EQ(r.images[0], a.images[2]);
    EXPECT_EQ(r.images[1], a.images[3]);
    EXPECT_EQ(r.indices[1], a.indices[3]);
  }
  EXPECT_GE(skipped, 1) << "the corrupt bee/004 falls in rank 1's share in one of the two epochs";
}

TEST(TarShards, MemberIndexIsCachedUntilAShardChanges) {
  const auto g = gpufeed::test::load_golden("shards.json");
  gpufeed::test::TempDir tmp("shard_cache");
  const fs::path dir = fs::path(g["urls"].get<std::string>()).parent_path();
  for (const char* s : {"train-000000.tar", "train-000001.tar"}) fs::copy_file(dir / s, tmp.path / s);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // past the racy window (dataset.h)
  const std::string pattern = (tmp.path / "train-{000000..000001}.tar").string();
  const DataOptions cache{.index_cache = (tmp.path / "cache").string()};
  const TarShards first(*shard_paths(pattern), pattern, cache);
  EXPECT_FALSE(first.from_cache());
  const TarShards second(*shard_paths(pattern), pattern, cache);
  EXPECT_TRUE(second.from_cache());
  ASSERT_EQ(second.size(), 20);
  for (int64_t i = 0; i < 20; ++i) {
    EXPECT_EQ(second.at(i).member, first.at(i).member);
    EXPECT_EQ(second.at(i).offset, first.at(i).offset);
    EXPECT_EQ(second.at(i).label, first.at(i).label);
    EXPECT_EQ(read_bytes(second.at(i)), read_bytes(first.at(i)));
  }
  // A shard replaced by another archive: indexed again, never read through the old offsets.
  Tar t;
  t.member("only.jpg", "J");
  t.member("only.cls", "2");
  t.end();
  std::ofstream(tmp.path / "train-000001.tar", std::ios::binary | std::ios::trunc) << t.bytes;
  const TarShards third(*shard_paths(pattern), pattern, cache);
  EXPECT_FALSE(third.from_cache());
  ASSERT_EQ(third.size(), 11);
  EXPECT_EQ(third.at(10).member, "only.jpg");
  // A shard cut short after indexing: the read fails naming the shard and the member.
  const SampleRef last = first.at(9);
  fs::resize_file(tmp.path / "train-000000.tar", static_cast<uintmax_t>(last.offset + 10));
  try {
    read_bytes(last);
    FAIL() << "expected an error";
  } catch (const gpufeed::decode::DecodeError& e) {
    EXPECT_EQ(e.source(), last.source());
    EXPECT_NE(std::string(e.what()).find("cut short"), std::string::npos) << e.what();
  }
}

// A key group without an image is refused at open, never dropped: webdataset.TarWriter wrote each
// shard and webdataset.WebDataset yields the group as a sample (goldens/gen_shards.py), so the
// error names the shard, the member and why; for a dot in the key it explains the first-dot rule.
TEST(TarShards, AKeyWithoutAnImageIsAnErrorNamingTheShardTheMemberAndWhy) {
  const auto g = gpufeed::test::load_golden("shards.json")["keyless"];
  const auto extensions_of = [&](const char* shard, const std::string& key) {
    for (const auto& s : g[shard]["samples"])
      if (s["key"] == key) return s["extensions"].get<std::vector<std::string>>();
    return std::vector<std::string>{"(webdataset yields no key '" + key + "')"};
  };
  // What webdataset makes of each group (the facts the messages state).
  EXPECT_EQ(g["multidot"]["samples"].size(), 3u);
  EXPECT_EQ(extensions_of("multidot", "22"), (std::vector<std::string>{"05.cls", "05.png"}));
  EXPECT_EQ(extensions_of("clsonly", "b"), std::vector<std::string>{"cls"});
  EXPECT_EQ(extensions_of("jsononly", "c"), std::vector<std::string>{"json"});

  gpufeed::test::TempDir tmp("keyless");
  const DataOptions cache{.index_cache = (tmp.path / "cache").string()};
  const auto error_opening = [&](const char* shard) {
    try {
      open_dataset(g[shard]["path"].get<std::string>(), cache);
      return std::string("no error");
    } catch (const ShardError& e) {
      return std::string(e.what());
    }
  };
  const auto expect = [](const std::string& what, const std::vector<std::string>& parts) {
    for (const std::string& p : parts) EXPECT_NE(what.find(p), std::string::npos) << "'" << p << "' not in: " << what;
  };
  const std::string multidot = error_opening("multidot");
  expect(multidot, {"shard " + g["multidot"]["path"].get<std::string>() + ": member '22.05.png': ",
                    "key '22' has members with the extensions '05.cls', '05.png' but no image extension",
                    "webdataset splits a name at the first '.' of its last path component, so '22.05.png' is key "
                    "'22' with extension '05.png'",
                    "rename the members without dots in the key (e.g. '22_05.png')"});
  expect(error_opening("clsonly"), {"shard " + g["clsonly"]["path"].get<std::string>() + ": member 'b.cls': ",
                                    "a label without an image member beside it (key 'b' has the extensions 'cls'"});
  expect(error_opening("jsononly"),
         {"shard " + g["jsononly"]["path"].get<std::string>() + ": member 'c.json': ",
          "key 'c' has members with the extensions 'json' but no image (key.jpg|jpeg|png|webp|ppm|pgm|bmp|tif|tiff|gif)",
          "webdataset would yield it as a sample without an image"});
  // No listing of a refused shard is cached, so the next open refuses it again.
  EXPECT_EQ(error_opening("multidot"), multidot);
  EXPECT_TRUE(!fs::exists(tmp.path / "cache") || fs::is_empty(tmp.path / "cache"));

  // The key is the name up to the first '.' of the last path component only: dots in folder
  // names are part of the key, dots in the file name are not.
  Tar t;
  t.member("x.y/3.jpg", "J");
  t.member("x.y/3.cls", "0");
  t.member("x.y/1.2.jpg", "J");
  t.member("x.y/1.2.cls", "1");
  t.end();
  expect(error_of(t.bytes), {"member 'x.y/1.2.jpg'", "key 'x.y/1' has members with the extensions '2.jpg', '2.cls'",
                             "so 'x.y/1.2.jpg' is key 'x.y/1' with extension '2.jpg'", "(e.g. 'x.y/1_2.jpg')"});
}

// A listing cached by an earlier cache format (whose grouping dropped keys without an image) is
// never read: the format's version is part of the file, and a cache of another version is listed
// again (then refused, for a bad shard).
TEST(TarShards, ACacheOfAnotherFormatVersionIsListedAgain) {
  gpufeed::test::TempDir tmp("cache_version");
  Tar t;
  t.member("k.jpg", "J");
  t.member("k.cls", "4");
  t.end();
  std::ofstream(tmp.path / "one.tar", std::ios::binary) << t.bytes;
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // past the racy window (dataset.h)
  const std::string shard = (tmp.path / "one.tar").string();
  const DataOptions cache{.index_cache = (tmp.path / "cache").string()};
  EXPECT_FALSE(TarShards({shard}, shard, cache).from_cache());
  EXPECT_TRUE(TarShards({shard}, shard, cache).from_cache());
  std::vector<fs::path> files = gpufeed::test::list_files_of(tmp.path / "cache");
  ASSERT_EQ(files.size(), 1u);
  std::string bytes;
  {
    std::ifstream in(files[0], std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_GT(bytes.size(), 16u);
  ASSERT_EQ(bytes.substr(8, 7), "GPUFIDX");  // after the magic section's length
  bytes[15] = 1;                             // the version byte: the format before this one
  std::ofstream(files[0], std::ios::binary | std::ios::trunc) << bytes;
  const TarShards again({shard}, shard, cache);
  EXPECT_FALSE(again.from_cache());
  EXPECT_EQ(again.at(0).label, 4);
}
