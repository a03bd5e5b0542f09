// gpufeed: train, launch, ckpt, bench, make-dataset, index, pack and inspect in one executable
// (and the hidden option-specs, the option schemas as JSON).
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <exception>
#include <iostream>
#include <map>
#include <memory>
#include <string>

#include "commands.h"
#include "gpufeed/option.h"

namespace {

// The pattern flag %* : the message with its backticked option names spelled as flags
// (`resume_replan_schedule` -> --resume-replan-schedule), as the errors main() prints.
class FlagSpelledMessage final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    const std::string text = gpufeed::options::spell_options(std::string_view(msg.payload.data(), msg.payload.size()),
                                                             gpufeed::options::Front::kCli);
    dest.append(text.data(), text.data() + text.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<FlagSpelledMessage>(); }
};

}  // namespace

int main(int argc, char** argv) {
  // Library logs go to stderr; results go to stdout. Library messages name options in
  // backticks: the log lines show them as this CLI's flags.
  spdlog::stderr_color_mt("gpufeed");  // creates and registers the library's logger
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  formatter->add_flag<FlagSpelledMessage>('*').set_pattern("[%H:%M:%S.%e] [%^%l%$] %*");
  spdlog::set_formatter(std::move(formatter));

  CLI::App app{"gpufeed: keep GPUs fed while they train image models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "gpufeed 0.1.0");
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
  std::map<CLI::App*, gpufeed::tools::Run> runs;
  auto add = [&](const char* name, const char* help, auto adder) {
    CLI::App* sub = app.add_subcommand(name, help);
    runs[sub] = adder(*sub);
  };
  add("train", "train a ResNet on an ImageFolder, fed by gpufeed", gpufeed::tools::add_train);
  add("bench", "measure the loader alone: images/s", gpufeed::tools::add_bench);
  add("launch", "start one worker per device with torchrun's environment: launch ... -- gpufeed train ...",
      gpufeed::tools::add_launch);
  add("ckpt", "list a checkpoint's state_dict, strip or add a key prefix, convert Python files",
      gpufeed::tools::add_ckpt);
  add("make-dataset", "write a synthetic ImageFolder of learnable JPEGs",
      gpufeed::tools::add_make_dataset);
  add("index", "list a dataset, write or read its index cache; time and memory of the sample table",
      gpufeed::tools::add_index);
  add("pack", "write a dataset as WebDataset tar shards (resize large images, manifest.json)",
      gpufeed::tools::add_pack);
  add("inspect", "what the decoder makes of image files: format, header, result, per-kind counts",
      gpufeed::tools::add_inspect);
  add("option-specs", "every option schema of the commands, as JSON (tools/gen_options_doc.py)",
      gpufeed::tools::add_option_specs);
  CLI11_PARSE(app, argc, argv);
  spdlog::get("gpufeed")->set_level(spdlog::level::from_str(log_level));
  try {
    for (auto& [sub, run] : runs) {
      if (sub->parsed()) return run();
    }
  } catch (const std::exception& e) {
    // Library errors name options in backticks (`num_workers`): shown as the flags (--num-workers).
    std::cerr << "gpufeed: error: " << gpufeed::options::spell_options(e.what(), gpufeed::options::Front::kCli)
              << "\n";
    return 1;
  }
  return 2;
}
