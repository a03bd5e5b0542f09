// JPEG through libjpeg-turbo's libjpeg API: DCT-domain scaling, jpeg_crop_scanline and
// jpeg_skip_scanlines, and a per-image error manager that never prints.
//
// libjpeg reports fatal errors by calling error_exit, which must not return; ours longjmps back to
// a setjmp. A longjmp skips destructors, so every setjmp lives in a small guarded_* function that
// holds nothing but raw pointers to state owned elsewhere (the decoder's State and the caller's
// buffers), and the callbacks libjpeg runs (error_exit, emit_message, progress_monitor) hold no
// C++ objects either. The guarded_* functions return false after a longjmp; the C++ caller then
// throws a DecodeError built from what the callbacks recorded, and its RAII guard aborts the
// decompressor (jpeg_abort_decompress frees the image's pools, so nothing leaks).

// clang-format off
#include <cstdio>  // jpeglib.h needs FILE and size_t declared before it
#include <jpeglib.h>
#include <jerror.h>
#include <jpegint.h>  // struct jpeg_marker_reader: its read_restart_marker is wrapped (see below)
// clang-format on

#include <fmt/format.h>

#include <algorithm>
#include <csetjmp>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "gpufeed/log.h"
#include "internal.h"

namespace gpufeed::decode::detail {

namespace {

/// More scans than any sane progressive encoder writes (libjpeg's simple progression uses 10;
/// TurboJPEG 3's TJPARAM_SCANLIMIT suggests 500). Crafted files with thousands of tiny scans make
/// a progressive decode quadratic; this bounds it.
constexpr int kMaxScans = 500;

/// Why a guarded call came back false.
enum Outcome : int {
  kOutcomeNone = 0,
  kOutcomeError,       ///< libjpeg called error_exit
  kOutcomeWarning,     ///< a warning the options make fatal
  kOutcomeScanLimit,   ///< more than kMaxScans scans
  kOutcomeNoProgress,  ///< jpeg_read_scanlines returned no row (cannot happen with a memory source)
};

/// Which libjpeg call was running when a guarded call failed (decides whether a retry without
/// crop or skip can help).
enum Phase : int { kPhaseHeader, kPhaseStart, kPhaseCrop, kPhaseSkip, kPhaseRead, kPhaseFinish };

/// libjpeg's error manager plus what our callbacks record. Plain data: it lives inside State and
/// is written by callbacks that may longjmp.
struct ErrorManager {
  jpeg_error_mgr pub;  // first member: libjpeg hands &pub back as cinfo->err
  std::jmp_buf jump;
  // Policy for the current image.
  bool allow_data_loss;
  bool strict;
  // Damage confined to restart intervals (see classify_warning and on_read_restart_marker). Set
  // after jpeg_start_decompress for single-scan sequential images with restart markers.
  bool confine_damage;
  int total_intervals;     // restart intervals in the scan
  int interval;            // index of the interval being decoded (restart markers read so far)
  int last_damaged;        // index of the last interval counted as damaged, -1 for none
  int damaged_intervals;   // intervals counted as damaged
  bool damage_pending;     // damage seen and no restart marker read since (not resynchronised)
  char damage[JMSG_LENGTH_MAX];  // the first damage warning, for the error if it is not tolerated
  jpeg_marker_parser_method read_restart_marker;  // libjpeg's own
  // Results of the current attempt.
  int warnings;
  bool saw_eof;  // premature end of data was seen, even if tolerated
  int outcome;
  int phase;
  int code;  // libjpeg message code of the failure
  ErrorKind kind;
  char message[JMSG_LENGTH_MAX];
};

ErrorManager* manager(j_common_ptr cinfo) { return reinterpret_cast<ErrorManager*>(cinfo->err); }

[[noreturn]] void on_error_exit(j_common_ptr cinfo) {
  ErrorManager* err = manager(cinfo);
  err->outcome = kOutcomeError;
  err->code = err->pub.msg_code;
  (*err->pub.format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

/// How a libjpeg warning is treated. kDamage is lost or garbled entropy data that a restart
/// marker can confine to one interval (see on_read_restart_marker); without restart markers it is
/// kCorrupt.
enum class WarningClass { kBenign, kTruncated, kDamage, kCorrupt };

WarningClass classify_warning(const ErrorManager& err) {
  switch (err.code) {
    case JWRN_EXTRANEOUS_DATA: {
      // Bytes left over before a marker. Before EOI, SOS or DHT, or anywhere after the last pixel
      // row (scanners write data past the declared height), the pixels are intact. Before a
      // restart marker while image rows are being decoded it means the interval's entropy data
      // decoded to fewer bits than it holds: those MCUs are garbage.
      const int marker = err.pub.msg_parm.i[1];
      const bool restart = marker >= 0xD0 && marker <= 0xD7;
      const bool decoding_rows =
          err.phase == kPhaseStart || err.phase == kPhaseSkip || err.phase == kPhaseRead;
      return restart && decoding_rows ? WarningClass::kDamage : WarningClass::kBenign;
    }
    case JWRN_HUFF_BAD_CODE:  // garbled entropy data: libjpeg decodes zeros until it resyncs
    case JWRN_HIT_MARKER:     // the interval's data ended early: the rest of it is grey
    case JWRN_MUST_RESYNC:    // a restart marker missing or out of sequence
      return WarningClass::kDamage;
    case JWRN_JFIF_MAJOR:   // unknown JFIF version
    case JWRN_ADOBE_XFORM:  // unknown Adobe transform code; libjpeg guesses the colour space
    case JWRN_BOGUS_ICC:    // bad ICC chunk; the profile is not used
      return WarningClass::kBenign;
    case JWRN_JPEG_EOF:  // premature end of data: the rest of the image is grey
      return WarningClass::kTruncated;
    default:  // ARITH_BAD_CODE, NOT_SEQUENTIAL, BOGUS_PROGRESSION...
      return WarningClass::kCorrupt;  // lost or garbled entropy data, or a code we do not know
  }
}

/// Largest share of a scan's restart intervals that may be damaged for the image to decode
/// (more is "most of the image is lost", kCorrupt).
constexpr int kMaxDamagedQuarters = 1;

[[noreturn]] void fail_damaged(ErrorManager* err, const char* why) {
  err->outcome = kOutcomeWarning;
  err->kind = ErrorKind::kCorrupt;
  std::snprintf(err->message, sizeof(err->message), "%.96s; %.96s", err->damage, why);
  std::longjmp(err->jump, 1);
}

/// Counts interval `index` as damaged (once), failing when too much of the scan is.
void mark_damaged(ErrorManager* err, int index) {
  if (index == err->last_damaged) return;
  err->last_damaged = index;
  ++err->damaged_intervals;
  if (err->damaged_intervals * 4 > err->total_intervals * kMaxDamagedQuarters &&
      err->damaged_intervals > 1) {
    char why[96];
    std::snprintf(why, sizeof(why), "%d of the scan's %d restart intervals are damaged",
                  err->damaged_intervals, err->total_intervals);
    fail_damaged(err, why);
  }
}

/// Wraps libjpeg's read_restart_marker, which the entropy decoder calls at the end of every
/// restart interval. Once it returns with the marker consumed (unread_marker == 0) libjpeg has
/// resynchronised: the next interval decodes from its own first bit, whatever the previous one
/// held. When it returns against another marker (data that never reaches the next RSTn), the
/// next interval is decoded as empty (grey): that interval is damaged too.
boolean on_read_restart_marker(j_decompress_ptr cinfo) {
  ErrorManager* err = manager(reinterpret_cast<j_common_ptr>(cinfo));
  const boolean ok = (*err->read_restart_marker)(cinfo);
  if (!ok || !err->confine_damage) return ok;
  ++err->interval;
  if (cinfo->unread_marker == 0) {
    err->damage_pending = false;
  } else {
    err->damage_pending = true;
    if (err->damage[0] == '\0')
      std::snprintf(err->damage, sizeof(err->damage),
                    "restart interval %d has no data (no restart marker where it should start)",
                    err->interval);
    mark_damaged(err, err->interval);
  }
  return ok;
}

void on_emit_message(j_common_ptr cinfo, int msg_level) {
  if (msg_level >= 0) return;  // trace messages
  ErrorManager* err = manager(cinfo);
  ++err->warnings;
  ++err->pub.num_warnings;
  err->code = err->pub.msg_code;
  WarningClass cls = classify_warning(*err);
  if (cls == WarningClass::kTruncated) err->saw_eof = true;
  if (cls == WarningClass::kDamage && err->confine_damage) {
    // Confined to this restart interval if libjpeg resynchronises at a later restart marker
    // (on_read_restart_marker); decided there and at the end of the image.
    if (err->damage[0] == '\0')
      (*err->pub.format_message)(cinfo, err->damage);
    err->damage_pending = true;
    mark_damaged(err, err->interval);
    return;
  }
  if (cls == WarningClass::kDamage) cls = WarningClass::kCorrupt;
  bool fatal = err->strict;
  if (cls != WarningClass::kBenign && !err->allow_data_loss) fatal = true;
  if (!fatal) return;
  err->outcome = kOutcomeWarning;
  err->kind = cls == WarningClass::kTruncated ? ErrorKind::kTruncated : ErrorKind::kCorrupt;
  (*err->pub.format_message)(cinfo, err->message);
  // Stop at the first fatal warning instead of decoding the rest of a broken image
  // (TurboJPEG's TJFLAG_STOPONWARNING does the same).
  std::longjmp(err->jump, 1);
}

void on_output_message(j_common_ptr) {}  // libjpeg never prints

void on_progress(j_common_ptr cinfo) {
  if (!cinfo->is_decompressor) return;
  auto* dinfo = reinterpret_cast<j_decompress_ptr>(cinfo);
  if (dinfo->input_scan_number <= kMaxScans) return;
  ErrorManager* err = manager(cinfo);
  err->outcome = kOutcomeScanLimit;
  std::snprintf(err->message, sizeof(err->message), "more than %d progressive scans", kMaxScans);
  std::longjmp(err->jump, 1);
}

/// Pillow's CMYK -> RGB (Convert.c cmyk2rgb): R = (255 - K) - (C * (255 - K)) / 255, rounded.
inline uint8_t muldiv255(int a, int b) {
  const int t = a * b + 128;
  return static_cast<uint8_t>(((t >> 8) + t) >> 8);
}

/// Converts n CMYK pixels to RGB. Adobe APP14 files store inverted values (Pillow's "CMYK;I"),
/// and libjpeg returns them as stored.
void cmyk_to_rgb(const uint8_t* in, uint8_t* out, size_t n, bool inverted) {
  for (size_t i = 0; i < n; ++i, in += 4, out += 3) {
    if (inverted) {
      const int nk = in[3];  // 255 - K with K = 255 - stored
      out[0] = static_cast<uint8_t>(nk - muldiv255(255 - in[0], nk));
      out[1] = static_cast<uint8_t>(nk - muldiv255(255 - in[1], nk));
      out[2] = static_cast<uint8_t>(nk - muldiv255(255 - in[2], nk));
    } else {
      const int nk = 255 - in[3];
      out[0] = static_cast<uint8_t>(nk - muldiv255(in[0], nk));
      out[1] = static_cast<uint8_t>(nk - muldiv255(in[1], nk));
      out[2] = static_cast<uint8_t>(nk - muldiv255(in[2], nk));
    }
  }
}

/// Which rows to produce and where to put them. Plain data, passed by pointer into the guarded
/// row loop.
struct RowPlan {
  JDIMENSION skip_rows;  // output rows above the region
  JDIMENSION rows;       // output rows in the region
  bool use_skip;         // jpeg_skip_scanlines, or read and discard
  uint8_t* scratch;      // one decoded row (decoded width x components)
  uint8_t* out;          // first row of the region in the output
  size_t out_stride;     // bytes
  size_t col_offset;     // decoded pixels left of the region (jpeg_crop_scanline widens left)
  size_t width;          // region pixels per row
  bool direct;           // decode straight into out (RGB and no column offset)
  bool cmyk;
  bool inverted;  // Adobe CMYK
};

/// Where libjpeg's per-image allocations go (JPOOL_IMAGE: Huffman tables, strip and row buffers),
/// so that decoding allocates nothing once the decoder has seen its largest image. libjpeg's own
/// manager mallocs them for every image and frees them in jpeg_abort (5 malloc/free pairs for a
/// typical JPEG); ours bumps a pointer through blocks it keeps, and rewinds when libjpeg frees the
/// image pool. The permanent pool and the virtual arrays of multi-scan (progressive) images stay
/// with libjpeg's manager. Plain data with raw pointers: these callbacks run inside libjpeg and
/// may leave by longjmp (ERREXIT on exhaustion).
struct ImageArena {
  static constexpr int kMaxBlocks = 64;
  static constexpr size_t kAlign = 64;  // libjpeg-turbo aligns to 32 bytes for its SIMD code
  static constexpr size_t kMinBlock = size_t{64} << 10;
  static constexpr size_t kMaxObject = size_t{1} << 30;
  uint8_t* blocks[kMaxBlocks];
  size_t sizes[kMaxBlocks];
  int count;     // blocks allocated
  int current;   // block being filled
  size_t used;   // bytes of blocks[current] handed out
  size_t total;  // bytes handed out since the last rewind, for coalescing
  // libjpeg's own methods, for the permanent pool and for freeing its pools.
  void* (*alloc_small)(j_common_ptr, int, size_t);
  void* (*alloc_large)(j_common_ptr, int, size_t);
  JSAMPARRAY (*alloc_sarray)(j_common_ptr, int, JDIMENSION, JDIMENSION);
  JBLOCKARRAY (*alloc_barray)(j_common_ptr, int, JDIMENSION, JDIMENSION);
  void (*free_pool)(j_common_ptr, int);
};

ImageArena* arena_of(j_common_ptr cinfo) { return static_cast<ImageArena*>(cinfo->client_data); }

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

void* arena_take(j_common_ptr cinfo, size_t n) {
  ImageArena* a = arena_of(cinfo);
  if (n > ImageArena::kMaxObject) ERREXIT1(cinfo, JERR_OUT_OF_MEMORY, 20);
  n = round_up(n == 0 ? 1 : n, ImageArena::kAlign);
  a->total += n;
  while (a->current < a->count) {
    if (a->used + n <= a->sizes[a->current]) {
      uint8_t* p = a->blocks[a->current] + a->used;
      a->used += n;
      return p;
    }
    ++a->current;
    a->used = 0;
  }
  if (a->count == ImageArena::kMaxBlocks) ERREXIT1(cinfo, JERR_OUT_OF_MEMORY, 21);
  const size_t size = std::max(n, ImageArena::kMinBlock);
  auto* block = static_cast<uint8_t*>(std::aligned_alloc(ImageArena::kAlign, size));
  if (block == nullptr) ERREXIT1(cinfo, JERR_OUT_OF_MEMORY, 22);
  a->blocks[a->count] = block;
  a->sizes[a->count] = size;
  a->current = a->count++;
  a->used = n;
  return block;
}

// Frees every block and forgets them.
void arena_release(ImageArena* a) {
  for (int i = 0; i < a->count; ++i) std::free(a->blocks[i]);
  a->count = a->current = 0;
  a->used = a->total = 0;
}

// The image pool was freed: rewind. An image that needed more than one block leaves one block
// of the size it needed, so the next such image fits in it.
void arena_rewind(ImageArena* a) {
  if (a->count > 1) {
    const size_t size = round_up(a->total, ImageArena::kAlign);
    arena_release(a);
    if (auto* block = static_cast<uint8_t*>(std::aligned_alloc(ImageArena::kAlign, size))) {
      a->blocks[0] = block;
      a->sizes[0] = size;
      a->count = 1;
    }
  }
  a->current = 0;
  a->used = a->total = 0;
}

void* arena_alloc_small(j_common_ptr cinfo, int pool_id, size_t n) {
  if (pool_id != JPOOL_IMAGE) return arena_of(cinfo)->alloc_small(cinfo, pool_id, n);
  return arena_take(cinfo, n);
}

void* arena_alloc_large(j_common_ptr cinfo, int pool_id, size_t n) {
  if (pool_id != JPOOL_IMAGE) return arena_of(cinfo)->alloc_large(cinfo, pool_id, n);
  return arena_take(cinfo, n);
}

// As libjpeg-turbo's alloc_sarray: rows padded to a multiple of 64 samples (its SIMD routines
// may touch the padding), each row aligned.
JSAMPARRAY arena_alloc_sarray(j_common_ptr cinfo, int pool_id, JDIMENSION samples,
                              JDIMENSION rows) {
  if (pool_id != JPOOL_IMAGE) return arena_of(cinfo)->alloc_sarray(cinfo, pool_id, samples, rows);
  const size_t stride = round_up(samples, 64) * sizeof(JSAMPLE);
  if (rows > 0 && stride > ImageArena::kMaxObject / rows) ERREXIT1(cinfo, JERR_OUT_OF_MEMORY, 23);
  auto* result = static_cast<JSAMPARRAY>(arena_take(cinfo, size_t{rows} * sizeof(JSAMPROW)));
  auto* data = static_cast<JSAMPLE*>(arena_take(cinfo, stride * rows));
  for (JDIMENSION r = 0; r < rows; ++r) result[r] = data + r * stride;
  return result;
}

JBLOCKARRAY arena_alloc_barray(j_common_ptr cinfo, int pool_id, JDIMENSION blocks,
                               JDIMENSION rows) {
  if (pool_id != JPOOL_IMAGE) return arena_of(cinfo)->alloc_barray(cinfo, pool_id, blocks, rows);
  const size_t row_bytes = size_t{blocks} * sizeof(JBLOCK);
  if (rows > 0 && row_bytes > ImageArena::kMaxObject / rows) ERREXIT1(cinfo, JERR_OUT_OF_MEMORY, 24);
  auto* result = static_cast<JBLOCKARRAY>(arena_take(cinfo, size_t{rows} * sizeof(JBLOCKROW)));
  auto* data = static_cast<JBLOCKROW>(arena_take(cinfo, row_bytes * rows));
  for (JDIMENSION r = 0; r < rows; ++r) result[r] = data + size_t{r} * blocks;
  return result;
}

void arena_free_pool(j_common_ptr cinfo, int pool_id) {
  ImageArena* a = arena_of(cinfo);
  a->free_pool(cinfo, pool_id);  // libjpeg's pools: the virtual arrays, the permanent pool
  if (pool_id == JPOOL_IMAGE) arena_rewind(a);
}

}  // namespace

struct JpegState {
  jpeg_decompress_struct cinfo;
  ErrorManager err;
  jpeg_progress_mgr progress;
  ImageArena arena;
  bool created;
};

namespace {

using State = JpegState;

// --- guarded calls: setjmp and libjpeg only; see the file comment ------------------------------

bool guarded_create(State* s) {
  if (setjmp(s->err.jump) != 0) return false;
  jpeg_create_decompress(&s->cinfo);
  return true;
}

bool guarded_header(State* s, const uint8_t* data, size_t size) {
  s->err.phase = kPhaseHeader;
  if (setjmp(s->err.jump) != 0) return false;
  jpeg_mem_src(&s->cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&s->cinfo, TRUE);
  return true;
}

bool guarded_start(State* s) {
  s->err.phase = kPhaseStart;
  if (setjmp(s->err.jump) != 0) return false;
  jpeg_start_decompress(&s->cinfo);
  return true;
}

bool guarded_crop(State* s, JDIMENSION* xoffset, JDIMENSION* width) {
  s->err.phase = kPhaseCrop;
  if (setjmp(s->err.jump) != 0) return false;
  jpeg_crop_scanline(&s->cinfo, xoffset, width);
  return true;
}

// The row loop is its own function so the setjmp frame below has no locals that change after
// setjmp (which -Wclobbered rightly distrusts).
[[gnu::noinline]] bool read_rows(State* s, const RowPlan* plan) {
  j_decompress_ptr cinfo = &s->cinfo;
  if (plan->skip_rows > 0) {
    s->err.phase = kPhaseSkip;
    if (plan->use_skip) {
      if (jpeg_skip_scanlines(cinfo, plan->skip_rows) != plan->skip_rows) {
        s->err.outcome = kOutcomeNoProgress;
        std::snprintf(s->err.message, sizeof(s->err.message), "jpeg_skip_scanlines fell short");
        return false;
      }
    } else {
      for (JDIMENSION y = 0; y < plan->skip_rows; ++y) {
        JSAMPROW row = plan->scratch;
        if (jpeg_read_scanlines(cinfo, &row, 1) != 1) {
          s->err.outcome = kOutcomeNoProgress;
          std::snprintf(s->err.message, sizeof(s->err.message), "libjpeg returned no scanline");
          return false;
        }
      }
    }
  }
  s->err.phase = kPhaseRead;
  for (JDIMENSION y = 0; y < plan->rows; ++y) {
    uint8_t* dst = plan->out + y * plan->out_stride;
    JSAMPROW row = plan->direct ? dst : plan->scratch;
    if (jpeg_read_scanlines(cinfo, &row, 1) != 1) {
      s->err.outcome = kOutcomeNoProgress;
      std::snprintf(s->err.message, sizeof(s->err.message), "libjpeg returned no scanline");
      return false;
    }
    if (plan->direct) continue;
    if (plan->cmyk)
      cmyk_to_rgb(plan->scratch + plan->col_offset * 4, dst, plan->width, plan->inverted);
    else
      std::memcpy(dst, plan->scratch + plan->col_offset * 3, plan->width * 3);
  }
  // A region that ends inside a damaged restart interval: read on to the next restart marker,
  // so the outcome (resynchronised or not) is the one a whole-image decode sees.
  while (s->err.damage_pending && cinfo->output_scanline < cinfo->output_height) {
    JSAMPROW row = plan->scratch;
    if (jpeg_read_scanlines(cinfo, &row, 1) != 1) {
      s->err.outcome = kOutcomeNoProgress;
      std::snprintf(s->err.message, sizeof(s->err.message), "libjpeg returned no scanline");
      return false;
    }
  }
  return true;
}

bool guarded_rows(State* s, const RowPlan* plan) {
  if (setjmp(s->err.jump) != 0) return false;
  return read_rows(s, plan);
}

bool guarded_finish(State* s) {
  s->err.phase = kPhaseFinish;
  if (setjmp(s->err.jump) != 0) return false;
  jpeg_finish_decompress(&s->cinfo);
  return true;
}

// --- C++ side ----------------------------------------------------------------------------------

ErrorKind kind_for_error(int code) {
  switch (code) {
    case JERR_INPUT_EMPTY:
    case JERR_INPUT_EOF:
      return ErrorKind::kTruncated;
    case JERR_SOF_UNSUPPORTED:  // hierarchical (differential) JPEG
    case JERR_NOT_COMPILED:
    case JERR_NOTIMPL:
    case JERR_BAD_PRECISION:
    case JERR_CONVERSION_NOTIMPL:
    case JERR_ARITH_NOTIMPL:
    case JERR_IMAGE_TOO_BIG:  // sides over 65500 pixels
      return ErrorKind::kUnsupported;
    default:
      return ErrorKind::kCorrupt;
  }
}

/// Throws the DecodeError for the failure the callbacks recorded.
[[noreturn]] void throw_failure(const ErrorManager& err, std::string_view source) {
  std::string reason = err.message;
  ErrorKind kind = ErrorKind::kCorrupt;
  switch (err.outcome) {
    case kOutcomeWarning:
      kind = err.kind;
      if (err.strict && classify_warning(err) == WarningClass::kBenign)
        reason += " (warning treated as an error: strict)";
      break;
    case kOutcomeError:
      // An error after tolerated premature end of data is a consequence of the truncation.
      kind = err.saw_eof ? ErrorKind::kTruncated : kind_for_error(err.code);
      break;
    default:
      break;
  }
  fail(kind, source, "libjpeg: " + reason);
}

// Whether the stream defines Huffman tables (DHT) before its first scan. Motion-JPEG (AVI1)
// frames leave them out and rely on the standard tables, which libjpeg installs only into table
// slots still empty: a reused decompressor still holds the previous image's tables there. True
// when the header cannot be walked (libjpeg then judges the stream as before).
bool defines_huffman_tables(std::span<const uint8_t> b) {
  size_t i = 2;
  while (i + 4 <= b.size()) {
    if (b[i] != 0xFF) return true;
    const uint8_t m = b[i + 1];
    if (m == 0xFF) {  // fill byte
      ++i;
      continue;
    }
    if (m == 0xC4) return true;
    if (m == 0xDA) return false;
    if (m == 0x01 || (m >= 0xD0 && m <= 0xD8)) {  // markers without a length
      i += 2;
      continue;
    }
    i += 2 + ((static_cast<size_t>(b[i + 2]) << 8) | b[i + 3]);
  }
  return true;
}

bool holds_huffman_tables(const jpeg_decompress_struct& cinfo) {
  for (int k = 0; k < NUM_HUFF_TBLS; ++k)
    if (cinfo.dc_huff_tbl_ptrs[k] != nullptr || cinfo.ac_huff_tbl_ptrs[k] != nullptr) return true;
  return false;
}

// --- one decode, step by step ------------------------------------------------------------------

/// The requested region in the DCT-scaled image: [x0, x1) x [y0, y1).
struct ScaledRegion {
  int x0, y0, x1, y1;
  int width() const { return x1 - x0; }
  int height() const { return y1 - y0; }
};

/// `crop` (source pixels) scaled by num/8: its first row and column rounded down, its end up.
ScaledRegion scaled_region(const CropRect& crop, int64_t num) {
  return ScaledRegion{static_cast<int>(crop.x * num / 8), static_cast<int>(crop.y * num / 8),
                      static_cast<int>(((crop.x + int64_t{crop.width}) * num + 7) / 8),
                      static_cast<int>(((crop.y + int64_t{crop.height}) * num + 7) / 8)};
}

/// The source rectangle a decoded region covers. Output pixel i covers source
/// [i * 8 / num, (i + 1) * 8 / num): the integer rectangle that contains all of them, clamped to
/// the image (see DecodeResult::region).
CropRect source_region(const ScaledRegion& r, int64_t num, const ImageInfo& info) {
  const int x0 = static_cast<int>(int64_t{r.x0} * 8 / num);
  const int y0 = static_cast<int>(int64_t{r.y0} * 8 / num);
  const int x1 =
      static_cast<int>(std::min<int64_t>((int64_t{r.x1} * 8 + num - 1) / num, info.width));
  const int y1 =
      static_cast<int>(std::min<int64_t>((int64_t{r.y1} * 8 + num - 1) / num, info.height));
  return CropRect{x0, y0, x1 - x0, y1 - y0};
}

/// Forgets what the callbacks recorded in an earlier attempt (the policy fields stay).
void reset_attempt(ErrorManager& err) {
  err.warnings = 0;
  err.saw_eof = false;
  err.outcome = kOutcomeNone;
  err.code = 0;
  err.message[0] = '\0';
  err.confine_damage = false;
  err.total_intervals = 0;
  err.interval = 0;
  err.last_damaged = -1;
  err.damaged_intervals = 0;
  err.damage_pending = false;
  err.damage[0] = '\0';
}

/// Restart markers confine damaged entropy data to its interval in a single-scan Huffman image
/// (Motion-JPEG webcams' frames are such): libjpeg resynchronises at the next marker. (strict
/// rejects every warning and allow_truncated accepts every one: neither needs it.)
void confine_damage_to_intervals(ErrorManager& err, const jpeg_decompress_struct& cinfo,
                                 const DecodeOptions& options) {
  if (!options.strict && !options.allow_truncated && cinfo.restart_interval > 0 &&
      !cinfo.progressive_mode && !cinfo.arith_code && cinfo.comps_in_scan == cinfo.num_components) {
    const int64_t mcus = int64_t{cinfo.MCUs_per_row} * cinfo.MCU_rows_in_scan;
    err.total_intervals =
        static_cast<int>((mcus + cinfo.restart_interval - 1) / cinfo.restart_interval);
    err.confine_damage = true;
  }
}

/// Reads the header and starts the decompression at options.scale, checking that libjpeg sees
/// the frame the probe saw. Throws DecodeError.
void start_decompress(State& s, std::span<const uint8_t> bytes, std::string_view source,
                      const ImageInfo& info, const DecodeOptions& options) {
  jpeg_decompress_struct& cinfo = s.cinfo;
  const int64_t num = options.scale.num;
  if (!guarded_header(&s, bytes.data(), bytes.size())) throw_failure(s.err, source);
  if (cinfo.image_width != static_cast<JDIMENSION>(info.width) ||
      cinfo.image_height != static_cast<JDIMENSION>(info.height)) {
    fail(ErrorKind::kCorrupt, source,
         fmt::format("libjpeg read a {}x{} frame where the header says {}x{}", cinfo.image_width,
                     cinfo.image_height, info.width, info.height));
  }
  // Grayscale, YCbCr and RGB all convert to RGB inside libjpeg-turbo; CMYK/YCCK come out as
  // CMYK (YCCK converted) and are turned into RGB by the row loop as Pillow does.
  cinfo.out_color_space = cinfo.num_components == 4 ? JCS_CMYK : JCS_EXT_RGB;
  cinfo.scale_num = static_cast<unsigned int>(num);
  cinfo.scale_denom = 8;
  if (!guarded_start(&s)) throw_failure(s.err, source);
  confine_damage_to_intervals(s.err, cinfo, options);
  if (static_cast<int>(cinfo.output_width) != scaled_size(info.width, options.scale) ||
      static_cast<int>(cinfo.output_height) != scaled_size(info.height, options.scale)) {
    fail(ErrorKind::kCorrupt, source,
         fmt::format("libjpeg scaled {}x{} by {}/8 to {}x{}", info.width, info.height, num,
                     cinfo.output_width, cinfo.output_height));
  }
}

/// Columns libjpeg decodes: [xoffset, xoffset + width) of the scaled image.
struct DecodedColumns {
  JDIMENSION xoffset;
  JDIMENSION width;
};

/// Narrows decoding to the region's columns with jpeg_crop_scanline. False, with the
/// decompressor aborted, when libjpeg refuses (an error) or returns columns that do not fit the
/// region: the caller decodes whole rows instead. Throws DecodeError for any other failure.
bool crop_columns(State& s, std::string_view source, const ScaledRegion& region,
                  DecodedColumns& columns) {
  columns.xoffset = static_cast<JDIMENSION>(region.x0);
  columns.width = static_cast<JDIMENSION>(region.width());
  if (!guarded_crop(&s, &columns.xoffset, &columns.width)) {
    if (s.err.outcome != kOutcomeError) throw_failure(s.err, source);
    log()->debug("{}: jpeg_crop_scanline failed ({}); decoding whole rows", source, s.err.message);
    jpeg_abort_decompress(&s.cinfo);
    return false;
  }
  // The decoded rows must start at or left of the region and end exactly at its right edge.
  if (columns.xoffset > static_cast<JDIMENSION>(region.x0) ||
      columns.xoffset + columns.width != static_cast<JDIMENSION>(region.x1)) {
    log()->debug("{}: jpeg_crop_scanline returned [{}, {}) for [{}, {}); decoding whole rows",
                 source, columns.xoffset, columns.xoffset + columns.width, region.x0, region.x1);
    jpeg_abort_decompress(&s.cinfo);
    return false;
  }
  return true;
}

/// The rows of `region` out of decoded `columns`, into `out` (already reshaped to the region).
RowPlan row_plan(const jpeg_decompress_struct& cinfo, const ScaledRegion& region,
                 const DecodedColumns& columns, bool use_skip, uint8_t* scratch, ImageBuffer& out) {
  const bool cmyk = cinfo.num_components == 4;
  RowPlan plan{};
  plan.skip_rows = static_cast<JDIMENSION>(region.y0);
  plan.rows = static_cast<JDIMENSION>(region.height());
  plan.use_skip = use_skip;
  plan.scratch = scratch;
  plan.out = out.pixels.data();
  plan.out_stride = static_cast<size_t>(region.width()) * 3;
  plan.col_offset = static_cast<size_t>(region.x0) - columns.xoffset;
  plan.width = static_cast<size_t>(region.width());
  plan.cmyk = cmyk;
  plan.inverted = cmyk && cinfo.saw_Adobe_marker;
  plan.direct = !cmyk && plan.col_offset == 0 &&
                columns.width == static_cast<JDIMENSION>(region.width());
  return plan;
}

/// After the region's rows: a region that reaches the last row reads on to EOI as well, so a
/// file that ends without one is reported, and warnings about bytes after the scan are counted.
/// Throws DecodeError, also for damage that no restart marker confined.
void finish_region(State& s, std::string_view source, const ScaledRegion& region) {
  if (region.y1 == static_cast<int>(s.cinfo.output_height)) {
    if (!guarded_finish(&s)) throw_failure(s.err, source);
  }
  if (s.err.damage_pending) {
    fail(ErrorKind::kCorrupt, source,
         std::string("libjpeg: ") + s.err.damage +
             "; the entropy data does not resynchronise at a restart marker before the end of "
             "the image (the rest of its interval is lost)");
  }
}
}  // namespace

JpegDecoder::JpegDecoder() : state_(std::make_unique<JpegState>()) {
  State& s = *state_;
  s.created = false;
  jpeg_std_error(&s.err.pub);
  s.err.pub.error_exit = on_error_exit;
  s.err.pub.emit_message = on_emit_message;
  s.err.pub.output_message = on_output_message;
  s.cinfo.err = &s.err.pub;
  if (!guarded_create(&s)) throw std::bad_alloc();  // only an allocation can fail here
  s.created = true;
  // Image-pool allocations go to our arena (see ImageArena); jpeg_create_decompress cleared
  // client_data and set up libjpeg's manager, whose methods the arena forwards to.
  ImageArena& a = s.arena;
  a = {};
  jpeg_memory_mgr* mem = s.cinfo.mem;
  a.alloc_small = mem->alloc_small;
  a.alloc_large = mem->alloc_large;
  a.alloc_sarray = mem->alloc_sarray;
  a.alloc_barray = mem->alloc_barray;
  a.free_pool = mem->free_pool;
  s.cinfo.client_data = &a;
  mem->alloc_small = arena_alloc_small;
  mem->alloc_large = arena_alloc_large;
  mem->alloc_sarray = arena_alloc_sarray;
  mem->alloc_barray = arena_alloc_barray;
  mem->free_pool = arena_free_pool;
  // Restart markers are watched to confine damage to its interval (on_read_restart_marker).
  s.err.read_restart_marker = s.cinfo.marker->read_restart_marker;
  s.cinfo.marker->read_restart_marker = on_read_restart_marker;
  // jpeg_create_decompress clears everything but err and client_data, so hook progress after.
  s.progress = {};
  s.progress.progress_monitor = on_progress;
  s.cinfo.progress = &s.progress;
}

JpegDecoder::~JpegDecoder() {
  if (state_ && state_->created) {
    jpeg_destroy_decompress(&state_->cinfo);
    arena_release(&state_->arena);
  }
}

void JpegDecoder::decode(std::span<const uint8_t> bytes, std::string_view source,
                         const ImageInfo& info, const DecodeOptions& options, const CropRect& crop,
                         ImageBuffer& out, DecodeResult& result) {
  if (holds_huffman_tables(state_->cinfo) && !defines_huffman_tables(bytes)) {
    // A stream without DHT gets a fresh decompressor, so that libjpeg gives it the standard
    // tables rather than whatever an earlier image on this decoder defined (which made such
    // frames decode differently depending on the image decoded before, i.e. on the thread).
    JpegDecoder fresh;
    std::swap(state_, fresh.state_);  // fresh's destructor frees the old decompressor
  }
  State& s = *state_;
  ErrorManager& err = s.err;
  jpeg_decompress_struct& cinfo = s.cinfo;
  err.allow_data_loss = options.allow_truncated;
  err.strict = options.strict;
  // However decode() leaves (return, DecodeError, bad_alloc from a buffer), the decompressor goes
  // back to its idle state and frees this image's pools, ready for the next image. Aborting an
  // idle or finished decompressor is a no-op.
  struct AbortOnExit {
    j_decompress_ptr cinfo;
    ~AbortOnExit() { jpeg_abort_decompress(cinfo); }
  } abort_on_exit{&cinfo};

  const ScaledRegion region = scaled_region(crop, options.scale.num);
  // jpeg_crop_scanline and jpeg_skip_scanlines refuse some layouts in libjpeg-turbo 2.1; when a
  // libjpeg error follows their use, decode again without them (whole rows, read-and-discard).
  // Both only save work. Warnings made fatal by the options are never retried.
  bool use_crop = true, use_skip = true;
  JDIMENSION decoded_columns = 0, image_rows = 0, read_rows_end = 0;
  for (;;) {
    reset_attempt(err);
    start_decompress(s, bytes, source, info, options);
    DecodedColumns columns{0, cinfo.output_width};
    const bool cropped = use_crop && region.width() < static_cast<int>(cinfo.output_width);
    const bool skipped = use_skip && region.y0 > 0;
    if (cropped && !crop_columns(s, source, region, columns)) {
      use_crop = false;
      continue;
    }
    const bool cmyk = cinfo.num_components == 4;
    const size_t row_bytes = static_cast<size_t>(columns.width) * (cmyk ? 4 : 3);
    if (row_.size() < row_bytes) row_.resize(row_bytes);
    out.reshape(region.width(), region.height());
    const RowPlan plan = row_plan(cinfo, region, columns, use_skip, row_.data(), out);
    if (!guarded_rows(&s, &plan)) {
      if (err.outcome != kOutcomeError || (!cropped && !skipped)) throw_failure(err, source);
      log()->debug("{}: libjpeg failed after {} ({}); decoding again without it", source,
                   cropped ? "jpeg_crop_scanline" : "jpeg_skip_scanlines", err.message);
      jpeg_abort_decompress(&cinfo);
      (cropped ? use_crop : use_skip) = false;
      continue;
    }
    decoded_columns = columns.width;
    image_rows = cinfo.output_height;
    read_rows_end = cinfo.output_scanline;
    finish_region(s, source, region);
    // Otherwise rows below the region are never decoded: abort_on_exit ends the decompression.
    break;
  }

  result.warnings = err.warnings;
  result.skipped_rows = use_skip ? region.y0 : 0;
  result.unread_rows = info.progressive ? 0 : static_cast<int>(image_rows - read_rows_end);
  result.damaged_intervals = err.damaged_intervals;
  result.decoded_columns = static_cast<int>(decoded_columns);
  result.scale = options.scale;
  result.scaled_region = CropRect{region.x0, region.y0, region.width(), region.height()};
  result.region = source_region(region, options.scale.num, info);
}

}  // namespace gpufeed::decode::detail
