#include "gpufeed/harness/checkpoint.h"

#include <ATen/core/grad_mode.h>

#include <regex>
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

bool is_num_batches_tracked(const std::string& key) {
  return key == "num_batches_tracked" || key.ends_with(".num_batches_tracked");
}

std::string join(const std::vector<std::string>& items, size_t max_items = 8) {
  std::string s;
  for (size_t i = 0; i < items.size() && i < max_items; ++i) s += (i ? ", " : "") + items[i];
  if (items.size() > max_items) s += ", ... (" + std::to_string(items.size()) + " in all)";
  return s;
}

}  // namespace

const std::vector<KeyWrapper>& known_key_wrappers() {
  static const std::vector<KeyWrapper> kWrappers = {
      {"module.", "DistributedDataParallel/DataParallel"},
      {"_orig_mod.", "torch.compile"},
      {"model.", "LightningModule.model"},
  };
  return kWrappers;
}

std::string StateDictSource::describe() const {
  std::string s = location.empty() ? "state_dict at the top level" : "state_dict under ";
  for (size_t i = 0; i < location.size(); ++i) s += (i ? "/'" : "'") + location[i] + "'";
  s += " (" + std::to_string(tensors) + " tensors), ";
  if (stripped_prefix.empty()) return s + "keys without a wrapper prefix";
  s += "keys had the '" + stripped_prefix + "' prefix (stripped): wrapper" +
       (wrappers.size() > 1 ? "s " : " ");
  for (size_t i = 0; i < wrappers.size(); ++i) {
    s += (i ? " > " : "") + wrappers[i].name + " (" + wrappers[i].prefix + ")";
  }
  return s;
}

bool key_matches(const std::string& key, const std::string& pattern) {
  if (key == pattern) return true;
  if (key.size() > pattern.size() && key.starts_with(pattern) && key[pattern.size()] == '.') return true;
  try {
    return std::regex_match(key, std::regex(pattern, std::regex::ECMAScript));
  } catch (const std::regex_error& e) {
    throw std::invalid_argument("key pattern '" + pattern + "' is not a valid regular expression (" +
                                e.what() + ")");
  }
}

StateDict drop_keys(const StateDict& state, const std::vector<std::string>& patterns,
                    std::vector<std::string>* dropped) {
  StateDict out;
  std::vector<bool> used(patterns.size(), false);
  for (const auto& kv : state) {
    bool drop = false;
    for (size_t i = 0; i < patterns.size(); ++i) {
      if (key_matches(kv.key(), patterns[i])) used[i] = drop = true;
    }
    if (!drop) {
      out.insert(kv.key(), kv.value());
    } else if (dropped) {
      dropped->push_back(kv.key());
    }
  }
  for (size_t i = 0; i < patterns.size(); ++i) {
    if (!used[i]) throw std::invalid_argument("key pattern '" + patterns[i] + "' matches no key");
  }
  return out;
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
  // Wrappers nest in any order (torch.compile(DDP(m)): "_orig_mod.module."); peel the outermost
  // one while every key has one.
  std::string stripped;
  std::vector<KeyWrapper> wrappers;
  for (bool peeled = true; peeled;) {
    peeled = false;
    for (const KeyWrapper& w : known_key_wrappers()) {
      if (all_keys_have(d, w.prefix)) {
        d = strip_key_prefix(d, w.prefix);
        stripped += w.prefix;
        wrappers.push_back(w);
        peeled = true;
        break;
      }
    }
  }
  if (source) {
    source->location = path;
    source->stripped_prefix = stripped;
    source->wrappers = wrappers;
    source->tensors = static_cast<int64_t>(d.size());
  }
  return d;
}

LoadReport load_state_dict(torch::nn::Module& module, const StateDict& state, const std::string& name,
                           const LoadStateDictOptions& options) {
  std::vector<std::pair<std::string, at::Tensor>> targets;
  for (auto& p : module.named_parameters(true)) targets.emplace_back(p.key(), p.value());
  for (auto& b : module.named_buffers(true)) targets.emplace_back(b.key(), b.value());
  std::vector<bool> used(options.exclude.size(), false);
  const auto excluded = [&](const std::string& key) {
    bool hit = false;
    for (size_t i = 0; i < options.exclude.size(); ++i) {
      if (key_matches(key, options.exclude[i])) used[i] = hit = true;
    }
    return hit;
  };
  LoadReport report;
  std::vector<std::string> missing, unexpected;
  std::vector<std::pair<std::string, at::Tensor>> copies;
  std::unordered_set<std::string> known;
  for (const auto& [key, t] : targets) {
    known.insert(key);
    auto it = state.find(key);
    if (excluded(key)) {
      report.excluded.push_back(key);
    } else if (it == state.end()) {
      (is_num_batches_tracked(key) ? report.defaulted_num_batches_tracked : missing).push_back(key);
    } else if (it->value().sizes() != t.sizes()) {
      report.mismatched.push_back(key + ": " + c10::str(it->value().sizes()) + " in the file, " +
                                  c10::str(t.sizes()) + " in the model");
    } else {
      copies.emplace_back(key, t);
    }
  }
  for (const auto& kv : state) {
    if (!known.count(kv.key()) && !excluded(kv.key())) unexpected.push_back(kv.key());
  }
  for (size_t i = 0; i < options.exclude.size(); ++i) {
    if (!used[i]) {
      throw std::runtime_error(name + ": exclude pattern '" + options.exclude[i] +
                               "' matches no key of the file or the model");
    }
  }
  const bool shape_error = !report.mismatched.empty() && !options.skip_mismatched_shapes;
  if (!missing.empty() || !unexpected.empty() || shape_error) {
    std::string why = name + ": state_dict does not match the model:";
    if (!missing.empty()) why += " missing keys: " + join(missing) + ";";
    if (!unexpected.empty()) why += " unexpected keys: " + join(unexpected) + ";";
    if (shape_error) {
      why += " shapes differ: " + join(report.mismatched) +
             " (fine-tuning onto another head or class count? exclude those keys, e.g. "
             "`init_weights_exclude` fc, or `init_weights_skip_mismatched`);";
    }
    throw std::runtime_error(why);
  }
  at::NoGradGuard no_grad;
  for (auto& [key, t] : copies) t.copy_(state.at(key));
  if (!report.defaulted_num_batches_tracked.empty()) {
    gpufeed::log_text(LogLevel::kWarn,
                      "load_state_dict: " + name + ": " +
                          std::to_string(report.defaulted_num_batches_tracked.size()) +
                          " BatchNorm num_batches_tracked buffers are missing (a state_dict from "
                          "PyTorch < 0.4.1, or saved without them): kept at the model's values, "
                          "as torch's BatchNorm load_state_dict does (" +
                          join(report.defaulted_num_batches_tracked, 3) + ")");
  }
  if (!report.excluded.empty()) {
    gpufeed::log_text(LogLevel::kWarn, "load_state_dict: " + name + ": left at their initial values (excluded): " +
                                           join(report.excluded, 32));
  }
  if (!report.mismatched.empty()) {
    gpufeed::log_text(LogLevel::kWarn, "load_state_dict: " + name +
                                           ": left at their initial values (shapes differ): " +
                                           join(report.mismatched, 32));
  }
  return report;
}

StateDictSource load_state_dict(torch::nn::Module& module, const fs::path& path,
                                const LoadStateDictOptions& options, LoadReport* report) {
  StateDictSource source;
  const StateDict state = find_state_dict(load_torch_file(path), path.string(), &source);
  LoadReport r = load_state_dict(module, state, path.string(), options);
  gpufeed::log_text(LogLevel::kInfo,
                    "load_state_dict: " + path.string() + ": " + source.describe());
  if (report) *report = std::move(r);
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
