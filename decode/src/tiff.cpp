// TIFF through libtiff directly (OpenCV's imdecode prints every libtiff failure to stderr). The
// handle gets its own error and warning handlers (libtiff 4.5's TIFFOpenOptions), which record the
// message and return 1 so libtiff's process-wide handlers (stderr, or whatever OpenCV installed)
// never run; libtiff reports errors by return codes, so no longjmp is involved.
//
// The first image (IFD) is read through TIFFReadRGBAImageOriented, which covers every photometric
// interpretation, bit depth and compression libtiff supports, and returns 8-bit RGBA (16-bit
// samples scaled with rounding). The raster is requested in the stored row order: orientation
// tags are not applied, as EXIF orientation is not by default. Unassociated alpha is declared
// "unspecified" first, so libtiff returns the stored colour instead of premultiplying it; alpha
// is dropped either way, as convert("RGB") does.

#include <fmt/format.h>
#ifdef GPUFEED_WITH_TIFF
#include <tiffio.h>
#endif

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "internal.h"

namespace gpufeed::decode::detail {

#ifndef GPUFEED_WITH_TIFF

void WholeImageDecoder::decode_tiff(std::span<const uint8_t>, std::string_view source,
                                  const ImageInfo&, const DecodeOptions&, const CropRect&,
                                  ImageBuffer&, DecodeResult&) {
  // A slim build (GPUFEED_WITH_IMGCODECS=OFF, e.g. the GPU-machine bundle) leaves libtiff out.
  fail(ErrorKind::kUnsupported, source,
       "TIFF needs libtiff, left out of this build (GPUFEED_WITH_IMGCODECS=OFF)");
}

#else

namespace {

/// The input and what libtiff's callbacks record.
struct TiffSource {
  const uint8_t* data;
  size_t size;
  toff_t pos;
  int errors;
  int warnings;
  std::string first_error;
};

tmsize_t tiff_read(thandle_t h, void* buffer, tmsize_t n) {
  auto* s = static_cast<TiffSource*>(h);
  if (n <= 0 || s->pos >= s->size) return 0;
  const size_t count = std::min(static_cast<size_t>(n), static_cast<size_t>(s->size - s->pos));
  std::memcpy(buffer, s->data + s->pos, count);
  s->pos += count;
  return static_cast<tmsize_t>(count);
}

tmsize_t tiff_write(thandle_t, void*, tmsize_t) { return 0; }

toff_t tiff_seek(thandle_t h, toff_t offset, int whence) {
  auto* s = static_cast<TiffSource*>(h);
  toff_t base = 0;
  if (whence == SEEK_CUR) base = s->pos;
  if (whence == SEEK_END) base = s->size;
  if (offset > UINT64_MAX - base) return static_cast<toff_t>(-1);
  s->pos = base + offset;  // past the end is allowed; reads there return nothing
  return s->pos;
}

int tiff_close(thandle_t) { return 0; }

toff_t tiff_size(thandle_t h) { return static_cast<TiffSource*>(h)->size; }

int tiff_map(thandle_t h, void** base, toff_t* size) {
  auto* s = static_cast<TiffSource*>(h);
  *base = const_cast<uint8_t*>(s->data);
  *size = s->size;
  return 1;
}

void tiff_unmap(thandle_t, void*, toff_t) {}

int on_tiff_error(TIFF*, void* user, const char* module, const char* format, va_list ap) {
  auto* s = static_cast<TiffSource*>(user);
  if (s->errors++ == 0) {
    char text[512];
    std::vsnprintf(text, sizeof(text), format, ap);
    s->first_error = module && *module ? std::string(module) + ": " + text : std::string(text);
  }
  return 1;  // handled: libtiff's global handler (which prints) is not called
}

int on_tiff_warning(TIFF*, void* user, const char*, const char*, va_list) {
  ++static_cast<TiffSource*>(user)->warnings;
  return 1;
}

struct TiffCloser {
  void operator()(TIFF* tif) const { TIFFClose(tif); }
};
struct OptionsFree {
  void operator()(TIFFOpenOptions* o) const { TIFFOpenOptionsFree(o); }
};

/// The kind a libtiff message stands for.
ErrorKind tiff_kind(const std::string& message) {
  const auto has = [&](const char* text) { return message.find(text) != std::string::npos; };
  if (has("not implemented") || has("not supported") || has("Sorry")) return ErrorKind::kUnsupported;
  if (has("Read error") || has("Seek error") || has("past end") || has("EOF") ||
      has("Cannot read") || has("truncated"))
    return ErrorKind::kTruncated;
  return ErrorKind::kCorrupt;
}

}  // namespace

void WholeImageDecoder::decode_tiff(std::span<const uint8_t> bytes, std::string_view source,
                                  const ImageInfo& info, const DecodeOptions& options,
                                  const CropRect& crop, ImageBuffer& out, DecodeResult& result) {
  TiffSource src{bytes.data(), bytes.size(), 0, 0, 0, {}};
  const auto give_up = [&](ErrorKind fallback, const std::string& what) {
    const std::string reason = src.first_error.empty() ? what : "libtiff: " + src.first_error;
    fail(src.first_error.empty() ? fallback : tiff_kind(src.first_error), source, reason);
  };
  std::unique_ptr<TIFFOpenOptions, OptionsFree> opts(TIFFOpenOptionsAlloc());
  if (!opts) throw std::bad_alloc();
  TIFFOpenOptionsSetErrorHandlerExtR(opts.get(), on_tiff_error, &src);
  TIFFOpenOptionsSetWarningHandlerExtR(opts.get(), on_tiff_warning, &src);
  // Our raster is sized from the checked header; libtiff's own buffers (strips, tiles) need no
  // more than a few times a row band. This caps what a forged strip size can make it allocate.
  TIFFOpenOptionsSetMaxSingleMemAlloc(opts.get(), tmsize_t{256} << 20);
  const std::string name(source);
  std::unique_ptr<TIFF, TiffCloser> tif(TIFFClientOpenExt(name.c_str(), "r", &src, tiff_read,
                                                          tiff_write, tiff_seek, tiff_close,
                                                          tiff_size, tiff_map, tiff_unmap,
                                                          opts.get()));
  if (!tif) give_up(ErrorKind::kCorrupt, "libtiff cannot open the data");
  uint32_t width = 0, height = 0;
  TIFFGetField(tif.get(), TIFFTAG_IMAGEWIDTH, &width);
  TIFFGetField(tif.get(), TIFFTAG_IMAGELENGTH, &height);
  if (width != static_cast<uint32_t>(info.width) || height != static_cast<uint32_t>(info.height))
    fail(ErrorKind::kCorrupt, source,
         fmt::format("libtiff read {}x{} where the header says {}x{}", width, height, info.width,
                     info.height));

  // Unassociated alpha would be premultiplied into the colour: call it unspecified instead.
  uint16_t extra_count = 0;
  uint16_t* extra = nullptr;
  if (TIFFGetField(tif.get(), TIFFTAG_EXTRASAMPLES, &extra_count, &extra) && extra_count > 0) {
    std::vector<uint16_t> unspecified(extra_count, EXTRASAMPLE_UNSPECIFIED);
    TIFFSetField(tif.get(), TIFFTAG_EXTRASAMPLES, extra_count, unspecified.data());
  }
  char why[1024] = {};
  if (!TIFFRGBAImageOK(tif.get(), why))
    fail(ErrorKind::kUnsupported, source, fmt::format("libtiff: {}", why));

  uint16_t orientation = ORIENTATION_TOPLEFT;
  TIFFGetFieldDefaulted(tif.get(), TIFFTAG_ORIENTATION, &orientation);
  // Rows as stored: asking for the file's own orientation makes libtiff flip nothing.
  const int stored = orientation >= 1 && orientation <= 8 ? orientation : ORIENTATION_TOPLEFT;
  const size_t pixels = static_cast<size_t>(width) * height;
  if (scratch_.size() < pixels * 4) scratch_.resize(pixels * 4);
  auto* raster = reinterpret_cast<uint32_t*>(scratch_.data());  // vector storage: 16-aligned
  if (!TIFFReadRGBAImageOriented(tif.get(), width, height, raster, stored, /*stop_on_error=*/1) ||
      src.errors > 0)
    give_up(ErrorKind::kCorrupt, "libtiff could not read the image");
  if (options.strict && src.warnings > 0)
    fail(ErrorKind::kCorrupt, source, "libtiff warned (warning treated as an error: strict)");
  result.warnings = src.warnings;

  out.reshape(crop.width, crop.height);
  for (int y = 0; y < crop.height; ++y) {
    const uint32_t* s = raster + static_cast<size_t>(crop.y + y) * width + crop.x;
    uint8_t* d = out.row(y);
    for (int x = 0; x < crop.width; ++x, d += 3) {
      d[0] = static_cast<uint8_t>(TIFFGetR(s[x]));
      d[1] = static_cast<uint8_t>(TIFFGetG(s[x]));
      d[2] = static_cast<uint8_t>(TIFFGetB(s[x]));
    }
  }
}

#endif  // GPUFEED_WITH_TIFF

}  // namespace gpufeed::decode::detail
