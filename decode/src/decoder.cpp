// Decoder front end: options checks, the pixel limit, dispatch by sniffed format, EXIF
// orientation, and the small free functions of the public API.

#include "gpufeed/decode/decoder.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <system_error>

#include "gpufeed/unique_fd.h"
#include "internal.h"

namespace gpufeed::decode {

namespace detail {

void fail(ErrorKind kind, std::string_view source, std::string reason) {
  throw DecodeError(kind, std::string(source), std::move(reason));
}

CropRect clamp_crop(const CropRect& crop, int width, int height) {
  if (crop.width == 0) return CropRect{0, 0, width, height};
  if (crop.width < 0 || crop.height <= 0)
    throw std::invalid_argument(
        fmt::format("gpufeed::decode: crop size {}x{} is not positive", crop.width, crop.height));
  const int64_t x0 = std::max(crop.x, 0);
  const int64_t y0 = std::max(crop.y, 0);
  const int64_t x1 = std::min<int64_t>(int64_t{crop.x} + crop.width, width);
  const int64_t y1 = std::min<int64_t>(int64_t{crop.y} + crop.height, height);
  if (x1 <= x0 || y1 <= y0)
    throw std::invalid_argument(
        fmt::format("gpufeed::decode: crop ({}, {}) {}x{} lies outside the {}x{} image", crop.x,
                    crop.y, crop.width, crop.height, width, height));
  return CropRect{static_cast<int>(x0), static_cast<int>(y0), static_cast<int>(x1 - x0),
                  static_cast<int>(y1 - y0)};
}

// EXIF orientation n says how the stored image must be transformed for display:
// 2 mirror left-right, 3 rotate 180, 4 mirror top-bottom, 5 transpose, 6 rotate 90 clockwise,
// 7 transverse, 8 rotate 90 counter-clockwise. The interval maps below follow from the pixel maps
// in apply_orientation().
CropRect display_to_stored(const CropRect& r, int orientation, int w, int h) {
  const int u0 = r.x, u1 = r.x + r.width, v0 = r.y, v1 = r.y + r.height;
  switch (orientation) {
    case 2:
      return {w - u1, v0, r.width, r.height};
    case 3:
      return {w - u1, h - v1, r.width, r.height};
    case 4:
      return {u0, h - v1, r.width, r.height};
    case 5:
      return {v0, u0, r.height, r.width};
    case 6:
      return {v0, h - u1, r.height, r.width};
    case 7:
      return {w - v1, h - u1, r.height, r.width};
    case 8:
      return {w - v1, u0, r.height, r.width};
    default:
      return r;
  }
}

CropRect stored_to_display(const CropRect& r, int orientation, int w, int h) {
  const int x0 = r.x, x1 = r.x + r.width, y0 = r.y, y1 = r.y + r.height;
  switch (orientation) {
    case 2:
      return {w - x1, y0, r.width, r.height};
    case 3:
      return {w - x1, h - y1, r.width, r.height};
    case 4:
      return {x0, h - y1, r.width, r.height};
    case 5:
      return {y0, x0, r.height, r.width};
    case 6:
      return {h - y1, x0, r.height, r.width};
    case 7:
      return {h - y1, w - x1, r.height, r.width};
    case 8:
      return {y0, w - x1, r.height, r.width};
    default:
      return r;
  }
}

void apply_orientation(const ImageBuffer& src, int orientation, ImageBuffer& dst) {
  const int sw = src.width, sh = src.height;
  const bool swap = orientation_swaps_axes(orientation);
  dst.reshape(swap ? sh : sw, swap ? sw : sh);
  // Displayed pixel (u, v) comes from stored pixel (x, y) = (ax + bx*u + cx*v, ay + by*u + cy*v).
  int ax = 0, bx = 1, cx = 0, ay = 0, by = 0, cy = 1;
  switch (orientation) {
    case 2:
      ax = sw - 1;
      bx = -1;
      break;
    case 3:
      ax = sw - 1;
      bx = -1;
      ay = sh - 1;
      cy = -1;
      break;
    case 4:
      ay = sh - 1;
      cy = -1;
      break;
    case 5:
      bx = 0;
      cx = 1;
      by = 1;
      cy = 0;
      break;
    case 6:
      bx = 0;
      cx = 1;
      ay = sh - 1;
      by = -1;
      cy = 0;
      break;
    case 7:
      ax = sw - 1;
      bx = 0;
      cx = -1;
      ay = sh - 1;
      by = -1;
      cy = 0;
      break;
    case 8:
      ax = sw - 1;
      bx = 0;
      cx = -1;
      by = 1;
      cy = 0;
      break;
    default:
      break;
  }
  const ptrdiff_t stride = static_cast<ptrdiff_t>(sw) * 3;
  const ptrdiff_t step = bx * 3 + by * stride;  // source step for u -> u + 1
  const uint8_t* base = src.pixels.data();
  for (int v = 0; v < dst.height; ++v) {
    // Offsets, not pointers, step through the source: a pointer stepped past either end of the
    // buffer after the last pixel would be undefined behaviour.
    ptrdiff_t at = ptrdiff_t{ax + cx * v} * 3 + ptrdiff_t{ay + cy * v} * stride;
    uint8_t* d = dst.row(v);
    for (int u = 0; u < dst.width; ++u, at += step, d += 3) {
      d[0] = base[at];
      d[1] = base[at + 1];
      d[2] = base[at + 2];
    }
  }
}

void copy_region(const uint8_t* src, size_t src_stride, const CropRect& rect, ImageBuffer& out) {
  out.reshape(rect.width, rect.height);
  const size_t row_bytes = static_cast<size_t>(rect.width) * 3;
  for (int y = 0; y < rect.height; ++y)
    std::memcpy(out.row(y), src + (rect.y + y) * src_stride + static_cast<size_t>(rect.x) * 3,
                row_bytes);
}

}  // namespace detail

void ImageBuffer::reshape(int w, int h) {
  if (w < 0 || h < 0)
    throw std::invalid_argument(fmt::format("ImageBuffer::reshape: negative size {}x{}", w, h));
  pixels.resize(static_cast<size_t>(w) * static_cast<size_t>(h) * 3);  // never shrinks capacity
  width = w;
  height = h;
}

bool orientation_swaps_axes(int orientation) { return orientation >= 5 && orientation <= 8; }

int scaled_size(int dim, ScaleFactor scale) {
  return static_cast<int>((int64_t{dim} * scale.num + 7) / 8);
}

double scale_cost(ScaleFactor scale) {
  // CPU time per image of whole-image decodes of the 900 files of ../shared/data/imagenet-sample
  // (baseline 4:2:0 / gray, mean 470x402) at each scale, relative to 8/8: libjpeg-turbo 2.1.5 on
  // an AMD EPYC (Zen 5) VM, `gpufeed bench --mode full --scales 8,7,6,5,4,3,2,1 --workers 1`
  // (docs/PERFORMANCE.md). Entropy decoding, the same at every scale, is most of it; 1/8, 2/8 and
  // 4/8 have SIMD IDCTs, the others scalar ones that cost more than a full-size decode.
  static constexpr double kCost[9] = {0, 0.76, 0.83, 0.91, 0.88, 1.13, 1.26, 1.51, 1.00};
  if (scale.num < 1 || scale.num > 8)
    throw std::invalid_argument(
        fmt::format("gpufeed::decode: scale {}/8 is outside 1/8..8/8", scale.num));
  return kCost[scale.num];
}

ScaleFactor choose_scale(const ImageInfo& info, const CropRect& crop, int out_width,
                         int out_height) {
  if (info.format != ImageFormat::kJpeg) return ScaleFactor{8};
  const int64_t w = crop.width > 0 ? crop.width : info.width;
  const int64_t h = crop.width > 0 ? crop.height : info.height;
  // The scaled crop spans w * num / 8 output pixels (fractional at the edges); require that
  // span, not the rounded-up pixel count, to cover the output, so the resize never upsamples.
  // Among the scales that qualify (8/8 always does: the resize then upsamples, as torchvision
  // does), the cheapest by scale_cost; on a tie the smaller, which leaves less to resize.
  ScaleFactor best{8};
  for (int num = 7; num >= 1; --num) {
    if (w * num < int64_t{out_width} * 8 || h * num < int64_t{out_height} * 8) break;
    if (scale_cost(ScaleFactor{num}) <= scale_cost(best)) best = ScaleFactor{num};
  }
  return best;
}

void read_file(const std::filesystem::path& path, std::vector<uint8_t>& out) {
  read_file(path.c_str(), out);
}

namespace {

template <class Bytes>
void read_whole_file(const char* path, Bytes& out) {
  const auto os_error = [&](std::string_view what) {
    const int err = errno;
    detail::fail(
        ErrorKind::kIo, path,
        fmt::format("{}: {}", what, std::error_code(err, std::generic_category()).message()));
  };
  // O_NONBLOCK: opening a FIFO that has no writer would otherwise block forever (it has no
  // effect on regular files, the only kind read below).
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) os_error("cannot open");
  const UniqueFd closer(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) os_error("cannot stat");
  if (S_ISDIR(st.st_mode)) {
    errno = EISDIR;
    os_error("cannot read");
  }
  // A FIFO can hang and a device (/dev/zero) never ends: a dataset's samples are regular files.
  if (!S_ISREG(st.st_mode))
    detail::fail(ErrorKind::kIo, path,
                 S_ISFIFO(st.st_mode)  ? "not a regular file (a FIFO)"
                 : S_ISCHR(st.st_mode) ? "not a regular file (a character device)"
                 : S_ISBLK(st.st_mode) ? "not a regular file (a block device)"
                                       : "not a regular file");
  // Sized from fstat, but read to EOF regardless: the size can change under us, and /proc files
  // report 0.
  size_t capacity = S_ISREG(st.st_mode) && st.st_size > 0 ? static_cast<size_t>(st.st_size) : 65536;
  out.resize(capacity);
  size_t total = 0;
  for (;;) {
    if (total == out.size()) out.resize(out.size() + std::max<size_t>(65536, out.size() / 2));
    const ssize_t n = ::read(fd, out.data() + total, out.size() - total);
    if (n < 0) {
      if (errno == EINTR) continue;
      os_error("read failed");
    }
    if (n == 0) break;
    total += static_cast<size_t>(n);
  }
  out.resize(total);
}

}  // namespace

void read_file(const char* path, std::vector<uint8_t>& out) { read_whole_file(path, out); }
void read_file(const char* path, ByteBuffer& out) { read_whole_file(path, out); }

struct Decoder::Impl {
  detail::JpegDecoder jpeg;
  detail::WholeImageDecoder whole_image;
  ImageBuffer stored;  // decode target when EXIF orientation is applied afterwards
};

Decoder::Decoder() : impl_(std::make_unique<Impl>()) {}
Decoder::~Decoder() = default;

DecodeResult Decoder::decode(std::span<const uint8_t> bytes, std::string_view source,
                             const DecodeOptions& options, ImageBuffer& out) {
  if (options.scale.num < 1 || options.scale.num > 8)
    throw std::invalid_argument(
        fmt::format("gpufeed::decode: scale {}/8 is outside 1/8..8/8", options.scale.num));
  DecodeResult result;
  result.info = probe(bytes, source);  // kEmpty, kUnsupported, kTruncated, kCorrupt
  const ImageInfo& info = result.info;

  // The limit comes before any allocation, for every format (decompression bombs).
  const int64_t pixels = int64_t{info.width} * info.height;
  if (pixels > options.max_pixels)
    detail::fail(ErrorKind::kTooLarge, source,
                 fmt::format("{}x{} = {} pixels exceeds max_pixels {}", info.width, info.height,
                             pixels, options.max_pixels));

  if (info.format == ImageFormat::kJpeg) {
    // libjpeg-turbo 2.1's 8-bit libjpeg API decodes neither 12-bit nor lossless JPEG; say so
    // before libjpeg allocates anything.
    if (info.lossless) detail::fail(ErrorKind::kUnsupported, source, "lossless JPEG");
    if (info.bits_per_sample != 8)
      detail::fail(ErrorKind::kUnsupported, source,
                   fmt::format("{}-bit precision", info.bits_per_sample));
    if (info.components != 1 && info.components != 3 && info.components != 4)
      detail::fail(ErrorKind::kUnsupported, source,
                   fmt::format("{}-component JPEG", info.components));
  }

  const int orientation = options.apply_exif_orientation ? info.orientation : 1;
  const bool swap = orientation_swaps_axes(orientation);
  const int display_w = swap ? info.height : info.width;
  const int display_h = swap ? info.width : info.height;
  const CropRect display_crop = detail::clamp_crop(options.crop, display_w, display_h);
  const CropRect crop =
      detail::display_to_stored(display_crop, orientation, info.width, info.height);
  ImageBuffer& target = orientation != 1 ? impl_->stored : out;

  if (info.format == ImageFormat::kJpeg) {
    impl_->jpeg.decode(bytes, source, info, options, crop, target, result);
  } else {
    impl_->whole_image.decode(bytes, source, info, options, crop, target, result);
    result.scale = ScaleFactor{8};
    result.region = crop;
    result.scaled_region = crop;
  }

  if (orientation != 1) {
    detail::apply_orientation(target, orientation, out);
    result.region = detail::stored_to_display(result.region, orientation, info.width, info.height);
    result.scaled_region = detail::stored_to_display(result.scaled_region, orientation,
                                                     scaled_size(info.width, result.scale),
                                                     scaled_size(info.height, result.scale));
  }
  return result;
}

}  // namespace gpufeed::decode
