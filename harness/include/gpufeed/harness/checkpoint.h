#pragma once
// Model state_dicts in the files people have, both ways:
//  - save_state_dict writes {name: tensor} (torchvision's parameter names) that Python loads with
//    torch.load(path, weights_only=True) straight into torchvision's model;
//  - load_state_dict reads what Python's torch.save(model.state_dict()) writes -- an OrderedDict,
//    maybe saved from CUDA, maybe with DataParallel/DDP's "module." prefix (or torch.compile's
//    "_orig_mod."), maybe nested under "state_dict" / "model" next to optimizer state -- and
//    gpufeed's own files, through load_torch_file (torch_file.h), without Python.
// Training checkpoints (model + optimizer + schedule + sampler + RNG + scaler) are written by the
// Trainer with the same functions; their layout is documented in trainer.h.

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>

#include <filesystem>
#include <string>
#include <vector>

namespace gpufeed::harness {

/// A model state_dict: parameter and buffer names -> tensors, in the module's order.
using StateDict = c10::Dict<std::string, at::Tensor>;

/// Where a state_dict was found in a file and what was done to its keys.
struct StateDictSource {
  /// The path of keys to the state_dict inside the loaded object: empty for a top-level
  /// state_dict, {"model"} for torch.save({"model": sd, "optimizer": ...}), and so on.
  std::vector<std::string> location;
  /// The prefix removed from every key ("module.", "_orig_mod.", "module._orig_mod.") or "".
  std::string stripped_prefix;
  /// Number of tensors in the state_dict.
  int64_t tensors = 0;
  /// One line for logs: "state_dict under 'model', keys had the 'module.' prefix (stripped)".
  std::string describe() const;
};

/// The module's state_dict as torch.nn.Module.state_dict() orders it for our models: parameters
/// then buffers, recursively, detached (not copied; same device).
StateDict module_state_dict(const torch::nn::Module& module);

/// Finds the model state_dict in `loaded` (what load_torch_file returned): `loaded` itself when it
/// is a dict whose values are all tensors; otherwise the first such dict under the keys
/// "state_dict", "model_state_dict", "model", "module", "net", "ema" (searched two levels deep, in
/// that order). Strips "module." (DataParallel, DDP) and then "_orig_mod." (torch.compile) when
/// *every* key carries it. `name` (the file) only goes into error messages.
/// Throws std::runtime_error naming `name` when no state_dict is found (listing the top-level
/// keys) or a value under it is not a tensor.
StateDict find_state_dict(const c10::IValue& loaded, const std::string& name,
                          StateDictSource* source = nullptr);

/// Copies `state` into `module` by name (values converted to each tensor's dtype and device, in
/// place, so optimizers keep their parameters). Strict, like torch's load_state_dict: throws
/// std::runtime_error naming `name` and the missing keys, unexpected keys, or the first
/// mis-shaped key with both shapes.
void load_state_dict(torch::nn::Module& module, const StateDict& state, const std::string& name);

/// load_torch_file(path) + find_state_dict + load_state_dict; logs (info) where the state_dict
/// was found and whether a prefix was stripped, and returns that. Throws std::runtime_error as
/// those do.
StateDictSource load_state_dict(torch::nn::Module& module, const std::filesystem::path& path);

/// Writes the module's state_dict as a plain dict {name: tensor}, tensors copied to the CPU and
/// made contiguous, with `prefix` (e.g. "module.") prepended to every key, atomically (see
/// save_torch_file). Python reads it with torch.load(path, weights_only=True) and
/// torchvision.models.resnetXX(num_classes=K).load_state_dict(...).
/// Throws std::runtime_error naming the path on I/O failure.
void save_state_dict(const torch::nn::Module& module, const std::filesystem::path& path,
                     const std::string& prefix = "");

/// `state` with `prefix` removed from every key that has it (other keys are kept as they are).
StateDict strip_key_prefix(const StateDict& state, const std::string& prefix);
/// `state` with `prefix` prepended to every key.
StateDict add_key_prefix(const StateDict& state, const std::string& prefix);

/// A StateDict as a generic IValue dict (what save_torch_file takes), tensors moved to the CPU
/// and made contiguous.
c10::IValue state_dict_to_ivalue(const StateDict& state);

}  // namespace gpufeed::harness
