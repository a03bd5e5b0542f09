// Everything that is not JPEG. GIF goes through giflib (OpenCV 4.6 reads no GIF), PNG through
// libpng (png.cpp), WebP through libwebp (animated: libwebpdemux's WebPAnimDecoder), BMP and PNM through our own readers (raster.cpp) and
// TIFF through libtiff (tiff.cpp): OpenCV's imdecode prints every failure of its codecs to stderr
// ("imdecode_(''): can't read data: ..."), which the library must never do. Each decodes the
// whole image at full size and copies the requested crop out, so the API's crop contract holds for
// every format (GIF stops after the crop's last row; PNG unfilters only the crop's rows and
// inflates the rest to check it).

#include <fmt/format.h>
#include <gif_lib.h>
#include <webp/decode.h>
#include <webp/demux.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <memory>
#include <string>

#include "internal.h"

namespace gpufeed::decode::detail {

WholeImageDecoder::WholeImageDecoder() = default;
WholeImageDecoder::~WholeImageDecoder() = default;

void WholeImageDecoder::decode(std::span<const uint8_t> bytes, std::string_view source,
                             const ImageInfo& info, const DecodeOptions& options,
                             const CropRect& crop, ImageBuffer& out, DecodeResult& result) {
  switch (info.format) {
    case ImageFormat::kGif:
      decode_gif(bytes, source, info, options, crop, out);
      break;
    case ImageFormat::kPng:
      decode_png(bytes, source, info, options, crop, out, result);
      break;
    case ImageFormat::kWebp:
      decode_webp(bytes, source, info, crop, out);
      break;
    case ImageFormat::kBmp:
      decode_bmp(bytes, source, info, crop, out);
      break;
    case ImageFormat::kPnm:
      decode_pnm(bytes, source, info, crop, out);
      break;
    case ImageFormat::kTiff:
      decode_tiff(bytes, source, info, options, crop, out, result);
      break;
    default:
      fail(ErrorKind::kUnsupported, source, fmt::format("no decoder for {}", to_string(info.format)));
  }
}

// --- GIF ----------------------------------------------------------------------------------------

namespace {

struct GifSource {
  const uint8_t* data;
  size_t size;
  size_t pos;
};

int gif_read(GifFileType* gif, GifByteType* buffer, int length) {
  auto* src = static_cast<GifSource*>(gif->UserData);
  const size_t n = std::min(static_cast<size_t>(std::max(length, 0)), src->size - src->pos);
  std::memcpy(buffer, src->data + src->pos, n);
  src->pos += n;
  return static_cast<int>(n);
}

struct GifCloser {
  void operator()(GifFileType* gif) const {
    int error = 0;
    DGifCloseFile(gif, &error);
  }
};

[[noreturn]] void gif_fail(int error, std::string_view source, std::string_view doing) {
  const char* text = GifErrorString(error);
  const ErrorKind kind = error == D_GIF_ERR_READ_FAILED || error == D_GIF_ERR_EOF_TOO_SOON
                             ? ErrorKind::kTruncated
                             : ErrorKind::kCorrupt;
  fail(kind, source, fmt::format("giflib: {}: {}", doing, text ? text : "unknown error"));
}

/// Reads records up to the first image descriptor (the first frame), skipping extensions.
/// Returns the transparent index the last graphic control extension before it gives, -1 for none.
/// Throws DecodeError, also for a GIF that ends without an image.
int read_to_first_frame(GifFileType* gif, std::string_view source) {
  int transparent = -1;
  for (;;) {
    GifRecordType type = UNDEFINED_RECORD_TYPE;
    if (DGifGetRecordType(gif, &type) == GIF_ERROR)
      gif_fail(gif->Error, source, "reading a record");
    if (type == TERMINATE_RECORD_TYPE) fail(ErrorKind::kCorrupt, source, "GIF contains no image");
    if (type == IMAGE_DESC_RECORD_TYPE) break;
    if (type != EXTENSION_RECORD_TYPE) continue;
    int code = 0;
    GifByteType* ext = nullptr;
    if (DGifGetExtension(gif, &code, &ext) == GIF_ERROR)
      gif_fail(gif->Error, source, "reading an extension");
    // Graphic control extension: ext[0] = 4, ext[1] flags (bit 0: transparency), ext[4] index.
    if (code == GRAPHICS_EXT_FUNC_CODE && ext && ext[0] >= 4)
      transparent = (ext[1] & 1) ? ext[4] : -1;
    while (ext) {
      if (DGifGetExtensionNext(gif, &ext) == GIF_ERROR)
        gif_fail(gif->Error, source, "reading an extension");
    }
  }
  if (DGifGetImageDesc(gif) == GIF_ERROR)
    gif_fail(gif->Error, source, "reading the image descriptor");
  return transparent;
}

/// Decodes the frame gif->Image describes, one row of `line` (its width) at a time, into the
/// logical screen's palette indices (`screen`, sw x sh): the part of the frame on the screen is
/// drawn, the rest dropped. A non-interlaced frame stops at screen row `end_row` (the crop's
/// end), as rows from there on are never shown.
void draw_frame(GifFileType* gif, uint8_t* line, uint8_t* screen, int sw, int sh, int end_row,
                std::string_view source) {
  const GifImageDesc& desc = gif->Image;
  const int fw = desc.Width, fh = desc.Height;
  const auto put_row = [&](int y) {
    const int sy = desc.Top + y;
    if (sy < 0 || sy >= sh) return;
    const int x0 = std::max(0, -desc.Left);
    const int x1 = std::min(fw, sw - desc.Left);
    if (x1 > x0)
      std::memcpy(screen + static_cast<size_t>(sy) * sw + desc.Left + x0, line + x0,
                  static_cast<size_t>(x1 - x0));
  };
  if (desc.Interlace) {
    static constexpr int kStart[4] = {0, 4, 2, 1};
    static constexpr int kStep[4] = {8, 8, 4, 2};
    for (int pass = 0; pass < 4; ++pass) {
      for (int y = kStart[pass]; y < fh; y += kStep[pass]) {
        if (DGifGetLine(gif, line, fw) == GIF_ERROR)
          gif_fail(gif->Error, source, "decoding the first frame");
        put_row(y);
      }
    }
  } else {
    // Rows below the screen (or the crop) are never shown: stop decoding there.
    const int last = std::min(fh, end_row - desc.Top);
    for (int y = 0; y < last; ++y) {
      if (DGifGetLine(gif, line, fw) == GIF_ERROR)
        gif_fail(gif->Error, source, "decoding the first frame");
      put_row(y);
    }
  }
}

/// The crop of the screen's indices (`screen`, sw wide) through colour table `map` into `out`.
void paint_crop(const uint8_t* screen, int sw, const ColorMapObject& map, const CropRect& crop,
                ImageBuffer& out) {
  out.reshape(crop.width, crop.height);
  const int colors = map.ColorCount;
  for (int y = 0; y < crop.height; ++y) {
    const uint8_t* idx = screen + static_cast<size_t>(crop.y + y) * sw + crop.x;
    uint8_t* d = out.row(y);
    for (int x = 0; x < crop.width; ++x, d += 3) {
      const int i = idx[x];
      if (i < colors) {
        d[0] = map.Colors[i].Red;
        d[1] = map.Colors[i].Green;
        d[2] = map.Colors[i].Blue;
      } else {
        d[0] = d[1] = d[2] = 0;  // index past the table: black, as a zero-padded palette gives
      }
    }
  }
}

}  // namespace

// The first frame as Pillow's Image.open(gif).convert("RGB") shows it (torchvision's path): the
// logical screen starts filled with the frame's transparent index if it has one, else index 0;
// the frame's indices are drawn over it; every index maps through the frame's colour table
// (local, else global), so transparent pixels take their index's colour, as convert("RGB") drops
// alpha. Later frames are never read.
void WholeImageDecoder::decode_gif(std::span<const uint8_t> bytes, std::string_view source,
                                 const ImageInfo& info, const DecodeOptions& options,
                                 const CropRect& crop, ImageBuffer& out) {
  GifSource src{bytes.data(), bytes.size(), 0};
  int error = 0;
  std::unique_ptr<GifFileType, GifCloser> gif(DGifOpen(&src, gif_read, &error));
  if (!gif) gif_fail(error, source, "reading the screen descriptor");
  const int sw = gif->SWidth, sh = gif->SHeight;
  if (sw != info.width || sh != info.height)
    fail(ErrorKind::kCorrupt, source, "giflib read a different screen size than the header's");

  const int transparent = read_to_first_frame(gif.get(), source);
  const GifImageDesc& desc = gif->Image;
  const ColorMapObject* map = desc.ColorMap ? desc.ColorMap : gif->SColorMap;
  if (!map) fail(ErrorKind::kCorrupt, source, "GIF frame has no colour table");
  const int fw = desc.Width, fh = desc.Height;
  if (fw <= 0 || fh <= 0)
    fail(ErrorKind::kCorrupt, source, fmt::format("GIF frame has size {}x{}", fw, fh));
  // The frame may claim more than the screen; its rows are decoded one at a time, but the LZW
  // work is still bounded by the same pixel limit.
  if (int64_t{fw} * fh > options.max_pixels)
    fail(ErrorKind::kTooLarge, source,
         fmt::format("GIF frame {}x{} = {} pixels exceeds max_pixels {}", fw, fh,
                     int64_t{fw} * fh, options.max_pixels));

  indices_.assign(static_cast<size_t>(sw) * sh,
                  static_cast<uint8_t>(transparent >= 0 ? transparent : 0));
  if (scratch_.size() < static_cast<size_t>(fw)) scratch_.resize(static_cast<size_t>(fw));
  draw_frame(gif.get(), scratch_.data(), indices_.data(), sw, sh, crop.y + crop.height, source);
  paint_crop(indices_.data(), sw, *map, crop, out);
}

// --- WebP ---------------------------------------------------------------------------------------

namespace {

ErrorKind webp_kind(VP8StatusCode status) {
  switch (status) {
    case VP8_STATUS_NOT_ENOUGH_DATA:
      return ErrorKind::kTruncated;
    case VP8_STATUS_UNSUPPORTED_FEATURE:
      return ErrorKind::kUnsupported;
    default:
      return ErrorKind::kCorrupt;
  }
}

const char* webp_status_text(VP8StatusCode status) {
  switch (status) {
    case VP8_STATUS_OUT_OF_MEMORY:
      return "out of memory";
    case VP8_STATUS_INVALID_PARAM:
      return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR:
      return "bitstream error";
    case VP8_STATUS_UNSUPPORTED_FEATURE:
      return "unsupported feature";
    case VP8_STATUS_NOT_ENOUGH_DATA:
      return "data ends early";
    default:
      return "decode failed";
  }
}

}  // namespace

void WholeImageDecoder::decode_webp(std::span<const uint8_t> bytes, std::string_view source,
                                  const ImageInfo& info, const CropRect& crop, ImageBuffer& out) {
  WebPDecoderConfig config;
  if (!WebPInitDecoderConfig(&config))
    fail(ErrorKind::kUnsupported, source, "libwebp version mismatch");
  VP8StatusCode status = WebPGetFeatures(bytes.data(), bytes.size(), &config.input);
  if (status != VP8_STATUS_OK)
    fail(webp_kind(status), source, fmt::format("libwebp: {}", webp_status_text(status)));
  if (config.input.has_animation) return decode_webp_animation(bytes, source, info, crop, out);
  if (config.input.width != info.width || config.input.height != info.height)
    fail(ErrorKind::kCorrupt, source, "libwebp read a different size than the header's");

  // MODE_RGB: alpha dropped, colour as stored (not premultiplied), as convert("RGB") shows it.
  // The whole image is decoded (libwebp's own cropping rounds the origin to even pixels), into
  // `out` directly when no crop is asked for.
  const bool whole = crop.width == info.width && crop.height == info.height;
  const size_t stride = static_cast<size_t>(info.width) * 3;
  const size_t bytes_needed = stride * static_cast<size_t>(info.height);
  uint8_t* target;
  if (whole) {
    out.reshape(info.width, info.height);
    target = out.pixels.data();
  } else {
    if (scratch_.size() < bytes_needed) scratch_.resize(bytes_needed);
    target = scratch_.data();
  }
  config.output.colorspace = MODE_RGB;
  config.output.is_external_memory = 1;
  config.output.u.RGBA.rgba = target;
  config.output.u.RGBA.stride = static_cast<int>(stride);
  config.output.u.RGBA.size = bytes_needed;
  status = WebPDecode(bytes.data(), bytes.size(), &config);
  WebPFreeDecBuffer(&config.output);  // external memory: frees nothing of ours, but pairs the call
  if (status != VP8_STATUS_OK)
    fail(webp_kind(status), source, fmt::format("libwebp: {}", webp_status_text(status)));
  if (!whole) copy_region(target, stride, crop, out);
}

namespace {

struct AnimDecoderCloser {
  void operator()(WebPAnimDecoder* d) const { WebPAnimDecoderDelete(d); }
};

}  // namespace

// An animated WebP's first frame, as libwebp's WebPAnimDecoder composes it (Pillow reads every
// WebP through the same API, so this is Image.open(f).convert("RGB")): the canvas starts
// transparent black, the first frame (always a key frame, never blended) is decoded into its
// rectangle, and the rest of the canvas stays black once alpha is dropped -- the still-WebP
// policy (alpha dropped, colour as stored, not premultiplied). Later frames are never decoded.
void WholeImageDecoder::decode_webp_animation(std::span<const uint8_t> bytes, std::string_view source,
                                            const ImageInfo& info, const CropRect& crop,
                                            ImageBuffer& out) {
  WebPAnimDecoderOptions options;
  if (!WebPAnimDecoderOptionsInit(&options))
    fail(ErrorKind::kUnsupported, source, "libwebpdemux version mismatch");
  options.color_mode = MODE_RGBA;
  options.use_threads = 0;
  const WebPData data{bytes.data(), bytes.size()};
  std::unique_ptr<WebPAnimDecoder, AnimDecoderCloser> decoder(WebPAnimDecoderNew(&data, &options));
  if (!decoder) {
    // WebPAnimDecoderNew says only that it failed; the demuxer's state tells a file cut short
    // from a malformed one.
    WebPDemuxState state = WEBP_DEMUX_PARSE_ERROR;
    if (WebPDemuxer* demux = WebPDemuxPartial(&data, &state)) WebPDemuxDelete(demux);
    if (state == WEBP_DEMUX_PARSING_HEADER || state == WEBP_DEMUX_PARSED_HEADER)
      fail(ErrorKind::kTruncated, source, "libwebp: animated WebP data ends early");
    fail(ErrorKind::kCorrupt, source, "libwebp: malformed animated WebP");
  }
  WebPAnimInfo anim{};
  if (!WebPAnimDecoderGetInfo(decoder.get(), &anim))
    fail(ErrorKind::kCorrupt, source, "libwebp: cannot read the animation's header");
  if (static_cast<int>(anim.canvas_width) != info.width ||
      static_cast<int>(anim.canvas_height) != info.height)
    fail(ErrorKind::kCorrupt, source, "libwebp read a different canvas size than the header's");
  if (anim.frame_count == 0) fail(ErrorKind::kCorrupt, source, "animated WebP has no frame");
  uint8_t* canvas = nullptr;
  int timestamp = 0;
  if (!WebPAnimDecoderGetNext(decoder.get(), &canvas, &timestamp) || canvas == nullptr)
    fail(ErrorKind::kCorrupt, source, "libwebp: cannot decode the first frame");
  out.reshape(crop.width, crop.height);
  for (int y = 0; y < crop.height; ++y) {
    const uint8_t* s = canvas + (static_cast<size_t>(crop.y + y) * info.width + crop.x) * 4;
    uint8_t* d = out.row(y);
    for (int x = 0; x < crop.width; ++x, s += 4, d += 3) {
      d[0] = s[0];
      d[1] = s[1];
      d[2] = s[2];
    }
  }
}

}  // namespace gpufeed::decode::detail
