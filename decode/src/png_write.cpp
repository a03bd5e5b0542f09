// encode_png through libpng. libpng reports errors by longjmp: the setjmp lives in a function
// that holds only raw pointers, and the output vector is owned by the C++ caller.

#include <fmt/format.h>
#include <png.h>

#include <climits>
#include <csetjmp>
#include <cstdio>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpufeed/decode/decoder.h"

namespace gpufeed::decode {

namespace {

struct PngWriter {
  std::jmp_buf jump;
  std::vector<uint8_t>* out;
  char message[256];
};

void write_data(png_structp png, png_bytep data, size_t length) {
  auto* w = static_cast<PngWriter*>(png_get_io_ptr(png));
  bool failed = false;
  try {
    w->out->insert(w->out->end(), data, data + length);
  } catch (...) {  // no exception may cross libpng's C frames
    failed = true;
  }
  if (failed) png_error(png, "out of memory");
}

void flush_data(png_structp) {}

[[noreturn]] void on_error(png_structp png, png_const_charp message) {
  auto* w = static_cast<PngWriter*>(png_get_error_ptr(png));
  std::snprintf(w->message, sizeof(w->message), "%s", message ? message : "unknown error");
  std::longjmp(w->jump, 1);
}

void on_warning(png_structp, png_const_charp) {}  // never printed

bool guarded_write(PngWriter* w, png_structp png, png_infop info, const uint8_t* rgb, int width,
                   int height) {
  if (setjmp(w->jump) != 0) return false;
  png_set_write_fn(png, w, write_data, flush_data);
  png_set_IHDR(png, info, static_cast<png_uint_32>(width), static_cast<png_uint_32>(height), 8,
               PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  const size_t stride = static_cast<size_t>(width) * 3;
  for (int y = 0; y < height; ++y) png_write_row(png, rgb + stride * static_cast<size_t>(y));
  png_write_end(png, nullptr);
  return true;
}

}  // namespace

std::vector<uint8_t> encode_png(const uint8_t* rgb, int width, int height) {
  if (!rgb) throw std::invalid_argument("encode_png: null image");
  if (width <= 0 || height <= 0 || width > INT_MAX / 3)
    throw std::invalid_argument(fmt::format("encode_png: invalid size {}x{}", width, height));
  std::vector<uint8_t> out;
  PngWriter writer{};
  writer.out = &out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  if (!png) throw std::bad_alloc();
  png_infop info = png_create_info_struct(png);
  if (!info) {
    png_destroy_write_struct(&png, nullptr);
    throw std::bad_alloc();
  }
  png_set_error_fn(png, &writer, on_error, on_warning);
  const bool ok = guarded_write(&writer, png, info, rgb, width, height);
  png_destroy_write_struct(&png, &info);
  if (!ok) throw std::runtime_error(std::string("encode_png: libpng: ") + writer.message);
  return out;
}

}  // namespace gpufeed::decode
