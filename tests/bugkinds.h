#pragma once
// Generated variants of every kind of bad or unusual input in ../shared/bugcases/EXPECTED.md, so
// that each kind is tested on a fresh clone without the shared files: the JPEGs come from
// libjpeg-turbo's own compressor (arithmetic coding, CMYK/YCCK, RGB colour space, ICC chunks,
// restart markers, progressive scans), the PNGs from libpng (palette + tRNS, Adam7, 16 bits), the
// WebPs from libwebp, the GIFs, BMPs, PNMs and TIFFs from small writers here; damage (truncation,
// corruption, patched headers) is byte surgery on those.
//
// Used by test_decode (each kind's outcome and pixels), test_robustness (the loader over a
// folder of them) and the fuzzer's seed corpus (tests/fuzz). Test code: it may abort the test
// with an exception on a generator error, never on a decoder's.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gpufeed/decode/decoder.h"
#include "gpufeed/decode/error.h"

namespace gpufeed::test {

using Bytes = std::vector<uint8_t>;

/// What decoding a variant with default DecodeOptions must give.
struct Outcome {
  std::optional<decode::ErrorKind> error;  ///< set: decode throws DecodeError of this kind
  std::string reason;                      ///< substring of DecodeError::reason(), when set
};

/// One generated input standing for a kind.
struct Variant {
  std::string kind;       ///< the ../shared/bugcases/files name that stands for the kind
  std::string name;       ///< file name to store it under (unique, with a telling extension)
  Bytes bytes;            ///< the file's content
  Outcome expect;         ///< default-options outcome
  int width = 0;          ///< expected output width when it decodes
  int height = 0;         ///< expected output height when it decodes
  /// Non-empty: the decode must equal the decode of these bytes exactly (same coefficients in a
  /// different container: Huffman vs arithmetic, no restart markers, no ICC, 8-bit DQT...).
  Bytes twin;
  /// Non-empty: [height, width, 3] RGB the decode must approximate within `tolerance` (mean
  /// absolute difference per sample); 0 means exactly.
  Bytes reference;
  double tolerance = 0;
  bool gray = false;      ///< the output must have R = G = B
  int min_warnings = 0;   ///< DecodeResult::warnings must be at least this
};

/// The 30 kinds of ../shared/bugcases/EXPECTED.md, by the name of the file standing for each,
/// sorted by name.
const std::vector<std::string>& bug_kinds();

/// Each kind's outcome under default options with this build's libjpeg-turbo 2.1 (no 12-bit,
/// no lossless), as EXPECTED.md states it.
Outcome expected_outcome(const std::string& kind);

/// Every kind's generated variants (at least one per kind; deterministic bytes).
std::vector<Variant> make_kind_variants();

/// BMP, PNM and TIFF variants (WholeImageDecoder: our readers and libtiff), good and damaged; `kind` is "bmp", "pnm" or
/// "tiff".
std::vector<Variant> make_whole_image_variants();

/// A smooth, deterministic test image with edges: [h, w, channels] uint8.
Bytes pattern(int width, int height, int channels, uint32_t seed = 1);

/// How generated JPEGs store colour.
enum class JpegColor { kYCbCr, kGray, kRgb, kCmyk, kYcck };

/// A JPEG for libjpeg-turbo's compressor to write.
struct JpegSpec {
  int width = 0;
  int height = 0;
  JpegColor color = JpegColor::kYCbCr;  ///< input is RGB for kYCbCr/kRgb, gray, or CMYK
  decode::Subsampling subsampling = decode::Subsampling::k420;  ///< kYCbCr only
  int quality = 90;
  bool progressive = false;
  bool arithmetic = false;
  int restart_interval = 0;  ///< MCUs between restart markers, 0 for none
  Bytes icc;                 ///< ICC profile to embed (APP2, split into 65519-byte chunks)
};

/// Encodes `samples` ([h, w, c], c = 1 gray, 3 RGB, 4 CMYK as stored) with libjpeg's compressor.
/// Throws std::runtime_error if libjpeg fails.
Bytes make_jpeg(const JpegSpec& spec, const Bytes& samples);

/// A PNG for libpng to write.
struct PngSpec {
  int width = 0;
  int height = 0;
  int color_type = 2;  ///< 0 gray, 2 RGB, 3 palette, 4 gray+alpha, 6 RGBA
  int depth = 8;       ///< bits per sample (1, 2, 4, 8, 16 as the colour type allows)
  bool interlace = false;  ///< Adam7
  std::vector<uint8_t> palette;  ///< colour type 3: RGB triples
  std::vector<uint8_t> trns;     ///< tRNS: palette alphas, or (gray/RGB) one 16-bit key sample set
};

/// Encodes `samples` with libpng: one byte per sample for depth <= 8 (palette indices or grey
/// levels, packed by libpng), two big-endian bytes per sample for depth 16.
Bytes make_png(const PngSpec& spec, const Bytes& samples);

/// A GIF frame for make_gif.
struct GifFrame {
  int left = 0, top = 0, width = 0, height = 0;
  Bytes indices;          ///< width * height palette indices, row-major
  bool interlace = false;
  int transparent = -1;   ///< graphic control extension's transparent index, -1 for none
  Bytes local;            ///< local colour table (RGB triples, zero-padded to 256); empty: global
};

/// A GIF89a of `width` x `height` with a 256-entry global table (`palette`, RGB triples,
/// zero-padded; empty: no global table), background index `background`, and the frames, LZW-coded
/// as literal 9-bit codes with a clear code every 250 literals, so the code width never grows
/// (every decoder reads it).
Bytes make_gif(int width, int height, const std::vector<uint8_t>& palette,
               const std::vector<GifFrame>& frames, int background = 0);

/// WebP through libwebp: lossless when quality > 100, else lossy at `quality`. `rgba` is
/// [h, w, 4].
Bytes make_webp(int width, int height, const Bytes& rgba, int quality);

/// A Motion-JPEG webcam frame as UVC cameras send it: baseline 4:2:2 from libjpeg's compressor
/// with its standard Huffman tables and a restart marker every `restart_interval` MCUs, then the
/// DHT segments removed (MJPEG leaves them out; decoders use the standard tables) and the JFIF
/// APP0 replaced by an AVI1 APP0. `rgb` is [h, w, 3].
Bytes make_mjpeg_frame(int width, int height, const Bytes& rgb, int restart_interval, int quality = 80);

/// Offsets of the restart markers (0xFF 0xD0..0xD7) in a JPEG's first scan, in order.
std::vector<size_t> restart_markers(const Bytes& jpeg);

/// `jpeg` with `garbage` inserted just before its restart marker number `k` (0-based, in scan
/// order): the USB packet junk webcams leave inside a frame. libjpeg reports "Corrupt JPEG data:
/// N extraneous bytes before marker 0xdN" and resynchronises there.
Bytes insert_before_restart(const Bytes& jpeg, size_t k, const Bytes& garbage);

/// One frame of an animated WebP for make_animated_webp.
struct WebpFrame {
  int x = 0, y = 0;          ///< offset on the canvas (even: the format stores offset / 2)
  int width = 0, height = 0;
  Bytes rgba;                ///< [height, width, 4]
  int quality = 101;         ///< lossless when > 100, else lossy at this quality
  bool blend = false;        ///< alpha-blend onto the previous canvas (else replace)
};

/// An animated WebP (VP8X + ANIM + one ANMF per frame) of a `width` x `height` canvas, assembled
/// with libwebpmux from frames libwebp encodes one by one, so a frame can be a sub-rectangle and
/// lossy or lossless independently of the others. Infinite loop, 100 ms per frame.
Bytes make_animated_webp(int width, int height, const std::vector<WebpFrame>& frames);

/// Offset of marker 0xFF `code` among a JPEG's segments before the first SOS, or npos.
size_t find_jpeg_marker(const Bytes& jpeg, uint8_t code);

/// [begin, end) of the entropy-coded data of the first scan.
std::pair<size_t, size_t> jpeg_scan_data(const Bytes& jpeg);

}  // namespace gpufeed::test
