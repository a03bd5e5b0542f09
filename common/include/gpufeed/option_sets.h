#pragma once
// Option schemas seen without their structs' types: what the fronts that list options read
// (`gpufeed option-specs`, gpufeed._C.option_specs(), the keyword routing of gpufeed.DataLoader).
// Each room that owns a front's options names that front's sets once, in the order the front
// lists them (loader::dataloader_option_sets(): the loader's and the data's), and every front
// iterates that list instead of naming the schemas itself.
//
// Header-only on the standard library, like gpufeed/option.h.

#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "gpufeed/option.h"

namespace gpufeed::options {

/// One row of a set: its spec and the default the fronts show (nullopt: a derived default).
struct Row {
  Spec spec;
  std::optional<Value> default_value;
};

/// One schema's rows under the set's name ("loader", "data", "schedule", "pack"): the key of
/// `gpufeed option-specs`' JSON and the table docs/OPTIONS.md gives it.
struct OptionSet {
  std::string name;
  std::vector<Row> rows;

  /// Whether `option` is one of the rows.
  bool has(const std::string& option) const {
    for (const Row& r : rows) {
      if (r.spec.name == option) return true;
    }
    return false;
  }
};

/// The set named `name` among `sets`; std::out_of_range when none is.
inline const OptionSet& set_named(const std::vector<OptionSet>& sets, const std::string& name) {
  for (const OptionSet& set : sets) {
    if (set.name == name) return set;
  }
  throw std::out_of_range("no option set named " + name);
}

// GCC 12 reports a member of a value-initialised TrainOptions (DataOptions::interrupt, a
// shared_ptr) as maybe uninitialised once option_set is inlined: a false positive.
#pragma GCC diagnostic push
#if !defined(__clang__)  // clang has no such warning, and -Werror rejects unknown ones
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
/// The rows of `schema`, with the defaults read off one default-constructed struct (as
/// Schema::default_value reads them: none for a derived default).
template <class T>
OptionSet option_set(std::string name, const Schema<T>& schema) {
  const T defaults{};
  OptionSet set{std::move(name), {}};
  for (const Field<T>& f : schema.fields()) {
    std::optional<Value> shown;
    if (f.spec.derived_default.empty()) shown = f.get(defaults);
    set.rows.push_back({f.spec, std::move(shown)});
  }
  return set;
}
#pragma GCC diagnostic pop

}  // namespace gpufeed::options
