// BMP and PNM, read here rather than through OpenCV: imdecode prints each failure of its codecs to
// stderr, and both formats are simple enough to read with every bound checked. Each decodes the
// whole image into scratch at full size and copies the crop out (the sizes were checked against
// max_pixels from the header before this runs).
//
// BMP: BITMAPCOREHEADER (OS/2 1.x), OS/2 2.x and BITMAPINFOHEADER with its V2..V5 extensions;
// 1, 2, 4 and 8 bits through the palette, 16 and 32 bits through bit masks (BI_BITFIELDS,
// BI_ALPHABITFIELDS, or the 5-5-5 / 8-8-8 defaults), 24-bit BGR, RLE8 and RLE4; bottom-up and
// top-down rows. Alpha is dropped. Embedded JPEG/PNG and OS/2 Huffman/RLE24 are unsupported.
// PNM: P1..P6, maxval 1..65535 scaled to 0..255 with rounding (halves to even, as Pillow).

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <string>

#include "internal.h"

namespace gpufeed::decode::detail {

namespace {

uint32_t le16(std::span<const uint8_t> b, size_t pos) {
  return pos + 2 <= b.size() ? uint32_t{b[pos]} | uint32_t{b[pos + 1]} << 8 : 0;
}
uint32_t le32(std::span<const uint8_t> b, size_t pos) {
  return pos + 4 <= b.size() ? le16(b, pos) | le16(b, pos + 2) << 16 : 0;
}

/// One channel of a bit-masked pixel: the masked bits scaled to 0..255 as Pillow's unpackers do
/// (v * 255 / max, truncated: 5-bit 31 -> 255, 16 -> 131).
struct Channel {
  uint32_t mask = 0;
  int shift = 0;
  uint32_t max = 0;  // largest value of the masked bits, 0 for an absent channel

  static Channel of(uint32_t mask) {
    Channel c;
    c.mask = mask;
    if (mask == 0) return c;
    c.shift = std::countr_zero(mask);
    c.max = mask >> c.shift;
    return c;
  }
  bool contiguous() const { return (max & (max + 1)) == 0; }
  uint8_t operator()(uint32_t px) const {
    if (max == 0) return 0;
    const uint64_t v = (px & mask) >> shift;
    return static_cast<uint8_t>(v * 255 / max);
  }
};

// --- BMP ----------------------------------------------------------------------------------------

enum BmpCompression : uint32_t {
  kRgb = 0,
  kRle8 = 1,
  kRle4 = 2,
  kBitfields = 3,
  kJpeg = 4,
  kPng = 5,
  kAlphaBitfields = 6
};

/// How a BMP's header says its pixels are stored, checked against what the reader supports.
struct BmpLayout {
  uint32_t offset;       // where the pixel data starts
  uint32_t dib;          // size of the DIB header
  bool core;             // BITMAPCOREHEADER (OS/2 1.x): 3-byte palette entries, no compression
  uint32_t bpp;          // bits per pixel
  uint32_t compression;  // BmpCompression
  bool top_down;         // rows stored top first (a negative height)
  bool rle;              // RLE8 or RLE4
  bool masked;           // 16 or 32 bits through bit masks given in the file
};

/// The layout of a BMP. Throws DecodeError for what the reader does not support or the header
/// contradicts, and kTruncated when the pixel data would start past the end of the input.
BmpLayout bmp_layout(std::span<const uint8_t> b, std::string_view source) {
  BmpLayout l{};
  l.offset = le32(b, 10);
  l.dib = le32(b, 14);
  l.core = l.dib == 12;
  const bool os2 = l.dib == 16 || l.dib == 64;  // OS/2 2.x: compression 3 and 4 mean other things
  l.bpp = l.core ? le16(b, 24) : le16(b, 28);
  l.compression = l.core || l.dib < 20 ? 0 : le32(b, 30);
  l.top_down = !l.core && static_cast<int32_t>(le32(b, 22)) < 0;
  const uint32_t compression = l.compression, bpp = l.bpp;
  if (compression == kJpeg || compression == kPng || (os2 && compression >= 3))
    fail(ErrorKind::kUnsupported, source,
         fmt::format("BMP compression {} (embedded JPEG/PNG or OS/2 Huffman/RLE24)", compression));
  if (compression > kAlphaBitfields)
    fail(ErrorKind::kCorrupt, source, fmt::format("BMP has unknown compression {}", compression));
  if (bpp == 0) fail(ErrorKind::kCorrupt, source, "BMP has bit depth 0 without embedded data");
  l.rle = compression == kRle8 || compression == kRle4;
  if ((compression == kRle8 && bpp != 8) || (compression == kRle4 && bpp != 4))
    fail(ErrorKind::kCorrupt, source, fmt::format("BMP RLE{} with {} bits per pixel", compression == kRle8 ? 8 : 4, bpp));
  if (l.rle && l.top_down) fail(ErrorKind::kCorrupt, source, "BMP RLE data cannot be top-down");
  l.masked = compression == kBitfields || compression == kAlphaBitfields;
  if (l.masked && bpp != 16 && bpp != 32)
    fail(ErrorKind::kCorrupt, source, fmt::format("BMP bit fields with {} bits per pixel", bpp));
  if (l.offset > b.size())
    fail(ErrorKind::kTruncated, source, "BMP data ends before its pixel data");
  return l;
}

/// What a BMP's pixel values mean: palette entries (bpp <= 8) or channel masks (16, 32 bits).
struct BmpColors {
  uint8_t palette[256][3] = {};  // RGB; entries past a short palette stay black
  Channel red, green, blue;
};

/// The palette and the masks of a BMP of layout `l`. Throws DecodeError for masks that end
/// past the input or are not contiguous.
BmpColors bmp_colors(std::span<const uint8_t> b, const BmpLayout& l, std::string_view source) {
  BmpColors c;
  // Palette (bpp <= 8): after the header (and the masks a BITMAPINFOHEADER puts after itself).
  if (l.bpp <= 8) {
    const size_t entry = l.core ? 3 : 4;
    size_t at = 14 + static_cast<size_t>(l.dib);
    if (l.dib == 40 && l.masked) at += l.compression == kAlphaBitfields ? 16 : 12;
    const uint32_t used = l.core || l.dib < 36 ? 0 : le32(b, 46);
    int colors = static_cast<int>(used == 0 || used > (1u << l.bpp) ? 1u << l.bpp : used);
    // A short palette (some writers stop at the pixel data) leaves the rest black.
    const size_t room = l.offset > at ? (l.offset - at) / entry : 0;
    colors = static_cast<int>(std::min<size_t>(static_cast<size_t>(colors), room));
    for (int i = 0; i < colors; ++i) {
      const size_t p = at + static_cast<size_t>(i) * entry;
      c.palette[i][0] = b[p + 2];
      c.palette[i][1] = b[p + 1];
      c.palette[i][2] = b[p];
    }
  }

  // Masks for 16 and 32 bits: given (at offset 54 for both the V2+ headers and the masks that
  // follow a BITMAPINFOHEADER), or the defaults 5-5-5 and 8-8-8.
  if (l.masked) {
    if (b.size() < 66) fail(ErrorKind::kTruncated, source, "BMP data ends inside its bit masks");
    c.red = Channel::of(le32(b, 54));
    c.green = Channel::of(le32(b, 58));
    c.blue = Channel::of(le32(b, 62));
    if (!c.red.contiguous() || !c.green.contiguous() || !c.blue.contiguous())
      fail(ErrorKind::kCorrupt, source, "BMP bit masks are not contiguous");
  } else if (l.bpp == 16) {
    c.red = Channel::of(0x7C00);
    c.green = Channel::of(0x03E0);
    c.blue = Channel::of(0x001F);
  } else if (l.bpp == 32) {
    c.red = Channel::of(0x00FF0000);
    c.green = Channel::of(0x0000FF00);
    c.blue = Channel::of(0x000000FF);
  }
  return c;
}

/// The decoded w x h RGB image, addressed by stored row: stored row r is image row (h - 1 - r)
/// unless the rows are stored top-down.
struct BmpImage {
  uint8_t* data;
  size_t stride;  // bytes
  int height;
  bool top_down;
  uint8_t* stored_row(int r) const {
    return data + stride * static_cast<size_t>(top_down ? r : height - 1 - r);
  }
};

/// RLE8/RLE4 data as palette indices, w per stored row, into `indices` (w x h). Pixels the
/// stream never sets (deltas, early end of line/bitmap) take index 0. Throws kTruncated when the
/// data ends before the image does without an end-of-bitmap.
void unpack_bmp_rle(std::span<const uint8_t> b, const BmpLayout& l, int w, int h,
                    std::vector<uint8_t>& indices, std::string_view source) {
  if (indices.size() < static_cast<size_t>(w) * h) indices.resize(static_cast<size_t>(w) * h);
  std::fill_n(indices.begin(), static_cast<size_t>(w) * h, uint8_t{0});
  const bool rle8 = l.compression == kRle8;
  size_t pos = l.offset;
  int x = 0, y = 0;
  bool ended = false;
  const auto put = [&](uint32_t index) {
    if (x < w && y < h) indices[static_cast<size_t>(y) * w + x] = static_cast<uint8_t>(index);
    ++x;
  };
  while (y < h) {
    if (pos + 2 > b.size()) break;
    const uint32_t n = b[pos], c = b[pos + 1];
    pos += 2;
    if (n > 0) {  // encoded run: n pixels of c (RLE4: alternating nibbles)
      for (uint32_t i = 0; i < n; ++i) put(rle8 ? c : (i % 2 ? c & 15 : c >> 4));
    } else if (c == 0) {  // end of line
      x = 0;
      ++y;
    } else if (c == 1) {  // end of bitmap
      ended = true;
      break;
    } else if (c == 2) {  // delta
      if (pos + 2 > b.size()) break;
      x += b[pos];
      y += b[pos + 1];
      pos += 2;
    } else {  // absolute run of c pixels, padded to 16 bits
      const size_t bytes = rle8 ? c : (c + 1) / 2;
      if (pos + bytes > b.size()) {
        pos = b.size();
        break;
      }
      for (uint32_t i = 0; i < c; ++i)
        put(rle8 ? b[pos + i] : (i % 2 ? b[pos + i / 2] & 15 : b[pos + i / 2] >> 4));
      pos += bytes + (bytes & 1);
    }
  }
  if (!ended && y < h) fail(ErrorKind::kTruncated, source, "BMP RLE data ends before the image does");
}

/// One stored row of w uncompressed pixels `s` as RGB into `d`.
void unpack_bmp_row(const uint8_t* s, uint8_t* d, int w, uint32_t bpp, const BmpColors& c) {
  for (int i = 0; i < w; ++i, d += 3) {
    switch (bpp) {
      case 1:
      case 2:
      case 4:
      case 8: {
        const size_t bit = static_cast<size_t>(i) * bpp;
        const uint32_t index = (s[bit / 8] >> (8 - bpp - bit % 8)) & ((1u << bpp) - 1);
        std::memcpy(d, c.palette[index], 3);  // past a short palette: black
        break;
      }
      case 24:
        d[0] = s[i * 3 + 2];
        d[1] = s[i * 3 + 1];
        d[2] = s[i * 3];
        break;
      default: {  // 16 or 32 through the masks
        const uint8_t* p = s + static_cast<size_t>(i) * (bpp / 8);
        const uint32_t px = bpp == 16 ? uint32_t{p[0]} | uint32_t{p[1]} << 8
                                      : uint32_t{p[0]} | uint32_t{p[1]} << 8 |
                                            uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
        d[0] = c.red(px);
        d[1] = c.green(px);
        d[2] = c.blue(px);
        break;
      }
    }
  }
}

/// Uncompressed rows (padded to 32 bits) into `image`. Throws kTruncated when the input is
/// shorter than its rows.
void unpack_bmp_rows(std::span<const uint8_t> b, const BmpLayout& l, int w, const BmpColors& c,
                     const BmpImage& image, std::string_view source) {
  const int h = image.height;
  const size_t stride = (static_cast<size_t>(w) * l.bpp + 31) / 32 * 4;
  if (stride * static_cast<size_t>(h) > b.size() - l.offset)
    fail(ErrorKind::kTruncated, source,
         fmt::format("BMP pixel data needs {} bytes, the input has {}",
                     static_cast<size_t>(l.offset) + stride * static_cast<size_t>(h), b.size()));
  for (int r = 0; r < h; ++r)
    unpack_bmp_row(b.data() + l.offset + stride * static_cast<size_t>(r), image.stored_row(r), w,
                   l.bpp, c);
}

// --- PNM ----------------------------------------------------------------------------------------

/// Where decoded PNM samples go: sample n (row-major, channel-interleaved) of an RGB or a grey
/// image, written as RGB (grey and bits replicated).
struct PnmSink {
  uint8_t* image;
  int channels;
  void store(size_t n, uint8_t v) const {
    if (channels == 3) {
      image[n] = v;
    } else {
      std::memset(image + n * 3, v, 3);
    }
  }
};

/// A sample 0..maxval as 0..255: round(v / maxval * 255), halves to even, as Pillow's PPM
/// decoders compute it. Throws kCorrupt for a sample above maxval.
struct PnmScale {
  uint32_t maxval;
  std::string_view source;
  uint8_t operator()(uint32_t v) const {
    if (v > maxval)
      fail(ErrorKind::kCorrupt, source, fmt::format("PNM sample {} exceeds maxval {}", v, maxval));
    const uint64_t q = uint64_t{v} * 255 / maxval, r = uint64_t{v} * 255 % maxval;
    return static_cast<uint8_t>(q + (2 * r > maxval || (2 * r == maxval && (q & 1))));
  }
};

/// P4: rows of bits, padded to whole bytes, 1 is black.
void read_pnm_bitmap(std::span<const uint8_t> b, size_t pos, int w, int h, const PnmSink& sink,
                     std::string_view source) {
  const size_t row = (static_cast<size_t>(w) + 7) / 8;
  if (pos > b.size() || row * static_cast<size_t>(h) > b.size() - pos)
    fail(ErrorKind::kTruncated, source, "PNM bitmap data ends before the image does");
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      const uint8_t bit = (b[pos + row * static_cast<size_t>(y) + static_cast<size_t>(x) / 8] >> (7 - x % 8)) & 1;
      sink.store(static_cast<size_t>(y) * w + x, bit ? 0 : 255);  // 1 is black
    }
}

/// P5/P6: `samples` binary samples, one byte each, or two (big-endian) above maxval 255.
void read_pnm_binary(std::span<const uint8_t> b, size_t pos, size_t samples, const PnmScale& scale,
                     const PnmSink& sink, std::string_view source) {
  const size_t bytes = scale.maxval > 255 ? 2 : 1;
  if (pos > b.size() || samples * bytes > b.size() - pos)
    fail(ErrorKind::kTruncated, source,
         fmt::format("PNM pixel data needs {} bytes, the input has {}", pos + samples * bytes, b.size()));
  const uint8_t* s = b.data() + pos;
  for (size_t n = 0; n < samples; ++n)
    sink.store(n, scale(bytes == 2 ? uint32_t{s[2 * n]} << 8 | s[2 * n + 1] : s[n]));
}

/// The position of the next character of b at or after `pos` that is neither whitespace nor
/// inside a '#' comment (b.size() when there is none).
size_t skip_pnm_space(std::span<const uint8_t> b, size_t pos) {
  while (pos < b.size()) {
    const uint8_t c = b[pos];
    if (c == '#') {
      while (pos < b.size() && b[pos] != '\n' && b[pos] != '\r') ++pos;
    } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') {
      ++pos;
    } else {
      return pos;
    }
  }
  return pos;
}

/// P1..P3 (ASCII): decimal samples, or '0'/'1' digits for P1 (whitespace optional).
void read_pnm_plain(std::span<const uint8_t> b, size_t pos, size_t samples, bool bits,
                    const PnmScale& scale, const PnmSink& sink, std::string_view source) {
  for (size_t n = 0; n < samples; ++n) {
    pos = skip_pnm_space(b, pos);
    if (pos >= b.size()) fail(ErrorKind::kTruncated, source, "PNM data ends before the image does");
    if (bits) {
      if (b[pos] != '0' && b[pos] != '1')
        fail(ErrorKind::kCorrupt, source, "PNM bitmap has a character other than 0 and 1");
      sink.store(n, b[pos++] == '1' ? 0 : 255);
      continue;
    }
    uint64_t v = 0;
    size_t digits = 0;
    while (pos < b.size() && b[pos] >= '0' && b[pos] <= '9' && v <= 65535) {
      v = v * 10 + (b[pos++] - '0');
      ++digits;
    }
    if (digits == 0) fail(ErrorKind::kCorrupt, source, "PNM data has a non-numeric sample");
    sink.store(n, scale(static_cast<uint32_t>(std::min<uint64_t>(v, 65536))));
  }
}

}  // namespace

void WholeImageDecoder::decode_bmp(std::span<const uint8_t> b, std::string_view source,
                                 const ImageInfo& info, const CropRect& crop, ImageBuffer& out) {
  const BmpLayout layout = bmp_layout(b, source);
  const BmpColors colors = bmp_colors(b, layout, source);
  const int w = info.width, h = info.height;
  const size_t full_stride = static_cast<size_t>(w) * 3;
  const size_t image_bytes = full_stride * static_cast<size_t>(h);
  if (scratch_.size() < image_bytes) scratch_.resize(image_bytes);
  const BmpImage image{scratch_.data(), full_stride, h, layout.top_down};
  if (layout.rle) {
    // RLE: pixels the stream never sets take palette index 0.
    unpack_bmp_rle(b, layout, w, h, indices_, source);
    for (int r = 0; r < h; ++r) {
      uint8_t* d = image.stored_row(r);
      const uint8_t* idx = indices_.data() + static_cast<size_t>(r) * w;
      for (int i = 0; i < w; ++i, d += 3) std::memcpy(d, colors.palette[idx[i]], 3);
    }
  } else {
    unpack_bmp_rows(b, layout, w, colors, image, source);
  }
  copy_region(image.data, full_stride, crop, out);
}

void WholeImageDecoder::decode_pnm(std::span<const uint8_t> b, std::string_view source,
                                 const ImageInfo& info, const CropRect& crop, ImageBuffer& out) {
  const PnmHeader header = pnm_header(b, source);
  const int w = info.width, h = info.height;
  const int channels = header.kind == '3' || header.kind == '6' ? 3 : 1;
  const bool bits = header.kind == '1' || header.kind == '4';
  const size_t full_stride = static_cast<size_t>(w) * 3;
  if (header.kind == '6' && header.maxval == 255) {
    // Binary RGB at 8 bits (what `gpufeed pack --raw-budget` stores): the samples are the pixels,
    // so the crop's rows are copied straight from the input, no scratch image, no per-byte work.
    const size_t pos = header.data_offset;
    if (pos > b.size() || full_stride * static_cast<size_t>(h) > b.size() - pos)
      fail(ErrorKind::kTruncated, source,
           fmt::format("PNM pixel data needs {} bytes, the input has {}", pos + full_stride * static_cast<size_t>(h),
                       b.size()));
    copy_region(b.data() + pos, full_stride, crop, out);
    return;
  }
  if (scratch_.size() < full_stride * static_cast<size_t>(h)) scratch_.resize(full_stride * static_cast<size_t>(h));
  const PnmSink sink{scratch_.data(), channels};
  const PnmScale scale{header.maxval, source};
  const size_t samples = static_cast<size_t>(w) * h * static_cast<size_t>(channels);
  if (header.kind >= '4') {  // binary
    if (bits)
      read_pnm_bitmap(b, header.data_offset, w, h, sink, source);
    else
      read_pnm_binary(b, header.data_offset, samples, scale, sink, source);
  } else {
    read_pnm_plain(b, header.data_offset, samples, bits, scale, sink, source);
  }
  copy_region(sink.image, full_stride, crop, out);
}

}  // namespace gpufeed::decode::detail
