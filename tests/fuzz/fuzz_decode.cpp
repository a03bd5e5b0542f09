// libFuzzer target: arbitrary bytes through sniff() and probe(), full decodes under three option
// sets (default, strict, lenient with EXIF applied) with and without a crop and DCT scale, and the
// loader's train transform exactly as a worker runs it (load_sample: read the file, probe, plan
// RandomResizedCrop from the header, DCT-scaled crop decode, resize into the output, flip).
//
// Findings are crashes (ASan, UBSan), any exception other than DecodeError escaping, a broken
// output invariant, and anything written to stdout or stderr while an input runs (the library
// must never print): each of these aborts, and libFuzzer keeps the input as an artifact.
// Built and run by tools/fuzz.sh.

#include <fcntl.h>
#include <sanitizer/common_interface_defs.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <span>
#include <string>
#include <vector>

#include "gpufeed/decode/decoder.h"
#include "gpufeed/decode/error.h"
#include "gpufeed/datasets/dataset.h"
#include "gpufeed/loader/loader.h"

namespace {

namespace fs = std::filesystem;
using namespace gpufeed;

/// A dataset of one file, rewritten for every input.
class OneFile : public datasets::Dataset {
 public:
  explicit OneFile(fs::path path) : path_(std::move(path).string()), classes_{"x"} {}
  int64_t size() const override { return 1000; }  // any index: the index keys the crop's RNG
  datasets::SampleRef at(int64_t) const override {
    datasets::SampleRef r;
    r.path = path_;
    return r;
  }
  const std::vector<std::string>& classes() const override { return classes_; }

 private:
  std::string path_;
  std::vector<std::string> classes_;
};

struct State {
  fs::path file;
  std::unique_ptr<OneFile> dataset;
  loader::LoaderOptions train;
  decode::Decoder decoder;
  decode::ImageBuffer image;
  std::vector<uint8_t> out;
  int capture = -1;  // stdout and stderr go here while an input runs
  int real_stderr = -1;
};

State& state() {
  static State* s = [] {
    auto* st = new State;
    const fs::path dir = fs::exists("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    st->file = dir / ("gpufeed_fuzz_" + std::to_string(::getpid()) + ".img");
    st->dataset = std::make_unique<OneFile>(st->file);
    st->train.transform.rrc.size = 32;
    // Small enough that every input runs in milliseconds; bombs are refused the same way.
    st->train.decode.max_pixels = int64_t{1} << 22;
    st->out.resize(32 * 32 * 3);
    const std::string capture = (dir / ("gpufeed_fuzz_stdio_" + std::to_string(::getpid()))).string();
    st->capture = ::open(capture.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ::unlink(capture.c_str());
    st->real_stderr = ::dup(2);
    // Sanitizer reports must reach the terminal even while stderr is captured.
    __sanitizer_set_report_fd(reinterpret_cast<void*>(static_cast<intptr_t>(st->real_stderr)));
    return st;
  }();
  return *s;
}

void check_image(const decode::ImageBuffer& image) {
  if (image.width <= 0 || image.height <= 0 ||
      image.pixels.size() != static_cast<size_t>(image.width) * image.height * 3) {
    std::fprintf(stderr, "decode returned a %dx%d image with %zu bytes\n", image.width, image.height,
                 image.pixels.size());
    std::abort();
  }
}

[[noreturn]] void die(const char* what, const char* detail) {
  const std::string text = std::string("fuzz_decode: ") + what + ": " + detail + "\n";
  (void)!::write(state().real_stderr, text.data(), text.size());
  std::abort();
}

void run(std::span<const uint8_t> bytes) {
  State& s = state();
  (void)decode::sniff(bytes);
  decode::ImageInfo info;
  bool header_ok = true;
  try {
    info = decode::probe(bytes, "fuzz");
  } catch (const decode::DecodeError&) {
    header_ok = false;
  }
  const uint8_t knob = bytes.empty() ? 0 : bytes[bytes.size() - 1];
  for (int variant = 0; variant < 3; ++variant) {
    decode::DecodeOptions o;
    o.max_pixels = int64_t{1} << 22;
    o.strict = variant == 1;
    o.allow_truncated = variant == 2;
    o.apply_exif_orientation = variant == 2;
    if (header_ok && variant > 0) {  // a crop and a scale taken from the input
      o.scale.num = 1 + knob % 8;
      const bool swap = o.apply_exif_orientation && gpufeed::decode::orientation_swaps_axes(info.orientation);
      const auto w = static_cast<unsigned>(swap ? info.height : info.width);
      const auto h = static_cast<unsigned>(swap ? info.width : info.height);
      const unsigned k = knob;
      o.crop = {static_cast<int>(k % w), static_cast<int>(k / 3 % h), 1 + static_cast<int>(k * 7 % w),
                1 + static_cast<int>(k * 5 % h)};
    }
    try {
      s.decoder.decode(bytes, "fuzz", o, s.image);
      check_image(s.image);
    } catch (const decode::DecodeError&) {
    }
  }
  // The loader's train transform on the same bytes, from a file as workers read it.
  const int fd = ::open(s.file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0 || ::write(fd, bytes.data(), bytes.size()) != static_cast<ssize_t>(bytes.size()))
    die("cannot write", s.file.c_str());
  ::close(fd);
  try {
    loader::load_sample(*s.dataset, static_cast<int64_t>(knob) * 3, knob % 5, s.train, s.out.data());
  } catch (const decode::DecodeError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  State& s = state();
  std::fflush(nullptr);
  ::ftruncate(s.capture, 0);
  ::lseek(s.capture, 0, SEEK_SET);
  const int saved_out = ::dup(1);
  ::dup2(s.capture, 1);
  ::dup2(s.capture, 2);
  try {
    run({data, size});
  } catch (const std::exception& e) {
    die("an exception other than DecodeError escaped", e.what());
  }
  std::fflush(nullptr);
  std::cout.flush();
  std::cerr.flush();
  ::dup2(saved_out, 1);
  ::close(saved_out);
  ::dup2(s.real_stderr, 2);
  struct stat st {};
  ::fstat(s.capture, &st);
  if (st.st_size > 0) {
    std::string printed(static_cast<size_t>(std::min<off_t>(st.st_size, 4096)), '\0');
    (void)!::pread(s.capture, printed.data(), printed.size(), 0);
    die("the library printed", printed.c_str());
  }
  return 0;
}
