// gpufeed option-specs (hidden): every option schema the CLI's commands are built from, as JSON,
// one list of rows per schema: the loader's and the index cache's (`gpufeed bench`, `gpufeed
// train` and gpufeed.DataLoader), training's and the training schedule's (`gpufeed train`) and
// pack's (`gpufeed pack`). tools/gen_options_doc.py writes docs/OPTIONS.md from it; python/tests/test_options.py
// checks that the Python package's rows (_C.option_specs()) are the same.
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "gpufeed/harness/schedule_options.h"
#include "gpufeed/harness/trainer.h"
#include "gpufeed/json_text.h"
#include "gpufeed/loader/loader.h"
#include "gpufeed/loader/pack.h"
#include "gpufeed/option.h"

namespace gpufeed::tools {
namespace {

nlohmann::json to_json(const options::Value& v) {
  struct {
    nlohmann::json operator()(bool b) const { return b; }
    nlohmann::json operator()(int64_t i) const { return i; }
    nlohmann::json operator()(double d) const { return d; }
    nlohmann::json operator()(const std::string& t) const { return t; }
    nlohmann::json operator()(const std::vector<double>& l) const { return l; }
  } visit;
  return std::visit(visit, v);
}

// The rows of one schema, with the fields _C.option_specs() gives each (gpufeed.DataLoader's
// signature and docstring come from those).
template <class T>
nlohmann::json rows(const options::Schema<T>& schema) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& f : schema.fields()) {
    const options::Spec& s = f.spec;
    const std::optional<options::Value> def = schema.default_value(f);
    out.push_back({{"name", s.name},
                   {"type", options::type_name(s.type)},
                   {"help", s.help},
                   {"unit", s.unit},
                   {"min", s.min ? nlohmann::json(*s.min) : nlohmann::json()},
                   {"max", s.max ? nlohmann::json(*s.max) : nlohmann::json()},
                   {"words", s.words},
                   {"sizes", s.sizes},
                   {"accepted", options::accepted(s)},
                   {"default", def ? to_json(*def) : nlohmann::json()},
                   {"derived_default", s.derived_default}});
  }
  return out;
}

}  // namespace

Run add_option_specs(CLI::App& app) {
  app.group("");  // tooling, not a user's command: hidden from `gpufeed --help`
  return [] {
    const nlohmann::json all = {{"loader", rows(loader::loader_options_schema())},
                                {"data", rows(loader::data_options_schema())},
                                {"train", rows(harness::train_options_schema())},
                                {"schedule", rows(harness::schedule_options_schema())},
                                {"pack", rows(loader::pack_options_schema())}};
    std::cout << json_text(all, 1) << "\n";
    return 0;
  };
}

}  // namespace gpufeed::tools
