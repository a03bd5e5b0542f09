// PNG through libpng directly rather than OpenCV: OpenCV installs libpng's default handlers,
// which print "libpng error: ..." / "libpng warning: ..." to stderr (a bad CRC, the common iCCP
// "known incorrect sRGB profile"), and the library must never print. Here libpng's errors and
// warnings come to us; rows stream one at a time, only the crop's rows are unfiltered and
// converted, and the rest of the data is inflated to check it (CRCs, truncation) up to IEND.
//
// libpng reports errors by calling our error function, which longjmps. As in jpeg.cpp, the setjmp
// lives in a function holding only raw pointers; the libpng structs are owned by an RAII holder
// in the C++ caller's frame, which a longjmp never skips.

#include <fmt/format.h>
#include <png.h>

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>

#include "internal.h"

namespace gpufeed::decode::detail {

namespace {

/// What the callbacks record; plain data.
struct PngContext {
  std::jmp_buf jump;
  const uint8_t* data;
  size_t size;
  size_t pos;
  bool strict;
  bool out_of_data;
  bool finishing;  // png_read_end after the crop's last row: the rest is read, not wanted
  int warnings;
  char message[256];
};

PngContext* context(png_structp png) { return static_cast<PngContext*>(png_get_error_ptr(png)); }

[[noreturn]] void on_png_error(png_structp png, png_const_charp message) {
  PngContext* ctx = context(png);
  std::snprintf(ctx->message, sizeof(ctx->message), "%s", message ? message : "unknown error");
  std::longjmp(ctx->jump, 1);
}

void on_png_warning(png_structp png, png_const_charp message) {
  PngContext* ctx = context(png);
  // Rows left unread when the crop ends early are "extra" data to libpng: expected here.
  if (ctx->finishing && message &&
      (std::strstr(message, "Too much image data") || std::strstr(message, "Extra compressed data")))
    return;
  ++ctx->warnings;
  if (!ctx->strict) return;
  std::snprintf(ctx->message, sizeof(ctx->message), "%s (warning treated as an error: strict)",
                message ? message : "unknown warning");
  std::longjmp(ctx->jump, 1);
}

void on_png_read(png_structp png, png_bytep out, size_t length) {
  auto* ctx = static_cast<PngContext*>(png_get_io_ptr(png));
  if (length > ctx->size - ctx->pos) {
    ctx->out_of_data = true;
    png_error(png, "PNG data ends early");
  }
  std::memcpy(out, ctx->data + ctx->pos, length);
  ctx->pos += length;
}

/// Where decoded rows go. Plain data.
struct PngPlan {
  int width;       // image width, pixels
  int height;      // image height
  CropRect crop;   // region to copy out (clamped)
  uint8_t* row;    // one RGB row (non-interlaced)
  uint8_t* image;  // the whole RGB image (interlaced: every pass touches every row)
  uint8_t* out;    // crop.height rows of crop.width * 3 bytes
};

/// Phase 1: the header (IHDR, its CRC, every chunk before IDAT) and the transforms to 8-bit RGB.
/// Nothing of the image's size is allocated before this succeeds.
[[gnu::noinline]] bool read_png_header(png_structp png, png_infop info, const PngPlan* plan,
                                       int* passes) {
  PngContext* ctx = context(png);
  png_read_info(png, info);
  png_uint_32 width = 0, height = 0;
  int depth = 0, color = 0, interlace = 0;
  png_get_IHDR(png, info, &width, &height, &depth, &color, &interlace, nullptr, nullptr);
  if (width != static_cast<png_uint_32>(plan->width) ||
      height != static_cast<png_uint_32>(plan->height)) {
    std::snprintf(ctx->message, sizeof(ctx->message),
                  "libpng read a different size than the header's");
    return false;
  }
  // Everything to 8-bit RGB, as PIL's convert("RGB") sees it: palette expanded (tRNS ignored),
  // grey replicated, alpha dropped, 16 bits scaled with rounding (png_set_scale_16, not
  // png_set_strip_16, which truncates).
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (depth == 16) png_set_scale_16(png);
  if ((color & PNG_COLOR_MASK_ALPHA) || png_get_valid(png, info, PNG_INFO_tRNS))
    png_set_strip_alpha(png);
  if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
  *passes = png_set_interlace_handling(png);
  png_read_update_info(png, info);
  if (png_get_channels(png, info) != 3 || png_get_bit_depth(png, info) != 8 ||
      png_get_rowbytes(png, info) != static_cast<size_t>(plan->width) * 3) {
    std::snprintf(ctx->message, sizeof(ctx->message),
                  "libpng could not convert this layout to 8-bit RGB");
    return false;
  }
  return true;
}

/// Phase 2: the rows, into the buffers sized from the checked header, then on to IEND.
[[gnu::noinline]] bool read_png_rows(png_structp png, const PngPlan* plan, int passes) {
  PngContext* ctx = context(png);
  const CropRect& c = plan->crop;
  const size_t stride = static_cast<size_t>(plan->width) * 3;
  const size_t out_stride = static_cast<size_t>(c.width) * 3;
  if (passes == 1) {
    const int last = c.y + c.height;  // rows below the crop are only inflated (png_read_end)
    for (int y = 0; y < last; ++y) {
      png_read_row(png, plan->row, nullptr);
      if (y >= c.y)
        std::memcpy(plan->out + (y - c.y) * out_stride, plan->row + static_cast<size_t>(c.x) * 3,
                    out_stride);
    }
  } else {
    // Each pass fills in pixels of rows across the whole image, so all passes need all rows.
    for (int pass = 0; pass < passes; ++pass)
      for (int y = 0; y < plan->height; ++y) png_read_row(png, plan->image + y * stride, nullptr);
    for (int y = 0; y < c.height; ++y)
      std::memcpy(plan->out + y * out_stride,
                  plan->image + (c.y + y) * stride + static_cast<size_t>(c.x) * 3, out_stride);
  }
  // Read on to IEND, as a full decode does: the rest of the compressed data is inflated without
  // being unfiltered, so a bad CRC or data that ends early below the crop is still reported.
  ctx->finishing = c.y + c.height < plan->height;
  png_read_end(png, nullptr);
  ctx->finishing = false;
  return true;
}

bool guarded_read_png_header(PngContext* ctx, png_structp png, png_infop info,
                             const PngPlan* plan, int* passes) {
  if (setjmp(ctx->jump) != 0) return false;
  png_set_read_fn(png, ctx, on_png_read);
  // Our max_pixels limit has already been checked; libpng's own default (1e6 per side) must not
  // reject what the caller allowed.
  png_set_user_limits(png, 0x7fffffff, 0x7fffffff);
  return read_png_header(png, info, plan, passes);
}

bool guarded_read_png_rows(PngContext* ctx, png_structp png, const PngPlan* plan, int passes) {
  if (setjmp(ctx->jump) != 0) return false;
  return read_png_rows(png, plan, passes);
}

/// Owns libpng's read and info structs.
struct PngHandles {
  png_structp png = nullptr;
  png_infop info = nullptr;
  ~PngHandles() {
    if (png) png_destroy_read_struct(&png, info ? &info : nullptr, nullptr);
  }
};

}  // namespace

void WholeImageDecoder::decode_png(std::span<const uint8_t> bytes, std::string_view source,
                                 const ImageInfo& info, const DecodeOptions& options,
                                 const CropRect& crop, ImageBuffer& out, DecodeResult& result) {
  PngContext ctx{};
  ctx.data = bytes.data();
  ctx.size = bytes.size();
  ctx.strict = options.strict;

  // Our handlers go in only after creation: an error inside png_create_read_struct would
  // otherwise longjmp to a jmp_buf no setjmp has filled yet (libpng's own handler returns NULL).
  PngHandles handles;
  handles.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  if (!handles.png) throw std::bad_alloc();
  handles.info = png_create_info_struct(handles.png);
  if (!handles.info) throw std::bad_alloc();
  png_set_error_fn(handles.png, &ctx, on_png_error, on_png_warning);

  const auto give_up = [&] {
    const std::string reason = ctx.message;
    // "Not enough image data": the IDAT chunks end before the image does.
    const bool truncated =
        ctx.out_of_data || reason.find("Not enough image data") != std::string::npos;
    fail(truncated ? ErrorKind::kTruncated : ErrorKind::kCorrupt, source, "libpng: " + reason);
  };
  PngPlan plan{};
  plan.width = info.width;
  plan.height = info.height;
  plan.crop = crop;
  int passes = 1;
  if (!guarded_read_png_header(&ctx, handles.png, handles.info, &plan, &passes)) give_up();

  // All memory the rows are written to is sized here, from the header libpng has checked, and
  // outside the setjmp frame.
  const size_t stride = static_cast<size_t>(info.width) * 3;
  const size_t scratch_bytes = passes > 1 ? stride * static_cast<size_t>(info.height) : stride;
  if (scratch_.size() < scratch_bytes) scratch_.resize(scratch_bytes);
  plan.row = scratch_.data();
  plan.image = scratch_.data();
  out.reshape(crop.width, crop.height);
  plan.out = out.pixels.data();
  if (!guarded_read_png_rows(&ctx, handles.png, &plan, passes)) give_up();
  result.warnings = ctx.warnings;
}

}  // namespace gpufeed::decode::detail
