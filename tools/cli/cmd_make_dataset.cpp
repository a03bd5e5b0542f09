#include <iostream>

#include "commands.h"
#include "gpufeed/datasets/synthetic.h"

namespace gpufeed::tools {

Run add_make_dataset(CLI::App& app) {
  auto out = std::make_shared<std::string>();
  auto o = std::make_shared<datasets::SyntheticOptions>();
  app.add_option("--out", *out, "folder to write (root/class_XXX/img_YYYYY.jpg)")->required();
  app.add_option("--classes", o->num_classes, "number of classes")->capture_default_str()->check(kAtLeastOne);
  app.add_option("--per-class", o->images_per_class, "images per class")->capture_default_str()->check(kAtLeastOne);
  app.add_option("--min-size", o->min_size, "smallest side, pixels")->capture_default_str()->check(kAtLeastOne);
  app.add_option("--max-size", o->max_size, "largest side, pixels")->capture_default_str()->check(kAtLeastOne);
  app.add_option("--quality", o->quality, "JPEG quality")->capture_default_str()->check(CLI::Range(1, 100));
  app.add_option("--seed", o->seed, "same seed, same bytes")->capture_default_str();
  return [out, o] {
    const int64_t n = datasets::write_synthetic_image_folder(*out, *o);
    std::cout << "wrote " << n << " JPEGs in " << o->num_classes << " classes to " << *out << "\n";
    return 0;
  };
}

}  // namespace gpufeed::tools
