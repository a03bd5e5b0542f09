// The augmentation flags `gpufeed train` and `gpufeed bench` share (loader::AugmentOptions),
// named as torchvision's classification references name them where they have a name
// (--auto-augment, --ra-magnitude, --random-erase) and as gpufeed.DataLoader's keywords otherwise.
#include <fmt/format.h>

#include <sstream>
#include <stdexcept>

#include "commands.h"

namespace gpufeed::tools {
namespace {

// "0.4" -> brightness = contrast = saturation = 0.4, hue 0 (torchvision's references use
// ColorJitter with one value that way in older recipes); "b,c,s,h" -> each.
loader::ColorJitterOptions parse_color_jitter(const std::string& text) {
  std::vector<float> v;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      size_t used = 0;
      v.push_back(std::stof(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw std::invalid_argument(fmt::format("--color-jitter: '{}' is not a number", item));
    }
  }
  if (v.size() == 1) return {v[0], v[0], v[0], 0.0f};
  if (v.size() == 4) return {v[0], v[1], v[2], v[3]};
  throw std::invalid_argument(
      fmt::format("--color-jitter: expected B or B,C,S,H (brightness, contrast, saturation, hue), got '{}'", text));
}

}  // namespace

std::function<void()> add_augment_options(CLI::App& app, loader::AugmentOptions& o) {
  auto text = std::make_shared<std::map<std::string, std::string>>();
  const char* group = "Augmentation (train transform, per sample, after RandomResizedCrop + flip)";
  app.add_option("--auto-augment", (*text)["auto_augment"],
                 "ta_wide (TrivialAugmentWide), ra (RandAugment) or imagenet (AutoAugment's ImageNet policy)")
      ->check(CLI::IsMember({"none", "ta_wide", "ra", "imagenet"}))
      ->group(group);
  app.add_option("--augment-interpolation", (*text)["augment_interpolation"],
                 "the policy's interpolation for its geometric ops: nearest (torchvision's default) or "
                 "bilinear (the references' --interpolation)")
      ->check(CLI::IsMember({"nearest", "bilinear"}))
      ->group(group);
  app.add_option("--ra-magnitude", o.ra_magnitude, "RandAugment magnitude bin, 0..30")->capture_default_str()->group(group);
  app.add_option("--ra-num-ops", o.ra_num_ops, "RandAugment ops per sample")->capture_default_str()->group(group);
  app.add_option("--color-jitter", (*text)["color_jitter"],
                 "ColorJitter: B (brightness = contrast = saturation = B) or B,C,S,H")
      ->group(group);
  app.add_option("--random-erase", o.random_erasing.p, "RandomErasing probability (0 = off)")
      ->capture_default_str()->group(group);
  app.add_option("--random-erase-value", (*text)["random_erase_value"],
                 "RandomErasing value in normalised units, or random (default 0: the mean colour)")
      ->group(group);
  // Runs after parsing: the text options into `o`, then the whole set validated.
  return [&o, text] {
    if (const auto& p = (*text)["auto_augment"]; !p.empty()) o.auto_augment = loader::parse_auto_augment(p);
    if (const auto& j = (*text)["color_jitter"]; !j.empty()) o.color_jitter = parse_color_jitter(j);
    if (const auto& m = (*text)["augment_interpolation"]; !m.empty()) o.interpolation = loader::parse_interpolation(m);
    if (const auto& v = (*text)["random_erase_value"]; !v.empty()) {
      if (v == "random") {
        o.random_erasing.random_value = true;
      } else {
        try {
          size_t used = 0;
          o.random_erasing.value = std::stof(v, &used);
          if (used != v.size()) throw std::invalid_argument(v);
        } catch (const std::exception&) {
          throw std::invalid_argument(fmt::format("--random-erase-value: '{}' is neither a number nor random", v));
        }
      }
    }
    try {
      o.validate();
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string("augmentation options: ") + e.what());
    }
  };
}

}  // namespace gpufeed::tools
