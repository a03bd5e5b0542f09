#pragma once
// The option sets of the loader's fronts (gpufeed/option_sets.h), each named once: the fronts
// iterate these lists instead of naming schemas.

#include <vector>

#include "gpufeed/option_sets.h"

namespace gpufeed::loader {

/// gpufeed.DataLoader's schema keywords, `gpufeed bench`'s and (with the trainer's own sets)
/// `gpufeed train`'s loader flags, in the order they are listed: "loader"
/// (loader_options_schema(), the transform's and augmentations' rows mounted) then "data"
/// (data_options_schema()). No name is in both.
const std::vector<options::OptionSet>& dataloader_option_sets();

}  // namespace gpufeed::loader
