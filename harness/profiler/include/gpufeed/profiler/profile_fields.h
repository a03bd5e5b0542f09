// The field list (gpufeed/fields.h) of the profiler's Verdict: the keys of the metrics summary's
// "verdict" object and of gpufeed.profile's result["verdict"]; profiler.h documents each field.
#pragma once
#include <string>
#include <tuple>

#include "gpufeed/fields.h"
#include "gpufeed/profiler/profiler.h"

namespace gpufeed::fields {

template <>
struct FieldList<profiler::Verdict> {
  using S = profiler::Verdict;
  /// "input", "compute" or "unknown".
  static std::string bound(const S& v) {
    return v.bound == S::Bound::kInput     ? "input"
           : v.bound == S::Bound::kCompute ? "compute"
                                           : "unknown";
  }
  static constexpr auto value =
      std::tuple{computed("bound", &bound, ""),
                 field("data_wait_fraction", &S::data_wait_fraction, "0..1"),
                 field("delivered_images_per_s", &S::delivered_images_per_s, "images/s"),
                 field("model_images_per_s", &S::model_images_per_s, "images/s"),
                 field("loader_images_per_s", &S::loader_images_per_s, "images/s"),
                 field("read_fraction", &S::read_fraction, "0..1"),
                 field("decode_fraction", &S::decode_fraction, "0..1"),
                 field("resize_fraction", &S::resize_fraction, "0..1"),
                 field("knob", &S::knob, ""),
                 field("text", &S::text, "")};
};

}  // namespace gpufeed::fields
