#pragma once
// Bytes -> RGB pixels. The format is sniffed from the first bytes, never from a file name.
// JPEG goes through libjpeg-turbo (its libjpeg API: DCT-domain scaling, jpeg_crop_scanline and
// jpeg_skip_scanlines, a per-image error manager that never prints); PNG through libpng, WebP
// through libwebp, TIFF through libtiff (each with handlers that never print: OpenCV's imdecode
// prints its codecs' failures to stderr); BMP and PNM through our own bounds-checked readers; GIF
// (first frame, as PIL composes it) through giflib, because OpenCV 4.6 reads no GIF.
//
// Policy (the same for every format):
//  - output is always 3-channel RGB uint8, rows contiguous ([H, W, 3]): grayscale replicated,
//    alpha dropped (as torchvision's ImageFolder does with PIL's convert("RGB")), CMYK/YCCK
//    converted, 16-bit scaled to 8-bit;
//  - the pixel limit (DecodeOptions::max_pixels, default 178,956,970 = Pillow's error threshold)
//    is checked from the header before anything is allocated;
//  - every failure is a DecodeError naming the source and the reason;
//  - libjpeg warnings are counted per image, never printed, and judged by how much of the image
//    they cost (docs/DECODE-POLICY.md):
//    * benign -- "extraneous bytes before a marker" before EOI, SOS or DHT or after the last row
//      (scanners and cameras write such files), an unknown JFIF version or Adobe transform, a bad
//      ICC chunk: decode, warning counted;
//    * damage confined to restart intervals -- in a single-scan Huffman JPEG with restart markers
//      (Motion-JPEG webcam frames), garbled or short entropy data ("bad Huffman code", "corrupt
//      data: N extraneous bytes before marker 0xd1", "hit marker", "must resync") that libjpeg
//      resynchronises at the next restart marker: decode (the damaged intervals come out garbled
//      or grey, as Pillow and OpenCV return them), counted in DecodeResult::warnings and
//      DecodeResult::damaged_intervals, unless more than a quarter of the scan's intervals are
//      damaged;
//    * lost remainder -- premature end of data (kTruncated); damage without restart markers, in a
//      progressive or arithmetic-coded image, or that does not resynchronise before the end of
//      the image (kCorrupt). allow_truncated accepts these (grey-filled); strict rejects every
//      warning, benign and confined ones included.
//    Damage that leaves the Huffman stream decodable is invisible to libjpeg (without restart
//    markers it shows at most as extraneous bytes before EOI): such files decode, the warning
//    counted;
//  - a JPEG decoded down to its last row is read on to EOI, so one that ends without EOI is
//    kTruncated; a crop that stops higher never reads the rest (its pixels are all there, and
//    decoding less is the point). A PNG is always read to IEND: a bad CRC or data that ends
//    below the crop is still reported (only the crop's rows are unfiltered).

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpufeed/decode/error.h"

namespace gpufeed::decode {

/// Container format, detected from content.
enum class ImageFormat { kUnknown, kJpeg, kPng, kBmp, kWebp, kGif, kPnm, kTiff };

/// "jpeg", "png", "bmp", "webp", "gif", "pnm", "tiff" or "unknown".
std::string_view to_string(ImageFormat format);

/// JPEG chroma subsampling, as TurboJPEG names it. kNone for non-JPEG or unrecognised layouts.
enum class Subsampling { kNone, k444, k422, k420, kGray, k440, k411 };

/// "4:4:4", "4:2:2", "4:2:0", "gray", "4:4:0", "4:1:1" or "none".
std::string_view to_string(Subsampling subsampling);

/// What a header says, read without decoding any pixel data.
struct ImageInfo {
  ImageFormat format = ImageFormat::kUnknown;
  int width = 0;        ///< pixels, as stored (EXIF orientation not applied)
  int height = 0;       ///< pixels
  int components = 0;   ///< channels as stored: 1 gray, 3 colour, 4 CMYK/RGBA, ...
  int bits_per_sample = 8;  ///< 8 for baseline JPEG; 12 for 12-bit JPEG; 16 for 16-bit PNG
  Subsampling subsampling = Subsampling::kNone;  ///< JPEG only
  bool progressive = false;  ///< JPEG SOF2/SOF6/SOF10/SOF14, or interlaced PNG
  bool arithmetic = false;   ///< JPEG arithmetic coding (SOF9..SOF15)
  bool lossless = false;     ///< JPEG lossless (SOF3, SOF7, SOF11, SOF15)
  /// EXIF orientation tag, 1..8 (1 = as stored). Read from a JPEG's APP1 Exif segment; 1 for
  /// every other format and when the tag is absent or invalid.
  int orientation = 1;
};

/// Whether EXIF orientation `orientation` (ImageInfo::orientation) turns the image a quarter
/// turn, so that the displayed width is the stored height and the displayed height the stored
/// width: true for 5..8 (transpose, rotations by 90 degrees, transverse), false for 1..4 and for
/// anything outside 1..8. decode() swaps by it under DecodeOptions::apply_exif_orientation, so a
/// caller that plans a crop in the displayed frame takes the frame's size from it too.
bool orientation_swaps_axes(int orientation);

/// DCT scale factor num/8 for JPEG (libjpeg-turbo supports 1/8 ... 8/8, and 9/8 ... 16/8 which
/// gpufeed never requests). An image of width w decodes to ceil(w * num / 8) columns.
struct ScaleFactor {
  int num = 8;  ///< 1..8
  friend bool operator==(ScaleFactor, ScaleFactor) = default;
};

/// Size of a dimension after DCT scaling: ceil(dim * scale.num / 8), libjpeg's rounding.
int scaled_size(int dim, ScaleFactor scale);

/// A rectangle in source (unscaled) pixels; x/y are the left/top column/row.
struct CropRect {
  int x = 0;
  int y = 0;
  int width = 0;
  int height = 0;
  friend bool operator==(const CropRect&, const CropRect&) = default;
};

/// Options for one decode. Defaults decode the whole image at full size.
struct DecodeOptions {
  /// JPEG only: DCT-domain downscale. Other formats ignore it (DecodeResult::scale says 8/8).
  ScaleFactor scale{};
  /// Decode only this region (source pixels; clamped to the image). For JPEG only the needed
  /// scanlines are entropy-decoded: rows below the crop are never read, rows above are skipped
  /// with jpeg_skip_scanlines, columns beside it with jpeg_crop_scanline. The output covers the
  /// scaled region [floor(x*s), ceil((x+width)*s)) x [floor(y*s), ceil((y+height)*s)), s=num/8.
  /// width == 0 means the whole image.
  CropRect crop{};
  /// Largest width*height accepted, checked from the header before any allocation.
  int64_t max_pixels = 178'956'970;
  /// Accept JPEGs whose data ends early or is corrupt beyond what restart markers confine
  /// (missing rows are filled grey by libjpeg) instead of throwing kTruncated/kCorrupt; the
  /// warnings are counted. Other formats ignore it.
  bool allow_truncated = false;
  /// Treat every libjpeg warning, even benign ones and damage confined to restart intervals, as
  /// an error (kCorrupt, or kTruncated for premature end of data); libpng warnings too. Takes
  /// precedence over allow_truncated. CLI: --strict-decode (train, bench, inspect).
  bool strict = false;
  /// Apply the EXIF orientation (ImageInfo::orientation) so the output is upright, as PIL's
  /// ImageOps.exif_transpose does. Off by default, as in torchvision's ImageFolder. When on,
  /// `crop`, DecodeResult::region and DecodeResult::scaled_region are in the displayed
  /// (rotated) frame, whose width and height are swapped for orientations 5..8.
  bool apply_exif_orientation = false;
};

/// A reusable RGB pixel buffer. Its storage grows to the largest image seen and is reused, so a
/// thread-local ImageBuffer makes steady-state decoding allocation-free.
struct ImageBuffer {
  std::vector<uint8_t> pixels;  ///< [height, width, 3] uint8, rows contiguous (stride = width*3)
  int width = 0;
  int height = 0;
  /// Resizes to [h, w, 3] without shrinking capacity; contents are unspecified afterwards.
  void reshape(int w, int h);
  uint8_t* row(int y) { return pixels.data() + static_cast<size_t>(y) * width * 3; }
  const uint8_t* row(int y) const { return pixels.data() + static_cast<size_t>(y) * width * 3; }
};

/// What a decode produced besides the pixels.
struct DecodeResult {
  ImageInfo info;          ///< the header, as probe() would report it
  ScaleFactor scale{};     ///< the DCT scale actually applied (always 8/8 for non-JPEG)
  /// The region of the source (unscaled pixels) the output covers: the smallest integer
  /// rectangle containing the footprints of the output pixels, clamped to the image. With
  /// s = scale.num / 8 and the output at scaled_region [xs0, xs1) x [ys0, ys1):
  /// x = floor(xs0 / s), x + width = min(image width, ceil(xs1 / s)), same for y. It contains
  /// the requested crop; at 8/8 it equals the clamped crop (the whole image without a crop).
  CropRect region{};
  /// Where the output lies in the whole image scaled by `scale` (libjpeg's output grid, whose
  /// pixel i covers source columns [i / s, (i + 1) / s)); width/height equal the output's.
  /// xs0 = floor(crop.x * s), xs1 = ceil((crop.x + crop.width) * s), same for y.
  CropRect scaled_region{};
  /// libjpeg/libpng warnings accepted (e.g. extraneous bytes before a marker, damage confined to
  /// restart intervals, or any data-loss warning when allow_truncated is set).
  int warnings = 0;
  /// JPEG only: restart intervals whose entropy data was damaged (decoded garbled or grey) and
  /// after which libjpeg resynchronised at a restart marker (see the policy above). 0 for an
  /// intact image.
  int damaged_intervals = 0;
  /// JPEG only: the work a crop saved, in rows/columns of the scaled image (0 for other formats).
  /// Rows above the region passed with jpeg_skip_scanlines: entropy-decoded (Huffman data has to
  /// be read in order) but never inverse-transformed, upsampled or colour-converted. 0 when there
  /// were none, or when libjpeg refused to skip and they were decoded and discarded.
  int skipped_rows = 0;
  /// JPEG only: rows below the region that were never read at all (the decode stopped there).
  /// 0 for progressive JPEGs, whose scans libjpeg reads whole before the first row.
  int unread_rows = 0;
  /// JPEG only: columns libjpeg produced per row: the region's width plus the few columns
  /// jpeg_crop_scanline adds on the left to start at an iMCU boundary, or the whole scaled width
  /// when it could not crop.
  int decoded_columns = 0;
};

/// Detects the format from the first bytes (magic numbers). Never throws.
ImageFormat sniff(std::span<const uint8_t> bytes);

/// Reads only the header. Throws DecodeError: kEmpty (no bytes), kUnsupported (unknown format),
/// kTruncated (header cut short), kCorrupt (zero width/height, malformed markers).
ImageInfo probe(std::span<const uint8_t> bytes, std::string_view source);

/// Decodes bytes to RGB. Holds per-thread state (libjpeg decompressor, scratch rows, and the memory
/// libjpeg asks for per image, kept between images), so keep one per thread and reuse it: once it
/// has decoded its largest baseline JPEG, decoding another (into an ImageBuffer that has grown
/// as large) allocates nothing. Progressive JPEGs' whole-image coefficient buffers and the other
/// formats' decoders still allocate per image. Not thread-safe itself.
class Decoder {
 public:
  Decoder();
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  /// Decodes `bytes` into `out` ([H, W, 3] uint8 RGB). `source` names the input in errors.
  /// Throws DecodeError (any kind but kIo); `out` is unspecified after a throw. Throws
  /// std::invalid_argument for options no image could satisfy (scale.num outside 1..8, a
  /// negative crop size, a crop that lies wholly outside the image).
  DecodeResult decode(std::span<const uint8_t> bytes, std::string_view source,
                      const DecodeOptions& options, ImageBuffer& out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// An allocator whose construct() default-initialises: std::vector<uint8_t>::resize
/// value-initialises (zero-fills) the bytes it adds, a wasted pass over a buffer that a read is
/// about to overwrite.
template <class T>
struct DefaultInitAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  using std::allocator<T>::allocator;
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

/// A byte vector whose resize() leaves the bytes it adds uninitialised: the loader's per-thread
/// file buffer (read_file, datasets::read_sample), which a read then fills.
using ByteBuffer = std::vector<uint8_t, DefaultInitAllocator<uint8_t>>;

/// Reads a whole file into `out` (reusing its capacity). Throws DecodeError kIo naming the path
/// and the OS reason when the file is missing or unreadable, and for anything but a regular file
/// (a folder, a FIFO that could block forever, a device that never ends).
void read_file(const std::filesystem::path& path, std::vector<uint8_t>& out);
/// The same for a NUL-terminated path (the loader's sample table holds its paths so, and this
/// overload makes no per-sample path object).
void read_file(const char* path, std::vector<uint8_t>& out);
/// The same into a ByteBuffer: the buffer is grown without zero-filling it first.
void read_file(const char* path, ByteBuffer& out);

/// Encodes [height, width, 3] RGB uint8 rows (stride width*3) as a baseline JPEG through
/// TurboJPEG. quality 1..100; subsampling k444, k422 or k420 (also k440, k411 and kGray, which
/// stores luminance only). Used by make-dataset and tests.
/// Throws std::invalid_argument for a null image, a non-positive size, a quality outside 1..100
/// or kNone; std::runtime_error if TurboJPEG fails.
std::vector<uint8_t> encode_jpeg(const uint8_t* rgb, int width, int height, int quality = 90,
                                 Subsampling subsampling = Subsampling::k420);

/// Encodes [height, width, 3] RGB uint8 rows (stride width*3) as an 8-bit RGB PNG through libpng
/// (lossless: decoding it gives these pixels back). Used by `gpufeed inspect --write-png`.
/// Throws std::invalid_argument for a null image or a non-positive size; std::runtime_error if
/// libpng fails.
std::vector<uint8_t> encode_png(const uint8_t* rgb, int width, int height);

/// The cost model behind choose_scale: CPU time to decode a JPEG at `scale`, relative to 8/8 (=
/// 1.0), measured on whole-image decodes (decoder.cpp names the files, machine and command).
/// 1/8, 2/8, 4/8 (libjpeg-turbo's SIMD IDCTs) cost less than 8/8; 3/8 a little less; 5/8..7/8 more
/// (scalar IDCTs). Throws std::invalid_argument for scale.num outside 1..8.
double scale_cost(ScaleFactor scale);

/// Picks the DCT scale for decoding `crop` (source pixels; width 0 = the whole image) of a JPEG
/// that will be resized to out_width x out_height: of the scales at which the crop still spans at
/// least the output (crop.width * num / 8 >= out_width, same for heights, so the resize never
/// upsamples what a full-size decode would not), the one with the least scale_cost(), the
/// smaller on a tie; 8/8 when none smaller qualifies. Returns 8/8 for non-JPEG formats.
ScaleFactor choose_scale(const ImageInfo& info, const CropRect& crop, int out_width, int out_height);

}  // namespace gpufeed::decode
