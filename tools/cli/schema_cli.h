#pragma once
// The CLI front of the option schemas (gpufeed/option.h): each schema row becomes a CLI11 flag
// spelled --kebab-case, its help built from the row (help, accepted values, unit, default), its
// value checked by the same options::parse/check as gpufeed.DataLoader's keywords.
#include <CLI/CLI.hpp>

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "gpufeed/option.h"

namespace gpufeed::tools {

/// The help line of a row: "help (accepted[, unit]; default D)", option names in it spelled as
/// flags (`weight_decay` -> --weight-decay).
inline std::string schema_help(const options::Spec& s, const std::string& default_text) {
  std::string h = s.help + " (" + options::accepted(s);
  if (!s.unit.empty()) h += ", " + s.unit;
  return options::spell_options(h + "; default " + default_text + ")", options::Front::kCli);
}

/// A CLI11 check of one value by the row's own parse/check: the message names the flag.
inline CLI::Validator schema_validator(const options::Spec& spec) {
  return CLI::Validator(
      [spec](std::string& text) -> std::string {
        try {
          options::parse(spec, text);
        } catch (const std::invalid_argument& e) {
          return options::spell_options(e.what(), options::Front::kCli);
        }
        return {};
      },
      "", "");
}

/// What add_schema_options registered: call apply() after parsing.
struct SchemaFlags {
  std::function<void()> apply;                      ///< sets the given flags on the target, checked
  std::shared_ptr<std::set<std::string>> given;     ///< the option names given, once applied
};

/// Registers every row of `schema` except those in `skip` on `app`, writing into `target` (which
/// must outlive the parse). Defaults are read off `target` as it is now, so a command may start
/// from its own defaults. A bool row that defaults to false is a flag --name; one that defaults
/// to true is a flag --no-name. Rows' cli_aliases are hidden spellings of the same flag.
template <class T>
SchemaFlags add_schema_options(CLI::App& app, const options::Schema<T>& schema, T& target,
                               const std::set<std::string>& skip = {}, const std::string& group = "") {
  auto texts = std::make_shared<std::map<std::string, std::string>>();
  auto flags = std::make_shared<std::map<std::string, bool>>();
  std::vector<std::pair<const options::Field<T>*, std::vector<CLI::Option*>>> registered;
  for (const options::Field<T>& f : schema.fields()) {
    const options::Spec& s = f.spec;
    if (skip.count(s.name) != 0) continue;
    std::vector<CLI::Option*> opts;
    const options::Value now = f.get(target);
    if (s.type == options::Type::kBool) {
      const bool on = std::get<bool>(now);
      const std::string flag = (on ? "--no-" : "--") + options::kebab(s.name);
      const std::string help = s.help + (on ? " (on by default; this flag turns it off)" : "");
      opts.push_back(app.add_flag(flag, (*flags)[s.name], options::spell_options(help, options::Front::kCli)));
    } else {
      std::string shown = s.derived_default.empty() ? options::format_value(now) : s.derived_default;
      if (shown.empty()) shown = "unset";
      auto& text = (*texts)[s.name];
      opts.push_back(app.add_option("--" + options::kebab(s.name), text, schema_help(s, shown)));
      for (const auto& alias : s.cli_aliases) opts.push_back(app.add_option(alias, text)->group(""));
    }
    if (!group.empty()) opts.front()->group(group);
    registered.push_back({&f, opts});
  }
  auto given = std::make_shared<std::set<std::string>>();
  auto apply = [&schema, &target, texts, flags, registered, given] {
    std::map<std::string, options::Value> values;
    for (const auto& [f, opts] : registered) {
      size_t count = 0;
      for (const CLI::Option* o : opts) count += o->count();
      if (count == 0) continue;
      const options::Spec& s = f->spec;
      if (s.type == options::Type::kBool) {
        values[s.name] = !std::get<bool>(f->get(target));  // the flag flips the default
      } else {
        values[s.name] = options::parse(s, texts->at(s.name));
      }
      given->insert(s.name);
    }
    schema.apply(target, values);
  };
  return {apply, given};
}

}  // namespace gpufeed::tools
