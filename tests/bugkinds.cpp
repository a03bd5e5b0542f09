// Generators for every kind of bad or unusual input (see bugkinds.h).
//
// libjpeg and libpng report errors by longjmp; as in decode/src, each setjmp lives in a function
// whose frame holds only raw pointers, and the C++ callers own every buffer.

#include "bugkinds.h"

// clang-format off
#include <cstdio>  // jpeglib.h needs FILE and size_t declared before it
#include <jpeglib.h>
// clang-format on
#include <png.h>
#include <webp/encode.h>
#include <webp/mux.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <csetjmp>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <stdexcept>
#include <tuple>

namespace gpufeed::test {

using decode::ErrorKind;
using decode::Subsampling;

// --- pixels ---------------------------------------------------------------------------------

Bytes pattern(int width, int height, int channels, uint32_t seed) {
  Bytes px(static_cast<size_t>(width) * height * channels);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      double v[4] = {30.0 + 190.0 * x / std::max(1, width - 1),
                     40.0 + 170.0 * y / std::max(1, height - 1),
                     128.0 + 80.0 * std::sin((x + seed) * 0.09) * std::cos(y * 0.07),
                     60.0 + 120.0 * ((x + 2 * y) % 64) / 63.0};
      if ((x / 13 + y / 11 + static_cast<int>(seed)) % 6 == 0) {  // hard-edged tiles
        v[0] = 220;
        v[1] = 50;
        v[2] = 70;
        v[3] = 30;
      }
      uint8_t* p = &px[(static_cast<size_t>(y) * width + x) * channels];
      if (channels == 1) {
        p[0] = static_cast<uint8_t>(std::lround((v[0] + v[1] + v[2]) / 3));
        continue;
      }
      for (int c = 0; c < channels; ++c) p[c] = static_cast<uint8_t>(std::lround(v[c]));
    }
  }
  return px;
}

namespace {

/// Pillow's CMYK -> RGB (Convert.c cmyk2rgb) on non-inverted CMYK.
Bytes cmyk_to_rgb(const Bytes& cmyk) {
  Bytes rgb(cmyk.size() / 4 * 3);
  for (size_t i = 0, o = 0; i < cmyk.size(); i += 4, o += 3) {
    const int nk = 255 - cmyk[i + 3];
    for (int c = 0; c < 3; ++c) {
      const int t = cmyk[i + c] * nk + 128;
      rgb[o + c] = static_cast<uint8_t>(nk - (((t >> 8) + t) >> 8));
    }
  }
  return rgb;
}

/// Grey levels replicated to RGB.
Bytes gray_to_rgb(const Bytes& gray) {
  Bytes rgb(gray.size() * 3);
  for (size_t i = 0; i < gray.size(); ++i) rgb[i * 3] = rgb[i * 3 + 1] = rgb[i * 3 + 2] = gray[i];
  return rgb;
}

/// The first three channels of [n, c] samples.
Bytes drop_to_rgb(const Bytes& px, int channels) {
  Bytes rgb(px.size() / static_cast<size_t>(channels) * 3);
  for (size_t i = 0, o = 0; i < px.size(); i += static_cast<size_t>(channels), o += 3)
    std::memcpy(&rgb[o], &px[i], 3);
  return rgb;
}

void put_be16(Bytes& b, size_t at, int v) {
  b[at] = static_cast<uint8_t>(v >> 8);
  b[at + 1] = static_cast<uint8_t>(v & 0xFF);
}

void put_le16(Bytes& b, int v) {
  b.push_back(static_cast<uint8_t>(v & 0xFF));
  b.push_back(static_cast<uint8_t>((v >> 8) & 0xFF));
}

void put_le32(Bytes& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

Bytes random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  Bytes b(n);
  for (auto& v : b) v = static_cast<uint8_t>(rng());
  return b;
}

// --- libjpeg compressor -------------------------------------------------------------------------

struct JpegWriteError {
  jpeg_error_mgr pub;  // first: libjpeg hands &pub back
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void jpeg_write_exit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegWriteError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

void jpeg_write_message(j_common_ptr, int) {}

struct JpegJob {
  const JpegSpec* spec;
  const uint8_t* samples;
  int components;
  bool force_baseline;
  bool adobe;  // write the Adobe marker where libjpeg would (RGB/CMYK/YCCK)
  unsigned char* out;
  unsigned long size;
};

bool run_jpeg_compress(jpeg_compress_struct* cinfo, JpegWriteError* err, JpegJob* job) {
  if (setjmp(err->jump) != 0) return false;
  const JpegSpec& s = *job->spec;
  jpeg_create_compress(cinfo);
  jpeg_mem_dest(cinfo, &job->out, &job->size);
  cinfo->image_width = static_cast<JDIMENSION>(s.width);
  cinfo->image_height = static_cast<JDIMENSION>(s.height);
  cinfo->input_components = job->components;
  cinfo->in_color_space =
      job->components == 1 ? JCS_GRAYSCALE : (job->components == 4 ? JCS_CMYK : JCS_RGB);
  jpeg_set_defaults(cinfo);
  switch (s.color) {
    case JpegColor::kGray:
      jpeg_set_colorspace(cinfo, JCS_GRAYSCALE);
      break;
    case JpegColor::kRgb:
      jpeg_set_colorspace(cinfo, JCS_RGB);
      break;
    case JpegColor::kCmyk:
      jpeg_set_colorspace(cinfo, JCS_CMYK);
      break;
    case JpegColor::kYcck:
      jpeg_set_colorspace(cinfo, JCS_YCCK);
      break;
    case JpegColor::kYCbCr: {
      int h = 2, v = 2;
      switch (s.subsampling) {
        case Subsampling::k444:
          h = v = 1;
          break;
        case Subsampling::k422:
          v = 1;
          break;
        case Subsampling::k440:
          h = 1;
          break;
        case Subsampling::k411:
          h = 4;
          v = 1;
          break;
        default:
          break;
      }
      cinfo->comp_info[0].h_samp_factor = h;
      cinfo->comp_info[0].v_samp_factor = v;
      break;
    }
  }
  if (!job->adobe) cinfo->write_Adobe_marker = FALSE;
  jpeg_set_quality(cinfo, s.quality, job->force_baseline ? TRUE : FALSE);
  cinfo->dct_method = JDCT_ISLOW;
  if (s.arithmetic) cinfo->arith_code = TRUE;
  cinfo->restart_interval = static_cast<unsigned int>(s.restart_interval);
  if (s.progressive) jpeg_simple_progression(cinfo);
  jpeg_start_compress(cinfo, TRUE);
  if (!s.icc.empty())
    jpeg_write_icc_profile(cinfo, s.icc.data(), static_cast<unsigned int>(s.icc.size()));
  const size_t stride = static_cast<size_t>(s.width) * job->components;
  while (cinfo->next_scanline < cinfo->image_height) {
    JSAMPROW row = const_cast<uint8_t*>(job->samples + cinfo->next_scanline * stride);
    jpeg_write_scanlines(cinfo, &row, 1);
  }
  jpeg_finish_compress(cinfo);
  return true;
}

Bytes jpeg_compress(const JpegSpec& spec, const Bytes& samples, bool force_baseline, bool adobe) {
  const int components = spec.color == JpegColor::kGray                                  ? 1
                         : spec.color == JpegColor::kCmyk || spec.color == JpegColor::kYcck ? 4
                                                                                            : 3;
  if (samples.size() != static_cast<size_t>(spec.width) * spec.height * components)
    throw std::invalid_argument("make_jpeg: sample count does not match the spec");
  jpeg_compress_struct cinfo{};
  JpegWriteError err{};
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = jpeg_write_exit;
  err.pub.emit_message = jpeg_write_message;
  JpegJob job{&spec, samples.data(), components, force_baseline, adobe, nullptr, 0};
  const bool ok = run_jpeg_compress(&cinfo, &err, &job);
  jpeg_destroy_compress(&cinfo);
  Bytes out;
  if (ok) out.assign(job.out, job.out + job.size);
  std::free(job.out);
  if (!ok) throw std::runtime_error(std::string("make_jpeg: libjpeg: ") + err.message);
  return out;
}

// --- libpng writer ------------------------------------------------------------------------------

struct PngWriteContext {
  std::jmp_buf jump;
  Bytes* out;
  char message[256];
};

void png_write_data(png_structp png, png_bytep data, size_t length) {
  auto* ctx = static_cast<PngWriteContext*>(png_get_io_ptr(png));
  ctx->out->insert(ctx->out->end(), data, data + length);
}

void png_flush_data(png_structp) {}

[[noreturn]] void png_write_error(png_structp png, png_const_charp message) {
  auto* ctx = static_cast<PngWriteContext*>(png_get_error_ptr(png));
  std::snprintf(ctx->message, sizeof(ctx->message), "%s", message ? message : "?");
  std::longjmp(ctx->jump, 1);
}

void png_write_warning(png_structp, png_const_charp) {}

struct PngJob {
  const PngSpec* spec;
  const uint8_t* samples;
  size_t row_bytes;
  const png_color* palette;
  int palette_size;
};

bool run_png_write(png_structp png, png_infop info, PngWriteContext* ctx, const PngJob* job) {
  if (setjmp(ctx->jump) != 0) return false;
  const PngSpec& s = *job->spec;
  png_set_write_fn(png, ctx, png_write_data, png_flush_data);
  png_set_IHDR(png, info, static_cast<png_uint_32>(s.width), static_cast<png_uint_32>(s.height),
               s.depth, s.color_type, s.interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (job->palette_size > 0) png_set_PLTE(png, info, job->palette, job->palette_size);
  if (!s.trns.empty()) {
    if (s.color_type == PNG_COLOR_TYPE_PALETTE) {
      png_set_tRNS(png, info, s.trns.data(), static_cast<int>(s.trns.size()), nullptr);
    } else {
      png_color_16 key{};
      key.gray = key.red = static_cast<png_uint_16>(s.trns[0]);
      key.green = static_cast<png_uint_16>(s.trns.size() > 1 ? s.trns[1] : 0);
      key.blue = static_cast<png_uint_16>(s.trns.size() > 2 ? s.trns[2] : 0);
      png_set_tRNS(png, info, nullptr, 0, &key);
    }
  }
  png_write_info(png, info);
  if (s.depth < 8) png_set_packing(png);
  const int passes = png_set_interlace_handling(png);
  for (int pass = 0; pass < passes; ++pass)
    for (int y = 0; y < s.height; ++y)
      png_write_row(png, job->samples + static_cast<size_t>(y) * job->row_bytes);
  png_write_end(png, nullptr);
  return true;
}

int png_channels(int color_type) {
  switch (color_type) {
    case 0:
    case 3:
      return 1;
    case 2:
      return 3;
    case 4:
      return 2;
    default:
      return 4;
  }
}

// --- JPEG byte surgery --------------------------------------------------------------------------

/// `jpeg` with a segment inserted right after SOI.
Bytes insert_after_soi(Bytes jpeg, const Bytes& segment) {
  jpeg.insert(jpeg.begin() + 2, segment.begin(), segment.end());
  return jpeg;
}

/// An APP1 Exif segment holding only an orientation tag, in big- or little-endian TIFF order.
Bytes exif_app1(int orientation, bool big_endian) {
  const auto o = static_cast<uint8_t>(orientation);
  Bytes tiff = big_endian ? Bytes{'M', 'M', 0, 42, 0, 0, 0, 8, 0, 1, 0x01, 0x12, 0, 3,
                                  0,   0,   0, 1,  0, o, 0, 0, 0, 0, 0,    0,    0, 0}
                          : Bytes{'I', 'I', 42, 0, 8, 0, 0, 0, 1, 0, 0x12, 0x01, 3, 0,
                                  1,   0,   0,  0, o, 0, 0, 0, 0, 0, 0,    0,    0, 0};
  Bytes seg = {0xFF, 0xE1, 0, 0, 'E', 'x', 'i', 'f', 0, 0};
  seg.insert(seg.end(), tiff.begin(), tiff.end());
  put_be16(seg, 2, static_cast<int>(seg.size() - 2));
  return seg;
}

/// The same JPEG with every 8-bit quantisation table rewritten with 16-bit entries (same values)
/// and SOF0 turned into SOF1 (extended sequential), which 16-bit tables require.
Bytes with_16bit_qtables(const Bytes& jpeg) {
  Bytes out(jpeg.begin(), jpeg.begin() + 2);
  size_t pos = 2;
  for (;;) {
    if (pos + 4 > jpeg.size() || jpeg[pos] != 0xFF) throw std::runtime_error("bad JPEG layout");
    const uint8_t marker = jpeg[pos + 1];
    const size_t len = static_cast<size_t>(jpeg[pos + 2]) << 8 | jpeg[pos + 3];
    if (marker == 0xDA) {
      out.insert(out.end(), jpeg.begin() + static_cast<ptrdiff_t>(pos), jpeg.end());
      return out;
    }
    if (marker == 0xDB) {
      Bytes seg = {0xFF, 0xDB, 0, 0};
      for (size_t t = pos + 4; t < pos + 2 + len;) {
        const uint8_t pq_tq = jpeg[t];
        if (pq_tq >> 4) throw std::runtime_error("already 16-bit");
        seg.push_back(static_cast<uint8_t>(0x10 | (pq_tq & 0x0F)));
        for (int k = 0; k < 64; ++k) {
          seg.push_back(0);
          seg.push_back(jpeg[t + 1 + static_cast<size_t>(k)]);
        }
        t += 65;
      }
      put_be16(seg, 2, static_cast<int>(seg.size() - 2));
      out.insert(out.end(), seg.begin(), seg.end());
    } else {
      const size_t at = out.size();
      out.insert(out.end(), jpeg.begin() + static_cast<ptrdiff_t>(pos),
                 jpeg.begin() + static_cast<ptrdiff_t>(pos + 2 + len));
      if (marker == 0xC0) out[at + 1] = 0xC1;
    }
    pos += 2 + len;
  }
}

/// Patches the frame header: byte `field` after the SOF marker (4: precision, 5: height, 7:
/// width) and turns SOF0 into `sof` when non-zero.
Bytes patch_sof(Bytes jpeg, uint8_t sof_in, size_t field, int value, uint8_t sof_out = 0) {
  const size_t sof = find_jpeg_marker(jpeg, sof_in);
  if (sof == std::string::npos) throw std::runtime_error("no SOF");
  if (field == 4)
    jpeg[sof + 4] = static_cast<uint8_t>(value);
  else if (field != 0)
    put_be16(jpeg, sof + field, value);
  if (sof_out) jpeg[sof + 1] = sof_out;
  return jpeg;
}

// --- PNG byte surgery ---------------------------------------------------------------------------

/// Offset of the first chunk of `type` (its length field), or npos.
size_t png_chunk(const Bytes& png, const char* type) {
  size_t pos = 8;
  while (pos + 12 <= png.size()) {
    const size_t len = static_cast<size_t>(png[pos]) << 24 | static_cast<size_t>(png[pos + 1]) << 16 |
                       static_cast<size_t>(png[pos + 2]) << 8 | png[pos + 3];
    if (std::memcmp(&png[pos + 4], type, 4) == 0) return pos;
    pos += 12 + len;
  }
  return std::string::npos;
}

// --- other containers ---------------------------------------------------------------------------

/// What make_bmp writes.
struct BmpSpec {
  int width = 0, height = 0;
  int bpp = 24;              // 1, 4, 8 (palette), 16, 24, 32
  uint32_t compression = 0;  // 0 RGB, 1 RLE8, 2 RLE4, 3 BITFIELDS
  uint32_t masks[4] = {};    // BITFIELDS: R, G, B, A (A written only by the 124-byte header)
  int header = 40;           // info header size: 12 (core), 40 or 124 (V5)
  bool top_down = false;
  std::vector<uint8_t> palette;  // RGB triples
};

/// A BMP of `samples`: palette indices (one byte per pixel) for bpp <= 8, else [h, w, 3 or 4]
/// RGB(A), packed through the masks for 16/32 bits. RLE8/RLE4 are written as runs of equal
/// pixels, an end of line per row and an end of bitmap.
Bytes make_bmp(const BmpSpec& s, const Bytes& samples) {
  const int w = s.width, h = s.height;
  const bool core = s.header == 12;
  const int colors = s.bpp <= 8 ? static_cast<int>(s.palette.size() / 3) : 0;
  const size_t palette_bytes = static_cast<size_t>(colors) * (core ? 3 : 4);
  const size_t masks_bytes = s.compression == 3 && s.header == 40 ? 12 : 0;
  const uint32_t offset = static_cast<uint32_t>(14 + s.header + masks_bytes + palette_bytes);
  Bytes pixels;
  const int channels = s.bpp == 32 && samples.size() == static_cast<size_t>(w) * h * 4 ? 4 : 3;
  for (int r = 0; r < h; ++r) {
    const int y = s.top_down ? r : h - 1 - r;
    if (s.compression == 1 || s.compression == 2) {
      const uint8_t* idx = &samples[static_cast<size_t>(y) * w];
      for (int x = 0; x < w;) {
        int n = 1;
        while (x + n < w && n < 255 && idx[x + n] == idx[x]) ++n;
        pixels.push_back(static_cast<uint8_t>(n));
        pixels.push_back(s.compression == 1 ? idx[x] : static_cast<uint8_t>(idx[x] << 4 | idx[x]));
        x += n;
      }
      pixels.insert(pixels.end(), {0, 0});  // end of line
      continue;
    }
    const size_t start = pixels.size();
    const size_t stride = (static_cast<size_t>(w) * s.bpp + 31) / 32 * 4;
    pixels.resize(start + stride, 0);
    for (int x = 0; x < w; ++x) {
      if (s.bpp <= 8) {
        const size_t bit = static_cast<size_t>(x) * s.bpp;
        pixels[start + bit / 8] |= static_cast<uint8_t>(samples[static_cast<size_t>(y) * w + x]
                                                        << (8 - s.bpp - bit % 8));
        continue;
      }
      const uint8_t* p = &samples[(static_cast<size_t>(y) * w + x) * channels];
      if (s.bpp == 24) {
        pixels[start + x * 3] = p[2];
        pixels[start + x * 3 + 1] = p[1];
        pixels[start + x * 3 + 2] = p[0];
        continue;
      }
      uint32_t v = 0;
      const uint32_t masks[4] = {s.compression == 3 ? s.masks[0] : (s.bpp == 16 ? 0x7C00u : 0xFF0000u),
                                 s.compression == 3 ? s.masks[1] : (s.bpp == 16 ? 0x03E0u : 0x00FF00u),
                                 s.compression == 3 ? s.masks[2] : (s.bpp == 16 ? 0x001Fu : 0x0000FFu),
                                 s.compression == 3 ? s.masks[3] : 0u};
      for (int c = 0; c < 4; ++c) {
        if (!masks[c] || (c == 3 && channels < 4)) continue;
        const int shift = std::countr_zero(masks[c]);
        const int bits = std::popcount(masks[c]);
        v |= (static_cast<uint32_t>(p[c]) >> (8 - bits)) << shift;
      }
      for (int k = 0; k < s.bpp / 8; ++k) pixels[start + x * (s.bpp / 8) + k] = static_cast<uint8_t>(v >> (8 * k));
    }
  }
  if (s.compression == 1 || s.compression == 2) pixels.insert(pixels.end(), {0, 1});  // end
  Bytes b = {'B', 'M'};
  put_le32(b, static_cast<uint32_t>(offset + pixels.size()));
  put_le32(b, 0);
  put_le32(b, offset);
  put_le32(b, static_cast<uint32_t>(s.header));
  if (core) {
    put_le16(b, w);
    put_le16(b, h);
    put_le16(b, 1);
    put_le16(b, s.bpp);
  } else {
    put_le32(b, static_cast<uint32_t>(w));
    put_le32(b, static_cast<uint32_t>(s.top_down ? -h : h));
    put_le16(b, 1);
    put_le16(b, s.bpp);
    put_le32(b, s.compression);
    put_le32(b, static_cast<uint32_t>(pixels.size()));
    put_le32(b, 2835);
    put_le32(b, 2835);
    put_le32(b, static_cast<uint32_t>(colors));
    put_le32(b, 0);
    if (s.header == 124) {
      for (uint32_t m : s.masks) put_le32(b, m);
      put_le32(b, 0x73524742);  // 'sRGB'
      b.resize(14 + 124, 0);
    } else if (masks_bytes) {
      for (int c = 0; c < 3; ++c) put_le32(b, s.masks[c]);
    }
  }
  for (int i = 0; i < colors; ++i) {
    b.insert(b.end(), {s.palette[i * 3 + 2], s.palette[i * 3 + 1], s.palette[i * 3]});
    if (!core) b.push_back(0);
  }
  b.insert(b.end(), pixels.begin(), pixels.end());
  return b;
}

Bytes make_pnm(int w, int h, const Bytes& samples, bool color) {
  const std::string header =
      std::string(color ? "P6" : "P5") + "\n# gpufeed\n" + std::to_string(w) + " " +
      std::to_string(h) + "\n255\n";
  Bytes b(header.begin(), header.end());
  b.insert(b.end(), samples.begin(), samples.end());
  return b;
}

/// Uncompressed little-endian RGB TIFF, one strip.
Bytes make_tiff(int w, int h, const Bytes& rgb) {
  Bytes b = {'I', 'I', 42, 0};
  put_le32(b, 8);
  const int entries = 10;
  const uint32_t bps_at = 8 + 2 + entries * 12 + 4;
  const uint32_t data_at = bps_at + 6;
  put_le16(b, entries);
  const auto entry = [&](int tag, int type, uint32_t count, uint32_t value) {
    put_le16(b, tag);
    put_le16(b, type);
    put_le32(b, count);
    if (type == 3 && count == 1) {
      put_le16(b, static_cast<int>(value));
      put_le16(b, 0);
    } else {
      put_le32(b, value);
    }
  };
  entry(256, 4, 1, static_cast<uint32_t>(w));
  entry(257, 4, 1, static_cast<uint32_t>(h));
  entry(258, 3, 3, bps_at);
  entry(259, 3, 1, 1);
  entry(262, 3, 1, 2);
  entry(273, 4, 1, data_at);
  entry(277, 3, 1, 3);
  entry(278, 4, 1, static_cast<uint32_t>(h));
  entry(279, 4, 1, static_cast<uint32_t>(w) * static_cast<uint32_t>(h) * 3);
  entry(284, 3, 1, 1);
  put_le32(b, 0);
  for (int i = 0; i < 3; ++i) put_le16(b, 8);
  b.insert(b.end(), rgb.begin(), rgb.end());
  return b;
}

/// A 256-entry palette of distinct colours.
std::vector<uint8_t> test_palette() {
  std::vector<uint8_t> p;
  for (int i = 0; i < 256; ++i) {
    p.push_back(static_cast<uint8_t>(i));
    p.push_back(static_cast<uint8_t>((i * 7) % 256));
    p.push_back(static_cast<uint8_t>(255 - i));
  }
  return p;
}

Bytes palette_rgb(const Bytes& indices, const std::vector<uint8_t>& palette) {
  Bytes rgb(indices.size() * 3);
  for (size_t i = 0; i < indices.size(); ++i)
    std::memcpy(&rgb[i * 3], &palette[static_cast<size_t>(indices[i]) * 3], 3);
  return rgb;
}

Bytes cut(const Bytes& b, double fraction) {
  return Bytes(b.begin(), b.begin() + static_cast<ptrdiff_t>(static_cast<double>(b.size()) * fraction));
}

}  // namespace

// --- public generators --------------------------------------------------------------------------

Bytes make_jpeg(const JpegSpec& spec, const Bytes& samples) {
  return jpeg_compress(spec, samples, true, true);
}

Bytes make_png(const PngSpec& spec, const Bytes& samples) {
  const int channels = png_channels(spec.color_type);
  const size_t row_bytes =
      static_cast<size_t>(spec.width) * channels * (spec.depth == 16 ? 2 : 1);
  if (samples.size() != row_bytes * static_cast<size_t>(spec.height))
    throw std::invalid_argument("make_png: sample count does not match the spec");
  std::vector<png_color> palette;
  for (size_t i = 0; i + 2 < spec.palette.size(); i += 3)
    palette.push_back(png_color{spec.palette[i], spec.palette[i + 1], spec.palette[i + 2]});
  Bytes out;
  PngWriteContext ctx{};
  ctx.out = &out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  if (!png) throw std::bad_alloc();
  png_infop info = png_create_info_struct(png);
  if (!info) {
    png_destroy_write_struct(&png, nullptr);
    throw std::bad_alloc();
  }
  png_set_error_fn(png, &ctx, png_write_error, png_write_warning);
  const PngJob job{&spec, samples.data(), row_bytes, palette.data(),
                   static_cast<int>(palette.size())};
  const bool ok = run_png_write(png, info, &ctx, &job);
  png_destroy_write_struct(&png, &info);
  if (!ok) throw std::runtime_error(std::string("make_png: libpng: ") + ctx.message);
  return out;
}

Bytes make_gif(int width, int height, const std::vector<uint8_t>& palette,
               const std::vector<GifFrame>& frames, int background) {
  const auto put_table = [](Bytes& out, Bytes table) {
    table.resize(768, 0);
    out.insert(out.end(), table.begin(), table.end());
  };
  Bytes out = {'G', 'I', 'F', '8', '9', 'a'};
  put_le16(out, width);
  put_le16(out, height);
  out.push_back(palette.empty() ? 0x70 : 0xF7);  // global table of 256 entries, or none
  out.push_back(static_cast<uint8_t>(background));
  out.push_back(0);
  if (!palette.empty()) put_table(out, palette);
  for (const GifFrame& f : frames) {
    if (f.transparent >= 0) {
      const uint8_t gce[] = {0x21, 0xF9, 4, 0x01, 0, 0, static_cast<uint8_t>(f.transparent), 0};
      out.insert(out.end(), std::begin(gce), std::end(gce));
    }
    out.push_back(0x2C);
    put_le16(out, f.left);
    put_le16(out, f.top);
    put_le16(out, f.width);
    put_le16(out, f.height);
    out.push_back(static_cast<uint8_t>((f.local.empty() ? 0 : 0x87) | (f.interlace ? 0x40 : 0)));
    if (!f.local.empty()) put_table(out, f.local);
    out.push_back(8);  // LZW minimum code size
    std::vector<int> rows;
    if (f.interlace) {
      for (int start : {0, 4, 2, 1})
        for (int y = start; y < f.height; y += start == 0 || start == 4 ? 8 : start == 2 ? 4 : 2)
          rows.push_back(y);
    } else {
      for (int y = 0; y < f.height; ++y) rows.push_back(y);
    }
    Bytes lzw;
    uint32_t acc = 0;
    int bits = 0;
    const auto code = [&](int c) {
      acc |= static_cast<uint32_t>(c) << bits;
      bits += 9;
      while (bits >= 8) {
        lzw.push_back(static_cast<uint8_t>(acc & 0xFF));
        acc >>= 8;
        bits -= 8;
      }
    };
    int run = 0;
    code(256);
    for (int y : rows)
      for (int x = 0; x < f.width; ++x) {
        if (run == 250) {  // clear before the code width would grow
          code(256);
          run = 0;
        }
        code(f.indices[static_cast<size_t>(y) * f.width + x]);
        ++run;
      }
    code(257);
    if (bits > 0) lzw.push_back(static_cast<uint8_t>(acc & 0xFF));
    for (size_t at = 0; at < lzw.size(); at += 255) {
      const size_t n = std::min<size_t>(255, lzw.size() - at);
      out.push_back(static_cast<uint8_t>(n));
      out.insert(out.end(), lzw.begin() + static_cast<ptrdiff_t>(at),
                 lzw.begin() + static_cast<ptrdiff_t>(at + n));
    }
    out.push_back(0);
  }
  out.push_back(0x3B);
  return out;
}

Bytes make_webp(int width, int height, const Bytes& rgba, int quality) {
  uint8_t* data = nullptr;
  const size_t n =
      quality > 100
          ? WebPEncodeLosslessRGBA(rgba.data(), width, height, width * 4, &data)
          : WebPEncodeRGBA(rgba.data(), width, height, width * 4, static_cast<float>(quality), &data);
  if (n == 0 || !data) throw std::runtime_error("make_webp: libwebp failed");
  Bytes out(data, data + n);
  WebPFree(data);
  return out;
}

Bytes make_animated_webp(int width, int height, const std::vector<WebpFrame>& frames) {
  struct MuxDeleter {
    void operator()(WebPMux* m) const { WebPMuxDelete(m); }
  };
  std::unique_ptr<WebPMux, MuxDeleter> mux(WebPMuxNew());
  if (!mux) throw std::runtime_error("make_animated_webp: WebPMuxNew failed");
  for (const WebpFrame& f : frames) {
    const Bytes still = make_webp(f.width, f.height, f.rgba, f.quality);
    WebPMuxFrameInfo info{};
    info.bitstream = {still.data(), still.size()};
    info.x_offset = f.x;
    info.y_offset = f.y;
    info.duration = 100;
    info.id = WEBP_CHUNK_ANMF;
    info.dispose_method = WEBP_MUX_DISPOSE_NONE;
    info.blend_method = f.blend ? WEBP_MUX_BLEND : WEBP_MUX_NO_BLEND;
    if (WebPMuxPushFrame(mux.get(), &info, /*copy_data=*/1) != WEBP_MUX_OK)
      throw std::runtime_error("make_animated_webp: WebPMuxPushFrame failed");
  }
  const WebPMuxAnimParams params{0xFFFFFFFFu, 0};  // white background (ignored by decoders), loop
  if (WebPMuxSetAnimationParams(mux.get(), &params) != WEBP_MUX_OK ||
      WebPMuxSetCanvasSize(mux.get(), width, height) != WEBP_MUX_OK)
    throw std::runtime_error("make_animated_webp: bad animation parameters");
  WebPData out{};
  if (WebPMuxAssemble(mux.get(), &out) != WEBP_MUX_OK)
    throw std::runtime_error("make_animated_webp: WebPMuxAssemble failed");
  Bytes bytes(out.bytes, out.bytes + out.size);
  WebPDataClear(&out);
  return bytes;
}

size_t find_jpeg_marker(const Bytes& j, uint8_t code) {
  size_t pos = 2;
  while (pos + 4 <= j.size() && j[pos] == 0xFF) {
    const uint8_t m = j[pos + 1];
    if (m == code) return pos;
    if (m == 0xDA) break;
    pos += 2 + (static_cast<size_t>(j[pos + 2]) << 8 | j[pos + 3]);
  }
  return std::string::npos;
}

std::pair<size_t, size_t> jpeg_scan_data(const Bytes& j) {
  const size_t sos = find_jpeg_marker(j, 0xDA);
  if (sos == std::string::npos) throw std::runtime_error("no SOS");
  const size_t begin = sos + 2 + (static_cast<size_t>(j[sos + 2]) << 8 | j[sos + 3]);
  size_t end = begin;
  while (end + 1 < j.size() &&
         !(j[end] == 0xFF && j[end + 1] != 0x00 && (j[end + 1] < 0xD0 || j[end + 1] > 0xD7)))
    ++end;
  return {begin, end};
}

Bytes make_mjpeg_frame(int width, int height, const Bytes& rgb, int restart_interval, int quality) {
  JpegSpec s;
  s.width = width;
  s.height = height;
  s.subsampling = Subsampling::k422;
  s.quality = quality;
  s.restart_interval = restart_interval;
  const Bytes jpeg = make_jpeg(s, rgb);  // standard Huffman tables (no optimize_coding)
  // AVI1 APP0: "AVI1", polarity 0 (progressive frame), reserved, two field sizes of 0.
  const Bytes avi1 = {0xFF, 0xE0, 0x00, 0x0E, 'A', 'V', 'I', '1', 0, 0, 0, 0, 0, 0, 0, 0};
  // Kept bytes: SOI, AVI1, every segment but DHT and the JFIF APP0, then SOS onwards.
  std::vector<bool> keep(jpeg.size(), true);
  size_t pos = 2;
  while (pos + 4 <= jpeg.size() && jpeg[pos] == 0xFF && jpeg[pos + 1] != 0xDA) {
    const size_t len = 2 + (static_cast<size_t>(jpeg[pos + 2]) << 8 | jpeg[pos + 3]);
    if (jpeg[pos + 1] == 0xC4 || jpeg[pos + 1] == 0xE0)
      for (size_t i = pos; i < pos + len && i < jpeg.size(); ++i) keep[i] = false;
    pos += len;
  }
  Bytes out;
  out.reserve(jpeg.size() + avi1.size());
  for (size_t i = 0; i < jpeg.size(); ++i) {
    if (i == 2)
      for (const uint8_t b : avi1) out.push_back(b);
    if (keep[i]) out.push_back(jpeg[i]);
  }
  return out;
}

std::vector<size_t> restart_markers(const Bytes& jpeg) {
  const size_t sos = find_jpeg_marker(jpeg, 0xDA);
  if (sos == std::string::npos) throw std::runtime_error("no SOS");
  std::vector<size_t> out;
  for (size_t i = sos + 2 + (static_cast<size_t>(jpeg[sos + 2]) << 8 | jpeg[sos + 3]); i + 1 < jpeg.size(); ++i) {
    if (jpeg[i] != 0xFF || jpeg[i + 1] == 0x00) continue;
    if (jpeg[i + 1] < 0xD0 || jpeg[i + 1] > 0xD7) break;  // EOI or another segment
    out.push_back(i);
  }
  return out;
}

Bytes insert_before_restart(const Bytes& jpeg, size_t k, const Bytes& garbage) {
  const auto rst = restart_markers(jpeg);
  if (k >= rst.size()) throw std::invalid_argument("insert_before_restart: no such restart marker");
  Bytes out = jpeg;
  out.insert(out.begin() + static_cast<ptrdiff_t>(rst[k]), garbage.begin(), garbage.end());
  return out;
}

// --- the kinds ----------------------------------------------------------------------------------

const std::vector<std::string>& bug_kinds() {
  static const std::vector<std::string> kinds = {
      "empty_0_bytes.jpg",
      "gif_animated_5_frames.gif",
      "jpeg_12bit_icc.jpg",
      "jpeg_1x1.jpg",
      "jpeg_arithmetic.jpg",
      "jpeg_cmyk_adobe_app14.jpg",
      "jpeg_corrupt_entropy_data.jpg",
      "jpeg_exif_orientation_6.jpg",
      "jpeg_extraneous_bytes_scanner.jpg",
      "jpeg_grayscale.jpg",
      "jpeg_header_65500x65500_no_data.jpg",
      "jpeg_icc_400k_multichunk_progressive.jpg",
      "jpeg_lossless_8bit_rgb.jpg",
      "jpeg_progressive.jpg",
      "jpeg_restart_markers.jpg",
      "jpeg_rgb_colorspace_no_ycc.jpg",
      "jpeg_sof1_16bit_qtables.jpg",
      "jpeg_subsampling_411.jpg",
      "jpeg_subsampling_440.jpg",
      "jpeg_trailing_garbage.jpg",
      "jpeg_truncated_baseline.jpg",
      "jpeg_very_wide_30000x2.jpg",
      "jpeg_zero_width.jpg",
      "png_16bit_gray.png",
      "png_bad_idat_crc.png",
      "png_bomb_40000x40000.png",
      "png_disguised_as.JPEG",
      "png_interlaced_rgba.png",
      "png_palette_trns.png",
      "webp_alpha.webp",
  };
  return kinds;
}

Outcome expected_outcome(const std::string& kind) {
  static const std::map<std::string, Outcome> m = {
      {"empty_0_bytes.jpg", {ErrorKind::kEmpty, "no bytes"}},
      // libjpeg-turbo 2.1's 8-bit API decodes neither 12-bit nor lossless JPEG.
      {"jpeg_12bit_icc.jpg", {ErrorKind::kUnsupported, "12-bit precision"}},
      {"jpeg_corrupt_entropy_data.jpg", {ErrorKind::kCorrupt, ""}},
      {"jpeg_header_65500x65500_no_data.jpg", {ErrorKind::kTooLarge, "exceeds max_pixels"}},
      {"jpeg_lossless_8bit_rgb.jpg", {ErrorKind::kUnsupported, "lossless"}},
      {"jpeg_truncated_baseline.jpg", {ErrorKind::kTruncated, ""}},
      {"jpeg_zero_width.jpg", {ErrorKind::kCorrupt, "zero size"}},
      {"png_bad_idat_crc.png", {ErrorKind::kCorrupt, "CRC"}},
      {"png_bomb_40000x40000.png", {ErrorKind::kTooLarge, "exceeds max_pixels"}},
  };
  const auto it = m.find(kind);
  return it == m.end() ? Outcome{} : it->second;
}

namespace {

std::vector<Variant> build_kind_variants() {
  std::vector<Variant> v;
  const auto add = [&](const std::string& kind, const std::string& name, Bytes bytes) -> Variant& {
    Variant x;
    x.kind = kind;
    x.name = name;
    x.bytes = std::move(bytes);
    x.expect = expected_outcome(kind);
    v.push_back(std::move(x));
    return v.back();
  };
  // A decodable variant: size, and what its pixels must be.
  const auto good = [&](const std::string& kind, const std::string& name, Bytes bytes, int w,
                        int h) -> Variant& {
    Variant& x = add(kind, name, std::move(bytes));
    x.width = w;
    x.height = h;
    return x;
  };
  const auto spec = [](int w, int h, Subsampling s = Subsampling::k420, int quality = 90) {
    JpegSpec js;
    js.width = w;
    js.height = h;
    js.subsampling = s;
    js.quality = quality;
    return js;
  };
  const int W = 45, H = 37;  // not a multiple of any MCU
  const Bytes rgb = pattern(W, H, 3);
  const Bytes base = make_jpeg(spec(W, H), rgb);

  // empty file
  add("empty_0_bytes.jpg", "empty.jpg", {});
  add("empty_0_bytes.jpg", "empty.png", {});

  // animated GIF: the first frame only
  {
    const auto pal = test_palette();
    std::vector<GifFrame> frames;
    for (int f = 0; f < 5; ++f) {
      GifFrame fr;
      fr.width = 24;
      fr.height = 16;
      for (int i = 0; i < 24 * 16; ++i) fr.indices.push_back(static_cast<uint8_t>((i + 37 * f) % 256));
      frames.push_back(fr);
    }
    Variant& a = good("gif_animated_5_frames.gif", "animated_5.gif", make_gif(24, 16, pal, frames), 24, 16);
    a.reference = palette_rgb(frames[0].indices, pal);
    frames[0].interlace = true;
    frames[0].transparent = 3;
    Variant& b = good("gif_animated_5_frames.gif", "animated_interlaced_first.gif",
                      make_gif(24, 16, pal, frames), 24, 16);
    b.reference = palette_rgb(frames[0].indices, pal);
  }

  // 12-bit JPEG: precision patched in the frame header (libjpeg's 8-bit API cannot write 12-bit)
  {
    JpegSpec s = spec(W, H);
    s.icc = random_bytes(3000, 12);
    add("jpeg_12bit_icc.jpg", "twelve_bit_icc.jpg", patch_sof(make_jpeg(s, rgb), 0xC0, 4, 12));
    s.progressive = true;
    add("jpeg_12bit_icc.jpg", "twelve_bit_progressive.jpg",
        patch_sof(make_jpeg(s, rgb), 0xC2, 4, 12));
  }

  // 1x1 images
  {
    const Bytes px = {200, 120, 40};
    for (Subsampling s : {Subsampling::k444, Subsampling::k420}) {
      Variant& x = good("jpeg_1x1.jpg", std::string("one_pixel_") + (s == Subsampling::k444 ? "444" : "420") + ".jpg",
                        make_jpeg(spec(1, 1, s, 95), px), 1, 1);
      x.reference = px;
      x.tolerance = 4;
    }
    JpegSpec p = spec(1, 1, Subsampling::k420, 95);
    p.progressive = true;
    Variant& x = good("jpeg_1x1.jpg", "one_pixel_progressive.jpg", make_jpeg(p, px), 1, 1);
    x.reference = px;
    x.tolerance = 4;
    PngSpec ps;
    ps.width = ps.height = 1;
    Variant& y = good("jpeg_1x1.jpg", "one_pixel.png", make_png(ps, px), 1, 1);
    y.reference = px;
  }

  // arithmetic coding: the same coefficients as the Huffman-coded twin
  {
    JpegSpec s = spec(W, H);
    JpegSpec a = s;
    a.arithmetic = true;
    good("jpeg_arithmetic.jpg", "arithmetic_420.jpg", make_jpeg(a, rgb), W, H).twin = base;
    s = spec(W, H, Subsampling::k444);
    s.progressive = true;
    a = s;
    a.arithmetic = true;
    good("jpeg_arithmetic.jpg", "arithmetic_progressive_444.jpg", make_jpeg(a, rgb), W, H).twin =
        make_jpeg(s, rgb);
    s = spec(W, H);
    s.restart_interval = 2;
    a = s;
    a.arithmetic = true;
    good("jpeg_arithmetic.jpg", "arithmetic_restart.jpg", make_jpeg(a, rgb), W, H).twin =
        make_jpeg(s, rgb);
  }

  // Adobe CMYK and YCCK, stored inverted as Photoshop writes them (Pillow's "CMYK;I")
  {
    const Bytes cmyk = pattern(W, H, 4, 3);
    Bytes inverted = cmyk;
    for (auto& c : inverted) c = static_cast<uint8_t>(255 - c);
    for (JpegColor color : {JpegColor::kCmyk, JpegColor::kYcck}) {
      JpegSpec s = spec(W, H, Subsampling::k444, 100);
      s.color = color;
      Variant& x = good("jpeg_cmyk_adobe_app14.jpg",
                        color == JpegColor::kCmyk ? "adobe_cmyk.jpg" : "adobe_ycck.jpg",
                        make_jpeg(s, inverted), W, H);
      x.reference = cmyk_to_rgb(cmyk);
      // JPEG's loss against the source (YCCK subsamples its chroma); the comparison with Pillow
      // itself (EXPECTED.md: within 2 levels, mean) is in test_decode.
      x.tolerance = color == JpegColor::kCmyk ? 2 : 4;
    }
  }

  // corrupt entropy data
  {
    const auto [begin, end] = jpeg_scan_data(base);
    Bytes marker = base;  // EOI in the middle of the scan
    marker[begin + (end - begin) / 2] = 0xFF;
    marker[begin + (end - begin) / 2 + 1] = 0xD9;
    add("jpeg_corrupt_entropy_data.jpg", "eoi_inside_scan.jpg", marker);
    Bytes short_scan(base.begin(), base.begin() + static_cast<ptrdiff_t>(begin + (end - begin) / 2));
    short_scan.insert(short_scan.end(), {0xFF, 0xD9});
    add("jpeg_corrupt_entropy_data.jpg", "scan_ends_early_with_eoi.jpg", short_scan);
    // Restart markers that stop: the last intervals' data never resynchronises, so the rest of
    // the image is lost (decoded grey), though junk earlier on is confined to its interval.
    const Bytes mjpeg = make_mjpeg_frame(W * 2, H * 2, pattern(W * 2, H * 2, 3, 5), 2);
    const auto markers = restart_markers(mjpeg);
    Bytes lost = insert_before_restart(mjpeg, 1, {0x12, 0x34, 0x56});
    for (size_t k = markers.size(); k-- > markers.size() - 2;) {  // the last two are removed
      const size_t at = markers[k] + 3;  // shifted by the inserted bytes
      lost.erase(lost.begin() + static_cast<ptrdiff_t>(at), lost.begin() + static_cast<ptrdiff_t>(at + 2));
    }
    add("jpeg_corrupt_entropy_data.jpg", "mjpeg_restart_markers_stop.jpg", lost).expect.reason =
        "does not resynchronise";
    // Junk before most restart markers: confined, but most of the image is damaged.
    Bytes most = mjpeg;
    for (size_t k = markers.size(); k-- > 0;)
      if (k % 4 != 0) most.insert(most.begin() + static_cast<ptrdiff_t>(markers[k]), {0x12, 0x34});
    add("jpeg_corrupt_entropy_data.jpg", "mjpeg_junk_in_most_intervals.jpg", most).expect.reason =
        "restart intervals are damaged";
  }

  // EXIF orientation 6: stored orientation by default
  for (bool big : {true, false}) {
    good("jpeg_exif_orientation_6.jpg", big ? "exif6_motorola.jpg" : "exif6_intel.jpg",
         insert_after_soi(base, exif_app1(6, big)), W, H)
        .twin = base;
  }

  // benign "extraneous bytes before marker": junk before EOI, junk before SOS
  {
    const Bytes junk = {0x12, 0x34, 0x56, 0x78};
    Bytes before_eoi = base;
    before_eoi.insert(before_eoi.end() - 2, junk.begin(), junk.end());
    Variant& a = good("jpeg_extraneous_bytes_scanner.jpg", "junk_before_eoi.jpg", before_eoi, W, H);
    a.twin = base;
    a.min_warnings = 1;
    Bytes before_sos = base;
    const size_t sos = find_jpeg_marker(base, 0xDA);
    before_sos.insert(before_sos.begin() + static_cast<ptrdiff_t>(sos), junk.begin(), junk.end());
    Variant& b = good("jpeg_extraneous_bytes_scanner.jpg", "junk_before_sos.jpg", before_sos, W, H);
    b.twin = base;
    b.min_warnings = 1;
  }

  // grayscale (1 component)
  {
    const Bytes gray = pattern(W, H, 1);
    JpegSpec s = spec(W, H, Subsampling::k444, 95);
    s.color = JpegColor::kGray;
    Variant& a = good("jpeg_grayscale.jpg", "gray.jpg", make_jpeg(s, gray), W, H);
    a.gray = true;
    a.reference = gray_to_rgb(gray);
    a.tolerance = 2;
    s.progressive = true;
    Variant& b = good("jpeg_grayscale.jpg", "gray_progressive.jpg", make_jpeg(s, gray), W, H);
    b.gray = true;
    b.reference = gray_to_rgb(gray);
    b.tolerance = 2;
  }

  // decompression bomb: a header that announces more pixels than the limit, little or no data
  {
    Bytes bomb = patch_sof(make_jpeg(spec(16, 16), pattern(16, 16, 3)), 0xC0, 5, 65500);
    bomb = patch_sof(bomb, 0xC0, 7, 65500);
    bomb.resize(find_jpeg_marker(bomb, 0xDA));
    bomb.insert(bomb.end(), {0xFF, 0xD9});
    add("jpeg_header_65500x65500_no_data.jpg", "bomb_65500x65500.jpg", bomb).expect.reason =
        "65500x65500 = 4290250000 pixels exceeds max_pixels 178956970";
    Bytes wide = patch_sof(patch_sof(base, 0xC0, 5, 9000), 0xC0, 7, 20000);
    add("jpeg_header_65500x65500_no_data.jpg", "bomb_20000x9000_with_data.jpg", wide)
        .expect.reason = "20000x9000 = 180000000 pixels exceeds max_pixels";
  }

  // progressive with a 400 KB ICC profile in seven APP2 chunks: the same pixels as without it
  {
    JpegSpec s = spec(W, H);
    s.progressive = true;
    const Bytes plain = make_jpeg(s, rgb);
    s.icc = random_bytes(400'000, 400);
    good("jpeg_icc_400k_multichunk_progressive.jpg", "icc_400k_progressive.jpg", make_jpeg(s, rgb),
         W, H)
        .twin = plain;
    JpegSpec b = spec(W, H);
    b.icc = random_bytes(140'000, 140);
    good("jpeg_icc_400k_multichunk_progressive.jpg", "icc_140k_baseline.jpg", make_jpeg(b, rgb), W,
         H)
        .twin = base;
  }

  // lossless (SOF3): the frame type patched
  add("jpeg_lossless_8bit_rgb.jpg", "lossless_sof3.jpg",
      patch_sof(jpeg_compress(spec(W, H), rgb, true, true), 0xC0, 0, 0, 0xC3));
  {
    JpegSpec s = spec(W, H);
    s.color = JpegColor::kRgb;
    add("jpeg_lossless_8bit_rgb.jpg", "lossless_sof3_rgb.jpg",
        patch_sof(make_jpeg(s, rgb), 0xC0, 0, 0, 0xC3));
  }

  // progressive: the same coefficients as the sequential twin
  for (Subsampling sub : {Subsampling::k420, Subsampling::k444}) {
    JpegSpec s = spec(W, H, sub);
    const Bytes sequential = make_jpeg(s, rgb);
    s.progressive = true;
    good("jpeg_progressive.jpg",
         std::string("progressive_") + (sub == Subsampling::k420 ? "420" : "444") + ".jpg",
         make_jpeg(s, rgb), W, H)
        .twin = sequential;
  }

  // restart markers: the same coefficients as without them
  for (int interval : {1, 3}) {
    JpegSpec s = spec(W, H);
    s.restart_interval = interval;
    good("jpeg_restart_markers.jpg", "restart_every_" + std::to_string(interval) + ".jpg",
         make_jpeg(s, rgb), W, H)
        .twin = base;
  }
  // Motion-JPEG webcam frames (AVI1 APP0, no DHT: the standard tables) decode as the same frame
  // with its tables; a marker out of sequence, or a few bytes of junk before a restart marker,
  // is damage libjpeg resynchronises at that marker: decoded, the warnings counted.
  {
    const int mw = W * 2, mh = H * 2;
    const Bytes mrgb = pattern(mw, mh, 3, 5);
    JpegSpec with_tables = spec(mw, mh, Subsampling::k422, 80);
    with_tables.restart_interval = 2;
    const Bytes tables = make_jpeg(with_tables, mrgb);
    const Bytes mjpeg = make_mjpeg_frame(mw, mh, mrgb, 2);
    good("jpeg_restart_markers.jpg", "mjpeg_avi1_no_dht.jpg", mjpeg, mw, mh).twin = tables;
    Variant& junk = good("jpeg_restart_markers.jpg", "mjpeg_junk_before_rst.jpg",
                         insert_before_restart(mjpeg, 3, {0x12, 0x34, 0x56, 0x78}), mw, mh);
    junk.min_warnings = 1;
    JpegSpec r = spec(W, H);
    r.restart_interval = 1;
    const Bytes in_order = make_jpeg(r, rgb);
    Bytes shuffled = in_order;
    const size_t second = restart_markers(shuffled).at(1);
    shuffled[second + 1] = static_cast<uint8_t>(0xD0 + (shuffled[second + 1] - 0xD0 + 3) % 8);
    Variant& out_of_sequence =
        good("jpeg_restart_markers.jpg", "restart_out_of_sequence.jpg", shuffled, W, H);
    out_of_sequence.twin = in_order;  // libjpeg takes it for the expected one: nothing is lost
    out_of_sequence.min_warnings = 1;
  }

  // RGB colour space: with an Adobe marker (transform 0), and told only by component IDs R, G, B
  {
    JpegSpec s = spec(W, H, Subsampling::k444, 95);
    s.color = JpegColor::kRgb;
    Variant& a = good("jpeg_rgb_colorspace_no_ycc.jpg", "rgb_adobe.jpg", make_jpeg(s, rgb), W, H);
    a.reference = rgb;
    a.tolerance = 2;
    Variant& b = good("jpeg_rgb_colorspace_no_ycc.jpg", "rgb_component_ids.jpg",
                      jpeg_compress(s, rgb, true, false), W, H);
    b.reference = rgb;
    b.tolerance = 2;
  }

  // SOF1 with 16-bit quantisation tables: rewritten from 8-bit (same values), and as libjpeg
  // writes them when a low quality is not forced to baseline
  {
    good("jpeg_sof1_16bit_qtables.jpg", "sof1_dqt16_rewritten.jpg", with_16bit_qtables(base), W, H)
        .twin = base;
    JpegSpec s = spec(W, H, Subsampling::k420, 3);
    const Bytes low = jpeg_compress(s, rgb, false, true);
    if (find_jpeg_marker(low, 0xC1) == std::string::npos)
      throw std::runtime_error("libjpeg did not write SOF1 for 16-bit tables");
    good("jpeg_sof1_16bit_qtables.jpg", "sof1_quality3.jpg", low, W, H);
  }

  // 4:1:1 and 4:4:0
  for (Subsampling sub : {Subsampling::k411, Subsampling::k440}) {
    const std::string kind =
        sub == Subsampling::k411 ? "jpeg_subsampling_411.jpg" : "jpeg_subsampling_440.jpg";
    Variant& x = good(kind, sub == Subsampling::k411 ? "s411.jpg" : "s440.jpg",
                      make_jpeg(spec(W, H, sub, 95), rgb), W, H);
    x.reference = rgb;
    x.tolerance = 8;  // chroma at a quarter/half resolution across hard colour edges
    JpegSpec p = spec(W, H, sub, 95);
    p.progressive = true;
    good(kind, sub == Subsampling::k411 ? "s411_progressive.jpg" : "s440_progressive.jpg",
         make_jpeg(p, rgb), W, H)
        .twin = x.bytes;
  }

  // bytes after EOI
  {
    Bytes random = base;
    const Bytes junk = random_bytes(700, 20);
    random.insert(random.end(), junk.begin(), junk.end());
    good("jpeg_trailing_garbage.jpg", "trailing_random.jpg", random, W, H).twin = base;
    Bytes second = base;
    const Bytes other = make_jpeg(spec(20, 20), pattern(20, 20, 3, 9));
    second.insert(second.end(), other.begin(), other.end());
    good("jpeg_trailing_garbage.jpg", "trailing_second_jpeg.jpg", second, W, H).twin = base;
    Bytes zeros = base;
    zeros.resize(zeros.size() + 4096, 0);
    good("jpeg_trailing_garbage.jpg", "trailing_zeros.jpg", zeros, W, H).twin = base;
  }

  // truncated
  {
    const auto [begin, end] = jpeg_scan_data(base);
    add("jpeg_truncated_baseline.jpg", "cut_in_scan.jpg",
        Bytes(base.begin(), base.begin() + static_cast<ptrdiff_t>(begin + (end - begin) * 6 / 10)));
    add("jpeg_truncated_baseline.jpg", "no_eoi.jpg", Bytes(base.begin(), base.end() - 2));
    JpegSpec p = spec(W, H);
    p.progressive = true;
    add("jpeg_truncated_baseline.jpg", "progressive_cut.jpg", cut(make_jpeg(p, rgb), 2.0 / 3));
    add("jpeg_truncated_baseline.jpg", "cut_in_header.jpg",
        Bytes(base.begin(), base.begin() + static_cast<ptrdiff_t>(find_jpeg_marker(base, 0xC0) + 6)));
  }

  // extreme aspect ratios
  {
    const Bytes wide = pattern(30000, 2, 3);
    Variant& a = good("jpeg_very_wide_30000x2.jpg", "wide_30000x2.jpg",
                      make_jpeg(spec(30000, 2, Subsampling::k444, 95), wide), 30000, 2);
    a.reference = wide;
    a.tolerance = 6;
    const Bytes tall = pattern(2, 20000, 3);
    Variant& b = good("jpeg_very_wide_30000x2.jpg", "tall_2x20000.jpg",
                      make_jpeg(spec(2, 20000, Subsampling::k444, 95), tall), 2, 20000);
    b.reference = tall;
    b.tolerance = 6;
  }

  // zero width or height in SOF
  add("jpeg_zero_width.jpg", "zero_width.jpg", patch_sof(base, 0xC0, 7, 0));
  add("jpeg_zero_width.jpg", "zero_height.jpg", patch_sof(base, 0xC0, 5, 0));

  // 16-bit PNGs: scaled by 1/257 with rounding, not truncated
  {
    const int w = 64, h = 8;
    Bytes gray16, expect_gray;
    for (int i = 0; i < w * h; ++i) {
      const int v = (i * 1031 + 77) % 65536;
      gray16.push_back(static_cast<uint8_t>(v >> 8));
      gray16.push_back(static_cast<uint8_t>(v & 0xFF));
      expect_gray.push_back(static_cast<uint8_t>((v * 2 + 257) / 514));
    }
    PngSpec s;
    s.width = w;
    s.height = h;
    s.color_type = 0;
    s.depth = 16;
    Variant& a = good("png_16bit_gray.png", "gray16.png", make_png(s, gray16), w, h);
    a.reference = gray_to_rgb(expect_gray);
    a.gray = true;
    Bytes rgb16;
    for (uint8_t c : rgb) {
      rgb16.push_back(c);  // c * 257 = (c << 8) | c
      rgb16.push_back(c);
    }
    PngSpec r;
    r.width = W;
    r.height = H;
    r.depth = 16;
    good("png_16bit_gray.png", "rgb16.png", make_png(r, rgb16), W, H).reference = rgb;
  }

  // PNG with bad CRCs
  {
    PngSpec s;
    s.width = W;
    s.height = H;
    const Bytes png = make_png(s, rgb);
    // The IDAT's CRC itself wrong (data intact), as in the shared file; a flipped data byte is
    // caught by zlib before the CRC is checked, so its reason varies.
    const size_t at = png_chunk(png, "IDAT");
    const size_t len = static_cast<size_t>(png[at]) << 24 | static_cast<size_t>(png[at + 1]) << 16 |
                       static_cast<size_t>(png[at + 2]) << 8 | png[at + 3];
    Bytes idat = png;
    idat[at + 8 + len] ^= 0x01;
    add("png_bad_idat_crc.png", "idat_crc.png", idat);
    Bytes idat_data = png;
    idat_data[at + 8 + 5] ^= 0x01;
    add("png_bad_idat_crc.png", "idat_data_flipped.png", idat_data).expect.reason = "";
    Bytes ihdr = png;
    ihdr[8 + 8 + 13] ^= 0xFF;  // IHDR's CRC itself
    add("png_bad_idat_crc.png", "ihdr_crc.png", ihdr);
  }

  // PNG decompression bombs: patched IHDR, and a real one (a deflated sea of zeros)
  {
    PngSpec s;
    s.width = 8;
    s.height = 8;
    Bytes patched = make_png(s, pattern(8, 8, 3));
    const uint8_t side[] = {0, 0, 0x9C, 0x40};  // 40000
    std::memcpy(&patched[16], side, 4);
    std::memcpy(&patched[20], side, 4);
    add("png_bomb_40000x40000.png", "ihdr_40000x40000.png", patched).expect.reason =
        "40000x40000 = 1600000000 pixels exceeds max_pixels 178956970";
    PngSpec z;
    z.width = 16000;
    z.height = 12000;
    z.color_type = 0;
    z.depth = 1;
    add("png_bomb_40000x40000.png", "deflate_bomb_16000x12000.png",
        make_png(z, Bytes(static_cast<size_t>(16000) * 12000, 0)))
        .expect.reason = "16000x12000 = 192000000 pixels exceeds max_pixels";
  }

  // a PNG named like a JPEG (ImageNet's n02105855_2933.JPEG), and the converse
  {
    PngSpec s;
    s.width = W;
    s.height = H;
    good("png_disguised_as.JPEG", "png_named.JPEG", make_png(s, rgb), W, H).reference = rgb;
    good("png_disguised_as.JPEG", "jpeg_named.png", base, W, H).twin = base;
    const auto pal = test_palette();
    GifFrame f;
    f.width = 8;
    f.height = 8;
    f.indices = Bytes(64, 9);
    good("png_disguised_as.JPEG", "gif_named.jpg", make_gif(8, 8, pal, {f}), 8, 8).reference =
        palette_rgb(f.indices, pal);
  }

  // Adam7 RGBA: the same pixels as non-interlaced, alpha dropped
  {
    Bytes rgba = pattern(W, H, 4, 5);
    for (size_t i = 3; i < rgba.size(); i += 4) rgba[i] = static_cast<uint8_t>(i * 13 % 256);
    PngSpec s;
    s.width = W;
    s.height = H;
    s.color_type = 6;
    const Bytes plain = make_png(s, rgba);
    s.interlace = true;
    Variant& a = good("png_interlaced_rgba.png", "adam7_rgba.png", make_png(s, rgba), W, H);
    a.twin = plain;
    a.reference = drop_to_rgb(rgba, 4);
    Bytes rgba16;
    for (uint8_t c : rgba) {
      rgba16.push_back(c);
      rgba16.push_back(c);
    }
    s.depth = 16;
    good("png_interlaced_rgba.png", "adam7_rgba16.png", make_png(s, rgba16), W, H).reference =
        drop_to_rgb(rgba, 4);
    PngSpec g;
    g.width = W;
    g.height = H;
    g.color_type = 0;
    g.interlace = true;
    const Bytes gray = pattern(W, H, 1);
    Variant& c = good("png_interlaced_rgba.png", "adam7_gray.png", make_png(g, gray), W, H);
    c.reference = gray_to_rgb(gray);
    c.gray = true;
  }

  // palette + transparency: palette colours, alpha ignored
  for (int depth : {8, 4, 1}) {
    const int colors = 1 << depth;
    std::vector<uint8_t> pal = test_palette();
    pal.resize(static_cast<size_t>(colors) * 3);
    Bytes idx(static_cast<size_t>(W) * H);
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<uint8_t>((i * 7 + i / W) % colors);
    PngSpec s;
    s.width = W;
    s.height = H;
    s.color_type = 3;
    s.depth = depth;
    s.palette = pal;
    for (int i = 0; i < std::min(colors, 5); ++i) s.trns.push_back(static_cast<uint8_t>(i * 60));
    good("png_palette_trns.png", "palette" + std::to_string(depth) + "_trns.png", make_png(s, idx),
         W, H)
        .reference = palette_rgb(idx, pal);
  }
  {
    PngSpec s;  // an RGB colour key (tRNS on a truecolour image)
    s.width = W;
    s.height = H;
    s.trns = {rgb[0], rgb[1], rgb[2]};
    good("png_palette_trns.png", "rgb_colour_key.png", make_png(s, rgb), W, H).reference = rgb;
  }

  // WebP with alpha
  {
    Bytes rgba = pattern(W, H, 4, 7);
    for (size_t i = 3; i < rgba.size(); i += 4) rgba[i] = static_cast<uint8_t>(1 + i * 11 % 255);
    good("webp_alpha.webp", "lossless_alpha.webp", make_webp(W, H, rgba, 101), W, H).reference =
        drop_to_rgb(rgba, 4);
    Variant& x = good("webp_alpha.webp", "lossy_alpha.webp", make_webp(W, H, rgba, 95), W, H);
    x.reference = drop_to_rgb(rgba, 4);
    x.tolerance = 8;  // lossy VP8, 4:2:0

    // Animated: the first frame, alpha dropped as for a still WebP. Three lossless full-canvas
    // frames (later ones differ, blended or not: never shown); then a canvas whose first frame is
    // a lossy sub-rectangle (the rest of the canvas is transparent black: black once alpha is
    // dropped, as Pillow shows it) followed by a lossless frame.
    std::vector<WebpFrame> frames;
    for (int f = 0; f < 3; ++f) {
      WebpFrame fr;
      fr.width = W;
      fr.height = H;
      fr.rgba = f == 0 ? rgba : pattern(W, H, 4, static_cast<uint32_t>(20 + f));
      fr.blend = f == 2;
      frames.push_back(std::move(fr));
    }
    good("webp_alpha.webp", "animated_lossless_alpha.webp", make_animated_webp(W, H, frames), W, H)
        .reference = drop_to_rgb(rgba, 4);
    const int fx = 6, fy = 8, fw = 20, fh = 12;
    Bytes first = pattern(fw, fh, 4, 8);
    for (size_t i = 3; i < first.size(); i += 4) first[i] = 255;
    std::vector<WebpFrame> sub(2);
    sub[0] = {fx, fy, fw, fh, first, 95, false};
    sub[1] = {0, 0, W, H, pattern(W, H, 4, 9), 101, true};
    Bytes expected(static_cast<size_t>(W) * H * 3, 0);
    const Bytes first_rgb = drop_to_rgb(first, 4);
    for (int y = 0; y < fh; ++y)
      std::memcpy(&expected[(static_cast<size_t>(fy + y) * W + fx) * 3], &first_rgb[static_cast<size_t>(y) * fw * 3],
                  static_cast<size_t>(fw) * 3);
    Variant& a = good("webp_alpha.webp", "animated_lossy_subrect_first.webp", make_animated_webp(W, H, sub), W, H);
    a.reference = expected;
    a.tolerance = 3;  // lossy VP8 inside the rectangle; the black rest is exact
  }
  return v;
}

}  // namespace

std::vector<Variant> make_kind_variants() {
  static const std::vector<Variant> variants = build_kind_variants();  // built once per process
  return variants;
}

std::vector<Variant> make_whole_image_variants() {
  std::vector<Variant> v;
  const int W = 21, H = 13;
  const Bytes rgb = pattern(W, H, 3, 11);
  const Bytes gray = pattern(W, H, 1, 11);
  const auto add = [&](const std::string& kind, const std::string& name, Bytes bytes,
                       std::optional<ErrorKind> error, Bytes reference = {}) {
    Variant x;
    x.kind = kind;
    x.name = name;
    x.bytes = std::move(bytes);
    x.expect.error = error;
    if (!error) {
      x.width = W;
      x.height = H;
      x.reference = std::move(reference);
    }
    v.push_back(std::move(x));
  };
  BmpSpec b24;
  b24.width = W;
  b24.height = H;
  const Bytes bmp = make_bmp(b24, rgb);
  add("bmp", "good.bmp", bmp, std::nullopt, rgb);
  b24.top_down = true;
  add("bmp", "top_down.bmp", make_bmp(b24, rgb), std::nullopt, rgb);
  add("bmp", "truncated.bmp", cut(bmp, 0.6), ErrorKind::kTruncated);
  Bytes bad_bpp = bmp;
  bad_bpp[28] = 7;  // 7 bits per pixel
  add("bmp", "bad_bpp.bmp", bad_bpp, ErrorKind::kCorrupt);
  // Palettes of 1, 4 and 8 bits, uncompressed and RLE, and the OS/2 core header.
  for (const auto& [bpp, compression, header] :
       std::vector<std::tuple<int, uint32_t, int>>{{1, 0, 40}, {4, 0, 40}, {8, 0, 40}, {8, 0, 12},
                                                   {8, 1, 40}, {4, 2, 40}}) {
    BmpSpec p;
    p.width = W;
    p.height = H;
    p.bpp = bpp;
    p.compression = compression;
    p.header = header;
    p.palette = test_palette();
    p.palette.resize(static_cast<size_t>(3) << bpp);
    Bytes idx(static_cast<size_t>(W) * H);
    for (size_t i = 0; i < idx.size(); ++i)  // runs along rows, so RLE has runs to encode
      idx[i] = static_cast<uint8_t>((i / 3 + i / W * 5) % (1u << bpp));
    const std::string name = "pal" + std::to_string(bpp) +
                             (compression == 1 ? "_rle8" : compression == 2 ? "_rle4" : "") +
                             (header == 12 ? "_core" : "") + ".bmp";
    const Bytes file = make_bmp(p, idx);
    add("bmp", name, file, std::nullopt, palette_rgb(idx, p.palette));
    if (compression) add("bmp", "truncated_" + name, cut(file, 0.5), ErrorKind::kTruncated);
  }
  // 16 bits: 5-6-5 through BITFIELDS and the 5-5-5 default; 32 bits with alpha in a V5 header.
  for (const bool b565 : {true, false}) {
    BmpSpec p;
    p.width = W;
    p.height = H;
    p.bpp = 16;
    p.compression = b565 ? 3 : 0;
    if (b565) {
      p.masks[0] = 0xF800;
      p.masks[1] = 0x07E0;
      p.masks[2] = 0x001F;
    }
    Bytes expect(rgb.size());
    for (size_t i = 0; i < rgb.size(); ++i) {
      const int bits = b565 && i % 3 == 1 ? 6 : 5;
      const int v = rgb[i] >> (8 - bits), max = (1 << bits) - 1;
      expect[i] = static_cast<uint8_t>(v * 255 / max);
    }
    add("bmp", b565 ? "rgb565_bitfields.bmp" : "rgb555.bmp", make_bmp(p, rgb), std::nullopt, expect);
  }
  {
    BmpSpec p;
    p.width = W;
    p.height = H;
    p.bpp = 32;
    p.compression = 3;
    p.header = 124;
    p.masks[0] = 0x00FF0000;
    p.masks[1] = 0x0000FF00;
    p.masks[2] = 0x000000FF;
    p.masks[3] = 0xFF000000;
    Bytes rgba = pattern(W, H, 4, 12);
    add("bmp", "bgra32_v5.bmp", make_bmp(p, rgba), std::nullopt, drop_to_rgb(rgba, 4));
  }

  const Bytes ppm = make_pnm(W, H, rgb, true);
  add("pnm", "good.ppm", ppm, std::nullopt, rgb);
  add("pnm", "good.pgm", make_pnm(W, H, gray, false), std::nullopt, gray_to_rgb(gray));
  add("pnm", "truncated.ppm", cut(ppm, 0.7), ErrorKind::kTruncated);
  {
    // Plain (ASCII) P3 and P2 with maxval 100, P1 and P4 bitmaps, 16-bit P6.
    std::string p3 = "P3\n" + std::to_string(W) + " " + std::to_string(H) + "\n255\n";
    for (size_t i = 0; i < rgb.size(); ++i) p3 += std::to_string(rgb[i]) + (i % 12 == 11 ? "\n" : " ");
    add("pnm", "plain.ppm", Bytes(p3.begin(), p3.end()), std::nullopt, rgb);
    add("pnm", "plain_truncated.ppm", Bytes(p3.begin(), p3.begin() + static_cast<ptrdiff_t>(p3.size() / 2)),
        ErrorKind::kTruncated);
    std::string p2 = "P2\n" + std::to_string(W) + " " + std::to_string(H) + "\n100\n";
    Bytes expect;
    for (size_t i = 0; i < gray.size(); ++i) {
      const int v = gray[i] * 100 / 255;
      p2 += std::to_string(v) + "\n";
      const int q = v * 255 / 100, r = v * 255 % 100;  // round half to even
      expect.push_back(static_cast<uint8_t>(q + (2 * r > 100 || (2 * r == 100 && (q & 1)))));
    }
    add("pnm", "plain_maxval100.pgm", Bytes(p2.begin(), p2.end()), std::nullopt, gray_to_rgb(expect));
    std::string p1 = "P1\n" + std::to_string(W) + " " + std::to_string(H) + "\n";
    Bytes p4 = {'P', '4', '\n'};
    const std::string dims = std::to_string(W) + " " + std::to_string(H) + "\n";
    p4.insert(p4.end(), dims.begin(), dims.end());
    Bytes bits;
    for (int y = 0; y < H; ++y) {
      Bytes row((static_cast<size_t>(W) + 7) / 8, 0);
      for (int x = 0; x < W; ++x) {
        const bool black = gray[static_cast<size_t>(y) * W + x] < 128;
        p1 += black ? '1' : '0';  // no whitespace between digits: allowed in P1
        if (black) row[static_cast<size_t>(x) / 8] |= static_cast<uint8_t>(0x80 >> (x % 8));
        bits.push_back(black ? 0 : 255);
      }
      p1 += '\n';
      p4.insert(p4.end(), row.begin(), row.end());
    }
    add("pnm", "bitmap_plain.pbm", Bytes(p1.begin(), p1.end()), std::nullopt, gray_to_rgb(bits));
    add("pnm", "bitmap.pbm", p4, std::nullopt, gray_to_rgb(bits));
    std::string p6 = "P6\n" + std::to_string(W) + " " + std::to_string(H) + "\n65535\n";
    Bytes p6_16(p6.begin(), p6.end());
    for (uint8_t c : rgb) p6_16.insert(p6_16.end(), {c, c});  // c * 257: scales back to c
    add("pnm", "rgb16.ppm", p6_16, std::nullopt, rgb);
  }
  const Bytes tiff = make_tiff(W, H, rgb);
  add("tiff", "good.tiff", tiff, std::nullopt, rgb);
  add("tiff", "strip_cut.tiff", cut(tiff, 0.6), ErrorKind::kTruncated);
  Bytes bad_compression = tiff;
  bad_compression[8 + 2 + 3 * 12 + 8] = 99;  // Compression = 99: no such codec
  add("tiff", "unknown_compression.tiff", bad_compression, ErrorKind::kUnsupported);
  Bytes ifd_inside = tiff;
  ifd_inside[4] = 0xF0;  // the first IFD points into the pixel data
  add("tiff", "ifd_in_pixel_data.tiff", ifd_inside, ErrorKind::kCorrupt);
  Bytes ifd_outside = tiff;
  ifd_outside[6] = 0x10;  // the first IFD lies 1 MB past the end
  add("tiff", "ifd_past_end.tiff", ifd_outside, ErrorKind::kTruncated);
  return v;
}

}  // namespace gpufeed::test
