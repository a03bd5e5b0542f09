// `gpufeed inspect`, run as a process over generated files of every bug-case kind (bugkinds.h):
// each file's reported result is the decoder's, the PNGs it writes hold exactly the pixels the
// decoder produced, the summary counts every kind, and nothing goes to stderr.

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bugkinds.h"
#include "process_util.h"
#include "gpufeed/cpu_features.h"
#include "gpufeed/decode/decoder.h"
#include "gpufeed/decode/error.h"

namespace {

namespace fs = std::filesystem;
namespace kinds = gpufeed::test;
using gpufeed::decode::Decoder;
using gpufeed::decode::ImageBuffer;

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("gpufeed_inspect_" + std::to_string(::getpid()));
  TempDir() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

void write_file(const fs::path& p, const std::vector<uint8_t>& bytes) {
  std::ofstream(p, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

/// Runs `gpufeed <args>` (process_util.h); returns its exit status, stdout in `out`, stderr in `err`.
int gpufeed(const std::string& args, const fs::path& scratch, std::string& out, std::string& err) {
  gpufeed::test::Output r = gpufeed::test::run_captured(gpufeed::test::shell_quote(GPUFEED_CLI) + " " + args, scratch);
  out = std::move(r.out);
  err = std::move(r.err);
  return r.code;
}

TEST(Inspect, JsonGivesEachKindsOutcomeAndPngsOfTheDecodedPixels) {
  TempDir tmp;
  const fs::path data = tmp.path / "data", pngs = tmp.path / "png";
  fs::create_directories(data / "sub");
  std::vector<kinds::Variant> variants = kinds::make_kind_variants();
  for (auto& v : kinds::make_whole_image_variants()) variants.push_back(std::move(v));
  std::map<std::string, const kinds::Variant*> by_path;
  for (size_t i = 0; i < variants.size(); ++i) {
    // Half in a subfolder: folders are searched recursively and their layout kept for the PNGs.
    const fs::path p = (i % 2 ? data / "sub" : data) / variants[i].name;
    write_file(p, variants[i].bytes);
    by_path[p.string()] = &variants[i];
  }
  // --all-files: .pbm is not among torchvision's extensions, and the format comes from the bytes.
  std::string out, err;
  const int status = gpufeed("inspect --json --all-files --write-png '" + pngs.string() + "' '" +
                                 data.string() + "'",
                             tmp.path, out, err);
  EXPECT_EQ(status, 1) << "some files fail to decode";
  EXPECT_EQ(err, "") << "nothing may go to stderr";
  const nlohmann::json j = nlohmann::json::parse(out);
  ASSERT_EQ(j["files"].size(), variants.size());
  int64_t decoded = 0, failed = 0;
  std::map<std::string, int64_t> by_result;
  Decoder decoder;
  for (const auto& f : j["files"]) {
    const std::string path = f["path"];
    SCOPED_TRACE(path);
    ASSERT_TRUE(by_path.count(path)) << "inspected a file it should not have";
    const kinds::Variant& v = *by_path.at(path);
    EXPECT_EQ(f["bytes"].get<int64_t>(), static_cast<int64_t>(v.bytes.size()));
    EXPECT_EQ(f["format"], std::string(gpufeed::decode::to_string(gpufeed::decode::sniff(v.bytes))));
    if (v.expect.error) {
      ++failed;
      ++by_result[std::string(gpufeed::decode::to_string(*v.expect.error))];
      EXPECT_EQ(f["result"], "error");
      EXPECT_EQ(f["error"]["kind"], std::string(gpufeed::decode::to_string(*v.expect.error)));
      EXPECT_NE(f["error"]["reason"].get<std::string>().find(v.expect.reason), std::string::npos);
      EXPECT_FALSE(f.contains("png"));
      continue;
    }
    ++decoded;
    EXPECT_NE(f["result"], "error");
    ++by_result[f["result"].get<std::string>()];
    EXPECT_EQ(f["width"], v.width);
    EXPECT_EQ(f["height"], v.height);
    EXPECT_EQ(f["output"]["width"], v.width);
    EXPECT_GE(f["warnings"].get<int>(), v.min_warnings);
    // The PNG holds exactly what the decoder gives for the original.
    ASSERT_TRUE(f.contains("png"));
    const fs::path png = f["png"].get<std::string>();
    EXPECT_EQ(png.parent_path().filename(), fs::path(path).parent_path().filename());
    std::vector<uint8_t> png_bytes;
    gpufeed::decode::read_file(png, png_bytes);
    ImageBuffer from_png, from_original;
    decoder.decode(png_bytes, png.string(), {}, from_png);
    decoder.decode(v.bytes, path, {}, from_original);
    EXPECT_EQ(from_png.width, from_original.width);
    EXPECT_EQ(from_png.height, from_original.height);
    EXPECT_TRUE(from_png.pixels == from_original.pixels);
  }
  EXPECT_EQ(j["summary"]["files"], variants.size());
  EXPECT_EQ(j["summary"]["decoded"], decoded);
  EXPECT_EQ(j["summary"]["failed"], failed);
  const auto reported = j["summary"]["by_result"].get<std::map<std::string, int64_t>>();
  EXPECT_EQ(reported, by_result);
  EXPECT_GE(failed, 20);
}

TEST(Inspect, TextNamesEachFileItsHeaderAndResultThenCountsPerKind) {
  TempDir tmp;
  kinds::JpegSpec s;
  s.width = 40;
  s.height = 30;
  s.progressive = true;
  const std::vector<uint8_t> good = kinds::make_jpeg(s, kinds::pattern(40, 30, 3));
  write_file(tmp.path / "good.jpg", good);
  write_file(tmp.path / "cut.jpg", std::vector<uint8_t>(good.begin(), good.begin() + 200));
  std::string out, err;
  int status = gpufeed("inspect '" + (tmp.path / "good.jpg").string() + "' '" +
                           (tmp.path / "cut.jpg").string() + "' '" + (tmp.path / "gone.jpg").string() + "'",
                       tmp.path, out, err);
  EXPECT_EQ(status, 1);
  EXPECT_EQ(err, "");
  EXPECT_NE(out.find("good.jpg: jpeg " + std::to_string(good.size()) +
                     " bytes 40x30 3ch 8bit 4:2:0 progressive -> ok\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("cut.jpg: jpeg 200 bytes 40x30 3ch 8bit 4:2:0 progressive -> truncated: "),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("gone.jpg: unknown -> io: cannot open: No such file or directory"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("inspect: 3 files: 1 ok, 1 io, 1 truncated\n"), std::string::npos) << out;

  status = gpufeed("inspect '" + (tmp.path / "good.jpg").string() + "'", tmp.path, out, err);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("inspect: 1 files: 1 ok\n"), std::string::npos) << out;

  // In a folder, files without an image extension are left out unless --all-files.
  fs::create_directories(tmp.path / "folder");
  write_file(tmp.path / "folder" / "a.jpg", good);
  std::ofstream(tmp.path / "folder" / "notes.txt") << "not an image\n";
  status = gpufeed("inspect '" + (tmp.path / "folder").string() + "'", tmp.path, out, err);
  EXPECT_EQ(status, 0) << out;
  EXPECT_EQ(out.find("notes.txt"), std::string::npos) << out;
  EXPECT_NE(out.find("inspect: 1 files: 1 ok\n"), std::string::npos) << out;
  status = gpufeed("inspect --all-files '" + (tmp.path / "folder").string() + "'", tmp.path, out, err);
  EXPECT_EQ(status, 1) << out;
  EXPECT_NE(out.find("notes.txt: unknown 13 bytes -> unsupported: unrecognised image format"),
            std::string::npos)
      << out;
}


TEST(BenchCli, OnErrorSkipCountsTheBadFileAndRaiseStopsNamingIt) {
  TempDir tmp;
  fs::create_directories(tmp.path / "data" / "a");
  kinds::JpegSpec s;
  s.width = 48;
  s.height = 40;
  const std::vector<uint8_t> good = kinds::make_jpeg(s, kinds::pattern(48, 40, 3));
  for (int i = 0; i < 7; ++i) write_file(tmp.path / "data" / "a" / ("ok" + std::to_string(i) + ".jpg"), good);
  write_file(tmp.path / "data" / "a" / "broken.jpg", std::vector<uint8_t>(good.begin(), good.begin() + 20));
  const std::string common = "bench --data '" + (tmp.path / "data").string() +
                             "' --num-workers 1 --batch-size 4 --image-size 32 --json";
  std::string out, err;
  int status = gpufeed(common + " --on-error skip --max-skips 1", tmp.path, out, err);
  ASSERT_EQ(status, 0) << out << err;
  const auto r = nlohmann::json::parse(out);
  EXPECT_EQ(r["samples"], 8);
  EXPECT_EQ(r["skipped"], 1);
  EXPECT_NE(err.find("broken.jpg"), std::string::npos) << err;  // the warning names the file

  status = gpufeed(common, tmp.path, out, err);  // --on-error raise, the default
  EXPECT_NE(status, 0);
  EXPECT_NE(err.find("broken.jpg"), std::string::npos) << err;
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;

  status = gpufeed(common + " --on-error ignore", tmp.path, out, err);
  EXPECT_NE(status, 0);
  EXPECT_NE(err.find("--on-error"), std::string::npos) << err;
}



// --num-workers takes auto among its counts, and --consumer-ms plays a consumer of known speed:
// the record gives the consumer's data wait, each epoch's first-batch wait, the CPU seconds per
// epoch and auto's decisions; the batches are the same (checksum) for every count. The floors
// have no consumer, so auto is refused there, naming the flag.
TEST(BenchCli, NumWorkersAutoAndAConsumerOfKnownSpeed) {
  TempDir tmp;
  fs::create_directories(tmp.path / "data" / "a");
  kinds::JpegSpec s;
  s.width = 96;
  s.height = 80;
  for (int i = 0; i < 16; ++i)
    write_file(tmp.path / "data" / "a" / ("img" + std::to_string(i) + ".jpg"),
               kinds::make_jpeg(s, kinds::pattern(96, 80, 3, static_cast<uint32_t>(i + 1))));
  const std::string common = "bench --data '" + (tmp.path / "data").string() +
                             "' --batch-size 2 --image-size 32 --index-cache off --epochs 2 --json";
  std::string out, err;
  ASSERT_EQ(gpufeed(common + " --num-workers 1,auto --consumer-ms 4", tmp.path, out, err), 0) << err;
  const auto runs = nlohmann::json::parse(out)["scaling"];
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0]["num_workers"], 1);
  EXPECT_EQ(runs[1]["num_workers"], "auto");
  EXPECT_EQ(runs[0]["checksum"], runs[1]["checksum"]);
  for (const auto& r : runs) {
    EXPECT_EQ(r["samples"], 32);
    EXPECT_EQ(r["consumer_ms"], 4.0);
    EXPECT_GE(r["seconds"].get<double>(), 16 * 0.004) << "16 batches held 4 ms each";
    EXPECT_EQ(r["first_batch_wait_s"].size(), 2u);
    EXPECT_GE(r["data_wait_fraction"].get<double>(), 0.0);
    EXPECT_LT(r["data_wait_fraction"].get<double>(), 1.0);
    EXPECT_GT(r["cpu_s_per_epoch"].get<double>(), 0.0);
  }
  EXPECT_TRUE(runs[0]["thread_decisions"].empty());
  for (const auto& d : runs[1]["thread_decisions"]) {
    EXPECT_NE(d["to"], d["from"]);
    EXPECT_FALSE(d["why"].get<std::string>().empty());
  }
  EXPECT_NE(gpufeed(common + " --num-workers auto --mode floor", tmp.path, out, err), 0);
  EXPECT_NE(err.find("--num-workers auto needs --mode loader"), std::string::npos) << err;
  EXPECT_NE(gpufeed(common + " --num-workers 2,many", tmp.path, out, err), 0);
  EXPECT_NE(err.find("--num-workers"), std::string::npos) << err;
  EXPECT_NE(err.find("or auto, not 'many'"), std::string::npos) << err;
  for (const char* bad : {"nan", "-1", "inf", "x"}) {
    EXPECT_NE(gpufeed(common + " --consumer-ms " + bad, tmp.path, out, err), 0) << bad;
    EXPECT_NE(err.find("--consumer-ms"), std::string::npos) << bad << ": " << err;
  }
  EXPECT_NE(gpufeed(common + " --consumer-ms 3 --mode floor", tmp.path, out, err), 0);
  EXPECT_NE(err.find("--consumer-ms needs --mode loader"), std::string::npos) << err;
}

TEST(BenchCli, ResizeKernelVariableGivesTheSameSamplesAndRefusesAnUnknownKernel) {
  // GPUFEED_RESIZE_KERNEL (loader/resize.h) narrows the loader's automatic kernel choice, so an
  // AVX2-only CPU's path can be measured on an AVX-512 machine: every kernel this CPU runs gives
  // the same bytes, and a value it cannot run or does not know stops the run naming the variable.
  TempDir tmp;
  fs::create_directories(tmp.path / "data" / "a");
  kinds::JpegSpec s;
  s.width = 120;
  s.height = 90;
  for (int i = 0; i < 6; ++i)
    write_file(tmp.path / "data" / "a" / ("img" + std::to_string(i) + ".jpg"),
               kinds::make_jpeg(s, kinds::pattern(120, 90, 3, static_cast<uint32_t>(i + 1))));
  const auto bench = [&](const std::string& kernel, const std::string& dump, std::string& out,
                         std::string& err) {
    const std::string env = kernel.empty() ? "" : "GPUFEED_RESIZE_KERNEL=" + kernel + " ";
    const std::string cmd = env + gpufeed::test::shell_quote(GPUFEED_CLI) + " bench --data '" +
                            (tmp.path / "data").string() +
                            "' --num-workers 1 --batch-size 3 --image-size 40 --index-cache off "
                            "--json --dump '" + (tmp.path / dump).string() + "'";
    gpufeed::test::Output r = gpufeed::test::run_captured(cmd, tmp.path);
    out = std::move(r.out);
    err = std::move(r.err);
    return r.code;
  };
  std::string out, err;
  ASSERT_EQ(bench("", "auto.raw", out, err), 0) << err;
  const std::string reference = gpufeed::test::read_text(tmp.path / "auto.raw");
  ASSERT_EQ(reference.size(), 6u * 40 * 40 * 3);
  std::vector<std::string> kernels = {"scalar"};
#if defined(__x86_64__) || defined(__i386__)
  const auto& cpu = gpufeed::cpu::x86_features();
  if (cpu.sse42) kernels.push_back("hwy");
  if (cpu.avx2) kernels.push_back("avx2");
  if (cpu.avx512f && cpu.avx512bw) kernels.push_back("avx512");
#elif defined(__aarch64__)
  kernels.push_back("hwy");
#endif
  for (const std::string& k : kernels) {
    ASSERT_EQ(bench(k, k + ".raw", out, err), 0) << k << ": " << err;
    EXPECT_TRUE(gpufeed::test::read_text(tmp.path / (k + ".raw")) == reference) << k;
  }
  EXPECT_NE(bench("avx1024", "bad.raw", out, err), 0);
  EXPECT_NE(err.find("GPUFEED_RESIZE_KERNEL=avx1024: expected auto, scalar, hwy, avx2 or avx512"),
            std::string::npos) << err;
#if defined(__x86_64__) || defined(__i386__)
  if (!(gpufeed::cpu::x86_features().avx512f && gpufeed::cpu::x86_features().avx512bw)) {
    EXPECT_NE(bench("avx512", "bad.raw", out, err), 0);
    EXPECT_NE(err.find("GPUFEED_RESIZE_KERNEL=avx512: this CPU does not run that kernel"),
              std::string::npos) << err;
  }
#endif
}


/// A small valid JPEG (gradient), through the decoder's encoder.
std::vector<uint8_t> small_jpeg(int w = 24, int h = 16) {
  std::vector<uint8_t> rgb(static_cast<size_t>(w) * h * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>(i * 7);
  return gpufeed::decode::encode_jpeg(rgb.data(), w, h, 90);
}


TEST(JsonOutput, NonUtf8FileNamesBecomeReplacementCharactersInEveryWriter) {
  // File names are bytes: a Latin-1 "café.jpg" is not UTF-8. Every JSON writer replaces each
  // invalid byte by U+FFFD (gpufeed/json_text.h) instead of failing with nlohmann's type_error.
  TempDir tmp;
  const std::string fffd = "\xEF\xBF\xBD";
  const fs::path data = tmp.path / "d\xE9j\xE0";  // a Latin-1 folder name too
  fs::create_directories(data);
  write_file(data / "caf\xE9.jpg", small_jpeg());
  write_file(data / "x\xFF\xFEy.jpg", {0xFF, 0xD8, 0xFF});  // two invalid bytes; truncated JPEG
  std::string out, err;
  // inspect --json: the example of the field report.
  EXPECT_EQ(gpufeed("inspect --json '" + data.string() + "'", tmp.path, out, err), 1)
      << "the truncated file fails; the JSON is still written\n" << err;
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(out)) << out;
  const std::string dir = (tmp.path / ("d" + fffd + "j" + fffd)).string();
  ASSERT_EQ(j["files"].size(), 2u);
  EXPECT_EQ(j["files"][0]["path"], dir + "/caf" + fffd + ".jpg");
  EXPECT_EQ(j["files"][0]["result"], "ok");
  EXPECT_EQ(j["files"][1]["path"], dir + "/x" + fffd + fffd + "y.jpg");
  EXPECT_EQ(j["files"][1]["error"]["kind"], "truncated");
  EXPECT_EQ(j["summary"]["failed"], 1);
  // The text output keeps the raw bytes (it is not JSON).
  EXPECT_EQ(gpufeed("inspect '" + (data / "caf\xE9.jpg").string() + "'", tmp.path, out, err), 0);
  EXPECT_NE(out.find((data / "caf\xE9.jpg").string() + ": jpeg"), std::string::npos) << out;

  // bench --json (its "data" field) and --dump's FILE.json (every sample's path), over a
  // flat folder whose only image has a Latin-1 name.
  fs::remove(data / "x\xFF\xFEy.jpg");
  const fs::path dump = tmp.path / "dump.bin";
  ASSERT_EQ(gpufeed("bench --data '" + data.string() + "' --num-workers 1 --epochs 1 --warmup 0 "
                    "--batch-size 1 --image-size 16 --json --dump '" + dump.string() + "'",
                    tmp.path, out, err),
            0)
      << err;
  ASSERT_NO_THROW(j = nlohmann::json::parse(out)) << out;
  EXPECT_EQ(j["data"], dir);
  ASSERT_NO_THROW(j = nlohmann::json::parse(gpufeed::test::read_text(dump.string() + ".json")));
  ASSERT_EQ(j["samples"].size(), 1u);
  EXPECT_EQ(j["samples"][0]["path"], dir + "/caf" + fffd + ".jpg");
}

TEST(FileListCli, ByteOrderMarkIsSkippedAndAMissingFileStopsTheStartWithItsLine) {
  TempDir tmp;
  write_file(tmp.path / "a.jpg", small_jpeg());
  write_file(tmp.path / "b.jpg", small_jpeg(16, 24));
  // Saved by a Windows editor: UTF-8 byte-order mark and CRLF.
  std::ofstream(tmp.path / "list.txt", std::ios::binary) << "\xEF\xBB\xBF" "a.jpg 0\r\nb.jpg 1\r\n";
  std::string out, err;
  // --index-cache off: a cache of the list (written when the first run starts more than a
  // second after the list was written, as on a loaded machine) adds an "index cache ... changed"
  // info line to the second run's stderr, which is compared whole.
  const std::string common =
      " --num-workers 1 --epochs 1 --warmup 0 --batch-size 2 --image-size 16 --json --index-cache off";
  ASSERT_EQ(gpufeed("bench --data '" + (tmp.path / "list.txt").string() + "'" + common, tmp.path, out, err), 0)
      << err;
  EXPECT_EQ(nlohmann::json::parse(out)["files"], 2);
  // A missing file: one line at start-up naming the list's line, not a failure at load time.
  std::ofstream(tmp.path / "list.txt", std::ios::binary) << "a.jpg 0\nmissing.jpg 1\nb.jpg 1\n";
  EXPECT_EQ(gpufeed("bench --data '" + (tmp.path / "list.txt").string() + "'" + common, tmp.path, out, err), 1);
  EXPECT_EQ(err, "gpufeed: error: FileList: " + (tmp.path / "list.txt").string() + ":2: cannot read " +
                     (tmp.path / "missing.jpg").string() + ": No such file or directory\n");
  // A UTF-16 list: named as such.
  std::ofstream(tmp.path / "list.txt", std::ios::binary) << std::string("\xFF\xFE" "a\0", 4);
  EXPECT_EQ(gpufeed("bench --data '" + (tmp.path / "list.txt").string() + "'" + common, tmp.path, out, err), 1);
  EXPECT_NE(err.find("is UTF-16 little-endian text"), std::string::npos) << err;
}

}  // namespace
