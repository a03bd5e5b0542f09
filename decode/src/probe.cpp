// Header parsing without any decoder library: sniff() and probe(). Every read is bounds-checked
// against the span, and every loop advances through the input, so probe() runs in time linear in
// the header's size for any input (it is a fuzzing target).

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>

#include "gpufeed/decode/decoder.h"
#include "internal.h"

namespace gpufeed::decode {

namespace {

using detail::fail;

/// Bounds-checked big/little-endian reads over the input. Callers check has() first; the
/// accessors themselves never read past the end either (they return 0 there).
class Bytes {
 public:
  explicit Bytes(std::span<const uint8_t> bytes) : p_(bytes.data()), n_(bytes.size()) {}

  size_t size() const { return n_; }
  /// True if [pos, pos + count) lies inside the input.
  bool has(size_t pos, size_t count) const { return pos <= n_ && count <= n_ - pos; }
  uint8_t u8(size_t pos) const { return pos < n_ ? p_[pos] : 0; }
  uint32_t be16(size_t pos) const { return (uint32_t{u8(pos)} << 8) | u8(pos + 1); }
  uint32_t be32(size_t pos) const { return (be16(pos) << 16) | be16(pos + 2); }
  uint32_t le16(size_t pos) const { return u8(pos) | (uint32_t{u8(pos + 1)} << 8); }
  uint32_t le24(size_t pos) const { return le16(pos) | (uint32_t{u8(pos + 2)} << 16); }
  uint32_t le32(size_t pos) const { return le16(pos) | (le16(pos + 2) << 16); }
  uint64_t u16(size_t pos, bool big) const { return big ? be16(pos) : le16(pos); }
  uint64_t u32(size_t pos, bool big) const { return big ? be32(pos) : le32(pos); }
  uint64_t u64(size_t pos, bool big) const {
    return big ? (u32(pos, true) << 32) | u32(pos + 4, true)
               : u32(pos, false) | (u32(pos + 4, false) << 32);
  }
  bool equals(size_t pos, std::string_view text) const {
    return has(pos, text.size()) && std::memcmp(p_ + pos, text.data(), text.size()) == 0;
  }

 private:
  const uint8_t* p_;
  size_t n_;
};

constexpr uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

// --- JPEG -------------------------------------------------------------------------------------

bool is_sof(uint8_t marker) {
  // C0..CF are SOFn except DHT (C4), JPG (C8) and DAC (CC).
  return marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC;
}

/// Chroma layout from the components' sampling factors, as TurboJPEG classifies it: every
/// chroma component at 1x1 relative to luma's factors (K of a 4-component image may also match
/// luma, as in YCCK).
Subsampling jpeg_subsampling(int components, const int* h, const int* v) {
  if (components == 1) return Subsampling::kGray;
  if (components != 3 && components != 4) return Subsampling::kNone;
  const int ch = h[1], cv = v[1];
  if (h[2] != ch || v[2] != cv) return Subsampling::kNone;
  if (components == 4 && !((h[3] == ch && v[3] == cv) || (h[3] == h[0] && v[3] == v[0])))
    return Subsampling::kNone;
  if (h[0] % ch != 0 || v[0] % cv != 0) return Subsampling::kNone;
  const int rh = h[0] / ch, rv = v[0] / cv;
  if (rh == 1 && rv == 1) return Subsampling::k444;
  if (rh == 2 && rv == 1) return Subsampling::k422;
  if (rh == 2 && rv == 2) return Subsampling::k420;
  if (rh == 1 && rv == 2) return Subsampling::k440;
  if (rh == 4 && rv == 1) return Subsampling::k411;
  return Subsampling::kNone;
}

/// Orientation (1..8) from an APP1 "Exif\0\0" payload [pos, pos + length), or nullopt.
std::optional<int> exif_orientation(const Bytes& b, size_t pos, size_t length) {
  if (length < 6 + 8 || !b.equals(pos, std::string_view("Exif\0\0", 6))) return std::nullopt;
  const size_t tiff = pos + 6;
  const size_t tiff_len = length - 6;
  bool big;
  if (b.equals(tiff, "MM"))
    big = true;
  else if (b.equals(tiff, "II"))
    big = false;
  else
    return std::nullopt;
  if (b.u16(tiff + 2, big) != 42) return std::nullopt;
  const uint64_t ifd = b.u32(tiff + 4, big);
  if (ifd + 2 > tiff_len) return std::nullopt;
  const uint64_t count = b.u16(tiff + ifd, big);
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t entry = ifd + 2 + 12 * i;
    if (entry + 12 > tiff_len) break;
    if (b.u16(tiff + entry, big) != 0x0112) continue;
    // SHORT (type 3) with count >= 1 stores its value in the first two bytes of the field.
    if (b.u16(tiff + entry + 2, big) != 3 || b.u32(tiff + entry + 4, big) < 1) return std::nullopt;
    const uint64_t value = b.u16(tiff + entry + 8, big);
    if (value >= 1 && value <= 8) return static_cast<int>(value);
    return std::nullopt;
  }
  return std::nullopt;
}

ImageInfo probe_jpeg(const Bytes& b, std::string_view source) {
  ImageInfo info;
  info.format = ImageFormat::kJpeg;
  std::optional<int> orientation;
  size_t pos = 2;  // after SOI
  for (;;) {
    // Bytes that are not 0xFF between segments are tolerated, as libjpeg does (with a warning).
    while (pos < b.size() && b.u8(pos) != 0xFF) ++pos;
    while (pos < b.size() && b.u8(pos) == 0xFF) ++pos;  // fill bytes
    if (pos >= b.size())
      fail(ErrorKind::kTruncated, source, "JPEG data ends before the frame header (SOF)");
    const uint8_t marker = b.u8(pos++);
    if (marker == 0x00 || marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) continue;
    if (marker == 0xD8)
      fail(ErrorKind::kCorrupt, source, "JPEG has a second SOI marker before the frame header");
    if (marker == 0xD9)
      fail(ErrorKind::kCorrupt, source, "JPEG ends (EOI) before the frame header");
    if (marker == 0xDA)
      fail(ErrorKind::kCorrupt, source, "JPEG scan (SOS) comes before the frame header");
    if (!b.has(pos, 2))
      fail(ErrorKind::kTruncated, source, "JPEG data ends inside a marker segment");
    const size_t length = b.be16(pos);
    if (length < 2)
      fail(ErrorKind::kCorrupt, source,
           fmt::format("JPEG marker 0xFF{:02X} has invalid length {}", marker, length));
    const size_t seg = pos + 2;
    const size_t seg_len = length - 2;
    if (!b.has(seg, seg_len))
      fail(ErrorKind::kTruncated, source,
           fmt::format("JPEG data ends inside marker 0xFF{:02X}", marker));
    if (marker == 0xE1 && !orientation) orientation = exif_orientation(b, seg, seg_len);
    if (is_sof(marker)) {
      if (seg_len < 6) fail(ErrorKind::kCorrupt, source, "JPEG frame header (SOF) is too short");
      info.bits_per_sample = b.u8(seg);
      info.height = static_cast<int>(b.be16(seg + 1));
      info.width = static_cast<int>(b.be16(seg + 3));
      info.components = b.u8(seg + 5);
      if (info.components == 0)
        fail(ErrorKind::kCorrupt, source, "JPEG frame header declares 0 components");
      if (seg_len < 6 + 3 * static_cast<size_t>(info.components))
        fail(ErrorKind::kCorrupt, source,
             "JPEG frame header (SOF) is shorter than its component list");
      int h[4] = {1, 1, 1, 1}, v[4] = {1, 1, 1, 1};
      for (int c = 0; c < info.components; ++c) {
        const uint8_t factors = b.u8(seg + 6 + 3 * c + 1);
        const int hc = factors >> 4, vc = factors & 15;
        if (hc < 1 || hc > 4 || vc < 1 || vc > 4)
          fail(ErrorKind::kCorrupt, source,
               fmt::format("JPEG component {} has invalid sampling factors {}x{}", c, hc, vc));
        if (c < 4) {
          h[c] = hc;
          v[c] = vc;
        }
      }
      info.subsampling = jpeg_subsampling(info.components, h, v);
      info.progressive = marker == 0xC2 || marker == 0xC6 || marker == 0xCA || marker == 0xCE;
      info.arithmetic = marker >= 0xC9;
      info.lossless = marker == 0xC3 || marker == 0xC7 || marker == 0xCB || marker == 0xCF;
      // The Exif segment precedes SOF in every conforming file (APPn come first).
      info.orientation = orientation.value_or(1);
      return info;
    }
    pos = seg + seg_len;
  }
}

// --- PNG --------------------------------------------------------------------------------------

ImageInfo probe_png(const Bytes& b, std::string_view source) {
  ImageInfo info;
  info.format = ImageFormat::kPng;
  if (!b.has(0, 8 + 8 + 13))
    fail(ErrorKind::kTruncated, source, "PNG data ends inside the IHDR chunk");
  if (b.be32(8) != 13 || !b.equals(12, "IHDR"))
    fail(ErrorKind::kCorrupt, source, "PNG's first chunk is not a 13-byte IHDR");
  const uint32_t width = b.be32(16), height = b.be32(20);
  if (width > INT_MAX || height > INT_MAX)
    fail(ErrorKind::kCorrupt, source, fmt::format("PNG size {}x{} exceeds 2^31-1", width, height));
  info.width = static_cast<int>(width);
  info.height = static_cast<int>(height);
  const int depth = b.u8(24), color = b.u8(25), interlace = b.u8(28);
  bool valid_depth = false;
  switch (color) {
    case 0:
      info.components = 1;
      valid_depth = depth == 1 || depth == 2 || depth == 4 || depth == 8 || depth == 16;
      break;
    case 2:
      info.components = 3;
      valid_depth = depth == 8 || depth == 16;
      break;
    case 3:
      info.components = 3;
      valid_depth = depth == 1 || depth == 2 || depth == 4 || depth == 8;
      break;
    case 4:
      info.components = 2;
      valid_depth = depth == 8 || depth == 16;
      break;
    case 6:
      info.components = 4;
      valid_depth = depth == 8 || depth == 16;
      break;
    default:
      fail(ErrorKind::kCorrupt, source, fmt::format("PNG has invalid colour type {}", color));
  }
  if (!valid_depth)
    fail(ErrorKind::kCorrupt, source,
         fmt::format("PNG colour type {} cannot have bit depth {}", color, depth));
  if (interlace > 1)
    fail(ErrorKind::kCorrupt, source,
         fmt::format("PNG has invalid interlace method {}", interlace));
  info.bits_per_sample = depth;
  info.progressive = interlace == 1;
  return info;
}

// --- GIF --------------------------------------------------------------------------------------

ImageInfo probe_gif(const Bytes& b, std::string_view source) {
  ImageInfo info;
  info.format = ImageFormat::kGif;
  if (!b.has(0, 10))
    fail(ErrorKind::kTruncated, source, "GIF data ends inside the logical screen descriptor");
  info.width = static_cast<int>(b.le16(6));
  info.height = static_cast<int>(b.le16(8));
  info.components = 3;
  return info;
}

// --- BMP --------------------------------------------------------------------------------------

ImageInfo probe_bmp(const Bytes& b, std::string_view source) {
  ImageInfo info;
  info.format = ImageFormat::kBmp;
  if (!b.has(0, 18)) fail(ErrorKind::kTruncated, source, "BMP data ends inside the file header");
  const uint32_t dib = b.le32(14);
  int64_t width, height;
  uint32_t bpp;
  if (dib == 12) {  // BITMAPCOREHEADER: 16-bit unsigned sizes, always bottom-up
    if (!b.has(0, 26)) fail(ErrorKind::kTruncated, source, "BMP data ends inside the info header");
    width = b.le16(18);
    height = b.le16(20);
    bpp = b.le16(24);
  } else if (dib >= 16 && dib <= 124) {  // OS/2 v2, BITMAPINFOHEADER and its V2..V5 extensions
    if (!b.has(0, 30)) fail(ErrorKind::kTruncated, source, "BMP data ends inside the info header");
    width = static_cast<int32_t>(b.le32(18));
    height = static_cast<int32_t>(b.le32(22));
    bpp = b.le16(28);
    height = height < 0 ? -height : height;  // negative height = rows stored top-down
  } else {
    fail(ErrorKind::kCorrupt, source, fmt::format("BMP has unknown info header size {}", dib));
  }
  if (width < 0) fail(ErrorKind::kCorrupt, source, fmt::format("BMP has negative width {}", width));
  // 0 (embedded JPEG/PNG) and 2 (Windows CE) exist too; nothing else is a BMP depth, and
  // guessing at one would turn data into garbage pixels.
  if (bpp != 0 && bpp != 1 && bpp != 2 && bpp != 4 && bpp != 8 && bpp != 16 && bpp != 24 &&
      bpp != 32)
    fail(ErrorKind::kCorrupt, source, fmt::format("BMP has invalid bit depth {}", bpp));
  if (width > INT_MAX || height > INT_MAX)
    fail(ErrorKind::kCorrupt, source, "BMP size exceeds 2^31-1");
  info.width = static_cast<int>(width);
  info.height = static_cast<int>(height);
  info.components = bpp == 32 ? 4 : 3;
  return info;
}

// --- WebP -------------------------------------------------------------------------------------

ImageInfo probe_webp(const Bytes& b, std::string_view source) {
  ImageInfo info;
  info.format = ImageFormat::kWebp;
  info.components = 3;
  if (!b.has(12, 8)) fail(ErrorKind::kTruncated, source, "WebP data ends before the first chunk");
  if (b.equals(12, "VP8 ")) {
    if (!b.has(20, 10))
      fail(ErrorKind::kTruncated, source, "WebP data ends inside the VP8 frame header");
    if (b.u8(23) != 0x9D || b.u8(24) != 0x01 || b.u8(25) != 0x2A)
      fail(ErrorKind::kCorrupt, source, "WebP VP8 frame lacks its start code");
    info.width = static_cast<int>(b.le16(26) & 0x3FFF);
    info.height = static_cast<int>(b.le16(28) & 0x3FFF);
  } else if (b.equals(12, "VP8L")) {
    if (!b.has(20, 5)) fail(ErrorKind::kTruncated, source, "WebP data ends inside the VP8L header");
    if (b.u8(20) != 0x2F) fail(ErrorKind::kCorrupt, source, "WebP VP8L stream lacks its signature");
    const uint32_t bits = b.le32(21);
    info.width = static_cast<int>((bits & 0x3FFF) + 1);
    info.height = static_cast<int>(((bits >> 14) & 0x3FFF) + 1);
    info.components = (bits >> 28) & 1 ? 4 : 3;
  } else if (b.equals(12, "VP8X")) {
    if (!b.has(20, 10)) fail(ErrorKind::kTruncated, source, "WebP data ends inside the VP8X chunk");
    info.width = static_cast<int>(b.le24(24) + 1);
    info.height = static_cast<int>(b.le24(27) + 1);
    info.components = b.u8(20) & 0x10 ? 4 : 3;
  } else {
    fail(ErrorKind::kCorrupt, source, "WebP's first chunk is not VP8, VP8L or VP8X");
  }
  return info;
}

// --- PNM --------------------------------------------------------------------------------------

/// Reads the next decimal token of a PNM header (whitespace and '#' comments skipped).
uint32_t pnm_token(const Bytes& b, size_t& pos, std::string_view source) {
  for (;;) {
    if (pos >= b.size()) fail(ErrorKind::kTruncated, source, "PNM data ends inside the header");
    const uint8_t c = b.u8(pos);
    if (c == '#') {
      while (pos < b.size() && b.u8(pos) != '\n' && b.u8(pos) != '\r') ++pos;
    } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') {
      ++pos;
    } else {
      break;
    }
  }
  uint64_t value = 0;
  size_t digits = 0;
  while (pos < b.size() && b.u8(pos) >= '0' && b.u8(pos) <= '9') {
    value = value * 10 + (b.u8(pos) - '0');
    if (value > INT_MAX) fail(ErrorKind::kCorrupt, source, "PNM header number exceeds 2^31-1");
    ++pos;
    ++digits;
  }
  if (digits == 0) fail(ErrorKind::kCorrupt, source, "PNM header has a non-numeric field");
  if (pos >= b.size()) fail(ErrorKind::kTruncated, source, "PNM data ends inside the header");
  return static_cast<uint32_t>(value);
}

/// PNM header; *header (if given) receives the kind, maxval and where the samples start: one
/// whitespace byte after the last header field.
ImageInfo probe_pnm(const Bytes& b, std::string_view source, detail::PnmHeader* header = nullptr) {
  ImageInfo info;
  info.format = ImageFormat::kPnm;
  const char kind = static_cast<char>(b.u8(1));
  size_t pos = 2;
  info.width = static_cast<int>(pnm_token(b, pos, source));
  info.height = static_cast<int>(pnm_token(b, pos, source));
  info.components = kind == '3' || kind == '6' ? 3 : 1;
  info.bits_per_sample = 1;
  uint32_t maxval = 1;
  if (kind != '1' && kind != '4') {
    maxval = pnm_token(b, pos, source);
    if (maxval == 0 || maxval > 65535)
      fail(ErrorKind::kCorrupt, source, fmt::format("PNM maxval {} is outside 1..65535", maxval));
    info.bits_per_sample = maxval > 255 ? 16 : 8;
  }
  if (header) *header = detail::PnmHeader{kind, maxval, pos + 1};
  return info;
}

// --- TIFF -------------------------------------------------------------------------------------

ImageInfo probe_tiff(const Bytes& b, std::string_view source) {
  ImageInfo info;
  info.format = ImageFormat::kTiff;
  const bool big = b.u8(0) == 'M';
  const bool bigtiff = b.u16(2, big) == 43;
  if (!b.has(0, bigtiff ? 16 : 8))
    fail(ErrorKind::kTruncated, source, "TIFF data ends inside the header");
  if (bigtiff && (b.u16(4, big) != 8 || b.u16(6, big) != 0))
    fail(ErrorKind::kCorrupt, source, "BigTIFF header has an unsupported offset size");
  const uint64_t ifd = bigtiff ? b.u64(8, big) : b.u32(4, big);
  const size_t count_size = bigtiff ? 8 : 2;
  const size_t entry_size = bigtiff ? 20 : 12;
  if (ifd > b.size() || !b.has(static_cast<size_t>(ifd), count_size))
    fail(ErrorKind::kTruncated, source, "TIFF data ends before the first IFD");
  const uint64_t count = bigtiff ? b.u64(ifd, big) : b.u16(ifd, big);
  // Entries beyond the end of the data are ignored; the loop is bounded by the data size.
  const uint64_t available = (b.size() - ifd - count_size) / entry_size;
  std::optional<uint64_t> width, height;
  info.components = 1;
  info.bits_per_sample = 1;
  for (uint64_t i = 0; i < std::min(count, available); ++i) {
    const size_t entry = static_cast<size_t>(ifd + count_size + i * entry_size);
    const uint64_t tag = b.u16(entry, big);
    const uint64_t type = b.u16(entry + 2, big);
    const size_t value = entry + (bigtiff ? 12 : 8);
    std::optional<uint64_t> scalar;
    if (type == 3)
      scalar = b.u16(value, big);
    else if (type == 4)
      scalar = b.u32(value, big);
    else if (type == 16 && bigtiff)
      scalar = b.u64(value, big);
    if (!scalar) continue;
    if (tag == 256)
      width = scalar;
    else if (tag == 257)
      height = scalar;
    else if (tag == 277)
      info.components = static_cast<int>(std::min<uint64_t>(*scalar, 255));
    else if (tag == 258 && type == 3) {
      // BitsPerSample has one value per sample; with more than fit the field it holds an offset.
      const uint64_t n = bigtiff ? b.u64(entry + 4, big) : b.u32(entry + 4, big);
      uint64_t bits = *scalar;
      if (n * 2 > (bigtiff ? 8u : 4u)) {
        const uint64_t at = bigtiff ? b.u64(value, big) : b.u32(value, big);
        bits = at < b.size() && b.has(static_cast<size_t>(at), 2)
                   ? b.u16(static_cast<size_t>(at), big)
                   : 8;
      }
      info.bits_per_sample = static_cast<int>(std::min<uint64_t>(bits, 64));
    }
  }
  if (!width || !height)
    fail(ErrorKind::kCorrupt, source, "TIFF's first IFD lacks ImageWidth or ImageLength");
  if (*width > INT_MAX || *height > INT_MAX)
    fail(ErrorKind::kCorrupt, source, "TIFF size exceeds 2^31-1");
  info.width = static_cast<int>(*width);
  info.height = static_cast<int>(*height);
  return info;
}

}  // namespace

detail::PnmHeader detail::pnm_header(std::span<const uint8_t> bytes, std::string_view source) {
  PnmHeader header;
  probe_pnm(Bytes(bytes), source, &header);
  return header;
}

std::string_view to_string(ImageFormat format) {
  switch (format) {
    case ImageFormat::kJpeg:
      return "jpeg";
    case ImageFormat::kPng:
      return "png";
    case ImageFormat::kBmp:
      return "bmp";
    case ImageFormat::kWebp:
      return "webp";
    case ImageFormat::kGif:
      return "gif";
    case ImageFormat::kPnm:
      return "pnm";
    case ImageFormat::kTiff:
      return "tiff";
    case ImageFormat::kUnknown:
      break;
  }
  return "unknown";
}

std::string_view to_string(Subsampling subsampling) {
  switch (subsampling) {
    case Subsampling::k444:
      return "4:4:4";
    case Subsampling::k422:
      return "4:2:2";
    case Subsampling::k420:
      return "4:2:0";
    case Subsampling::kGray:
      return "gray";
    case Subsampling::k440:
      return "4:4:0";
    case Subsampling::k411:
      return "4:1:1";
    case Subsampling::kNone:
      break;
  }
  return "none";
}

ImageFormat sniff(std::span<const uint8_t> bytes) {
  const Bytes b(bytes);
  // Two bytes suffice for JPEG so that a file cut right after SOI is reported as truncated JPEG.
  if (b.has(0, 2) && b.u8(0) == 0xFF && b.u8(1) == 0xD8) return ImageFormat::kJpeg;
  if (b.has(0, 8) && std::memcmp(bytes.data(), kPngSignature, 8) == 0) return ImageFormat::kPng;
  if (b.equals(0, "GIF87a") || b.equals(0, "GIF89a")) return ImageFormat::kGif;
  if (b.equals(0, "RIFF") && b.equals(8, "WEBP")) return ImageFormat::kWebp;
  if (b.equals(0, std::string_view("II*\0", 4)) || b.equals(0, std::string_view("MM\0*", 4)) ||
      b.equals(0, std::string_view("II+\0", 4)) || b.equals(0, std::string_view("MM\0+", 4)))
    return ImageFormat::kTiff;
  if (b.has(0, 3) && b.u8(0) == 'P' && b.u8(1) >= '1' && b.u8(1) <= '6') {
    const uint8_t c = b.u8(2);
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '#') return ImageFormat::kPnm;
  }
  if (b.equals(0, "BM")) {
    // "BM" alone is a weak signature (text can start with it): also require a known info header
    // size when the bytes reach it.
    if (!b.has(14, 4)) return ImageFormat::kBmp;
    const uint32_t dib = b.le32(14);
    if (dib == 12 || dib == 16 || dib == 40 || dib == 52 || dib == 56 || dib == 64 || dib == 108 ||
        dib == 124)
      return ImageFormat::kBmp;
  }
  return ImageFormat::kUnknown;
}

ImageInfo probe(std::span<const uint8_t> bytes, std::string_view source) {
  if (bytes.empty()) fail(ErrorKind::kEmpty, source, "no bytes");
  const Bytes b(bytes);
  ImageInfo info;
  switch (sniff(bytes)) {
    case ImageFormat::kJpeg:
      info = probe_jpeg(b, source);
      break;
    case ImageFormat::kPng:
      info = probe_png(b, source);
      break;
    case ImageFormat::kGif:
      info = probe_gif(b, source);
      break;
    case ImageFormat::kBmp:
      info = probe_bmp(b, source);
      break;
    case ImageFormat::kWebp:
      info = probe_webp(b, source);
      break;
    case ImageFormat::kPnm:
      info = probe_pnm(b, source);
      break;
    case ImageFormat::kTiff:
      info = probe_tiff(b, source);
      break;
    case ImageFormat::kUnknown: {
      std::string head;
      for (size_t i = 0; i < std::min<size_t>(bytes.size(), 8); ++i)
        head += fmt::format("{}{:02x}", i ? " " : "", bytes[i]);
      fail(ErrorKind::kUnsupported, source,
           fmt::format("unrecognised image format (first bytes: {})", head));
    }
  }
  if (info.width <= 0 || info.height <= 0)
    fail(ErrorKind::kCorrupt, source,
         fmt::format("{} header declares a zero size ({}x{})", to_string(info.format), info.width,
                     info.height));
  return info;
}

}  // namespace gpufeed::decode
