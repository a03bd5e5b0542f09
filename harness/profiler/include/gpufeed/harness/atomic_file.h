#pragma once
// Forwarding header: this room's header is <gpufeed/profiler/atomic_file.h> and its names are in
// gpufeed::profiler. The old path and the gpufeed::harness:: spellings keep compiling through this file
// for the 0.x releases (docs/API.md, "Header paths and namespaces"); new code includes the header
// above. tools/check_layers.py refuses an include of this file inside the project.
#include "gpufeed/profiler/atomic_file.h"

namespace gpufeed::harness {
using namespace gpufeed::profiler;  // NOLINT(google-build-using-namespace): the old spellings
}  // namespace gpufeed::harness
