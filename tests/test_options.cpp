// The option schema (gpufeed/option.h) and the loader's rows (loader/src/options.cpp): defaults
// read off the structs, values set by name with the fronts' checks, refusals naming the option,
// the CLI's text parsing, and the fronts' spelling of option names in messages.
#include <gtest/gtest.h>

#include <string>

#include "gpufeed/datasets/dataset.h"
#include "gpufeed/loader/loader.h"
#include "gpufeed/option.h"

namespace {

using gpufeed::loader::LoaderOptions;
using gpufeed::transforms::TransformOptions;
namespace options = gpufeed::options;

const auto& schema() { return gpufeed::loader::loader_options_schema(); }

options::Value default_of(const std::string& name) {
  const auto* f = schema().find(name);
  EXPECT_NE(f, nullptr) << name;
  return *schema().default_value(*f);
}

std::string refusal(const std::map<std::string, options::Value>& given) {
  LoaderOptions o;
  try {
    schema().apply(o, given);
  } catch (const std::invalid_argument& e) {  // options::OptionError, or the struct's validate()
    return e.what();
  }
  return "";
}

TEST(OptionSchema, DefaultsAreTheStructsOwnAsWritten) {
  EXPECT_EQ(std::get<int64_t>(default_of("batch_size")), LoaderOptions{}.batch_size);
  EXPECT_EQ(std::get<int64_t>(default_of("prefetch_depth")), 3);
  EXPECT_EQ(std::get<std::string>(default_of("on_error")), "raise");
  EXPECT_EQ(std::get<std::string>(default_of("decode_device")), "cpu");
  EXPECT_EQ(options::format_value(default_of("gpu_decode_budget")), "0.25");
  EXPECT_EQ(std::get<bool>(default_of("train")), true);
  // float fields read as their decimal text: 0.08f is 0.08, not 0.07999999821186066
  EXPECT_EQ(std::get<std::vector<double>>(default_of("scale")), (std::vector<double>{0.08, 1.0}));
  EXPECT_EQ(options::format_value(default_of("mean")), "0.485,0.456,0.406");
  EXPECT_EQ(options::format_value(default_of("ratio")), "0.75,1.3333334");
  // A derived default has no value of its own.
  EXPECT_FALSE(schema().default_value(*schema().find("resize_size")).has_value());
  // Every row once, snake_case.
  std::set<std::string> seen;
  for (const auto& f : schema().fields()) {
    EXPECT_TRUE(seen.insert(f.spec.name).second) << f.spec.name;
    for (const char c : f.spec.name) EXPECT_TRUE((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_');
  }
  EXPECT_EQ(seen.size(), 40u);
  // shuffle_order and its knobs: auto, and ShardOrderOptions' own window and partitions.
  EXPECT_EQ(std::get<std::string>(default_of("shuffle_order")), "auto");
  EXPECT_EQ(std::get<int64_t>(default_of("shard_window")), 8);
  EXPECT_EQ(std::get<int64_t>(default_of("shard_partitions")), 24);
}

TEST(OptionSchema, ApplySetsTheFieldsAndResolvesDerivedDefaults) {
  LoaderOptions o;
  schema().apply(o, {{"num_workers", int64_t{8}}, {"color_jitter", std::vector<double>{0.4}},
                     {"random_erase_value", std::string("random")}, {"on_error", std::string("skip")},
                     {"strict_decode", true}, {"seed", int64_t{-1}}});
  EXPECT_EQ(o.num_workers, 8);
  EXPECT_FLOAT_EQ(o.transform.augment.color_jitter.brightness, 0.4f);
  EXPECT_FLOAT_EQ(o.transform.augment.color_jitter.saturation, 0.4f);
  EXPECT_FLOAT_EQ(o.transform.augment.color_jitter.hue, 0.0f);
  EXPECT_TRUE(o.transform.augment.random_erasing.random_value);
  EXPECT_EQ(o.error_policy, gpufeed::loader::ErrorPolicy::kSkip);
  EXPECT_TRUE(o.decode.strict);
  EXPECT_EQ(o.seed, ~uint64_t{0});  // torch.manual_seed(-1)'s seed, mod 2**64
  // image_size sets both crops; the eval Resize follows it unless resize_size is given
  // (TransformOptions::imagenet: round(size x 256 / 224)).
  LoaderOptions eval;
  schema().apply(eval, {{"train", false}, {"image_size", int64_t{32}}});
  EXPECT_EQ(eval.transform.kind, TransformOptions::Kind::kEval);
  EXPECT_EQ(eval.transform.eval.crop, 32);
  EXPECT_EQ(eval.transform.eval.resize, 37);
  EXPECT_EQ(eval.transform.rrc.size, 32);
  schema().apply(eval, {{"resize_size", int64_t{40}}});
  EXPECT_EQ(eval.transform.eval.resize, 40);
  LoaderOptions at_224;
  schema().apply(at_224, {});
  EXPECT_EQ(at_224.transform.eval.resize, 256);
}

// The self-supervised recipes' rows: the resize interpolation and the per-crop ops (DINO's
// settings), their defaults (off, bilinear) and their refusals.
TEST(OptionSchema, InterpolationAndSslOpRowsSetTheirFields) {
  EXPECT_EQ(std::get<std::string>(default_of("interpolation")), "bilinear");
  EXPECT_EQ(std::get<double>(default_of("color_jitter_p")), 1.0);
  EXPECT_EQ(std::get<double>(default_of("grayscale_p")), 0.0);
  EXPECT_EQ(std::get<double>(default_of("gaussian_blur_p")), 0.0);
  EXPECT_EQ(std::get<int64_t>(default_of("gaussian_blur_kernel")), 9);
  EXPECT_EQ(options::format_value(default_of("gaussian_blur_sigma")), "0.1,2");
  EXPECT_EQ(std::get<double>(default_of("solarize_threshold")), 128.0);
  LoaderOptions o;
  schema().apply(o, {{"interpolation", std::string("bicubic")}, {"scale", std::vector<double>{0.32, 1}},
                     {"color_jitter", std::vector<double>{0.4, 0.4, 0.2, 0.1}}, {"color_jitter_p", 0.8},
                     {"grayscale_p", 0.2}, {"gaussian_blur_p", 0.1}, {"gaussian_blur_kernel", int64_t{9}},
                     {"gaussian_blur_sigma", std::vector<double>{0.1, 2.0}}, {"solarize_p", 0.2},
                     {"solarize_threshold", 128.0}});
  const auto& a = o.transform.augment;
  EXPECT_EQ(o.transform.interpolation, gpufeed::transforms::ResizeFilter::kBicubic);
  EXPECT_FLOAT_EQ(a.color_jitter_p, 0.8f);
  EXPECT_FLOAT_EQ(a.grayscale_p, 0.2f);
  EXPECT_FLOAT_EQ(a.gaussian_blur.p, 0.1f);
  EXPECT_EQ(a.gaussian_blur.kernel_size, 9);
  EXPECT_FLOAT_EQ(a.gaussian_blur.sigma_min, 0.1f);
  EXPECT_FLOAT_EQ(a.gaussian_blur.sigma_max, 2.0f);
  EXPECT_FLOAT_EQ(a.solarize_p, 0.2f);
  EXPECT_FLOAT_EQ(a.solarize_threshold, 128.0f);
  EXPECT_EQ(gpufeed::transforms::to_string(a),
            "color_jitter=0.4,0.4,0.2,0.1 color_jitter_p=0.8 grayscale_p=0.2 gaussian_blur_p=0.1 (kernel 9, sigma "
            "0.1..2) solarize_p=0.2 (threshold 128)");
  EXPECT_EQ(refusal({{"interpolation", std::string("lanczos")}}),
            "`interpolation` must be bilinear or bicubic, not 'lanczos'");
  EXPECT_EQ(refusal({{"grayscale_p", 1.5}}), "`grayscale_p` must be a number in [0, 1], not 1.5");
  EXPECT_EQ(refusal({{"gaussian_blur_sigma", std::vector<double>{2, 0.1}}}),
            "`gaussian_blur_sigma` must be (min, max) with min <= max, not (2, 0.1)");
  EXPECT_EQ(refusal({{"gaussian_blur_kernel", int64_t{8}}}), "`gaussian_blur_kernel` must be an odd number >= 1, got 8");
  EXPECT_EQ(refusal({{"solarize_threshold", 300.0}}), "`solarize_threshold` must be a number in [0, 255], not 300");
  // The blur's reflect padding (kernel_size / 2) must be smaller than the crop.
  EXPECT_EQ(refusal({{"image_size", int64_t{4}}, {"gaussian_blur_p", 0.5}}),
            "`gaussian_blur_kernel` must be below 2 x `image_size` + 1 (reflect padding of 4 on a 4 pixel crop), "
            "not 9");
  EXPECT_EQ(refusal({{"image_size", int64_t{5}}, {"gaussian_blur_p", 0.5}}), "");
}

TEST(OptionSchema, RefusalsNameTheOptionAndWhatItAccepts) {
  EXPECT_EQ(refusal({{"num_workers", int64_t{-1}}}), "`num_workers` must be an integer in [0, 1024] or auto, not -1");
  EXPECT_EQ(refusal({{"num_workers", std::string("many")}}),
            "`num_workers` must be an integer in [0, 1024] or auto, not 'many'");
  EXPECT_EQ(refusal({{"batch_size", int64_t{0}}}), "`batch_size` must be an integer >= 1, not 0");
  EXPECT_EQ(refusal({{"on_error", std::string("ignore")}}), "`on_error` must be raise or skip, not 'ignore'");
  EXPECT_EQ(refusal({{"scale", std::vector<double>{1, 0.08}}}),
            "`scale` must be (min, max) with min <= max, not (1, 0.08)");
  EXPECT_EQ(refusal({{"scale", std::vector<double>{0.1, 0.5, 1}}}), "`scale` must be 2 numbers in [0, 1], not 0.1,0.5,1");
  EXPECT_EQ(refusal({{"color_jitter", std::vector<double>{0.1, 0.2}}}),
            "`color_jitter` must be 1 or 4 numbers >= 0, not 0.1,0.2");
  EXPECT_EQ(refusal({{"random_erase", 1.5}}), "`random_erase` must be a number in [0, 1], not 1.5");
  EXPECT_EQ(refusal({{"batch_size", 2.5}}), "`batch_size` must be an integer >= 1, not 2.5");
  EXPECT_EQ(refusal({{"nope", int64_t{1}}}), "`nope` is not an option");
  EXPECT_EQ(refusal({{"train", false}, {"image_size", int64_t{32}}, {"resize_size", int64_t{16}}}),
            "`resize_size` must be >= `image_size` (CenterCrop of the Resize), not 16 < 32");
  // The struct's own validate() runs last, its messages naming options too.
  EXPECT_NE(refusal({{"auto_augment", std::string("ra")}, {"ra_magnitude", int64_t{31}}}).find("`ra_magnitude`"),
            std::string::npos);
}

TEST(OptionSchema, TheLoadersRulesBetweenFieldsAreCheckedOnceForTheFrontsAndTheConstructor) {
  // LoaderOptions::validate() is the one place of the Loader's rules: the schema runs it after a
  // front set its options, so a keyword or flag is refused with the text a C++ caller gets from
  // Loader's constructor.
  const std::string text = "max_image_size 16 is below the transform's output size 32";
  EXPECT_NE(refusal({{"image_size", int64_t{32}}, {"max_image_size", int64_t{16}}}).find(text), std::string::npos);
  LoaderOptions o;
  o.transform.rrc.size = o.transform.eval.crop = 32;
  o.max_image_size = 16;
  try {
    o.validate();
    ADD_FAILURE() << "validate() accepted max_image_size below the output size";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
  o.max_image_size = 0;  // the output size
  EXPECT_NO_THROW(o.validate());
  EXPECT_EQ(refusal({{"image_size", int64_t{32}}, {"max_image_size", int64_t{64}}}), "");
}

TEST(OptionSchema, CliTextParsesToTheSameValues) {
  const auto& spec = [](const char* name) -> const options::Spec& { return schema().find(name)->spec; };
  EXPECT_EQ(std::get<std::vector<double>>(options::parse(spec("scale"), "0.25,1")), (std::vector<double>{0.25, 1}));
  EXPECT_EQ(std::get<bool>(options::parse(spec("drop_last"), "off")), false);
  EXPECT_EQ(std::get<double>(options::parse(spec("random_erase"), "1")), 1.0);
  EXPECT_EQ(std::get<std::string>(options::parse(spec("random_erase_value"), "random")), "random");
  EXPECT_EQ(std::get<double>(options::parse(spec("random_erase_value"), "-0.5")), -0.5);
  EXPECT_EQ(std::get<std::string>(options::parse(spec("num_workers"), "auto")), "auto");
  EXPECT_EQ(std::get<int64_t>(options::parse(spec("num_workers"), "3")), 3);
  // "auto" is kAutoNumWorkers in the struct, and reads back as "auto".
  LoaderOptions tuned;
  schema().apply(tuned, {{"num_workers", std::string("auto")}});
  EXPECT_EQ(tuned.num_workers, gpufeed::loader::kAutoNumWorkers);
  EXPECT_EQ(std::get<std::string>(schema().find("num_workers")->get(tuned)), "auto");
  const auto text_refusal = [&](const char* name, const char* text) {
    try {
      options::parse(spec(name), text);
    } catch (const options::OptionError& e) {
      EXPECT_EQ(e.option(), name);
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(text_refusal("num_workers", "1e3"), "`num_workers` must be an integer in [0, 1024] or auto, not '1e3'");
  EXPECT_EQ(text_refusal("num_workers", "Auto"), "`num_workers` must be an integer in [0, 1024] or auto, not 'Auto'");
  EXPECT_EQ(text_refusal("random_erase_value", "x"), "`random_erase_value` must be a number or random, not 'x'");
  EXPECT_EQ(text_refusal("scale", "0.1,x"), "`scale` must be 2 numbers in [0, 1], not '0.1,x'");
}

TEST(OptionSchema, EachFrontSpellsOptionNamesItsOwnWay) {
  const std::string text = "raise `num_workers` from 1 to 4, or see `torch.compile` and `Loader`";
  EXPECT_EQ(options::spell_options(text, options::Front::kCli),
            "raise --num-workers from 1 to 4, or see `torch.compile` and `Loader`");
  EXPECT_EQ(options::spell_options(text, options::Front::kPython),
            "raise num_workers= from 1 to 4, or see `torch.compile` and `Loader`");
  EXPECT_EQ(options::spell_options("an unmatched ` stays", options::Front::kCli), "an unmatched ` stays");
}

}  // namespace
