// The Python emitter of gpufeed/fields.h's field lists: a reported struct is a dict of its
// fields in the list's order (int for integers, float for doubles, bool, str, None for an empty
// optional; nested structs, vectors and string-keyed maps recursively).
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gpufeed/fields.h"

namespace gpufeed::python {

template <class V>
nanobind::object to_py(const V& value);

namespace detail {
template <class V>
struct PyOf {
  static nanobind::object of(const V& v) { return nanobind::cast(v); }
};
template <class V>
struct PyOf<std::vector<V>> {
  static nanobind::object of(const std::vector<V>& v) {
    nanobind::list out;
    for (const V& x : v) out.append(to_py(x));
    return out;
  }
};
template <class V>
struct PyOf<std::map<std::string, V>> {
  static nanobind::object of(const std::map<std::string, V>& m) {
    nanobind::dict out;
    for (const auto& [k, x] : m) out[k.c_str()] = to_py(x);
    return out;
  }
};
template <class V>
struct PyOf<std::optional<V>> {
  static nanobind::object of(const std::optional<V>& v) { return v ? to_py(*v) : nanobind::none(); }
};
}  // namespace detail

/// A reported struct as a dict of its fields; anything else as nanobind casts it.
template <class V>
nanobind::object to_py(const V& value) {
  if constexpr (fields::Reported<V>) {
    nanobind::dict out;
    fields::for_each_field(value, [&](std::string_view name, const auto& x) {
      out[nanobind::str(name.data(), name.size())] = to_py(x);
    });
    return out;
  } else {
    return detail::PyOf<V>::of(value);
  }
}

/// to_py() of a reported struct, typed as the dict it is.
template <fields::Reported V>
nanobind::dict to_dict(const V& value) {
  return nanobind::borrow<nanobind::dict>(to_py(value));
}

/// The list's names, in order: the keys to_dict() writes.
template <fields::Reported V>
nanobind::list field_names() {
  nanobind::list out;
  for (std::string_view name : fields::field_names<V>())
    out.append(nanobind::str(name.data(), name.size()));
  return out;
}

}  // namespace gpufeed::python
