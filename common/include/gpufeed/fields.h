// One declared field list per reported struct: the Python dicts (python/src/fields_dict.h) and
// the JSON records (gpufeed/fields_json.h) are made from it, so a field is named, read and
// documented once. Header-only; no torch, no fmt, no JSON library.
//
//   template <> struct gpufeed::fields::FieldList<Stats> {
//     static constexpr auto value = std::tuple{
//         fields::field("samples", &Stats::samples, "count"),
//         fields::computed<Stats>("rate", +[](const Stats& s) { return s.n / s.t; }, "1/s")};
//   };
//   fields::for_each_field(stats, [](std::string_view name, const auto& value) { ... });
//
// A list's order is the order of the keys the emitters write (a Python dict keeps it).
#pragma once
#include <cstddef>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

namespace gpufeed::fields {

/// A data member reported under `name`; `unit` documents its unit ("s", "bytes", "count", ...;
/// "" for text and flags).
template <class T, class V>
struct Field {
  std::string_view name;
  V T::*member;
  std::string_view unit;
  const V& get(const T& object) const { return object.*member; }
};

/// A value computed from the struct (a rate, an enum's spelling), reported under `name`.
template <class T, class V>
struct Computed {
  std::string_view name;
  V (*read)(const T&);
  std::string_view unit;
  V get(const T& object) const { return read(object); }
};

template <class T, class V>
constexpr Field<T, V> field(std::string_view name, V T::*member, std::string_view unit) {
  return {name, member, unit};
}

template <class T, class V>
constexpr Computed<T, V> computed(std::string_view name, V (*read)(const T&),
                                  std::string_view unit) {
  return {name, read, unit};
}

/// Specialised beside each reported struct: `static constexpr auto value = std::tuple{...}` of
/// field() and computed() entries.
template <class T>
struct FieldList;

/// T has a declared field list.
template <class T>
concept Reported = requires {
  FieldList<T>::value;
};

/// Calls f(name, value) for each field of `object`, in the list's order.
template <Reported T, class F>
void for_each_field(const T& object, F&& f) {
  std::apply([&](const auto&... entry) { (f(entry.name, entry.get(object)), ...); },
             FieldList<T>::value);
}

/// The list's names, in order.
template <Reported T>
std::vector<std::string_view> field_names() {
  return std::apply(
      [](const auto&... entry) { return std::vector<std::string_view>{entry.name...}; },
      FieldList<T>::value);
}

namespace detail {
template <class E>
inline constexpr bool kCounter = false;
template <class T, class V>
inline constexpr bool kCounter<Field<T, V>> = std::is_arithmetic_v<V> && !std::is_same_v<V, bool>;

template <class T, class E>
void subtract(T& now, const T& since, const E& entry) {
  if constexpr (kCounter<E>) now.*(entry.member) -= since.*(entry.member);
}
}  // namespace detail

/// `now` with each numeric data member of the list (counters and summed times) less `since`'s:
/// what accrued between two snapshots. Other members keep `now`'s values.
template <Reported T>
T difference(T now, const T& since) {
  std::apply([&](const auto&... entry) { (detail::subtract(now, since, entry), ...); },
             FieldList<T>::value);
  return now;
}

}  // namespace gpufeed::fields
