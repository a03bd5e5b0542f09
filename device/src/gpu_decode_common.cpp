// The parts of gpufeed/device/gpu_decode.h every build has: the region rule and the library's name.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "gpufeed/device/gpu_decode.h"

namespace gpufeed::device {

decode::CropRect gpu_decode_region(const transforms::SamplePlan& plan, int width, int height) {
  if (plan.taps_clamped_to_box) return plan.box;
  // Eval: the filter's taps run on past the box, up to support * max(region / output, 1) source
  // pixels from an output pixel's centre; one pixel more covers the rounding of the tap range.
  const double support = plan.filter == transforms::ResizeFilter::kBicubic ? 2.0 : 1.0;
  const double out = std::max(plan.output_size, 1);
  const int mx = static_cast<int>(std::ceil(support * std::max(plan.region.width() / out, 1.0))) + 1;
  const int my = static_cast<int>(std::ceil(support * std::max(plan.region.height() / out, 1.0))) + 1;
  const int x0 = std::max(plan.box.x - mx, 0), y0 = std::max(plan.box.y - my, 0);
  const int x1 = std::min(plan.box.x + plan.box.width + mx, width);
  const int y1 = std::min(plan.box.y + plan.box.height + my, height);
  return decode::CropRect{x0, y0, x1 - x0, y1 - y0};
}

std::string nvimgcodec_library() {
  const char* env = std::getenv("GPUFEED_NVIMGCODEC_LIBRARY");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string("libnvimgcodec.so.0");
}

}  // namespace gpufeed::device
