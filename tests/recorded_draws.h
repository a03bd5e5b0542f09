#pragma once
// Replays the random draws torchvision made (recorded by tests/goldens/draw_recorder.py) into a
// gpufeed plan: every draw the plan asks for must have the kind and range torchvision's had.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "gpufeed/transforms/transform.h"

namespace gpufeed::test {

// Replays torchvision's recorded draws; every draw must have the same kind and range.
class RecordedDraws : public transforms::DrawSource {
 public:
  explicit RecordedDraws(const nlohmann::json& draws) : draws_(draws) {}
  float uniform(float lo, float hi) override {
    const auto& d = next("uniform");
    EXPECT_FLOAT_EQ(lo, d["lo"].get<float>());
    EXPECT_FLOAT_EQ(hi, d["hi"].get<float>());
    return d["value"].get<float>();
  }
  int64_t randint(int64_t lo, int64_t hi) override {
    const auto& d = next("randint");
    EXPECT_EQ(lo, d["lo"].get<int64_t>());
    EXPECT_EQ(hi, d["hi"].get<int64_t>());
    return d["value"].get<int64_t>();
  }
  void randperm(int n, int* out) override {
    const auto& d = next("randperm");
    EXPECT_EQ(n, d["n"].get<int>());
    for (int k = 0; k < n; ++k) out[k] = d["value"][static_cast<size_t>(k)].get<int>();
  }
  void normal(float* out, size_t n) override {
    const auto& d = next("normal");
    EXPECT_EQ(n, d["value"].size());
    for (size_t k = 0; k < n; ++k) out[k] = d["value"][k].get<float>();
  }
  size_t used() const { return pos_; }

 private:
  const nlohmann::json& next(const char* kind) {
    if (pos_ >= draws_.size()) throw std::runtime_error("the plan drew more than torchvision did");
    const auto& d = draws_[pos_++];
    if (d["kind"] != kind) {
      throw std::runtime_error(std::string("expected a ") + kind + " draw, torchvision made a " +
                               d["kind"].get<std::string>() + " draw at position " + std::to_string(pos_ - 1));
    }
    return d;
  }
  const nlohmann::json& draws_;
  size_t pos_ = 0;
};

}  // namespace gpufeed::test
