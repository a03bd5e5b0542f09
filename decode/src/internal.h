#pragma once
// Pieces of gpufeed_decode shared between its .cpp files. Not part of the public API.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpufeed/decode/decoder.h"
#include "gpufeed/decode/error.h"

namespace gpufeed::decode::detail {

/// Throws DecodeError(kind, source, reason).
[[noreturn]] void fail(ErrorKind kind, std::string_view source, std::string reason);

/// The crop clamped to a width x height image; the whole image when crop.width == 0.
/// Throws std::invalid_argument for a negative size or a crop that misses the image entirely,
/// because the caller computed it from the header and such a crop is a programming error.
CropRect clamp_crop(const CropRect& crop, int width, int height);

/// A PNM header's fields beyond ImageInfo.
struct PnmHeader {
  char kind = '6';          ///< '1'..'6' as in "P6"
  uint32_t maxval = 255;    ///< 1 for P1/P4
  size_t data_offset = 0;   ///< where the samples start
};

/// The PNM header of bytes that probe() accepted as PNM. Throws DecodeError like probe().
PnmHeader pnm_header(std::span<const uint8_t> bytes, std::string_view source);

/// Maps a rectangle given in the displayed frame of an image (after EXIF orientation) to the
/// stored frame. `stored_width`/`stored_height` are the stored image's dimensions.
CropRect display_to_stored(const CropRect& rect, int orientation, int stored_width,
                           int stored_height);

/// Maps a rectangle in the stored frame to the displayed frame (inverse of display_to_stored).
CropRect stored_to_display(const CropRect& rect, int orientation, int stored_width,
                           int stored_height);

/// Writes `src` (stored orientation) into `dst` rotated/flipped for display. dst is reshaped.
void apply_orientation(const ImageBuffer& src, int orientation, ImageBuffer& dst);

/// Copies rect (which must lie inside the src_width x src_height packed RGB image whose rows are
/// src_stride bytes apart) into `out`, reshaped to rect's size.
void copy_region(const uint8_t* src, size_t src_stride, const CropRect& rect, ImageBuffer& out);

struct JpegState;  // libjpeg's decompressor and error manager (jpeg.cpp)

/// libjpeg-turbo decoding with DCT scaling, crop and skip. One per Decoder (it owns a
/// jpeg_decompress_struct that is created once and reused across images).
class JpegDecoder {
 public:
  JpegDecoder();
  ~JpegDecoder();
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;

  /// Decodes `crop` (stored source pixels, already clamped) of a JPEG whose header is `info`.
  /// Fills result.scale, result.region, result.scaled_region and result.warnings.
  void decode(std::span<const uint8_t> bytes, std::string_view source, const ImageInfo& info,
              const DecodeOptions& options, const CropRect& crop, ImageBuffer& out,
              DecodeResult& result);

 private:
  std::unique_ptr<JpegState> state_;
  std::vector<uint8_t> row_;  // one decoded scanline (RGB or CMYK), reused across images
};

/// The decoder of every format that is not JPEG, named for how it works: it decodes the whole
/// image at full resolution, then copies `crop` (stored source pixels, clamped) out, where
/// JpegDecoder decodes only the crop at a DCT scale. GIF (giflib, first frame), PNG (libpng),
/// WebP (libwebp; animated: the first frame, libwebpdemux), BMP and PNM (our own readers,
/// raster.cpp), TIFF (libtiff, tiff.cpp).
class WholeImageDecoder {
 public:
  WholeImageDecoder();
  ~WholeImageDecoder();
  WholeImageDecoder(const WholeImageDecoder&) = delete;
  WholeImageDecoder& operator=(const WholeImageDecoder&) = delete;

  /// Decodes into `out`; fills result.warnings (libpng warnings), the rest is set by the caller.
  void decode(std::span<const uint8_t> bytes, std::string_view source, const ImageInfo& info,
              const DecodeOptions& options, const CropRect& crop, ImageBuffer& out,
              DecodeResult& result);

 private:
  void decode_gif(std::span<const uint8_t> bytes, std::string_view source, const ImageInfo& info,
                  const DecodeOptions& options, const CropRect& crop, ImageBuffer& out);
  void decode_png(std::span<const uint8_t> bytes, std::string_view source, const ImageInfo& info,
                  const DecodeOptions& options, const CropRect& crop, ImageBuffer& out,
                  DecodeResult& result);
  void decode_webp(std::span<const uint8_t> bytes, std::string_view source, const ImageInfo& info,
                   const CropRect& crop, ImageBuffer& out);
  void decode_webp_animation(std::span<const uint8_t> bytes, std::string_view source,
                             const ImageInfo& info, const CropRect& crop, ImageBuffer& out);
  void decode_bmp(std::span<const uint8_t> bytes, std::string_view source, const ImageInfo& info,
                  const CropRect& crop, ImageBuffer& out);
  void decode_pnm(std::span<const uint8_t> bytes, std::string_view source, const ImageInfo& info,
                  const CropRect& crop, ImageBuffer& out);
  void decode_tiff(std::span<const uint8_t> bytes, std::string_view source, const ImageInfo& info,
                   const DecodeOptions& options, const CropRect& crop, ImageBuffer& out,
                   DecodeResult& result);

  std::vector<uint8_t> scratch_;  // decoded rows / whole images, reused across images
  std::vector<uint8_t> indices_;  // GIF palette indices of the logical screen
};

}  // namespace gpufeed::decode::detail
