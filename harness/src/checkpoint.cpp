#include "gpufeed/harness/checkpoint.h"

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/serialize.h>

#include <fstream>
#include <iterator>
#include <stdexcept>

namespace gpufeed::harness {
namespace fs = std::filesystem;
namespace {

// torch::pickle_save, minus the type tags: it wraps typed containers in
// torch.jit._pickle.restore_type_tag, a global that Python's torch.load(weights_only=True)
// refuses. Same zip layout (archive/data.pkl + one record per tensor) as torch.save.
std::vector<char> pickle_without_type_tags(const c10::IValue& value) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler([&](const char* buf, size_t n) { pickle.insert(pickle.end(), buf, buf + n); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr,
                              /*memoized_class_types=*/nullptr, /*get_tensor_id=*/nullptr,
                              /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  std::vector<char> zip;
  {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
      const char* bytes = static_cast<const char*>(data);
      zip.insert(zip.end(), bytes, bytes + n);
      return n;
    });
    torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), writer);
  }
  return zip;
}

}  // namespace

void save_state_dict(const torch::nn::Module& module, const fs::path& path) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    dict.insert(p.key(), p.value().detach().to(at::kCPU).contiguous());
  }
  for (const auto& b : module.named_buffers(/*recurse=*/true)) {
    dict.insert(b.key(), b.value().detach().to(at::kCPU).contiguous());
  }
  const std::vector<char> bytes = pickle_without_type_tags(c10::IValue(dict));
  if (!path.parent_path().empty()) fs::create_directories(path.parent_path());
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) throw std::runtime_error("save_state_dict: cannot write " + tmp.string());
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw std::runtime_error("save_state_dict: cannot rename to " + path.string() + ": " + ec.message());
}

void load_state_dict(torch::nn::Module& module, const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("load_state_dict: cannot open " + path.string());
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const c10::IValue value = torch::pickle_load(bytes);
  if (!value.isGenericDict()) {
    throw std::runtime_error("load_state_dict: " + path.string() + " does not hold a dict");
  }
  std::unordered_map<std::string, at::Tensor> loaded;
  bool all_prefixed = true;
  for (const auto& kv : value.toGenericDict()) {
    const std::string key = kv.key().toStringRef();
    all_prefixed = all_prefixed && key.rfind("module.", 0) == 0;
    loaded.emplace(key, kv.value().toTensor());
  }
  const std::string prefix = all_prefixed && !loaded.empty() ? "module." : "";
  torch::NoGradGuard no_grad;
  size_t used = 0;
  auto assign = [&](const std::string& name, at::Tensor& target) {
    auto it = loaded.find(prefix + name);
    if (it == loaded.end()) {
      throw std::runtime_error("load_state_dict: " + path.string() + ": missing key " + name);
    }
    if (it->second.sizes() != target.sizes()) {
      throw std::runtime_error("load_state_dict: " + path.string() + ": " + name + " has shape " +
                               c10::str(it->second.sizes()) + ", model has " + c10::str(target.sizes()));
    }
    target.copy_(it->second);
    ++used;
  };
  for (auto& p : module.named_parameters(true)) assign(p.key(), p.value());
  for (auto& b : module.named_buffers(true)) assign(b.key(), b.value());
  if (used != loaded.size()) {
    throw std::runtime_error("load_state_dict: " + path.string() + " has " +
                             std::to_string(loaded.size() - used) + " unexpected keys");
  }
}

}  // namespace gpufeed::harness
