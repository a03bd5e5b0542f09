// gpufeed bench: the loader alone, decoding and augmenting into slots as fast as it can; and the
// decode floors it is measured against (tools/bench/bench_compare.py runs them side by side).
//
//   --mode loader  the Loader over --data: read, probe, plan, decode, resize into batch slots
//   --mode floor   libjpeg-turbo doing exactly the decode work the loader does (same files, same
//                  plans, scale factors and crop windows, via transforms::decode_options_for) and
//                  nothing else: files preloaded into memory, no resize, no slots
//   --mode full    whole-image decode of the same files at each --scales factor (8 = full size):
//                  the reference rate, and the measurement behind decode::choose_scale's costs
//
// --consumer-ms X holds each batch X ms (a sleep: a training step of known speed that uses no
// CPU), so the loader runs against a consumer of fixed rate; the record then says how long the
// consumer waited for data, which is what num_workers auto (its thread choices are in the
// record) keeps under 1% with the fewest threads. tools/bench/bench_autotune.py sweeps it.
//
// The loader's "per sample" split (read, decode, resize, other) is each stage's wall time summed
// over the worker threads, divided by the samples: on a loaded machine, where workers are
// preempted mid-stage, it can exceed the CPU time per sample (getrusage) printed beside it.
#include <sys/resource.h>
#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "commands.h"
#include "schema_cli.h"
#include "gpufeed/cpu_budget.h"
#include "gpufeed/fields_json.h"
#include "gpufeed/json_text.h"
#include "proc_stats.h"
#include "gpufeed/loader/loader.h"
#include "gpufeed/loader/rank_sampler.h"
#include "gpufeed/loader/stats_fields.h"

namespace gpufeed::tools {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

/// CPU time this process has used (user + system, all threads), seconds.
double process_cpu_s() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  const auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6; };
  return sec(ru.ru_utime) + sec(ru.ru_stime);
}

int resolve_threads(int workers) {
  return workers > 0 ? workers : gpufeed::cpu_budget();
}

struct Args {
  std::string data;
  datasets::DataOptions data_options;  // --index-cache, --endpoint-url, ... (the data set's rows)
  loader::LoaderOptions loader;     // the loader's schema flags (--batch-size, --image-size, ...)
  std::vector<int> workers{0};      // --num-workers as a list: one run per count (kAutoNumWorkers: auto)
  std::vector<std::string> worker_texts;  // as given
  double consumer_ms = 0;
  int epochs = 1;
  int warmup = 0;
  std::string mode = "loader";
  std::vector<int> scales{8};
  std::string dump;
  bool json = false;

  bool train() const { return loader.transform.kind == transforms::TransformOptions::Kind::kTrain; }
  const char* transform() const { return train() ? "train" : "eval"; }
  int image_size() const { return loader.transform.output_size(); }
};

loader::LoaderOptions loader_options(const Args& a, int workers) {
  loader::LoaderOptions o = a.loader;
  o.num_workers = workers;
  return o;
}

// The stage times of a timed window (`timed`: the loader's counters over it), per sample,
// microseconds. `other` is what the threads spent outside read/decode/resize (scheduling,
// waiting for a free slot, idling at epoch ends).
nlohmann::json stage_breakdown(const loader::LoaderStats& timed, double seconds, int threads, int64_t samples) {
  const double n = std::max<int64_t>(samples, 1);
  const double read = timed.read_s, dec = timed.decode_s, res = timed.resize_s;
  const double other = std::max(0.0, seconds * threads - read - dec - res);
  return {{"read", read / n * 1e6}, {"decode", dec / n * 1e6}, {"resize", res / n * 1e6},
          {"other", other / n * 1e6}};
}

// Writes the first pass's samples ([N, S, S, 3] uint8, sampler order) to `path` and their plans
// to `path`.json, for tools/bench/bench_compare.py's quality report.
class Dumper {
 public:
  Dumper(const std::string& path, const datasets::Dataset& ds, const loader::LoaderOptions& o,
         int64_t epoch)
      : out_(path, std::ios::binary), meta_path_(path + ".json"), ds_(ds), o_(o), epoch_(epoch) {
    if (!out_) throw std::runtime_error("bench: cannot write --dump file " + path);
  }
  void add(const loader::Batch& b) {
    out_.write(reinterpret_cast<const char*>(b.images), b.image_bytes());
    decode::ByteBuffer bytes;
    for (int64_t k = 0; k < b.size; ++k) {
      const int64_t index = b.indices[static_cast<size_t>(k)];
      const datasets::SampleRef ref = ds_.at(index);
      const std::string path = ref.source();
      ds_.read(index, ref, bytes);  // the dataset's read: a file, a tar member or a ranged GET
      const loader::PlannedSample p = loader::plan_for(decode::probe(bytes, path), o_, epoch_, index);
      const auto& r = p.plan.region;
      const auto& c = p.decode.crop;
      samples_.push_back({{"index", index}, {"path", path}, {"label", b.labels[k]},
                          {"box", {p.plan.box.x, p.plan.box.y, p.plan.box.width, p.plan.box.height}},
                          {"region", {r.x0, r.y0, r.x1, r.y1}}, {"flip", p.plan.flip},
                          {"scale", p.decode.scale.num},
                          {"decode_crop", {c.x, c.y, c.width, c.height}}});
    }
  }
  ~Dumper() {
    std::ofstream meta(meta_path_);
    meta << json_text(nlohmann::json{{"epoch", epoch_}, {"size", o_.transform.output_size()},
                           {"transform", o_.transform.kind == transforms::TransformOptions::Kind::kTrain
                                             ? "train"
                                             : "eval"},
                           {"samples", samples_}},
                      1);
  }

 private:
  std::ofstream out_;
  std::string meta_path_;
  const datasets::Dataset& ds_;
  loader::LoaderOptions o_;
  int64_t epoch_;
  nlohmann::json samples_ = nlohmann::json::array();
};

// The fields every record has (--mode loader, floor and full).
nlohmann::json base_record(const char* mode, const Args& a, const datasets::Dataset& ds, size_t samples,
                             double seconds, double cpu_s, int workers, int threads) {
  return {{"mode", mode},
          {"data", a.data},
          {"files", ds.size()},
          {"samples", samples},
          {"seconds", seconds},
          {"images_per_s", static_cast<double>(samples) / seconds},
          {"cpu_us_per_sample", cpu_s / static_cast<double>(std::max<size_t>(samples, 1)) * 1e6},
          {"num_workers", workers},
          {"threads", threads},
          {"epochs", a.epochs},
          {"warmup", a.warmup}};
}

// The consumer's side of a timed run: --consumer-ms, its data wait (seconds and fraction of the
// timed wall time), each timed epoch's first-batch wait, CPU seconds per epoch, and
// num_workers=auto's thread count at the start and every change after.
nlohmann::json consumer_record(const Args& a, const loader::Loader& loader, double wait_s,
                               const std::vector<double>& first_wait_s, double seconds, double cpu_s,
                               int start_threads) {
  return {{"consumer_ms", a.consumer_ms},
          {"data_wait_s", wait_s},
          {"data_wait_fraction", seconds > 0 ? wait_s / seconds : 0.0},
          {"first_batch_wait_s", first_wait_s},
          {"cpu_s_per_epoch", cpu_s / a.epochs},
          {"start_threads", start_threads},
          {"thread_decisions", fields::to_json(loader.thread_decisions())}};
}

nlohmann::json run_loader(const Args& a, std::shared_ptr<const datasets::Dataset> ds, int workers,
                          bool dump) {
  const loader::LoaderOptions o = loader_options(a, workers);
  loader::Loader loader(ds, std::make_shared<sampler::SequentialSampler>(ds->size()), o);
  const int threads = loader.num_threads();
  std::unique_ptr<Dumper> dumper;
  if (dump) dumper = std::make_unique<Dumper>(a.dump, *ds, o, 0);
  int64_t samples = 0, batches = 0;
  uint64_t checksum = 0;
  std::vector<int64_t> rss;          // after every pass, warm-up included
  std::vector<double> pass_per_s;    // every pass
  loader::LoaderStats before{};
  double wait_s = 0;
  std::vector<double> first_wait_s;  // every timed epoch's wait for its first batch
  Clock::time_point t0 = Clock::now();
  double cpu0 = process_cpu_s();
  for (int e = 0; e < a.warmup + a.epochs; ++e) {
    if (e == a.warmup) {
      before = loader.stats();
      t0 = Clock::now();
      cpu0 = process_cpu_s();
    }
    const auto tp = Clock::now();
    int64_t pass_samples = 0;
    loader.start_epoch(e);
    while (auto b = loader.next()) {
      pass_samples += b->size;
      if (e >= a.warmup) {
        samples += b->size;
        ++batches;
      }
      // Touch the batch as a consumer would, and make the run's output checkable.
      for (int64_t k = 0; k < b->size; ++k) checksum += b->images[k * b->height * b->width * 3];
      if (dumper && e == 0) dumper->add(*b);
      if (a.consumer_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(a.consumer_ms));
    }
    if (e >= a.warmup) {
      const loader::EpochSummary summary = loader.epoch_summary();
      wait_s += summary.wait_s;
      first_wait_s.push_back(summary.first_wait_s);
    }
    if (e == 0) dumper.reset();
    pass_per_s.push_back(static_cast<double>(pass_samples) / seconds_since(tp));
    rss.push_back(proc_status_bytes("VmRSS"));
  }
  const double seconds = seconds_since(t0);
  const double cpu_s = process_cpu_s() - cpu0;
  const auto st = loader.stats();
  nlohmann::json r = base_record("loader", a, *ds, static_cast<size_t>(samples), seconds, cpu_s, workers,
                                 loader.num_threads());
  if (workers == loader::kAutoNumWorkers) r["num_workers"] = "auto";
  // The loader's counters over the timed epochs, but for `samples` (the record's own: the samples
  // the timed epochs handed out) and `skipped` (the loader's life, warm-up included).
  const loader::LoaderStats timed = fields::difference(st, before);
  nlohmann::json counters = fields::to_json(timed);
  counters.erase("samples");
  counters.erase("skipped");
  r.update(counters);
  r.update(consumer_record(a, loader, wait_s, first_wait_s, seconds, cpu_s, threads));
  r.update({{"batches", batches},
            {"batch_size", a.loader.batch_size},
            {"image_size", a.image_size()},
            {"transform", a.transform()},
            {"augment", transforms::to_string(o.transform.augment)},
            {"skipped", st.skipped},
            {"per_sample_us", stage_breakdown(timed, seconds, threads, samples)},
            {"pass_images_per_s", pass_per_s},
            {"rss_after_pass_bytes", rss},
            {"peak_rss_bytes", proc_status_bytes("VmHWM")},
            {"checksum", checksum}});
  return r;
}

// What a set of decodes did, summed: pixels produced, and (JPEG) rows of the scaled images
// skipped above crops, never read below them, and columns produced per row, against the scaled
// images' rows and columns.
struct DecodeTotals {
  std::atomic<int64_t> pixels{0}, skipped_rows{0}, unread_rows{0}, rows{0}, columns{0},
      image_columns{0};
  nlohmann::json fractions() const {
    const auto frac = [](int64_t a, int64_t b) { return b > 0 ? static_cast<double>(a) / b : 0.0; };
    return {{"rows_skipped", frac(skipped_rows, rows)},
            {"rows_unread", frac(unread_rows, rows)},
            {"columns_decoded", frac(columns, image_columns)}};
  }
};

// Decodes `jobs` (file, options) on `threads` threads; returns wall seconds, and the process's
// CPU seconds in `cpu_s`.
double timed_decodes(const std::vector<std::vector<uint8_t>>& files,
                     const std::vector<std::pair<size_t, decode::DecodeOptions>>& jobs,
                     const std::vector<std::string>& names, int threads, DecodeTotals& totals,
                     double& cpu_s) {
  tbb::task_arena arena(threads, /*reserved_for_masters=*/1);
  const double cpu0 = process_cpu_s();
  const auto t0 = Clock::now();
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<size_t>(0, jobs.size(), 1),
                      [&](const tbb::blocked_range<size_t>& r) {
                        thread_local decode::Decoder decoder;
                        thread_local decode::ImageBuffer image;
                        for (size_t k = r.begin(); k < r.end(); ++k) {
                          const auto& [file, options] = jobs[k];
                          const auto d = decoder.decode(files[file], names[file], options, image);
                          totals.pixels += int64_t{image.width} * image.height;
                          if (d.info.format != decode::ImageFormat::kJpeg) continue;
                          totals.skipped_rows += d.skipped_rows;
                          totals.unread_rows += d.unread_rows;
                          totals.rows += decode::scaled_size(d.info.height, d.scale);
                          totals.columns += d.decoded_columns;
                          totals.image_columns += decode::scaled_size(d.info.width, d.scale);
                        }
                      });
  });
  const double seconds = seconds_since(t0);
  cpu_s = process_cpu_s() - cpu0;
  return seconds;
}

nlohmann::json run_decode_floor(const Args& a, const datasets::Dataset& ds, int workers,
                                const std::vector<std::vector<uint8_t>>& files,
                                const std::vector<std::string>& names) {
  const loader::LoaderOptions o = loader_options(a, workers);
  const int threads = resolve_threads(workers);
  std::vector<std::pair<size_t, decode::DecodeOptions>> warm, timed;
  std::map<int, int64_t> scales;
  for (int e = 0; e < a.warmup + a.epochs; ++e) {
    for (size_t i = 0; i < files.size(); ++i) {
      const loader::PlannedSample p =
          loader::plan_for(decode::probe(files[i], names[i]), o, e, static_cast<int64_t>(i));
      (e < a.warmup ? warm : timed).emplace_back(i, p.decode);
      if (e >= a.warmup) ++scales[p.decode.scale.num];
    }
  }
  DecodeTotals warm_totals, totals;
  double cpu_s = 0;
  if (!warm.empty()) timed_decodes(files, warm, names, threads, warm_totals, cpu_s);
  const double seconds = timed_decodes(files, timed, names, threads, totals, cpu_s);
  nlohmann::json hist = nlohmann::json::object();
  int64_t reduced = 0;  // samples decoded below full size (DCT scale n/8, n < 8)
  for (const auto& [num, n] : scales) {
    hist[fmt::format("{}/8", num)] = n;
    if (num < 8) reduced += n;
  }
  nlohmann::json r = base_record("floor", a, ds, timed.size(), seconds, cpu_s, workers, threads);
  r["image_size"] = a.image_size();
  r["transform"] = a.transform();
  r["decoded_pixels"] = totals.pixels.load();
  r["decode_work"] = totals.fractions();
  r["scale_histogram"] = hist;
  r["reduced_scale_fraction"] = timed.empty() ? 0.0 : static_cast<double>(reduced) / static_cast<double>(timed.size());
  return r;
}

nlohmann::json run_full_decode(const Args& a, const datasets::Dataset& ds, int workers, int scale,
                               const std::vector<std::vector<uint8_t>>& files,
                               const std::vector<std::string>& names) {
  const int threads = resolve_threads(workers);
  decode::DecodeOptions d;
  d.scale = decode::ScaleFactor{scale};
  d.strict = a.loader.decode.strict;
  std::vector<std::pair<size_t, decode::DecodeOptions>> warm, timed;
  for (int e = 0; e < a.warmup + a.epochs; ++e)
    for (size_t i = 0; i < files.size(); ++i) (e < a.warmup ? warm : timed).emplace_back(i, d);
  DecodeTotals warm_totals, totals;
  double cpu_s = 0;
  if (!warm.empty()) timed_decodes(files, warm, names, threads, warm_totals, cpu_s);
  const double seconds = timed_decodes(files, timed, names, threads, totals, cpu_s);
  int64_t source_pixels = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    const auto info = decode::probe(files[i], names[i]);
    source_pixels += int64_t{info.width} * info.height;
  }
  nlohmann::json r = base_record("full", a, ds, timed.size(), seconds, cpu_s, workers, threads);
  r["source_megapixels_per_s"] = static_cast<double>(source_pixels) * a.epochs / seconds * 1e-6;
  r["scale"] = scale;
  r["decoded_pixels"] = totals.pixels.load();
  return r;
}

std::string describe(const nlohmann::json& r) {
  const std::string mode = r["mode"];
  std::string s = fmt::format(
      "bench {}: {} samples in {:.2f} s = {:.1f} images/s, {} threads{}, {:.0f} CPU us/sample", mode,
      r["samples"].get<int64_t>(), r["seconds"].get<double>(), r["images_per_s"].get<double>(),
      r["threads"].get<int>(), r["num_workers"] == "auto" ? " (num_workers auto, at the end)" : "",
      r["cpu_us_per_sample"].get<double>());
  if (mode == "loader") {
    const auto& p = r["per_sample_us"];
    const auto& rss = r["rss_after_pass_bytes"];
    s += fmt::format(
        "; per sample: read {:.0f} us, decode {:.0f} us, resize{} {:.0f} us, other {:.0f} us; "
        "RSS after last pass {:.1f} MiB, peak {:.1f} MiB",
        p["read"].get<double>(), p["decode"].get<double>(),
        r.value("augment", "none") == "none" ? "" : " + augment (" + r["augment"].get<std::string>() + ")",
        p["resize"].get<double>(),
        p["other"].get<double>(), rss.back().get<double>() / (1 << 20),
        r["peak_rss_bytes"].get<double>() / (1 << 20));
    if (const auto skipped = r["skipped"].get<int64_t>(); skipped > 0)
      s += fmt::format("; {} samples skipped (--on-error skip)", skipped);
    if (r["consumer_ms"].get<double>() > 0) {
      s += fmt::format("; consumer {:g} ms a batch, data wait {:.2f}%, {:.2f} CPU s an epoch",
                       r["consumer_ms"].get<double>(), r["data_wait_fraction"].get<double>() * 100,
                       r["cpu_s_per_epoch"].get<double>());
    }
    for (const auto& d : r["thread_decisions"]) {
      s += fmt::format("\n  num_workers auto: {} -> {} threads after batch {} of epoch {}: {}", d["from"].get<int>(),
                       d["to"].get<int>(), d["batch"].get<int64_t>(), d["epoch"].get<int64_t>(),
                       d["why"].get<std::string>());
    }
  } else if (mode == "floor") {
    const auto& w = r["decode_work"];
    s += fmt::format(
        "; scales {} ({:.1f}% of samples at a reduced DCT scale); of the scaled images' rows {:.0f}% "
        "skipped above crops, {:.0f}% never read below them; {:.0f}% of columns decoded",
        json_text(r["scale_histogram"]), r["reduced_scale_fraction"].get<double>() * 100,
        w["rows_skipped"].get<double>() * 100,
        w["rows_unread"].get<double>() * 100, w["columns_decoded"].get<double>() * 100);
  } else {
    s += fmt::format(" at {}/8 ({:.1f} source MP/s)", r["scale"].get<int>(),
                     r["source_megapixels_per_s"].get<double>());
  }
  return s;
}

// A number of milliseconds in [0, 1e6] (CLI::Range lets NaN through).
CLI::Validator milliseconds_validator() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const double v = std::strtod(text.c_str(), nullptr);
        return v >= 0 && v <= 1e6 ? "" : "must be a number of milliseconds in [0, 1e6], not '" + text + "'";
      },
      "", "");
}

// The floors decode from memory: every file read once, before any timing.
void preload(const datasets::Dataset& ds, std::vector<std::vector<uint8_t>>& files, std::vector<std::string>& names) {
  files.resize(static_cast<size_t>(ds.size()));
  for (int64_t i = 0; i < ds.size(); ++i) {
    const datasets::SampleRef ref = ds.at(i);
    names.push_back(ref.source());
    decode::ByteBuffer bytes;
    ds.read(i, ref, bytes);  // the dataset's read: a file, a tar member or a ranged GET
    files[static_cast<size_t>(i)].assign(bytes.begin(), bytes.end());
  }
}

// --num-workers as given (numbers, auto) into Args::workers; auto only for --mode loader.
void parse_workers(Args& a, const options::Spec& spec) {
  if (!a.worker_texts.empty()) {
    a.workers.clear();
    for (const std::string& t : a.worker_texts) {
      const options::Value v = options::parse(spec, t);
      a.workers.push_back(std::holds_alternative<std::string>(v) ? loader::kAutoNumWorkers
                                                                 : static_cast<int>(std::get<int64_t>(v)));
    }
  }
  for (const int w : a.workers) {
    if (w == loader::kAutoNumWorkers && a.mode != "loader")
      throw std::invalid_argument("bench: --num-workers auto needs --mode loader (the floors have no consumer to measure)");
  }
  if (a.consumer_ms > 0 && a.mode != "loader")
    throw std::invalid_argument("bench: --consumer-ms needs --mode loader (the floors hand no batches to a consumer)");
  if (!a.loader.views.empty() && (a.mode != "loader" || !a.dump.empty()))
    throw std::invalid_argument("bench: --views needs --mode loader without --dump (the floors and the dump replay "
                                "the single-view transform)");
}

}  // namespace

Run add_bench(CLI::App& app) {
  auto a = std::make_shared<Args>();
  app.add_option("--data", a->data,
                 "ImageFolder root, flat image folder, file list, or WebDataset tar shards "
                 "('dir/train-{000000..000146}.tar', a folder of .tar files, a list of .tar paths)")
      ->required();
  const SchemaFlags data_flags = add_schema_options(app, datasets::data_options_schema(), a->data_options);
  const options::Spec& workers = loader::loader_options_schema().find("num_workers")->spec;
  app.add_option("--num-workers", a->worker_texts,
                 schema_help(workers, "0") + "; a list such as 1,2,4,auto runs once per count: a thread-scaling "
                 "curve (--json, then tools/bench/plot.py --bench)")
      ->delimiter(',')
      ->check(schema_validator(workers));
  for (const auto& alias : workers.cli_aliases) app.add_option(alias, a->worker_texts)->delimiter(',')->group("");
  app.add_option("--consumer-ms", a->consumer_ms,
                 "--mode loader: hold each batch this long (a sleep), as a training step of known speed; the "
                 "record gives the consumer's data wait (milliseconds; default 0: take batches as fast as they come)")
      ->check(milliseconds_validator())
      ->check(CLI::Range(0.0, 1e6));
  // The loader's own flags, from its schema (gpufeed/loader/loader.h), but --num-workers (a list here).
  const SchemaFlags flags = add_schema_options(app, loader::loader_options_schema(), a->loader, {"num_workers"});
  // The old spelling of --no-train, for scripts (hidden from --help).
  auto transform = std::make_shared<std::string>();
  auto* transform_opt = app.add_option("--transform", *transform)->check(CLI::IsMember({"train", "eval"}))->group("");
  app.add_option("--epochs", a->epochs, "timed passes over the data")->capture_default_str()->check(kAtLeastOne);
  app.add_option("--warmup", a->warmup, "untimed passes before them (epochs 0..warmup-1)")
      ->capture_default_str()->check(kAtLeastZero);
  app.add_option("--mode", a->mode,
                 "loader: the Loader; floor: only the loader's decode work (same plans, scales and "
                 "crops; files preloaded, no resize); full: whole-image decodes at each --scales")
      ->capture_default_str()->check(CLI::IsMember({"loader", "floor", "full"}));
  app.add_option("--scales", a->scales, "--mode full: DCT scale numerators (n/8), e.g. 8,4,2,1")
      ->delimiter(',')->capture_default_str()->check(CLI::Range(1, 8));
  app.add_option("--dump", a->dump,
                 "--mode loader: write the first pass's samples ([N, S, S, 3] uint8, sampler order) "
                 "to this file and their plans to FILE.json (first --num-workers count only)");
  app.add_flag("--json", a->json, "print one JSON object instead of text");
  return [a, data_flags, flags, transform, transform_opt, workers] {
    data_flags.apply();
    if (transform_opt->count() > 0) {
      a->loader.transform.kind = *transform == "train" ? transforms::TransformOptions::Kind::kTrain
                                                       : transforms::TransformOptions::Kind::kEval;
    }
    flags.apply();
    parse_workers(*a, workers);
    std::shared_ptr<const datasets::Dataset> ds = datasets::open_dataset(a->data, a->data_options);
    // The passes read in dataset order whatever --shuffle-order says, but a value `train` and
    // gpufeed.DataLoader refuse for this dataset (shards on a folder) is refused here too.
    loader::resolve_shuffle_order(*ds, a->loader.shuffle_order, a->data);
    std::vector<std::vector<uint8_t>> files;
    std::vector<std::string> names;
    if (a->mode != "loader") preload(*ds, files, names);
    // Let the floors' arenas have as many threads as asked for (oneTBB defaults to the cores).
    int most = 1;
    for (const int w : a->workers) most = std::max(most, resolve_threads(w));
    tbb::global_control parallelism(tbb::global_control::max_allowed_parallelism,
                                    static_cast<size_t>(most) + 1);
    nlohmann::json results = nlohmann::json::array();
    bool dumped = false;
    const auto add = [&](nlohmann::json r) {
      if (!a->json) std::cout << describe(r) << "\n" << std::flush;
      results.push_back(std::move(r));
    };
    for (const int workers : a->workers) {
      if (a->mode == "loader") {
        add(run_loader(*a, ds, workers, !a->dump.empty() && !dumped));
        dumped = true;
      } else if (a->mode == "floor") {
        add(run_decode_floor(*a, *ds, workers, files, names));
      } else {
        for (const int scale : a->scales) add(run_full_decode(*a, *ds, workers, scale, files, names));
      }
    }
    if (a->json) {
      std::cout << json_text(results.size() == 1 ? results[0] : nlohmann::json{{"scaling", results}}, 2)
                << "\n";
    }
    return 0;
  };
}

}  // namespace gpufeed::tools
