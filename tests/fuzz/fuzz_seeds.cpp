// Writes the fuzzer's seed corpus: every generated variant of every bug-case kind and of BMP,
// PNM and TIFF (tests/bugkinds.h), one file each, into the folder given as the only argument.
// Inputs larger than 256 KB are left out (libFuzzer mutates small inputs far faster).

#include <filesystem>
#include <fstream>
#include <iostream>

#include "bugkinds.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: fuzz_seeds OUT_DIR\n";
    return 2;
  }
  const std::filesystem::path dir(argv[1]);
  std::filesystem::create_directories(dir);
  auto variants = gpufeed::test::make_kind_variants();
  for (auto& v : gpufeed::test::make_whole_image_variants()) variants.push_back(std::move(v));
  int written = 0;
  for (const auto& v : variants) {
    if (v.bytes.size() > 256 * 1024) continue;
    std::ofstream(dir / v.name, std::ios::binary)
        .write(reinterpret_cast<const char*>(v.bytes.data()), static_cast<std::streamsize>(v.bytes.size()));
    ++written;
  }
  std::cout << "fuzz_seeds: wrote " << written << " seeds to " << dir.string() << "\n";
  return 0;
}
