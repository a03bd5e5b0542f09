#pragma once
// Options declared once. Each user-facing field of an options struct is one row of the struct's
// schema, declared beside the struct: its name, type, help, unit, accepted values, and how it
// reads and writes the field. The fronts come from the schemas: the CLI's flags (--kebab-case of
// the name), gpufeed.DataLoader's keywords (the name), their validation (one check, here), the
// Python docstring's argument list and docs/OPTIONS.md. The default is declared once too, as the
// struct's member initialiser: a schema reads it off a default-constructed struct.
//
// Library errors name an option in backticks (`num_workers`); each front respells such names in
// its own words with spell_options (`--num-workers` on the command line, `num_workers=` in
// Python), so a message reads right wherever it surfaces.
//
// Header-only on the standard library (torch translation units include it; no fmt, no spdlog).

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace gpufeed::options {

/// How a front reads an option's value.
enum class Type : uint8_t {
  kBool,    ///< CLI: a flag; Python: bool
  kInt,     ///< CLI: an integer; Python: int; with `words`, also one of them (num_workers "auto")
  kFloat,   ///< CLI: a number; Python: float or int; with `words`, also one of them (e.g. "random")
  kString,  ///< free text (a path, a folder); "" is the unset state
  kChoice,  ///< one of `words`
  kFloats,  ///< CLI: "a,b[,...]"; Python: a number or a sequence of numbers (lengths in `sizes`)
};

/// The type's name as the fronts' spec listings give it (`gpufeed option-specs`,
/// gpufeed._C.option_specs()): bool, int, float, str, choice, floats.
inline const char* type_name(Type t) {
  switch (t) {
    case Type::kBool: return "bool";
    case Type::kInt: return "int";
    case Type::kFloat: return "float";
    case Type::kString: return "str";
    case Type::kChoice: return "choice";
    case Type::kFloats: return "floats";
  }
  return "?";
}

/// An option's value as a front hands it over (after parsing its text or converting its object).
using Value = std::variant<bool, int64_t, double, std::string, std::vector<double>>;

/// One user-facing option.
struct Spec {
  std::string name;  ///< snake_case: the Python keyword; the CLI spells it --kebab-case
  Type type = Type::kInt;
  std::string help;  ///< one phrase, lower case, no final period
  std::string unit;  ///< "pixels", "samples", "threads", ... ("" when the value has none)
  std::optional<double> min, max;  ///< inclusive bounds of every number (kInt, kFloat, kFloats)
  std::vector<std::string> words;  ///< kChoice: the accepted words; kInt, kFloat: words accepted besides numbers
  std::vector<size_t> sizes;       ///< kFloats: the accepted list lengths (empty: any length)
  /// Set when the default is no value of the field's own: one that depends on other options
  /// ("round(image_size x 256 / 224)") or an unset option ("unset (no progressive resizing)").
  /// The CLI shows this text and Python's default is None; the field's initialiser is not the
  /// default then.
  std::string derived_default;
  std::vector<std::string> cli_aliases;  ///< other CLI spellings ("--workers"), hidden from --help
  /// gpufeed.DataLoader's default where the Python front's convention is not the struct's
  /// (batch_size: 1, torch.utils.data.DataLoader's); unset: the struct's default.
  std::optional<Value> python_default;
  /// kInt: a 64-bit seed. gpufeed.DataLoader takes torch.manual_seed's range, [-2^63, 2^64 - 1],
  /// and reads a value above 2^63 - 1 modulo 2^64 (seed s orders as s mod 2^64, as torch's).
  bool seed_range = false;
};

/// "num_workers" -> "num-workers".
inline std::string kebab(std::string_view name) {
  std::string s(name);
  for (char& c : s) c = c == '_' ? '-' : c;
  return s;
}

/// The number as the fronts print it: integers without a fraction, reals as the shortest text
/// that reads back to the same double ("0.08", "0.5", "1").
inline std::string format_number(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::abs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  for (int digits = 1; digits <= 17; ++digits) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) return buf;
  }
  return std::to_string(v);
}

/// A float field as the double its shortest decimal text names (0.08f -> 0.08, not
/// 0.07999999821186066), so defaults read as they were written.
inline double from_float(float f) {
  for (int digits = 1; digits <= 9; ++digits) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(f));
    if (std::strtof(buf, nullptr) == f) return std::strtod(buf, nullptr);
  }
  return f;
}

/// The value as text, as the CLI would accept it back ("true", "3", "0.08,1", "raise").
inline std::string format_value(const Value& v) {
  struct {
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const { return format_number(d); }
    std::string operator()(const std::string& s) const { return s; }
    std::string operator()(const std::vector<double>& l) const {
      std::string s;
      for (size_t i = 0; i < l.size(); ++i) {
        if (i) s += ',';
        s += format_number(l[i]);
      }
      return s;
    }
  } visit;
  return std::visit(visit, v);
}

/// What a spec accepts, in words: ">= 0", "in [0, 1]", "raise or skip", "2 numbers >= 0".
inline std::string accepted(const Spec& s) {
  std::string bounds;
  if (s.min && s.max) bounds = "in [" + format_number(*s.min) + ", " + format_number(*s.max) + "]";
  else if (s.min) bounds = ">= " + format_number(*s.min);
  else if (s.max) bounds = "<= " + format_number(*s.max);
  const auto words = [&] {
    std::string w;
    for (size_t i = 0; i < s.words.size(); ++i) {
      w += (i == 0 ? "" : i + 1 == s.words.size() ? " or " : ", ") + s.words[i];
    }
    return w;
  };
  switch (s.type) {
    case Type::kBool: return "true or false";
    case Type::kString: return "text";
    case Type::kChoice: return words();
    case Type::kInt:
    case Type::kFloat: {
      std::string a = (s.type == Type::kInt ? "an integer" : "a number") + (bounds.empty() ? "" : " " + bounds);
      return s.words.empty() ? a : a + " or " + words();
    }
    case Type::kFloats: {
      std::string n = s.sizes.empty() ? "a list of" : "";
      for (size_t i = 0; i < s.sizes.size(); ++i) n += (i ? " or " : "") + std::to_string(s.sizes[i]);
      return n + " numbers" + (bounds.empty() ? "" : " " + bounds);
    }
  }
  return "";
}

/// A value refused by its spec: std::invalid_argument whose message names the option in
/// backticks (respelled by the fronts: spell_options).
class OptionError : public std::invalid_argument {
 public:
  OptionError(const std::string& option, const std::string& message)
      : std::invalid_argument("`" + option + "` " + message), option_(option) {}
  const std::string& option() const noexcept { return option_; }

 private:
  std::string option_;
};

/// Checks `v` against `s`: type, bounds, words, list length. Returns the value normalised
/// (an integer given for a kFloat becomes a double). Throws OptionError:
/// "`num_workers` must be an integer >= 0, not -1".
inline Value check(const Spec& s, Value v) {
  const auto refuse = [&](const std::string& shown) -> Value {
    throw OptionError(s.name, "must be " + accepted(s) + ", not " + shown);
  };
  const auto in_bounds = [&](double x) {
    return std::isfinite(x) && (!s.min || x >= *s.min) && (!s.max || x <= *s.max);
  };
  const auto is_word = [&](const std::string& w) { return std::find(s.words.begin(), s.words.end(), w) != s.words.end(); };
  switch (s.type) {
    case Type::kBool:
      if (!std::holds_alternative<bool>(v)) return refuse(format_value(v));
      return v;
    case Type::kString:
      if (!std::holds_alternative<std::string>(v)) return refuse(format_value(v));
      return v;
    case Type::kChoice: {
      const auto* w = std::get_if<std::string>(&v);
      if (w == nullptr) return refuse(format_value(v));
      return is_word(*w) ? v : refuse("'" + *w + "'");
    }
    case Type::kInt: {
      if (const auto* w = std::get_if<std::string>(&v)) return is_word(*w) ? v : refuse("'" + *w + "'");
      const auto* i = std::get_if<int64_t>(&v);
      if (i == nullptr || !in_bounds(static_cast<double>(*i))) return refuse(format_value(v));
      return v;
    }
    case Type::kFloat: {
      if (const auto* w = std::get_if<std::string>(&v)) return is_word(*w) ? v : refuse("'" + *w + "'");
      if (const auto* i = std::get_if<int64_t>(&v)) v = static_cast<double>(*i);
      const auto* d = std::get_if<double>(&v);
      if (d == nullptr || !in_bounds(*d)) return refuse(format_value(v));
      return v;
    }
    case Type::kFloats: {
      if (const auto* d = std::get_if<double>(&v)) v = std::vector<double>{*d};
      if (const auto* i = std::get_if<int64_t>(&v)) v = std::vector<double>{static_cast<double>(*i)};
      const auto* l = std::get_if<std::vector<double>>(&v);
      if (l == nullptr) return refuse(format_value(v));
      bool size_ok = s.sizes.empty();
      for (const size_t n : s.sizes) size_ok = size_ok || l->size() == n;
      bool values_ok = true;
      for (const double x : *l) values_ok = values_ok && in_bounds(x);
      if (!size_ok || !values_ok) return refuse(format_value(v));
      return v;
    }
  }
  return v;
}

/// Parses the CLI's text for `s` and checks it: "true"/"false" (also 1/0, yes/no, on/off) for
/// kBool, integers, numbers, "a,b" lists. Throws OptionError naming the option.
inline Value parse(const Spec& s, const std::string& text) {
  const auto refuse = [&]() -> Value {
    throw OptionError(s.name, "must be " + accepted(s) + ", not '" + text + "'");
  };
  const auto number = [&](const std::string& t, double& out) {
    char* end = nullptr;
    out = std::strtod(t.c_str(), &end);
    return !t.empty() && end == t.c_str() + t.size();
  };
  switch (s.type) {
    case Type::kBool:
      if (text == "true" || text == "1" || text == "yes" || text == "on") return check(s, true);
      if (text == "false" || text == "0" || text == "no" || text == "off") return check(s, false);
      return refuse();
    case Type::kString:
    case Type::kChoice:
      return check(s, text);
    case Type::kInt: {
      char* end = nullptr;
      errno = 0;
      const long long i = std::strtoll(text.c_str(), &end, 10);
      if (!s.words.empty() && std::find(s.words.begin(), s.words.end(), text) != s.words.end()) return check(s, text);
      if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE) return refuse();
      return check(s, static_cast<int64_t>(i));
    }
    case Type::kFloat: {
      double d = 0;
      if (number(text, d)) return check(s, d);
      return check(s, text);  // a word, or the error naming the accepted values
    }
    case Type::kFloats: {
      std::vector<double> l;
      size_t start = 0;
      while (start <= text.size()) {
        const size_t comma = std::min(text.find(',', start), text.size());
        double d = 0;
        if (!number(text.substr(start, comma - start), d)) return refuse();
        l.push_back(d);
        start = comma + 1;
      }
      return check(s, l);
    }
  }
  return refuse();
}

/// Which front an error message is shown by.
enum class Front : uint8_t {
  kCli,     ///< `num_workers` -> --num-workers
  kPython,  ///< `num_workers` -> num_workers=
};

/// Rewrites every backticked option name (`snake_case`: lower-case letters, digits and
/// underscores) in `text` into the front's spelling; other backticked text is left as it is.
inline std::string spell_options(std::string_view text, Front front) {
  const auto is_name = [](std::string_view n) {
    if (n.empty() || !(n[0] >= 'a' && n[0] <= 'z')) return false;
    for (const char c : n) {
      if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
    }
    return true;
  };
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    const size_t open = text.find('`', i);
    if (open == std::string_view::npos) break;
    const size_t close = text.find('`', open + 1);
    if (close == std::string_view::npos) break;
    const std::string_view name = text.substr(open + 1, close - open - 1);
    out.append(text.substr(i, open - i));
    if (is_name(name)) {
      out += front == Front::kCli ? "--" + kebab(name) : std::string(name) + "=";
    } else {
      out.append(text.substr(open, close - open + 1));
    }
    i = close + 1;
  }
  out.append(text.substr(i));
  return out;
}

/// The schema `Make` returns, made on first use and kept (a function-local static: made once,
/// thread-safe). The schemas' accessors: `return options::made_once<make_loader_schema>();`.
template <auto Make>
const auto& made_once() {
  static const auto schema = Make();
  return schema;
}

/// One option of T: its spec and how it reads and writes T's field.
template <class T>
struct Field {
  Spec spec;
  std::function<void(T&, const Value&)> set;  ///< the value is checked against spec first
  std::function<Value(const T&)> get;
};

/// The options of one struct T, in the order the fronts list them.
template <class T>
class Schema {
 public:
  /// An option with its own reader and writer.
  Schema& add(Spec spec, std::function<void(T&, const Value&)> set, std::function<Value(const T&)> get) {
    fields_.push_back({std::move(spec), std::move(set), std::move(get)});
    return *this;
  }

  /// An option that is a member of T (bool, an integer, float/double or std::string; its Spec's
  /// type must fit).
  template <class M>
  Schema& member(Spec spec, M T::*field) {
    return add(std::move(spec), [field](T& t, const Value& v) { t.*field = from_value<M>(v); },
               [field](const T& t) { return to_value(t.*field); });
  }

  /// Every option of U's schema, reaching U inside T through `part`.
  template <class U, class Part>
  Schema& mount(const Schema<U>& schema, Part part) {
    for (const Field<U>& f : schema.fields()) {
      add(f.spec, [part, set = f.set](T& t, const Value& v) { set(part(t), v); },
          [part, get = f.get](const T& t) { return get(part(const_cast<T&>(t))); });
    }
    for (const auto& finish : schema.finishers()) {
      finishers_.push_back([part, finish](T& t, const std::set<std::string>& given) { finish(part(t), given); });
    }
    return *this;
  }

  /// Runs after a front has set the options it was given (their names in `given`): resolves
  /// derived defaults (image_size also setting the eval Resize, say).
  Schema& finish(std::function<void(T&, const std::set<std::string>&)> f) {
    finishers_.push_back(std::move(f));
    return *this;
  }

  const std::vector<Field<T>>& fields() const { return fields_; }
  const std::vector<std::function<void(T&, const std::set<std::string>&)>>& finishers() const { return finishers_; }

  /// The field named `name`, or nullptr.
  const Field<T>* find(std::string_view name) const {
    for (const auto& f : fields_) {
      if (f.spec.name == name) return &f;
    }
    return nullptr;
  }

  /// Sets the given options on `t` (each checked against its spec), then runs the finishers.
  /// Throws OptionError for an unknown name or a refused value.
  void apply(T& t, const std::map<std::string, Value>& given) const {
    std::set<std::string> names;
    for (const auto& [name, value] : given) {
      const Field<T>* f = find(name);
      if (f == nullptr) throw OptionError(name, "is not an option");
      f->set(t, check(f->spec, value));
      names.insert(name);
    }
    for (const auto& fin : finishers_) fin(t, names);
  }

  /// The default as the fronts show it: read off T{} (nullopt for a derived default).
  std::optional<Value> default_value(const Field<T>& f) const {
    if (!f.spec.derived_default.empty()) return std::nullopt;
    return f.get(T{});
  }

  /// Every option name.
  std::set<std::string> names() const {
    std::set<std::string> n;
    for (const auto& f : fields_) n.insert(f.spec.name);
    return n;
  }

  template <class M>
  static M from_value(const Value& v) {
    if constexpr (std::is_same_v<M, bool>) {
      return std::get<bool>(v);
    } else if constexpr (std::is_integral_v<M>) {
      return static_cast<M>(std::get<int64_t>(v));
    } else if constexpr (std::is_floating_point_v<M>) {
      return static_cast<M>(std::get<double>(v));
    } else {
      return std::get<std::string>(v);
    }
  }
  template <class M>
  static Value to_value(const M& m) {
    if constexpr (std::is_same_v<M, bool>) {
      return m;
    } else if constexpr (std::is_integral_v<M>) {
      return static_cast<int64_t>(m);
    } else if constexpr (std::is_same_v<M, float>) {
      return from_float(m);
    } else if constexpr (std::is_floating_point_v<M>) {
      return static_cast<double>(m);
    } else {
      return std::string(m);
    }
  }

 private:
  std::vector<Field<T>> fields_;
  std::vector<std::function<void(T&, const std::set<std::string>&)>> finishers_;
};

}  // namespace gpufeed::options
