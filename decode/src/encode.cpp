// encode_jpeg through TurboJPEG (the only use of turbojpeg.h: decoding goes through the libjpeg
// API, which TurboJPEG 2.1 lacks crop/skip for).

#include <fmt/format.h>
#include <turbojpeg.h>

#include <climits>
#include <memory>
#include <stdexcept>

#include "gpufeed/decode/decoder.h"

namespace gpufeed::decode {

namespace {

struct TjHandleCloser {
  void operator()(void* handle) const { tjDestroy(handle); }
};
using TjHandle = std::unique_ptr<void, TjHandleCloser>;

struct TjBufferFree {
  void operator()(unsigned char* buffer) const { tjFree(buffer); }
};

int tj_subsampling(Subsampling subsampling) {
  switch (subsampling) {
    case Subsampling::k444:
      return TJSAMP_444;
    case Subsampling::k422:
      return TJSAMP_422;
    case Subsampling::k420:
      return TJSAMP_420;
    case Subsampling::kGray:
      return TJSAMP_GRAY;
    case Subsampling::k440:
      return TJSAMP_440;
    case Subsampling::k411:
      return TJSAMP_411;
    case Subsampling::kNone:
      break;
  }
  throw std::invalid_argument("encode_jpeg: subsampling must not be kNone");
}

}  // namespace

std::vector<uint8_t> encode_jpeg(const uint8_t* rgb, int width, int height, int quality,
                                 Subsampling subsampling) {
  if (!rgb) throw std::invalid_argument("encode_jpeg: null image");
  if (width <= 0 || height <= 0 || width > INT_MAX / 3)
    throw std::invalid_argument(fmt::format("encode_jpeg: invalid size {}x{}", width, height));
  if (quality < 1 || quality > 100)
    throw std::invalid_argument(fmt::format("encode_jpeg: quality {} is outside 1..100", quality));
  const int samp = tj_subsampling(subsampling);

  TjHandle handle(tjInitCompress());
  if (!handle) throw std::runtime_error(fmt::format("tjInitCompress: {}", tjGetErrorStr2(nullptr)));
  unsigned char* jpeg = nullptr;
  unsigned long size = 0;
  // Accurate DCT, as libjpeg's and PIL's encoders default to; TurboJPEG would pick the fast one.
  const int rc = tjCompress2(handle.get(), rgb, width, width * 3, height, TJPF_RGB, &jpeg, &size,
                             samp, quality, TJFLAG_ACCURATEDCT);
  const std::unique_ptr<unsigned char, TjBufferFree> owned(jpeg);  // freed on every path
  if (rc != 0)
    throw std::runtime_error(fmt::format("tjCompress2: {}", tjGetErrorStr2(handle.get())));
  return std::vector<uint8_t>(jpeg, jpeg + size);
}

}  // namespace gpufeed::decode
