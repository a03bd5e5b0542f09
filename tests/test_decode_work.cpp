// The JPEG crop-decode really decodes less: rows above the crop are skipped (jpeg_skip_scanlines),
// columns beside it are not produced (jpeg_crop_scanline), and rows below it are never read, which
// a file truncated below the crop proves without any timing.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "gpufeed/decode/decoder.h"

using namespace gpufeed::decode;

namespace {

constexpr int kW = 640, kH = 480;

// A textured 4:2:0 JPEG: its entropy data is spread over the whole file.
std::vector<uint8_t> textured_jpeg() {
  std::mt19937 rng(5);
  std::vector<uint8_t> rgb(static_cast<size_t>(kW) * kH * 3);
  for (int y = 0; y < kH; ++y)
    for (int x = 0; x < kW; ++x)
      for (int c = 0; c < 3; ++c)
        rgb[(static_cast<size_t>(y) * kW + x) * 3 + c] =
            static_cast<uint8_t>((x * (c + 1) + y * (3 - c)) % 200 + rng() % 56);
  return encode_jpeg(rgb.data(), kW, kH, 90, Subsampling::k420);
}

}  // namespace

TEST(DecodeWork, CropSkipsRowsAboveProducesFewColumnsAndStopsBelow) {
  const auto jpeg = textured_jpeg();
  Decoder decoder;
  ImageBuffer out;
  DecodeOptions o;
  const DecodeResult whole = decoder.decode(jpeg, "whole", o, out);
  EXPECT_EQ(whole.skipped_rows, 0);
  EXPECT_EQ(whole.unread_rows, 0);
  EXPECT_EQ(whole.decoded_columns, kW);

  o.crop = {200, 240, 100, 80};
  const DecodeResult crop = decoder.decode(jpeg, "crop", o, out);
  EXPECT_EQ(out.width, 100);
  EXPECT_EQ(crop.skipped_rows, 240);           // rows 0..239: no IDCT, no colour conversion
  EXPECT_EQ(crop.unread_rows, kH - 320);       // rows 320..479: never read
  EXPECT_GE(crop.decoded_columns, 100);        // from the iMCU boundary left of x = 200 ...
  EXPECT_LT(crop.decoded_columns, 100 + 16);   // ... 16 columns at most (4:2:0 iMCUs)

  o.scale = ScaleFactor{4};  // the same crop at 4/8: rows 120..159 of a 320x240 image
  const DecodeResult half = decoder.decode(jpeg, "half", o, out);
  EXPECT_EQ(half.scaled_region, (CropRect{100, 120, 50, 40}));
  EXPECT_EQ(half.skipped_rows, 120);
  EXPECT_EQ(half.unread_rows, 240 - 160);
  EXPECT_LT(half.decoded_columns, kW / 2);
}

TEST(DecodeWork, DataBelowTheCropIsNeverRead) {
  const auto jpeg = textured_jpeg();
  // Cut the file at 60%: the scan data of the lower rows and the EOI marker are gone.
  const std::vector<uint8_t> cut(jpeg.begin(), jpeg.begin() + static_cast<ptrdiff_t>(jpeg.size() * 6 / 10));
  Decoder decoder;
  ImageBuffer full, top, expected;
  EXPECT_THROW(decoder.decode(cut, "cut", {}, full), DecodeError);
  DecodeOptions o;
  o.crop = {0, 0, kW, 100};
  const DecodeResult r = decoder.decode(cut, "cut", o, top);  // no error: never got that far
  EXPECT_EQ(r.warnings, 0);
  EXPECT_EQ(r.unread_rows, kH - 100);
  decoder.decode(jpeg, "intact", o, expected);
  EXPECT_EQ(top.pixels, expected.pixels);
}
