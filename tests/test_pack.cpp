// `gpufeed pack` (gpufeed/pack/pack.h): a generated ImageFolder packed into WebDataset shards
// and read back by TarShards (labels, order, copied bytes, resized sizes and pixels) and by the
// webdataset package; the bytes for any worker count; the skip policy; manifest.json; refusal to
// overwrite; the tar writer's ustar fields; the options' schema.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "gpufeed/decode/decoder.h"
#include "gpufeed/datasets/dataset.h"
#include "gpufeed/loader/loader.h"
#include "gpufeed/pack/pack.h"
#include "gpufeed/sampler/randperm.h"
#include "gpufeed/transforms/resize.h"
#include "gpufeed/datasets/shards.h"
#include "gpufeed/version.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace gpufeed;
using namespace gpufeed::loader;
using namespace gpufeed::datasets;
using namespace gpufeed::transforms;
using namespace gpufeed::pack;
using gpufeed::test::TempDir;

namespace {

using Bytes = std::vector<uint8_t>;

Bytes file_bytes(const fs::path& p) {
  Bytes b;
  decode::read_file(p, b);
  return b;
}

void write_bytes(const fs::path& p, const Bytes& b) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// Sizes 40..160 px around a max side of 100: some images are resized, some copied; plus a small
// and a large PNG (copied as .png / re-encoded as .jpg).
fs::path make_folder(const fs::path& root) {
  write_synthetic_image_folder(root, {.num_classes = 3, .images_per_class = 7, .min_size = 40, .max_size = 160});
  const auto png = [](int w, int h) {
    std::vector<uint8_t> rgb(static_cast<size_t>(w) * h * 3);
    for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>((i * 7 + i / 97) & 0xff);
    return decode::encode_png(rgb.data(), w, h);
  };
  write_bytes(root / "class_000" / "zz_small.png", png(60, 30));
  write_bytes(root / "class_001" / "zz_big.PNG", png(90, 150));
  return root;
}

// make_folder plus two bad files: class_001/zz_truncated.jpg (half a JPEG) and
// class_002/zz_empty.jpg (0 bytes): 25 samples.
fs::path make_broken_folder(const fs::path& root) {
  make_folder(root);
  const Bytes good = file_bytes(root / "class_000" / "img_00001.jpg");
  write_bytes(root / "class_001" / "zz_truncated.jpg", Bytes(good.begin(), good.begin() + static_cast<long>(good.size() / 2)));
  write_bytes(root / "class_002" / "zz_empty.jpg", Bytes{});
  return root;
}

std::vector<std::string> shard_files(const fs::path& out, const PackResult& r) {
  std::vector<std::string> v;
  for (const PackedShard& s : r.shards) v.push_back((out / s.file).string());
  return v;
}

std::vector<TarMember> members_of(const fs::path& shard) {
  const Bytes b = file_bytes(shard);
  const ReadAt read = [&b](int64_t offset, void* buf, size_t n) -> size_t {
    if (offset < 0 || static_cast<size_t>(offset) >= b.size()) return 0;
    const size_t k = std::min(n, b.size() - static_cast<size_t>(offset));
    std::memcpy(buf, b.data() + offset, k);
    return k;
  };
  return index_tar(read, static_cast<int64_t>(b.size()), shard.string());
}

PackOptions small_shards() {
  PackOptions o;
  o.shard_size = 30000;
  o.max_side = 100;
  o.num_workers = 2;
  o.chunk_samples = 5;  // several chunks
  return o;
}

}  // namespace

TEST(PackKey, RelativePathMadeSafe) {
  EXPECT_EQ(pack_key(12, 900, "data/x/n014/sub/a.b.JPEG", "", "data/x"), "000012_n014_sub_a_b");
  EXPECT_EQ(pack_key(12, 900, "data/x/n014/sub/a.b.JPEG", "", "data/x/"), "000012_n014_sub_a_b");
  EXPECT_EQ(pack_key(12, 900, "data/x//n014/a.jpg", "", "data/x"), "000012_n014_a");
  // Outside the base: the file name; seven digits for 10 million samples.
  EXPECT_EQ(pack_key(3, 10'000'000, "/elsewhere/../caf\xe9 1.jpg", "", "data/x"), "0000003_caf__1");
  EXPECT_EQ(pack_key(0, 1, "./a/.hidden", "", ""), "000000_a__hidden");
  EXPECT_EQ(pack_key(5, 10, "s.tar", "train/n014_10026.JPEG", "s"), "000005_train_n014_10026");
  const std::string long_key = pack_key(1, 10, "d/" + std::string(300, 'x') + ".jpg", "", "d");
  EXPECT_EQ(long_key.size(), 95u);
  EXPECT_EQ(long_key.substr(0, 8), "000001_x");
}

TEST(TarWriter, UstarFieldsAndLongNames) {
  TempDir dir("pack_tar");
  const fs::path p = dir.path / "t.tar";
  const std::string long_name = std::string(120, 'd') + "/" + std::string(90, 'n') + ".jpg";
  {
    TarWriter w(p);
    w.add("a.cls", Bytes{'7'});
    w.add(long_name, Bytes(1000, 0x5a));
    EXPECT_THROW(w.add(std::string(101, 'x'), Bytes{}), std::invalid_argument);  // no '/' to split at
    w.close();
    EXPECT_EQ(w.bytes(), 512 + 512 + 512 + 1024 + TarWriter::kEndBytes);
  }
  const Bytes b = file_bytes(p);
  ASSERT_EQ(b.size(), 3584u + 512);  // + the trailer
  const std::string h(b.begin(), b.begin() + 512);
  EXPECT_EQ(h.substr(0, 6), std::string("a.cls\0", 6));
  EXPECT_EQ(h.substr(100, 8), std::string("0000644\0", 8));
  EXPECT_EQ(h.substr(108, 16), std::string("0000000\0" "0000000\0", 16));
  EXPECT_EQ(h.substr(124, 12), std::string("00000000001\0", 12));
  EXPECT_EQ(h.substr(136, 12), std::string("00000000000\0", 12));
  EXPECT_EQ(h[156], '0');
  EXPECT_EQ(h.substr(257, 8), std::string("ustar\0" "00", 8));
  EXPECT_EQ(h.substr(265, 64), std::string(64, '\0'));  // uname, gname empty
  const auto members = members_of(p);
  ASSERT_EQ(members.size(), 2u);
  EXPECT_EQ(members[0].name, "a.cls");
  EXPECT_EQ(members[1].name, long_name);
  EXPECT_EQ(members[1].size, 1000);
  EXPECT_EQ(members[1].offset, 1536);
}

// Test 1: read back by TarShards.
TEST(Pack, ImageFolderRoundTripThroughTarShards) {
  TempDir dir("pack_roundtrip");
  const fs::path src = make_folder(dir.path / "src");
  const ImageFolder folder(src, {.index_cache = "off"});
  const PackOptions o = small_shards();
  const PackResult r = pack_dataset(folder, src, dir.path / "out", o);
  ASSERT_GE(r.shards.size(), 3u);
  EXPECT_EQ(r.samples, folder.size());
  EXPECT_EQ(r.reencoded + r.copied, folder.size());
  EXPECT_TRUE(r.skipped.empty());
  for (const PackedShard& s : r.shards) {
    EXPECT_EQ(static_cast<int64_t>(fs::file_size(dir.path / "out" / s.file)), s.bytes);
    if (s.samples > 1) {
      EXPECT_LE(s.bytes, o.shard_size) << s.file;
    }
  }
  EXPECT_FALSE(fs::exists(dir.path / "out" / (r.shards[0].file + ".tmp")));

  // Members: KEY.ext then KEY.cls, adjacent; keys by the documented rule.
  const auto first = members_of(dir.path / "out" / r.shards[0].file);
  ASSERT_GE(first.size(), 2u);
  EXPECT_EQ(first[0].name, "000000_class_000_img_00000.jpg");
  EXPECT_EQ(first[1].name, "000000_class_000_img_00000.cls");
  std::map<std::string, std::string> ext_of;  // key -> image extension, over every shard
  for (const PackedShard& s : r.shards) {
    for (const TarMember& m : members_of(dir.path / "out" / s.file)) {
      const size_t dot = m.name.find('.');
      if (m.name.substr(dot + 1) != "cls") ext_of[m.name.substr(0, dot)] = m.name.substr(dot + 1);
    }
  }
  ASSERT_EQ(static_cast<int64_t>(ext_of.size()), folder.size());

  const TarShards shards(shard_files(dir.path / "out", r), dir.path / "out", {.index_cache = "off"});
  ASSERT_EQ(shards.size(), folder.size());
  decode::Decoder decoder;
  Resizer resizer;
  int64_t copied = 0, resized = 0, png_copied = 0, png_resized = 0;
  double worst_jpeg = 0, worst_png = 0;
  for (int64_t i = 0; i < folder.size(); ++i) {
    const SampleRef a = folder.at(i), b = shards.at(i);
    ASSERT_EQ(a.label, b.label) << i;
    const std::string key = pack_key(i, folder.size(), a.path, "", src);
    Bytes src_bytes, packed;
    read_sample(a, src_bytes);
    read_sample(b, packed);
    const decode::ImageInfo info = decode::probe(src_bytes, a.path);
    const bool is_png = info.format == decode::ImageFormat::kPng;
    if (std::max(info.width, info.height) <= o.max_side) {
      EXPECT_EQ(src_bytes, packed) << a.path;  // copied byte for byte
      EXPECT_EQ(ext_of[key], is_png ? "png" : "jpg") << key;
      ++copied;
      png_copied += is_png;
      continue;
    }
    ++resized;
    png_resized += is_png;
    EXPECT_EQ(ext_of[key], "jpg") << key;
    decode::ImageBuffer out, whole;
    decoder.decode(packed, b.source(), {}, out);
    const int longer = std::max(info.width, info.height), shorter = std::min(info.width, info.height);
    const int want_short = static_cast<int>(std::lround(static_cast<double>(shorter) * o.max_side / longer));
    EXPECT_EQ(std::max(out.width, out.height), o.max_side) << a.path;
    EXPECT_EQ(std::min(out.width, out.height), want_short) << a.path;
    EXPECT_EQ(out.width >= out.height, info.width >= info.height) << a.path;  // orientation kept
    // Pixels: the source decoded whole and resized by the loader's Resizer, against the packed
    // JPEG decoded: only the re-encode (quality 90, 4:2:0) separates them.
    decoder.decode(src_bytes, a.path, {}, whole);
    std::vector<uint8_t> ref(static_cast<size_t>(out.width) * out.height * 3);
    resizer.resize(whole.pixels.data(), whole.width, whole.height, static_cast<size_t>(whole.width) * 3,
                   BoxF{0, 0, static_cast<double>(whole.width), static_cast<double>(whole.height)}, ref.data(),
                   out.width, out.height, static_cast<size_t>(out.width) * 3);
    double diff = 0;
    for (size_t k = 0; k < ref.size(); ++k) diff += std::abs(int{ref[k]} - int{out.pixels[k]});
    const double mean = diff / static_cast<double>(ref.size());
    (is_png ? worst_png : worst_jpeg) = std::max(is_png ? worst_png : worst_jpeg, mean);
    // Synthetic images carry sigma-12 noise that 4:2:0 at quality 90 partly smooths; the PNG
    // pattern is high-frequency. A wrong region, size or orientation gives tens of levels.
    EXPECT_LT(mean, is_png ? 12.0 : 6.0) << a.path;
  }
  std::printf("copied %lld, resized %lld; worst mean |diff| of a resized image: JPEG %.2f, PNG %.2f levels\n",
              static_cast<long long>(copied), static_cast<long long>(resized), worst_jpeg, worst_png);
  EXPECT_EQ(copied, r.copied);
  EXPECT_EQ(resized, r.reencoded);
  EXPECT_GE(copied, 3);
  EXPECT_GE(resized, 3);
  EXPECT_EQ(png_copied, 1);
  EXPECT_EQ(png_resized, 1);
}

// Test 2: the bytes do not depend on the worker count (nor on the chunking).
TEST(Pack, TheIndexBesideEachShardIsItsTarHeaders) {
  TempDir dir("pack_index");
  const fs::path src = make_folder(dir.path / "src");
  const ImageFolder folder(src, {.index_cache = "off"});
  PackOptions o = small_shards();
  o.raw_budget_fraction = 0.25;  // some KEY.ppm members too
  const PackResult r = pack_dataset(folder, src, dir.path / "out", o);
  ASSERT_GE(r.shards.size(), 3u);
  int64_t samples = 0;
  for (const std::string& shard : shard_files(dir.path / "out", r)) {
    const Bytes b = file_bytes(shard);
    const Bytes text = file_bytes(shard + kShardIndexSuffix);
    const ShardIndex index = parse_shard_index(std::string(text.begin(), text.end()), shard);
    EXPECT_EQ(index.shard_size, static_cast<int64_t>(b.size()));
    EXPECT_EQ(index.etag, "");
    // The index and the shard's trailer record the same SHA-256, that of the tar before the
    // trailer (what sha256sum computes), which the manifest lists too.
    const auto trailer = parse_shard_trailer(std::string_view(reinterpret_cast<const char*>(b.data()), b.size()),
                                             static_cast<int64_t>(b.size()));
    ASSERT_TRUE(trailer) << shard;
    EXPECT_EQ(trailer->tar_bytes, static_cast<int64_t>(b.size()) - kShardTrailerBytes);
    EXPECT_EQ(trailer->sha256, index.sha256);
    const test::Output sum = test::run_captured(
        "head -c " + std::to_string(trailer->tar_bytes) + " " + test::shell_quote(shard) + " | sha256sum", dir.path);
    EXPECT_EQ(sum.out.substr(0, 64), index.sha256);
    const auto packed = std::find_if(r.shards.begin(), r.shards.end(),
                                     [&](const PackedShard& p) { return shard.ends_with("/" + p.file); });
    ASSERT_NE(packed, r.shards.end());
    EXPECT_EQ(packed->sha256, index.sha256);
    // GNU tar stops at the end-of-archive blocks: the trailer is neither a member nor an error.
    const test::Output listed = test::run_captured("tar -tf " + test::shell_quote(shard), dir.path);
    EXPECT_EQ(listed.code, 0) << listed.err;
    EXPECT_EQ(listed.err, "");
    std::string expected;
    for (const ShardSample& x : index.samples) {
      expected += x.member + "\n";
      expected += x.member.substr(0, x.member.rfind('.')) + ".cls\n";
    }
    EXPECT_EQ(listed.out, expected);
    const ReadAt read = [&b](int64_t offset, void* buf, size_t n) -> size_t {
      if (offset < 0 || static_cast<size_t>(offset) >= b.size()) return 0;
      const size_t k = std::min(n, b.size() - static_cast<size_t>(offset));
      std::memcpy(buf, b.data() + offset, k);
      return k;
    };
    const std::vector<ShardSample> headers = index_shard(read, static_cast<int64_t>(b.size()), shard);
    ASSERT_EQ(index.samples.size(), headers.size());
    for (size_t i = 0; i < headers.size(); ++i) {
      EXPECT_EQ(index.samples[i].member, headers[i].member);
      EXPECT_EQ(index.samples[i].offset, headers[i].offset);
      EXPECT_EQ(index.samples[i].size, headers[i].size);
      EXPECT_EQ(index.samples[i].label, headers[i].label);
    }
    samples += static_cast<int64_t>(headers.size());
  }
  EXPECT_EQ(samples, folder.size());
  // Packing again over it (overwrite) into fewer shards leaves no index of a shard that is gone.
  o.shard_size = int64_t{1} << 30;
  o.overwrite = true;
  const PackResult again = pack_dataset(folder, src, dir.path / "out", o);
  ASSERT_EQ(again.shards.size(), 1u);
  std::set<std::string> indexes;
  for (const auto& e : fs::directory_iterator(dir.path / "out"))
    if (e.path().string().ends_with(kShardIndexSuffix)) indexes.insert(e.path().filename().string());
  EXPECT_EQ(indexes, (std::set<std::string>{"train-000000.tar.gpufeed-idx"}));
}

TEST(Pack, SameBytesForAnyWorkerCount) {
  TempDir dir("pack_workers");
  const fs::path src = make_folder(dir.path / "src");
  const ImageFolder folder(src, {.index_cache = "off"});
  PackOptions o = small_shards();
  o.num_workers = 1;
  o.chunk_samples = 256;
  const PackResult one = pack_dataset(folder, src, dir.path / "w1", o);
  o.num_workers = 4;
  o.chunk_samples = 3;
  const PackResult four = pack_dataset(folder, src, dir.path / "w4", o);
  ASSERT_EQ(one.shards.size(), four.shards.size());
  ASSERT_GE(one.shards.size(), 3u);
  for (const PackedShard& s : one.shards)
    EXPECT_EQ(file_bytes(dir.path / "w1" / s.file), file_bytes(dir.path / "w4" / s.file)) << s.file;
  EXPECT_EQ(gpufeed::test::read_text(dir.path / "w1" / "manifest.json"),
            gpufeed::test::read_text(dir.path / "w4" / "manifest.json"));
}

TEST(Pack, WhatTheRawBudgetsFirstPassKeepsChangesNoByte) {
  // plan_keep_bytes: everything kept (the default), nothing kept (the main pass decodes, resizes
  // and encodes again), and room for a few JPEGs and PPMs only (some samples from either side).
  TempDir dir("pack_keep");
  const fs::path src = make_folder(dir.path / "src");
  const ImageFolder folder(src, {.index_cache = "off"});
  for (const bool reencode : {false, true}) {
    PackOptions o = small_shards();
    o.reencode = reencode;
    o.raw_budget_fraction = 0.5;
    std::vector<PackResult> results;
    std::vector<fs::path> outs;
    for (const int64_t keep : {o.plan_keep_bytes, int64_t{0}, int64_t{60000}}) {
      o.plan_keep_bytes = keep;
      outs.push_back(dir.path / ("out_" + std::to_string(reencode) + "_" + std::to_string(keep)));
      results.push_back(pack_dataset(folder, src, outs.back(), o));
    }
    ASSERT_GT(results[0].raw, 0);
    ASSERT_GT(results[0].reencoded, 0);
    for (size_t k = 1; k < results.size(); ++k) {
      ASSERT_EQ(results[k].shards.size(), results[0].shards.size());
      EXPECT_EQ(results[k].raw, results[0].raw);
      for (const PackedShard& s : results[0].shards)
        EXPECT_EQ(file_bytes(outs[k] / s.file), file_bytes(outs[0] / s.file)) << s.file << " keep " << k;
      EXPECT_EQ(gpufeed::test::read_text(outs[k] / "manifest.json"), gpufeed::test::read_text(outs[0] / "manifest.json"));
    }
  }
  PackOptions bad = small_shards();
  bad.plan_keep_bytes = -1;
  EXPECT_THROW(pack_dataset(folder, src, dir.path / "bad", bad), std::invalid_argument);
  bad = small_shards();
  bad.num_workers = kMaxNumWorkers + 1;
  EXPECT_THROW(pack_dataset(folder, src, dir.path / "bad", bad), std::invalid_argument);
}

TEST(Pack, AnEarlierKilledPacksUnfinishedShardOfThePrefixIsRemoved) {
  TempDir dir("pack_tmp");
  const fs::path src = make_folder(dir.path / "src"), out = dir.path / "out";
  fs::create_directories(out);
  write_bytes(out / "train-000007.tar.tmp", Bytes(100, 1));  // what a SIGKILLed pack leaves
  write_bytes(out / "notes.tmp", Bytes(3, 1));               // not ours: kept
  const ImageFolder folder(src, {.index_cache = "off"});
  pack_dataset(folder, src, out, small_shards());
  EXPECT_FALSE(fs::exists(out / "train-000007.tar.tmp"));
  EXPECT_TRUE(fs::exists(out / "notes.tmp"));
}

// Test 3: the webdataset package reads the shards: same keys, labels and bytes, in order.
TEST(Pack, WebdatasetPackageReadsTheShards) {
  const fs::path python = GPUFEED_PYTHON;
  if (!fs::exists(python)) GTEST_SKIP() << "no Python at " << python;
  TempDir dir("pack_wds");
  const fs::path src = make_folder(dir.path / "src");
  const ImageFolder folder(src, {.index_cache = "off"});
  const PackResult r = pack_dataset(folder, src, dir.path / "out", small_shards());
  ASSERT_GE(r.shards.size(), 3u);
  std::ofstream(dir.path / "read.py") << "import sys, webdataset as wds\n"
                                         "with open(sys.argv[2], 'w') as out:\n"
                                         "    for s in wds.WebDataset(sys.argv[1], shardshuffle=False, empty_check=False):\n"
                                         "        img = [k for k in s if not k.startswith('__') and k != 'cls']\n"
                                         "        assert len(img) == 1, sorted(s)\n"
                                         "        data = s[img[0]]\n"
                                         "        out.write('%s %s %d %d %d\\n' % (s['__key__'], img[0], int(s['cls']), len(data), sum(data)))\n";
  const std::string cmd = "'" + python.string() + "' '" + (dir.path / "read.py").string() + "' '" +
                          (dir.path / "out" / r.pattern).string() + "' '" + (dir.path / "got.txt").string() + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream got(dir.path / "got.txt");
  const TarShards shards(shard_files(dir.path / "out", r), dir.path / "out", {.index_cache = "off"});
  int64_t i = 0;
  std::string key, ext;
  int64_t label = 0, size = 0, sum = 0;
  while (got >> key >> ext >> label >> size >> sum) {
    ASSERT_LT(i, folder.size());
    EXPECT_EQ(key, pack_key(i, folder.size(), folder.at(i).path, "", src));
    EXPECT_EQ(label, folder.at(i).label) << key;
    Bytes packed;
    read_sample(shards.at(i), packed);
    EXPECT_EQ(size, static_cast<int64_t>(packed.size())) << key;
    int64_t s = 0;
    for (const uint8_t v : packed) s += v;
    EXPECT_EQ(sum, s) << key;
    ++i;
  }
  EXPECT_EQ(i, folder.size());
}

// Test 4: broken files under raise and skip.
TEST(Pack, BrokenFilesRaiseOrAreSkippedAndCounted) {
  TempDir dir("pack_broken");
  const fs::path src = make_broken_folder(dir.path / "src");
  const ImageFolder folder(src, {.index_cache = "off"});
  PackOptions o = small_shards();
  try {
    pack_dataset(folder, src, dir.path / "raise", o);
    FAIL() << "no error";
  } catch (const decode::DecodeError& e) {
    EXPECT_NE(std::string(e.what()).find("class_001/zz_truncated.jpg"), std::string::npos) << e.what();
    EXPECT_EQ(e.kind(), decode::ErrorKind::kTruncated) << e.what();
  }
  // Nothing of the failed run stays: no shard, no temporary, no manifest.
  EXPECT_TRUE(fs::is_empty(dir.path / "raise"));

  o.error_policy = ErrorPolicy::kSkip;
  const PackResult r = pack_dataset(folder, src, dir.path / "skip", o);
  EXPECT_EQ(r.samples, folder.size() - 2);
  ASSERT_EQ(r.skipped.size(), 2u);
  EXPECT_EQ(r.skipped[0].kind, "truncated");
  EXPECT_NE(r.skipped[0].path.find("zz_truncated.jpg"), std::string::npos);
  EXPECT_EQ(r.skipped[1].kind, "empty");
  EXPECT_NE(r.skipped[1].path.find("zz_empty.jpg"), std::string::npos);
  EXPECT_EQ(r.skipped_by_kind, (std::map<std::string, int64_t>{{"empty", 1}, {"truncated", 1}}));
  EXPECT_NE(r.summary().find("2 skipped (empty 1, truncated 1)"), std::string::npos) << r.summary();
  const auto m = nlohmann::json::parse(gpufeed::test::read_text(dir.path / "skip" / "manifest.json"));
  EXPECT_EQ(m["totals"]["skipped"], 2);
  ASSERT_EQ(m["skipped"].size(), 2u);
  EXPECT_EQ(m["skipped"][0]["path"], r.skipped[0].path);
  EXPECT_EQ(m["skipped"][0]["kind"], "truncated");
  EXPECT_EQ(m["skipped"][1]["index"], r.skipped[1].index);
  EXPECT_EQ(m["skipped_by_kind"]["empty"], 1);
  // The rest is packed: every other sample, in order, with its label.
  const TarShards shards(shard_files(dir.path / "skip", r), dir.path / "skip", {.index_cache = "off"});
  ASSERT_EQ(shards.size(), r.samples);
  int64_t j = 0;
  for (int64_t i = 0; i < folder.size(); ++i) {
    if (i == r.skipped[0].index || i == r.skipped[1].index) continue;
    EXPECT_EQ(shards.at(j).label, folder.at(i).label);
    EXPECT_NE(std::string(shards.at(j).member).find(pack_key(i, folder.size(), folder.at(i).path, "", src)),
              std::string::npos);
    ++j;
  }
  // A flood of bad files is an error.
  o.max_skips = 1;
  try {
    pack_dataset(folder, src, dir.path / "limit", o);
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("more than 1 files skipped"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("zz_empty.jpg"), std::string::npos) << e.what();
  }
}

// `shuffle`: the samples in torch.randperm(N, seed)'s order, each copied whole with its label;
// keys number the pack positions; a skipped file is reported by its dataset index; the manifest
// records the order.
TEST(Pack, ShuffleWritesTheSamplesInTorchRandpermOrder) {
  TempDir dir("pack_shuffle");
  const fs::path src = make_broken_folder(dir.path / "src");
  const ImageFolder folder(src, {.index_cache = "off"});
  ASSERT_EQ(folder.size(), 25);
  PackOptions o = small_shards();
  o.max_side = 0;  // every image copied byte for byte
  o.shuffle = true;
  o.seed = 7;
  o.error_policy = ErrorPolicy::kSkip;
  const PackResult r = pack_dataset(folder, src, dir.path / "out", o);
  // torch.randperm(25, generator=torch.Generator().manual_seed(7)).tolist()
  const std::vector<int64_t> order{15, 5, 19, 23, 1, 12, 0, 4, 6, 18, 3, 24, 17, 22, 9, 8, 16, 7, 20, 2, 21, 14, 11, 13, 10};
  ASSERT_EQ(sampler::randperm(25, 7), order);
  ASSERT_EQ(r.samples, 23);
  const TarShards shards(shard_files(dir.path / "out", r), dir.path / "out", {.index_cache = "off"});
  ASSERT_EQ(shards.size(), 23);
  std::vector<int64_t> broken, labels;
  int64_t j = 0;
  for (int64_t pos = 0; pos < 25; ++pos) {
    const int64_t i = order[static_cast<size_t>(pos)];
    const SampleRef a = folder.at(i);
    if (std::string(a.path).find("/zz_truncated") != std::string::npos || std::string(a.path).find("/zz_empty") != std::string::npos) {
      broken.push_back(i);
      continue;
    }
    const SampleRef b = shards.at(j++);
    EXPECT_EQ(b.label, a.label) << pos;
    labels.push_back(b.label);
    EXPECT_NE(std::string(b.member).find(pack_key(pos, 25, a.path, "", src)), std::string::npos) << b.member;
    Bytes want, got;
    read_sample(a, want);
    read_sample(b, got);
    EXPECT_EQ(got, want) << a.path;
  }
  ASSERT_EQ(r.skipped.size(), 2u);
  EXPECT_EQ((std::vector<int64_t>{r.skipped[0].index, r.skipped[1].index}), broken);
  EXPECT_FALSE(std::is_sorted(labels.begin(), labels.end()));
  const auto m = nlohmann::json::parse(gpufeed::test::read_text(dir.path / "out" / "manifest.json"));
  EXPECT_EQ(m["options"]["shuffle"], true);
  EXPECT_EQ(m["options"]["seed"], 7);
  EXPECT_EQ(m["skipped"][0]["index"], broken[0]);
}

// Test 5: manifest.json.
TEST(Pack, ManifestRecordsShardsTotalsAndOptions) {
  TempDir dir("pack_manifest");
  const fs::path src = make_folder(dir.path / "src");
  const ImageFolder folder(src, {.index_cache = "off"});
  PackOptions o = small_shards();
  o.prefix = "val";
  o.quality = 85;
  o.max_samples_per_shard = 4;
  const PackResult r = pack_dataset(folder, src, dir.path / "out", o);
  const auto m = nlohmann::json::parse(gpufeed::test::read_text(dir.path / "out" / "manifest.json"));
  EXPECT_EQ(m["format"], "webdataset");
  EXPECT_EQ(m["gpufeed_version"], GPUFEED_VERSION_STRING);
  EXPECT_EQ(m["classes"].get<std::vector<std::string>>(), folder.classes());
  EXPECT_EQ(m["options"]["prefix"], "val");
  EXPECT_EQ(m["options"]["shard_size"], 30000);
  EXPECT_EQ(m["options"]["max_side"], 100);
  EXPECT_EQ(m["options"]["quality"], 85);
  EXPECT_EQ(m["options"]["max_samples_per_shard"], 4);
  EXPECT_EQ(m["options"]["on_error"], "raise");
  int64_t samples = 0, bytes = 0;
  std::vector<std::string> files;
  for (const auto& s : m["shards"]) {
    const std::string file = s["file"];
    files.push_back((dir.path / "out" / file).string());
    EXPECT_LE(s["samples"].get<int64_t>(), 4) << file;
    EXPECT_EQ(s["bytes"].get<int64_t>(), static_cast<int64_t>(fs::file_size(dir.path / "out" / file))) << file;
    samples += s["samples"].get<int64_t>();
    bytes += s["bytes"].get<int64_t>();
  }
  EXPECT_EQ(samples, folder.size());
  EXPECT_EQ(m["totals"]["samples"], samples);
  EXPECT_EQ(m["totals"]["bytes"], bytes);
  EXPECT_EQ(m["totals"]["shards"], m["shards"].size());
  EXPECT_EQ(m["totals"]["reencoded"].get<int64_t>() + m["totals"]["copied"].get<int64_t>(), samples);
  EXPECT_EQ(m["totals"]["reencoded"], r.reencoded);
  int64_t bytes_in = 0;
  for (int64_t i = 0; i < folder.size(); ++i) bytes_in += static_cast<int64_t>(fs::file_size(folder.at(i).path));
  EXPECT_EQ(m["totals"]["bytes_in"], bytes_in);
  EXPECT_EQ(files.front(), (dir.path / "out" / "val-000000.tar").string());
  // The pattern expands to exactly the shards (what --data takes).
  EXPECT_EQ(expand_braces((dir.path / "out").string() + "/" + m["pattern"].get<std::string>()), files);
  EXPECT_GE(static_cast<int64_t>(files.size()), (folder.size() + 3) / 4);
  EXPECT_EQ(m["totals"]["shards"], r.shards.size());
}

// --reencode (FFCV's write_mode="jpg"): every image becomes a JPEG at the quality, resized only
// above max_side, same size otherwise, close to the source's pixels; recorded in the manifest.
TEST(Pack, ReencodeMakesEveryImageAJpeg) {
  TempDir dir("pack_reencode");
  const fs::path src = make_folder(dir.path / "src");
  const ImageFolder folder(src, {.index_cache = "off"});
  PackOptions o = small_shards();
  o.reencode = true;
  const PackResult r = pack_dataset(folder, src, dir.path / "out", o);
  EXPECT_EQ(r.reencoded, folder.size());
  EXPECT_EQ(r.copied, 0);
  const TarShards shards(shard_files(dir.path / "out", r), dir.path / "out", {.index_cache = "off"});
  ASSERT_EQ(shards.size(), folder.size());
  decode::Decoder decoder;
  int64_t kept_size = 0;
  for (int64_t i = 0; i < folder.size(); ++i) {
    const std::string member(shards.at(i).member);
    EXPECT_EQ(member.substr(member.size() - 4), ".jpg") << member;
    Bytes packed, source;
    read_sample(shards.at(i), packed);
    read_sample(folder.at(i), source);
    EXPECT_EQ(decode::probe(packed, member).format, decode::ImageFormat::kJpeg) << member;
    EXPECT_NE(packed, source) << member;
    decode::ImageBuffer got, whole;
    decoder.decode(packed, member, {}, got);
    decoder.decode(source, folder.at(i).path, {}, whole);
    if (std::max(whole.width, whole.height) > o.max_side) {
      EXPECT_EQ(std::max(got.width, got.height), o.max_side) << member;
      continue;
    }
    ASSERT_EQ(got.width, whole.width) << member;
    ASSERT_EQ(got.height, whole.height) << member;
    double diff = 0;
    for (size_t k = 0; k < got.pixels.size(); ++k) diff += std::abs(int{got.pixels[k]} - int{whole.pixels[k]});
    const bool is_png = decode::probe(source, folder.at(i).path).format == decode::ImageFormat::kPng;
    EXPECT_LT(diff / static_cast<double>(got.pixels.size()), is_png ? 12.0 : 6.0) << member;
    ++kept_size;
  }
  EXPECT_GE(kept_size, 3);
  const auto m = nlohmann::json::parse(gpufeed::test::read_text(dir.path / "out" / "manifest.json"));
  EXPECT_EQ(m["options"]["reencode"], true);
  EXPECT_EQ(m["totals"]["reencoded"], folder.size());
}

// Test 6: existing output is refused without overwrite; with it, an older longer set is replaced.
TEST(Pack, ExistingShardsRefusedUnlessOverwrite) {
  TempDir dir("pack_refuse");
  const fs::path src = make_folder(dir.path / "src");
  const ImageFolder folder(src, {.index_cache = "off"});
  PackOptions o = small_shards();
  const PackResult r = pack_dataset(folder, src, dir.path / "out", o);
  const Bytes before = file_bytes(dir.path / "out" / r.shards[0].file);
  o.shard_size = 1'000'000'000;  // one shard
  try {
    pack_dataset(folder, src, dir.path / "out", o);
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    // The shards, their indexes and the manifest.
    EXPECT_NE(what.find("already holds manifest.json (and " + std::to_string(2 * r.shards.size()) + " more)"),
              std::string::npos) << what;
    EXPECT_NE(what.find("pass `overwrite` to replace them"), std::string::npos) << what;
  }
  EXPECT_EQ(file_bytes(dir.path / "out" / r.shards[0].file), before);
  EXPECT_EQ(gpufeed::test::list_files_of(dir.path / "out").size(), 2 * r.shards.size() + 1);
  o.overwrite = true;
  const PackResult again = pack_dataset(folder, src, dir.path / "out", o);
  ASSERT_EQ(again.shards.size(), 1u);
  EXPECT_EQ(gpufeed::test::list_files_of(dir.path / "out"),
            (std::vector<fs::path>{dir.path / "out" / "manifest.json", dir.path / "out" / "train-000000.tar",
                                   dir.path / "out" / "train-000000.tar.gpufeed-idx"}));
  EXPECT_EQ(TarShards({(dir.path / "out" / "train-000000.tar").string()}, dir.path / "out", {.index_cache = "off"}).size(),
            folder.size());
}

// --raw-budget, raw pixels where they pay: the samples stored as PPM hold exactly the
// loader's decode (resized where max_side asks), the choice follows the documented model and
// budget, and it is the same for any worker count.
TEST(Pack, RawBudgetStoresTheBestPayingSamplesAsPpm) {
  TempDir dir("pack_raw");
  const fs::path src = make_folder(dir.path / "src");
  const ImageFolder folder(src, {.index_cache = "off"});
  PackOptions o = small_shards();
  o.raw_budget_fraction = 1.0;  // as many extra bytes as the JPEGs take
  const PackResult r = pack_dataset(folder, src, dir.path / "out", o);
  EXPECT_GT(r.raw, 0);
  EXPECT_LT(r.raw, r.samples);
  EXPECT_EQ(r.raw + r.copied + r.reencoded, r.samples);
  EXPECT_LE(r.raw_extra, r.raw_budget);

  // The model, from the documented rule, on the pack without a budget: a sample's JPEG member
  // there, its pixels (after the resize), extra = tar bytes of the PPM - tar bytes of that JPEG.
  PackOptions plain_options = o;
  plain_options.raw_budget_fraction = 0;
  const PackResult plain_result = pack_dataset(folder, src, dir.path / "plain", plain_options);
  const TarShards plain(shard_files(dir.path / "plain", plain_result), dir.path / "plain", {.index_cache = "off"});
  struct Model {
    int64_t pixels, extra;
  };
  std::vector<Model> models;
  int64_t jpeg_total = 0;
  for (int64_t i = 0; i < folder.size(); ++i) {
    Bytes b;
    read_sample(plain.at(i), b);
    const decode::ImageInfo info = decode::probe(b, "x");
    const int64_t pixels = int64_t{info.width} * info.height;
    const std::string header = "P6\n" + std::to_string(info.width) + " " + std::to_string(info.height) + "\n255\n";
    const int64_t jpeg = static_cast<int64_t>(b.size());
    models.push_back({pixels, TarWriter::member_bytes(static_cast<int64_t>(header.size()) + 3 * pixels) -
                                  TarWriter::member_bytes(jpeg)});
    jpeg_total += TarWriter::member_bytes(jpeg);
  }
  EXPECT_EQ(r.raw_budget, jpeg_total);

  const TarShards shards(shard_files(dir.path / "out", r), dir.path / "out", {.index_cache = "off"});
  ASSERT_EQ(shards.size(), folder.size());
  decode::Decoder decoder;
  Resizer resizer;
  std::vector<int64_t> picked, unpicked;
  int64_t extra_sum = 0, raw_as_is = 0, raw_resized = 0;
  for (int64_t i = 0; i < folder.size(); ++i) {
    const std::string member(shards.at(i).member);
    if (member.substr(member.size() - 4) != ".ppm") {
      unpicked.push_back(i);
      continue;
    }
    picked.push_back(i);
    extra_sum += std::max<int64_t>(models[static_cast<size_t>(i)].extra, 0);
    Bytes packed, source;
    read_sample(shards.at(i), packed);
    read_sample(folder.at(i), source);
    decode::ImageBuffer got, whole;
    decoder.decode(packed, member, {}, got);
    decoder.decode(source, folder.at(i).path, {}, whole);
    if (std::max(whole.width, whole.height) <= o.max_side) {
      ASSERT_EQ(got.width, whole.width);
      ASSERT_EQ(got.height, whole.height);
      EXPECT_EQ(got.pixels, whole.pixels) << member;  // lossless: the loader's own decode
      ++raw_as_is;
    } else {
      std::vector<uint8_t> ref(static_cast<size_t>(got.width) * got.height * 3);
      resizer.resize(whole.pixels.data(), whole.width, whole.height, static_cast<size_t>(whole.width) * 3,
                     BoxF{0, 0, static_cast<double>(whole.width), static_cast<double>(whole.height)}, ref.data(),
                     got.width, got.height, static_cast<size_t>(got.width) * 3);
      EXPECT_EQ(std::max(got.width, got.height), o.max_side) << member;
      EXPECT_EQ(std::vector<uint8_t>(got.pixels.begin(), got.pixels.begin() + static_cast<long>(ref.size())), ref)
          << member;
      ++raw_resized;
    }
  }
  EXPECT_GE(raw_as_is, 1);
  EXPECT_GE(raw_resized, 1);
  std::printf("raw: %lld of %lld samples, %lld extra bytes of a %lld budget\n", static_cast<long long>(r.raw),
              static_cast<long long>(r.samples), static_cast<long long>(r.raw_extra), static_cast<long long>(r.raw_budget));
  EXPECT_EQ(static_cast<int64_t>(picked.size()), r.raw);
  EXPECT_EQ(extra_sum, r.raw_extra);
  // Exactly that many more bytes of members than the pack without a budget (the end blocks apart).
  EXPECT_EQ(r.bytes_out - TarWriter::kEndBytes * static_cast<int64_t>(r.shards.size()),
            plain_result.bytes_out - TarWriter::kEndBytes * static_cast<int64_t>(plain_result.shards.size()) + r.raw_extra);
  // Greedy by pixels per extra byte: a sample left out that pays better than one taken did not
  // fit what was left of the budget when its turn came (at least what is left at the end).
  const auto score = [&](int64_t i) {
    return static_cast<double>(models[static_cast<size_t>(i)].pixels) /
           static_cast<double>(std::max<int64_t>(models[static_cast<size_t>(i)].extra, 1));
  };
  for (const int64_t u : unpicked)
    for (const int64_t p : picked)
      if (score(u) > score(p)) {
        EXPECT_GT(models[static_cast<size_t>(u)].extra, r.raw_budget - r.raw_extra) << u;
      }

  // A sample not stored raw is the member the pack without a budget writes (the JPEG the first
  // pass encoded and kept, or a fresh encode: the same bytes), resized ones included.
  int64_t unpicked_resized = 0;
  for (const int64_t u : unpicked) {
    Bytes a, b, source;
    read_sample(shards.at(u), a);
    read_sample(plain.at(u), b);
    read_sample(folder.at(u), source);
    EXPECT_EQ(a, b) << u;
    unpicked_resized += a != source;
  }
  EXPECT_GE(unpicked_resized, 1);

  o.num_workers = 3;
  o.chunk_samples = 4;
  const PackResult again = pack_dataset(folder, src, dir.path / "again", o);
  ASSERT_EQ(again.shards.size(), r.shards.size());
  for (const PackedShard& s : r.shards)
    EXPECT_EQ(file_bytes(dir.path / "out" / s.file), file_bytes(dir.path / "again" / s.file)) << s.file;
  const auto m = nlohmann::json::parse(gpufeed::test::read_text(dir.path / "out" / "manifest.json"));
  EXPECT_EQ(m["totals"]["raw"], r.raw);
  EXPECT_EQ(m["options"]["raw_budget_fraction"], 1.0);
}

// The schema's rows show PackOptions{}'s defaults, share the loader's specs for its concepts, and
// pack_dataset refuses what a row refuses, naming the option (test_pack_cli.cpp: the flags).
TEST(PackOptionsSchema, DefaultsLoaderSpecsAndPackDatasetsCheck) {
  const auto& schema = pack_options_schema();
  const PackOptions d;
  const auto shown = [&](const char* name) { return *schema.default_value(*schema.find(name)); };
  EXPECT_TRUE(shown("shard_size") == options::Value(static_cast<double>(d.shard_size)));
  EXPECT_TRUE(shown("quality") == options::Value(int64_t{d.quality}));
  EXPECT_TRUE(shown("raw_budget") == options::Value(std::string("0")));
  EXPECT_TRUE(shown("on_error") == options::Value(std::string("raise")));
  for (const char* shared : {"num_workers", "on_error", "max_skips", "strict_decode"}) {
    const options::Spec& loader_row = loader_options_schema().find(shared)->spec;
    const options::Spec& pack_row = schema.find(shared)->spec;
    EXPECT_EQ(pack_row.type, loader_row.type) << shared;
    EXPECT_EQ(pack_row.min, loader_row.min) << shared;
    EXPECT_EQ(pack_row.max, loader_row.max) << shared;
    // The loader's num_workers also takes "auto" (sized from its consumer's rate); pack has no
    // consumer and takes numbers only.
    if (std::string_view(shared) == "num_workers") {
      EXPECT_EQ(loader_row.words, std::vector<std::string>{"auto"});
      EXPECT_TRUE(pack_row.words.empty());
    } else {
      EXPECT_EQ(pack_row.words, loader_row.words) << shared;
    }
  }
  TempDir dir("pack_schema");
  const fs::path src = make_folder(dir.path / "src");
  const ImageFolder folder(src, {.index_cache = "off"});
  PackOptions bad;
  bad.max_skips = -1;
  try {
    pack_dataset(folder, src, dir.path / "out", bad);
    FAIL() << "no error";
  } catch (const options::OptionError& e) {
    EXPECT_EQ(e.option(), "max_skips");
    EXPECT_EQ(std::string(e.what()), "`max_skips` must be an integer >= 0, not -1");
  }
  EXPECT_FALSE(fs::exists(dir.path / "out"));
}
