#include "gpufeed/harness/checkpoint.h"

#include <ATen/core/grad_mode.h>

#include <stdexcept>
#include <unordered_set>

#include "gpufeed/harness/torch_file.h"
#include "gpufeed/log_text.h"

namespace gpufeed::harness {
namespace fs = std::filesystem;
namespace {

// A dict whose keys are strings and values all tensors (at least one).
bool is_tensor_dict(const c10::IValue& v) {
  if (!v.isGenericDict()) return false;
  const auto d = v.toGenericDict();
  if (d.size() == 0) return false;
  for (const auto& kv : d) {
    if (!kv.key().isString() || !kv.value().isTensor()) return false;
  }
  return true;
}

bool search(const c10::IValue& v, int depth, std::vector<std::string>& path, c10::IValue& found) {
  if (is_tensor_dict(v)) {
    found = v;
    return true;
  }
  if (depth == 0 || !v.isGenericDict()) return false;
  static const char* kKeys[] = {"state_dict", "model_state_dict", "model", "module", "net", "ema"};
  const auto d = v.toGenericDict();
  for (const char* k : kKeys) {
    auto it = d.find(k);
    if (it == d.end()) continue;
    path.emplace_back(k);
    if (search(it->value(), depth - 1, path, found)) return true;
    path.pop_back();
  }
  return false;
}

bool all_keys_have(const StateDict& d, const std::string& prefix) {
  for (const auto& kv : d) {
    if (kv.key().rfind(prefix, 0) != 0) return false;
  }
  return d.size() > 0;
}

}  // namespace

std::string StateDictSource::describe() const {
  std::string s = location.empty() ? "state_dict at the top level" : "state_dict under ";
  for (size_t i = 0; i < location.size(); ++i) s += (i ? "/'" : "'") + location[i] + "'";
  s += " (" + std::to_string(tensors) + " tensors), ";
  s += stripped_prefix.empty() ? "keys without a prefix"
                               : "keys had the '" + stripped_prefix + "' prefix (stripped)";
  return s;
}

StateDict module_state_dict(const torch::nn::Module& module) {
  StateDict d;
  for (const auto& p : module.named_parameters(/*recurse=*/true))
    d.insert(p.key(), p.value().detach());
  for (const auto& b : module.named_buffers(/*recurse=*/true))
    d.insert(b.key(), b.value().detach());
  return d;
}

StateDict find_state_dict(const c10::IValue& loaded, const std::string& name,
                          StateDictSource* source) {
  std::vector<std::string> path;
  c10::IValue found;
  if (!search(loaded, 2, path, found)) {
    std::string keys;
    if (loaded.isGenericDict()) {
      for (const auto& kv : loaded.toGenericDict()) {
        if (keys.size() > 200) {
          keys += ", ...";
          break;
        }
        std::ostringstream os;
        os << kv.key();
        keys += (keys.empty() ? "" : ", ") + os.str();
      }
      keys = " (its keys: " + keys + ")";
    } else {
      keys = " (it holds a " + loaded.tagKind() + ")";
    }
    throw std::runtime_error(name +
                             ": no model state_dict found: expected a dict of tensors at the "
                             "top level or under 'state_dict', 'model_state_dict', 'model', "
                             "'module', 'net' or 'ema'" +
                             keys);
  }
  StateDict d;
  for (const auto& kv : found.toGenericDict())
    d.insert(kv.key().toStringRef(), kv.value().toTensor());
  std::string stripped;
  for (const std::string prefix : {"module.", "_orig_mod."}) {
    if (all_keys_have(d, prefix)) {
      d = strip_key_prefix(d, prefix);
      stripped += prefix;
    }
  }
  if (source) {
    source->location = path;
    source->stripped_prefix = stripped;
    source->tensors = static_cast<int64_t>(d.size());
  }
  return d;
}

void load_state_dict(torch::nn::Module& module, const StateDict& state, const std::string& name) {
  std::vector<std::pair<std::string, at::Tensor>> targets;
  for (auto& p : module.named_parameters(true)) targets.emplace_back(p.key(), p.value());
  for (auto& b : module.named_buffers(true)) targets.emplace_back(b.key(), b.value());
  std::string missing;
  std::unordered_set<std::string> known;
  for (const auto& [key, t] : targets) {
    known.insert(key);
    auto it = state.find(key);
    if (it == state.end()) {
      missing += (missing.empty() ? "" : ", ") + key;
    } else if (it->value().sizes() != t.sizes()) {
      throw std::runtime_error(name + ": " + key + " has shape " + c10::str(it->value().sizes()) +
                               " in the file, the model has " + c10::str(t.sizes()));
    }
  }
  std::string unexpected;
  for (const auto& kv : state) {
    if (!known.count(kv.key())) unexpected += (unexpected.empty() ? "" : ", ") + kv.key();
  }
  if (!missing.empty() || !unexpected.empty()) {
    std::string why = name + ": state_dict does not match the model:";
    if (!missing.empty()) why += " missing keys: " + missing + ";";
    if (!unexpected.empty()) why += " unexpected keys: " + unexpected + ";";
    throw std::runtime_error(why);
  }
  at::NoGradGuard no_grad;
  for (auto& [key, t] : targets) t.copy_(state.at(key));
}

StateDictSource load_state_dict(torch::nn::Module& module, const fs::path& path) {
  StateDictSource source;
  const StateDict state = find_state_dict(load_torch_file(path), path.string(), &source);
  load_state_dict(module, state, path.string());
  gpufeed::log_text(LogLevel::kInfo,
                    "load_state_dict: " + path.string() + ": " + source.describe());
  return source;
}

StateDict strip_key_prefix(const StateDict& state, const std::string& prefix) {
  StateDict out;
  for (const auto& kv : state) {
    const std::string& k = kv.key();
    out.insert(k.rfind(prefix, 0) == 0 ? k.substr(prefix.size()) : k, kv.value());
  }
  return out;
}

StateDict add_key_prefix(const StateDict& state, const std::string& prefix) {
  StateDict out;
  for (const auto& kv : state) out.insert(prefix + kv.key(), kv.value());
  return out;
}

c10::IValue state_dict_to_ivalue(const StateDict& state) {
  c10::impl::GenericDict d(c10::StringType::get(), c10::TensorType::get());
  for (const auto& kv : state) d.insert(kv.key(), kv.value().detach().to(at::kCPU).contiguous());
  return d;
}

void save_state_dict(const torch::nn::Module& module, const fs::path& path,
                     const std::string& prefix) {
  StateDict state = module_state_dict(module);
  if (!prefix.empty()) state = add_key_prefix(state, prefix);
  save_torch_file(state_dict_to_ivalue(state), path);
}

}  // namespace gpufeed::harness
