// The sub-rooms' headers at their old paths (gpufeed/loader/dataset.h, gpufeed/harness/profiler.h, ...)
// forward to the new ones and keep the old namespace spellings (gpufeed::loader::Dataset,
// gpufeed::harness::Profiler) naming the very same entities, for code written against 0.1
// (docs/API.md, "Header paths and namespaces"). This is the one file in the project that includes
// them (tools/check_layers.py refuses the old paths anywhere else).

#include <gtest/gtest.h>

#include <type_traits>

#include "gpufeed/loader/augment.h"
#include "gpufeed/loader/dataset.h"
#include "gpufeed/loader/remote.h"
#include "gpufeed/loader/resize.h"
#include "gpufeed/loader/shards.h"
#include "gpufeed/loader/synthetic.h"
#include "gpufeed/loader/transform.h"
#ifdef GPUFEED_TEST_PROFILER_FORWARDERS
#include "gpufeed/harness/atomic_file.h"
#include "gpufeed/harness/profiler.h"
#include "gpufeed/harness/progress.h"
#endif

namespace {

static_assert(std::is_same_v<gpufeed::loader::Dataset, gpufeed::datasets::Dataset>);
static_assert(std::is_same_v<gpufeed::loader::ImageFolderOptions, gpufeed::datasets::ImageFolderOptions>);
static_assert(std::is_same_v<gpufeed::loader::TarShards, gpufeed::datasets::TarShards>);
static_assert(std::is_same_v<gpufeed::loader::SyntheticOptions, gpufeed::datasets::SyntheticOptions>);
static_assert(std::is_same_v<gpufeed::loader::TransformOptions, gpufeed::transforms::TransformOptions>);
static_assert(std::is_same_v<gpufeed::loader::AugmentPlan, gpufeed::transforms::AugmentPlan>);
static_assert(std::is_same_v<gpufeed::loader::ResizeFilter, gpufeed::transforms::ResizeFilter>);
#ifdef GPUFEED_TEST_PROFILER_FORWARDERS
static_assert(std::is_same_v<gpufeed::harness::Profiler, gpufeed::profiler::Profiler>);
static_assert(std::is_same_v<gpufeed::harness::ProgressMode, gpufeed::profiler::ProgressMode>);
#endif

TEST(ForwardingHeaders, TheOldSpellingsCallTheNewFunctions) {
  namespace gl = gpufeed::loader;
  EXPECT_TRUE(gl::is_url("s3://bucket/train-{000..005}.tar"));
  EXPECT_FALSE(gl::is_url("/data/train"));
  const gl::TransformOptions eval = gl::TransformOptions::imagenet(gl::TransformOptions::Kind::kEval, 224);
  const gpufeed::transforms::TransformOptions same =
      gpufeed::transforms::TransformOptions::imagenet(gpufeed::transforms::TransformOptions::Kind::kEval, 224);
  EXPECT_EQ(eval.output_size(), same.output_size());
  EXPECT_EQ(eval.output_size(), 224);
  EXPECT_EQ(&gl::transform_options_schema(), &gpufeed::transforms::transform_options_schema());
}

}  // namespace
