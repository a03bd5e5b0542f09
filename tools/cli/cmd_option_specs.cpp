// gpufeed option-specs (hidden): every option set the CLI's commands are built from, as JSON, one
// list of rows per set (gpufeed/option_sets.h): loader::dataloader_option_sets()' "loader" and
// "data" (`gpufeed bench`, `gpufeed train` and gpufeed.DataLoader), training's and the training
// schedule's (`gpufeed train`) and pack's (`gpufeed pack`). tools/gen_options_doc.py writes
// docs/OPTIONS.md from it; python/tests/test_options.py
// checks that the Python package's rows (_C.option_specs()) are the same.
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "gpufeed/harness/schedule_options.h"
#include "gpufeed/harness/trainer.h"
#include "gpufeed/json_text.h"
#include "gpufeed/loader/option_sets.h"
#include "gpufeed/pack/pack.h"
#include "gpufeed/option_sets.h"

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

// The rows of one set, with the fields _C.option_specs() gives each (gpufeed.DataLoader's
// signature and docstring come from those).
nlohmann::json rows(const options::OptionSet& set) {
  nlohmann::json out = nlohmann::json::array();
  for (const options::Row& row : set.rows) {
    const options::Spec& s = row.spec;
    out.push_back({{"name", s.name},
                   {"type", options::type_name(s.type)},
                   {"help", s.help},
                   {"unit", s.unit},
                   {"min", s.min ? nlohmann::json(*s.min) : nlohmann::json()},
                   {"max", s.max ? nlohmann::json(*s.max) : nlohmann::json()},
                   {"words", s.words},
                   {"sizes", s.sizes},
                   {"accepted", options::accepted(s)},
                   {"default", row.default_value ? to_json(*row.default_value) : nlohmann::json()},
                   {"derived_default", s.derived_default},
                   {"python_default", s.python_default ? to_json(*s.python_default) : nlohmann::json()},
                   {"seed_range", s.seed_range}});
  }
  return out;
}

}  // namespace

Run add_option_specs(CLI::App& app) {
  app.group("");  // tooling, not a user's command: hidden from `gpufeed --help`
  return [] {
    // The DataLoader's sets (`gpufeed bench`'s and `gpufeed train`'s loader flags too), then the
    // trainer's and pack's own.
    std::vector<options::OptionSet> sets = loader::dataloader_option_sets();
    sets.push_back(options::option_set("train", harness::train_options_schema()));
    sets.push_back(options::option_set("schedule", harness::schedule_options_schema()));
    sets.push_back(options::option_set("pack", pack::pack_options_schema()));
    nlohmann::json all = nlohmann::json::object();
    for (const options::OptionSet& set : sets) all[set.name] = rows(set);
    std::cout << json_text(all, 1) << "\n";
    return 0;
  };
}

}  // namespace gpufeed::tools
