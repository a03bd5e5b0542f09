// Baseline for tools/bench/bench_compare.py: what a C++ user writes by hand with LibTorch's own data API.
// A torch::data::datasets::Dataset whose get() reads and decodes a file with OpenCV (cv::imread,
// whole image, BGR -> RGB), applies torchvision's RandomResizedCrop(size) + RandomHorizontalFlip
// (or Resize(size * 256 / 224) + CenterCrop(size)) with cv::resize (bilinear), and returns a
// [size, size, 3] uint8 tensor; torch::data's DataLoader with `--num-workers` threads collates
// batches with Stack. Output type and layout are gpufeed's ([N, S, S, 3] uint8), so both do the
// same work per sample.
//
//   libtorch_dataloader --data DIR [--num-workers 2] [--batch-size 256] [--image-size 224]
//                       [--transform train|eval] [--epochs 3] [--warmup 1]
// prints one JSON object: images_per_s over the timed epochs, and what was run.
//
// A torch translation unit: no spdlog or fmt here (LibTorch bundles its own fmt).
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

struct Args {
  std::string data;
  int workers = 2;
  int batch_size = 256;
  int image_size = 224;
  std::string transform = "train";
  int epochs = 3;
  int warmup = 1;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument("missing value after " + k);
    const std::string v = argv[++i];
    if (k == "--data") a.data = v;
    else if (k == "--num-workers") a.workers = std::stoi(v);
    else if (k == "--batch-size") a.batch_size = std::stoi(v);
    else if (k == "--image-size") a.image_size = std::stoi(v);
    else if (k == "--transform") a.transform = v;
    else if (k == "--epochs") a.epochs = std::stoi(v);
    else if (k == "--warmup") a.warmup = std::stoi(v);
    else throw std::invalid_argument("unknown option " + k);
  }
  if (a.data.empty()) throw std::invalid_argument("--data is required");
  if (a.transform != "train" && a.transform != "eval")
    throw std::invalid_argument("--transform must be train or eval");
  return a;
}

// The epoch the workers are in: get() only receives an index, and the augmentation of sample i
// should differ between epochs.
std::atomic<int64_t> g_epoch{0};

class ImageFiles : public torch::data::datasets::Dataset<ImageFiles> {
 public:
  ImageFiles(const fs::path& root, int size, bool train) : size_(size), train_(train) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(root)) {
      std::string ext = e.path().extension().string();
      std::transform(ext.begin(), ext.end(), ext.begin(), ::tolower);
      if (e.is_regular_file() && (ext == ".jpeg" || ext == ".jpg" || ext == ".png"))
        names.push_back(e.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    std::vector<std::string> classes;
    for (const auto& n : names) classes.push_back(n.substr(0, n.find('_')));
    std::vector<std::string> sorted = classes;
    std::sort(sorted.begin(), sorted.end());
    sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
    for (size_t i = 0; i < names.size(); ++i) {
      files_.push_back(root / names[i]);
      labels_.push_back(std::lower_bound(sorted.begin(), sorted.end(), classes[i]) - sorted.begin());
    }
    if (files_.empty()) throw std::runtime_error("no images in " + root.string());
  }

  torch::data::Example<> get(size_t index) override {
    cv::Mat bgr = cv::imread(files_[index].string(), cv::IMREAD_COLOR);
    if (bgr.empty()) throw std::runtime_error("cannot decode " + files_[index].string());
    cv::Mat rgb;
    cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
    cv::Mat out;
    if (train_) {
      std::mt19937_64 rng(static_cast<uint64_t>(g_epoch.load()) * 1000003ULL + index);
      const cv::Rect box = random_resized_crop(rgb.cols, rgb.rows, rng);
      cv::resize(rgb(box), out, cv::Size(size_, size_), 0, 0, cv::INTER_LINEAR);
      if (std::uniform_real_distribution<double>(0, 1)(rng) < 0.5) cv::flip(out, out, 1);
    } else {
      const int resize = static_cast<int>(std::lround(size_ * 256.0 / 224.0));
      const bool wide = rgb.cols >= rgb.rows;
      const int shorter = wide ? rgb.rows : rgb.cols, longer = wide ? rgb.cols : rgb.rows;
      const int new_long = static_cast<int>(static_cast<int64_t>(resize) * longer / shorter);
      cv::Mat resized;
      cv::resize(rgb, resized, wide ? cv::Size(new_long, resize) : cv::Size(resize, new_long), 0,
                 0, cv::INTER_LINEAR);
      const int left = (resized.cols - size_) / 2, top = (resized.rows - size_) / 2;
      out = resized(cv::Rect(left, top, size_, size_)).clone();
    }
    if (!out.isContinuous()) out = out.clone();
    auto image = torch::from_blob(out.data, {size_, size_, 3}, torch::kUInt8).clone();
    return {image, torch::tensor(labels_[index], torch::kInt64)};
  }

  torch::optional<size_t> size() const override { return files_.size(); }

 private:
  // torchvision's RandomResizedCrop.get_params: scale (0.08, 1), ratio (3/4, 4/3).
  static cv::Rect random_resized_crop(int width, int height, std::mt19937_64& rng) {
    const double area = static_cast<double>(width) * height;
    std::uniform_real_distribution<double> scale(0.08, 1.0);
    std::uniform_real_distribution<double> log_ratio(std::log(3.0 / 4), std::log(4.0 / 3));
    for (int attempt = 0; attempt < 10; ++attempt) {
      const double target = area * scale(rng);
      const double ratio = std::exp(log_ratio(rng));
      const int w = static_cast<int>(std::lround(std::sqrt(target * ratio)));
      const int h = static_cast<int>(std::lround(std::sqrt(target / ratio)));
      if (w > 0 && w <= width && h > 0 && h <= height) {
        const int y = std::uniform_int_distribution<int>(0, height - h)(rng);
        const int x = std::uniform_int_distribution<int>(0, width - w)(rng);
        return {x, y, w, h};
      }
    }
    const double in_ratio = static_cast<double>(width) / height;
    int w = width, h = height;
    if (in_ratio < 3.0 / 4) h = static_cast<int>(std::lround(w / (3.0 / 4)));
    else if (in_ratio > 4.0 / 3) w = static_cast<int>(std::lround(h * (4.0 / 3)));
    w = std::min(w, width);
    h = std::min(h, height);
    return {(width - w) / 2, (height - h) / 2, w, h};
  }

  std::vector<fs::path> files_;
  std::vector<int64_t> labels_;
  int size_;
  bool train_;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    // The `--num-workers` threads are the only ones: OpenCV's and ATen's own pools stay at one thread.
    cv::setNumThreads(1);
    torch::set_num_threads(1);
    auto dataset = ImageFiles(a.data, a.image_size, a.transform == "train")
                       .map(torch::data::transforms::Stack<>());
    const auto files = static_cast<int64_t>(*dataset.size());
    auto loader = torch::data::make_data_loader(
        std::move(dataset),
        torch::data::DataLoaderOptions().batch_size(a.batch_size).workers(a.workers));
    int64_t samples = 0;
    uint64_t checksum = 0;
    auto t0 = std::chrono::steady_clock::now();
    for (int e = 0; e < a.warmup + a.epochs; ++e) {
      if (e == a.warmup) t0 = std::chrono::steady_clock::now();
      g_epoch = e;
      for (auto& batch : *loader) {
        if (e >= a.warmup) samples += batch.data.size(0);
        checksum += static_cast<uint64_t>(batch.data.index({0, 0, 0, 0}).item<uint8_t>());
      }
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::cout << "{\"method\": \"libtorch\", \"transform\": \"" << a.transform
              << "\", \"threads\": " << a.workers << ", \"files\": " << files
              << ", \"samples\": " << samples << ", \"seconds\": " << seconds
              << ", \"images_per_s\": " << samples / seconds << ", \"checksum\": " << checksum
              << "}\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "libtorch_dataloader: " << e.what() << "\n";
    return 1;
  }
}
