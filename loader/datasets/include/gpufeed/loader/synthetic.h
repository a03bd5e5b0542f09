#pragma once
// Forwarding header: this room's header is <gpufeed/datasets/synthetic.h> and its names are in
// gpufeed::datasets. The old path and the gpufeed::loader:: spellings keep compiling through this file
// for the 0.x releases (docs/API.md, "Header paths and namespaces"); new code includes the header
// above. tools/check_layers.py refuses an include of this file inside the project.
#include "gpufeed/datasets/synthetic.h"

namespace gpufeed::loader {
using namespace gpufeed::datasets;  // NOLINT(google-build-using-namespace): the old spellings
}  // namespace gpufeed::loader
