// `gpufeed pack` run as a process (tools/cli/cmd_pack.cpp; tests/test_pack.cpp tests the library):
// the exit code, the summary's counts against manifest.json and the files written, `gpufeed
// bench --data` over the pattern the run prints reading every sample with exactly the pixels of
// the source folder, --max-side and --on-error through the command line, and clear errors with a
// non-zero exit for bad arguments. Data is generated (a fresh clone without ../shared runs it).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "gpufeed/loader/loader.h"
#include "gpufeed/pack/pack.h"
#include "gpufeed/datasets/synthetic.h"
#include "test_util.h"

namespace fs = std::filesystem;
using gpufeed::test::Output;
using gpufeed::test::read_text;
using gpufeed::test::shell_quote;
using gpufeed::test::TempDir;

namespace {

/// `gpufeed <args>` (args already quoted for the shell), streams captured in `scratch`.
Output gpufeed_cli(const std::string& args, const fs::path& scratch) {
  return gpufeed::test::run_captured(shell_quote(GPUFEED_CLI) + " " + args, scratch);
}

/// 3 classes x 7 JPEGs of 40..160 px: around a --max-side of 100 some are resized, some copied.
fs::path make_source(const fs::path& root) {
  gpufeed::datasets::write_synthetic_image_folder(
      root, {.num_classes = 3, .images_per_class = 7, .min_size = 40, .max_size = 160});
  return root;
}

/// The counts of the summary line (`packed N samples into S shards: ... R re-encoded, C copied,
/// K skipped ...`); -1 each when the line is not there.
struct Summary {
  int64_t samples = -1, shards = -1, reencoded = -1, copied = -1, skipped = -1;
};

Summary summary_of(const std::string& out) {
  static const std::regex line(
      R"(packed (\d+) samples into (\d+) shards: [0-9.]+ MB in -> [0-9.]+ MB out, (\d+) re-encoded, (\d+) copied, (\d+) skipped)");
  std::smatch m;
  Summary s;
  if (!std::regex_search(out, m, line)) return s;
  s = {std::stoll(m[1]), std::stoll(m[2]), std::stoll(m[3]), std::stoll(m[4]), std::stoll(m[5])};
  return s;
}

/// The shard pattern of the run's last line (`shards: DIR/PREFIX-{...}.tar (manifest.json beside them)`).
std::string printed_pattern(const std::string& out) {
  static const std::regex line(R"(shards: (.*) \(manifest\.json beside them\))");
  std::smatch m;
  return std::regex_search(out, m, line) ? m[1].str() : "";
}

/// The `.tar` files in `dir`, sorted.
std::vector<std::string> tars_in(const fs::path& dir) {
  std::vector<std::string> v;
  for (const fs::path& p : gpufeed::test::list_files_of(dir))
    if (p.extension() == ".tar") v.push_back(p.filename().string());
  return v;
}

/// `gpufeed bench` over `data`, one pass, 1 thread, 32-px samples dumped to `dump`: its JSON.
nlohmann::json bench(const std::string& data, const fs::path& dump, const fs::path& scratch) {
  const Output r = gpufeed_cli("bench --data " + shell_quote(data) +
                                   " --num-workers 1 --epochs 1 --warmup 0 --batch-size 8 --image-size 32"
                                   " --index-cache off --json --dump " + shell_quote(dump.string()),
                               scratch);
  EXPECT_EQ(r.code, 0) << r.err;
  try {
    return nlohmann::json::parse(r.out);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "bench printed no JSON: " << e.what() << "\n" << r.out << r.err;
    return {};
  }
}

}  // namespace

TEST(PackCli, FolderToShardsThatBenchReadsWholeWithTheSourcePixels) {
  TempDir dir("pack_cli");
  const fs::path src = make_source(dir.path / "src"), out = dir.path / "out";
  const Output r = gpufeed_cli("pack " + shell_quote(src.string()) + " " + shell_quote(out.string()) +
                                   " --shard-size 30000 --num-workers 2 --progress off --index-cache off",
                               dir.path);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(r.err, "") << "--progress off: nothing on stderr";

  // The summary's counts are the manifest's and the folder's.
  const Summary s = summary_of(r.out);
  EXPECT_EQ(s.samples, 21) << r.out;
  EXPECT_EQ(s.reencoded, 0) << r.out;  // no --max-side: every file copied
  EXPECT_EQ(s.copied, 21) << r.out;
  EXPECT_EQ(s.skipped, 0) << r.out;
  const std::vector<std::string> tars = tars_in(out);
  EXPECT_GT(tars.size(), 1u) << "30 kB shards hold a few samples each";
  EXPECT_EQ(s.shards, static_cast<int64_t>(tars.size())) << r.out;
  const auto m = nlohmann::json::parse(read_text(out / "manifest.json"));
  EXPECT_EQ(m["classes"], (std::vector<std::string>{"class_000", "class_001", "class_002"}));
  EXPECT_EQ(m["source"], src.string());
  EXPECT_EQ(m["options"]["shard_size"], 30000);
  EXPECT_EQ(m["totals"]["samples"], 21);
  EXPECT_EQ(m["totals"]["copied"], 21);
  EXPECT_EQ(m["totals"]["shards"], tars.size());
  ASSERT_EQ(m["shards"].size(), tars.size());
  int64_t in_shards = 0;
  for (size_t i = 0; i < tars.size(); ++i) {
    EXPECT_EQ(m["shards"][i]["file"], tars[i]);
    EXPECT_EQ(m["shards"][i]["bytes"].get<int64_t>(), static_cast<int64_t>(fs::file_size(out / tars[i])));
    EXPECT_LE(m["shards"][i]["bytes"].get<int64_t>(), 30000);
    in_shards += m["shards"][i]["samples"].get<int64_t>();
  }
  EXPECT_EQ(in_shards, 21);
  const std::string pattern = printed_pattern(r.out);
  EXPECT_EQ(pattern, (out / m["pattern"].get<std::string>()).string()) << r.out;
  EXPECT_EQ(m["pattern"], "train-{000000.." + tars.back().substr(6, 6) + "}.tar");

  // What the run printed is what --data takes: every sample read, the source folder's pixels and
  // labels (copied bytes, same order, same plans).
  const nlohmann::json from_shards = bench(pattern, dir.path / "shards.bin", dir.path);
  const nlohmann::json from_folder = bench(src.string(), dir.path / "folder.bin", dir.path);
  EXPECT_EQ(from_shards["files"], 21);
  EXPECT_EQ(from_shards["samples"], 21);
  EXPECT_EQ(from_shards["skipped"], 0);
  EXPECT_EQ(from_shards["checksum"], from_folder["checksum"]);
  const std::string pixels = read_text(dir.path / "shards.bin");
  EXPECT_EQ(pixels.size(), 21u * 32 * 32 * 3);
  EXPECT_TRUE(pixels == read_text(dir.path / "folder.bin")) << "shards' samples differ from the folder's";
  const auto labels_of = [](const fs::path& meta) {
    const nlohmann::json j = nlohmann::json::parse(read_text(meta));
    std::vector<int64_t> v;
    for (const auto& e : j["samples"]) v.push_back(e["label"]);
    return v;
  };
  const std::vector<int64_t> labels = labels_of(dir.path / "shards.bin.json");
  EXPECT_EQ(labels.size(), 21u);
  EXPECT_EQ(labels, labels_of(dir.path / "folder.bin.json"));

  // A second pack into the same folder is refused, naming --overwrite, and leaves the set as it was.
  const std::string first_shard = read_text(out / tars[0]);
  const Output again = gpufeed_cli("pack " + shell_quote(src.string()) + " " + shell_quote(out.string()) +
                                       " --progress off --index-cache off",
                                   dir.path);
  EXPECT_EQ(again.code, 1);
  EXPECT_NE(again.err.find("gpufeed: error: pack: " + out.string() + " already holds manifest.json"),
            std::string::npos) << again.err;
  EXPECT_NE(again.err.find("--overwrite"), std::string::npos) << again.err;
  EXPECT_EQ(tars_in(out), tars);
  EXPECT_TRUE(read_text(out / tars[0]) == first_shard);
}

TEST(PackCli, MaxSideAndOnErrorSkipThroughTheCommandLine) {
  TempDir dir("pack_cli_skip");
  const fs::path src = make_source(dir.path / "src");
  const std::string good = read_text(src / "class_000" / "img_00001.jpg");
  ASSERT_GT(good.size(), 100u);
  std::ofstream(src / "class_001" / "zz_truncated.jpg", std::ios::binary) << good.substr(0, good.size() / 2);
  const std::string common = " --max-side 100 --quality 85 --progress off --index-cache off";

  // --on-error raise (the default): exit 1, the bad file named, no shard left behind.
  const Output raised = gpufeed_cli(
      "pack " + shell_quote(src.string()) + " " + shell_quote((dir.path / "raise").string()) + common, dir.path);
  EXPECT_EQ(raised.code, 1) << raised.out;
  EXPECT_NE(raised.err.find("gpufeed: error:"), std::string::npos) << raised.err;
  EXPECT_NE(raised.err.find("class_001/zz_truncated.jpg"), std::string::npos) << raised.err;
  EXPECT_TRUE(tars_in(dir.path / "raise").empty());
  EXPECT_FALSE(fs::exists(dir.path / "raise" / "manifest.json"));

  // --on-error skip: listed, counted per kind, the rest packed; larger images re-encoded.
  const fs::path out = dir.path / "skip";
  const Output r = gpufeed_cli("pack " + shell_quote(src.string()) + " " + shell_quote(out.string()) + common +
                                   " --on-error skip",
                               dir.path);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("skipped " + (src / "class_001" / "zz_truncated.jpg").string() + ": truncated: "),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1 skipped (truncated 1)"), std::string::npos) << r.out;
  const Summary s = summary_of(r.out);
  const auto m = nlohmann::json::parse(read_text(out / "manifest.json"));
  EXPECT_EQ(s.samples, 21);
  EXPECT_EQ(s.skipped, 1);
  EXPECT_GT(s.reencoded, 0) << r.out;  // 40..160 px around --max-side 100: both kinds
  EXPECT_GT(s.copied, 0) << r.out;
  EXPECT_EQ(s.reencoded + s.copied, 21);
  EXPECT_EQ(m["totals"]["samples"], s.samples);
  EXPECT_EQ(m["totals"]["reencoded"], s.reencoded);
  EXPECT_EQ(m["totals"]["copied"], s.copied);
  EXPECT_EQ(m["totals"]["skipped"], 1);
  EXPECT_EQ(m["skipped_by_kind"]["truncated"], 1);
  EXPECT_EQ(m["options"]["max_side"], 100);
  EXPECT_EQ(m["options"]["quality"], 85);
  EXPECT_EQ(m["options"]["on_error"], "skip");
  EXPECT_EQ(m["totals"]["shards"], s.shards);
  const nlohmann::json read = bench(printed_pattern(r.out), dir.path / "skip.bin", dir.path);
  EXPECT_EQ(read["samples"], 21);
  EXPECT_EQ(read["skipped"], 0);
}

TEST(PackCli, BadArgumentsFailWithAClearErrorAndWriteNothing) {
  TempDir dir("pack_cli_bad");
  const fs::path src = make_source(dir.path / "src"), out = dir.path / "out";
  const std::string to = ' ' + shell_quote(out.string()) + " --index-cache off --progress off";
  struct Case {
    std::string args, error;
  };
  const std::vector<Case> cases = {
      {shell_quote((dir.path / "missing").string()) + to,
       "gpufeed: error: open_dataset: " + (dir.path / "missing").string() + " is neither a file list nor a folder"},
      {shell_quote(src.string()) + to + " --shard-size 0", "gpufeed: error: --shard-size must be a number >= 1, not 0"},
      {shell_quote(src.string()) + to + " --shard-size 1.5e3x",
       "gpufeed: error: --shard-size must be a number >= 1, not '1.5e3x'"},
      {shell_quote(src.string()) + to + " --shard-size 1.5",
       "gpufeed: error: --shard-size must be a whole number of bytes"},
      {shell_quote(src.string()) + to + " --raw-budget lots",
       "gpufeed: error: --raw-budget must be bytes (2e9), a fraction (0.25) or a percentage (25%), not 'lots'"},
      {shell_quote(src.string()) + to + " --prefix a/b", "gpufeed: error: pack: the prefix 'a/b' must be"},
      {shell_quote(src.string()) + to + " --on-error ignore", "gpufeed: error: --on-error must be raise or skip, not 'ignore'"},
      {shell_quote(src.string()) + to + " --quality 0", "gpufeed: error: --quality must be an integer in [1, 100], not 0"},
      {shell_quote(src.string()) + to + " --max-skips -1", "gpufeed: error: --max-skips must be an integer >= 0, not -1"},
      {shell_quote(src.string()) + to + " --num-workers -2",
       "gpufeed: error: --num-workers must be an integer in [0, 1024], not -2"},
      {shell_quote(src.string()), "out_dir is required"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    const Output r = gpufeed_cli("pack " + c.args, dir.path);
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.err.find(c.error), std::string::npos) << r.err;
    EXPECT_EQ(r.out.find("packed"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(out / "manifest.json"));
    EXPECT_TRUE(!fs::exists(out) || tars_in(out).empty());
  }
}

// Byte counts as numbers ("3e4") and raw budgets as bytes, fractions or percentages reach
// PackOptions as the manifest records them.
TEST(PackCli, ByteCountsAndRawBudgetsAsWritten) {
  TempDir dir("pack_cli_bytes");
  const fs::path src = make_source(dir.path / "src");
  const std::string common = " --progress off --index-cache off --shard-size 3e4";
  const auto manifest_options = [&](const std::string& out, const std::string& flags) {
    const Output r = gpufeed_cli("pack " + shell_quote(src.string()) + " " + shell_quote((dir.path / out).string()) +
                                     common + flags,
                                 dir.path);
    EXPECT_EQ(r.code, 0) << r.err;
    return nlohmann::json::parse(read_text(dir.path / out / "manifest.json"))["options"];
  };
  const nlohmann::json percent = manifest_options("percent", " --raw-budget 25%");
  EXPECT_EQ(percent["shard_size"], 30000);
  EXPECT_EQ(percent["raw_budget_fraction"], 0.25);
  EXPECT_EQ(percent["raw_budget"], 0);
  const nlohmann::json bytes = manifest_options("bytes", " --raw-budget 2e5");
  EXPECT_EQ(bytes["raw_budget"], 200000);
  EXPECT_EQ(bytes["raw_budget_fraction"], 0.0);
}

// --help lists each PackOptions flag (the schema's rows, gpufeed/pack/pack.h) with
// PackOptions{}'s default, and no flag that is not one of them, --index-cache or --progress.
TEST(PackCli, HelpListsEveryPackOptionWithPackOptionsDefault) {
  TempDir dir("pack_cli_help");
  const Output r = gpufeed_cli("pack --help", dir.path);
  ASSERT_EQ(r.code, 0) << r.err;
  const gpufeed::pack::PackOptions d;
  const auto flag = [](const char* name, bool on) { return std::string(on ? "--no-" : "--") + name; };
  const std::map<std::string, std::string> defaults = {
      {"--prefix", d.prefix},
      {"--shard-size", std::to_string(d.shard_size)},
      {"--max-samples-per-shard", std::to_string(d.max_samples_per_shard)},
      {"--max-side", std::to_string(d.max_side)},
      {"--quality", std::to_string(d.quality)},
      {"--num-workers", std::to_string(d.num_workers)},
      {"--on-error", std::string(gpufeed::loader::to_string(d.error_policy))},
      {"--max-skips", std::to_string(d.max_skips)},
      {"--raw-budget", std::to_string(d.raw_budget)},
      {"--seed", std::to_string(d.seed)},
      {flag("reencode", d.reencode), ""},  // a flag: its spelling is the default
      {flag("shuffle", d.shuffle), ""},
      {flag("strict-decode", d.decode.strict), ""},
      {flag("overwrite", d.overwrite), ""},
  };
  // Each option's entry: from its flag to the next option's line.
  static const std::regex option_line(R"(\n  (-h,)?(--[a-z-]+))");
  std::map<std::string, std::string> entries;
  const auto begin = std::sregex_iterator(r.out.begin(), r.out.end(), option_line);
  for (auto it = begin; it != std::sregex_iterator(); ++it) {
    const auto next = std::next(it);
    const size_t end = next == std::sregex_iterator() ? r.out.size() : static_cast<size_t>(next->position());
    entries[(*it)[2]] = r.out.substr(static_cast<size_t>(it->position()), end - static_cast<size_t>(it->position()));
  }
  for (const auto& [name, value] : defaults) {
    ASSERT_EQ(entries.count(name), 1u) << name << " not in\n" << r.out;
    if (!value.empty()) {
      EXPECT_NE(entries[name].find("; default " + value + ")"), std::string::npos) << entries[name];
    }
  }
  // The source's options (DataOptions: its index cache, remote shards' options) are the loaders'.
  std::set<std::string> data_flags;
  for (const auto& f : gpufeed::datasets::data_options_schema().fields()) data_flags.insert("--" + gpufeed::options::kebab(f.spec.name));
  for (const auto& [name, entry] : entries) {
    EXPECT_TRUE(defaults.count(name) || name == "--help" || data_flags.count(name) || name == "--progress")
        << name << ": an option that is not PackOptions' (add it here):\n" << entry;
  }
}

TEST(PackCli, SigtermStopsThePackAndRemovesWhatItWrote) {
  // SIGTERM (or Ctrl-C's SIGINT) in the middle: exit 143 (130), and no shard, .tmp or manifest left behind (a partial set in
  // the folder would be read as the whole dataset). The signal goes as soon as the first shard
  // file appears; 3 chunks of 256 samples keep the pack busy after that.
  TempDir dir("pack_cli_sigint");
  const fs::path src = dir.path / "src", out = dir.path / "out";
  gpufeed::datasets::write_synthetic_image_folder(
      src, {.num_classes = 3, .images_per_class = 250, .min_size = 150, .max_size = 220});
  std::string cmd = "(";
  cmd += shell_quote(GPUFEED_CLI) + " pack " + shell_quote(src.string()) + " " +
                          shell_quote(out.string()) +
                          " --reencode --num-workers 1 --shard-size 100000 --index-cache off --progress off & P=$!; "
                          "i=0; while [ -z \"$(ls " + shell_quote(out.string()) + " 2>/dev/null)\" ] && [ $i -lt 3000 ]; "
                          "do sleep 0.01; i=$((i+1)); done; kill -TERM $P; wait $P; echo code=$?)";
  const Output r = gpufeed::test::run_captured(cmd, dir.path);
  EXPECT_NE(r.out.find("code=143"), std::string::npos) << r.out << r.err;
  EXPECT_NE(r.err.find("gpufeed pack: SIGTERM: stopped; the shards this run wrote were removed"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.out.find("packed"), std::string::npos) << r.out;
  ASSERT_TRUE(fs::exists(out));
  EXPECT_TRUE(gpufeed::test::list_files_of(out).empty()) << gpufeed::test::list_files_of(out).size() << " files left";
}
