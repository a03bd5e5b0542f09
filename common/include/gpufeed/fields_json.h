// The JSON emitter of gpufeed/fields.h's field lists (the profiler's metrics, `gpufeed bench
// --json`): a reported struct is an object of its fields, in nlohmann::json's key order.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "gpufeed/fields.h"

namespace gpufeed::fields {

template <class V>
nlohmann::json to_json(const V& value);

namespace detail {
template <class V>
struct JsonOf {
  static nlohmann::json of(const V& v) { return v; }
};
template <class V>
struct JsonOf<std::vector<V>> {
  static nlohmann::json of(const std::vector<V>& v) {
    nlohmann::json out = nlohmann::json::array();
    for (const V& x : v) out.push_back(to_json(x));
    return out;
  }
};
template <class V>
struct JsonOf<std::map<std::string, V>> {
  static nlohmann::json of(const std::map<std::string, V>& m) {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& [k, x] : m) out[k] = to_json(x);
    return out;
  }
};
template <class V>
struct JsonOf<std::optional<V>> {
  static nlohmann::json of(const std::optional<V>& v) {
    return v ? to_json(*v) : nlohmann::json(nullptr);
  }
};
}  // namespace detail

/// A reported struct as an object of its fields (nested structs, vectors and maps recursively);
/// anything else as nlohmann::json converts it.
template <class V>
nlohmann::json to_json(const V& value) {
  if constexpr (Reported<V>) {
    nlohmann::json out = nlohmann::json::object();
    for_each_field(
        value, [&](std::string_view name, const auto& x) { out[std::string(name)] = to_json(x); });
    return out;
  } else {
    return detail::JsonOf<V>::of(value);
  }
}

}  // namespace gpufeed::fields
