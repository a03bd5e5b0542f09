#pragma once
// Model state_dicts in the files people have, both ways:
//  - save_state_dict writes {name: tensor} (torchvision's parameter names) that Python loads with
//    torch.load(path, weights_only=True) straight into torchvision's model;
//  - load_state_dict reads what Python's torch.save(model.state_dict()) writes -- an OrderedDict,
//    maybe saved from CUDA, maybe with wrapper prefixes in any nesting (DataParallel/DDP's
//    "module.", torch.compile's "_orig_mod.", a Lightning module's "model.": known_key_wrappers),
//    maybe nested under "state_dict" / "model" next to optimizer state, maybe from a PyTorch
//    without BatchNorm's num_batches_tracked -- and gpufeed's own files, through load_torch_file
//    (torch_file.h), without Python.
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

/// A wrapper module that puts its attribute name in front of every key of the wrapped model's
/// state_dict.
struct KeyWrapper {
  std::string prefix;  ///< e.g. "module."
  std::string name;    ///< who adds it, e.g. "DistributedDataParallel/DataParallel"
};
/// The wrappers find_state_dict recognises, in any nesting and order:
///   "module."    torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel
///   "_orig_mod." torch.compile (OptimizedModule)
///   "model."     a LightningModule (or any wrapper) holding the network as self.model
/// torch.compile(DDP(model)).state_dict() has "_orig_mod.module.conv1.weight".
const std::vector<KeyWrapper>& known_key_wrappers();

/// Where a state_dict was found in a file and what was done to its keys.
struct StateDictSource {
  /// The path of keys to the state_dict inside the loaded object: empty for a top-level
  /// state_dict, {"model"} for torch.save({"model": sd, "optimizer": ...}), and so on.
  std::vector<std::string> location;
  /// The prefix removed from every key: the wrappers' prefixes, outermost first
  /// ("_orig_mod.module." for torch.compile(DDP(model))), or "".
  std::string stripped_prefix;
  /// The wrappers whose prefixes were stripped, outermost first (entries of known_key_wrappers).
  std::vector<KeyWrapper> wrappers;
  /// Number of tensors in the state_dict.
  int64_t tensors = 0;
  /// One line for logs and `gpufeed ckpt list`: "state_dict under 'model' (122 tensors), keys
  /// had the '_orig_mod.module.' prefix (stripped): wrappers torch.compile (_orig_mod.) >
  /// DistributedDataParallel/DataParallel (module.)".
  std::string describe() const;
};

/// Which keys load_state_dict leaves alone (fine-tuning onto another head, see LoadReport).
struct LoadStateDictOptions {
  /// Keys left at the model's current values (its fresh initialisation) and ignored in the file.
  /// A key matches a pattern when it equals it, starts with it followed by '.' ("fc" matches
  /// fc.weight and fc.bias, not fc2.weight), or matches it whole as an ECMAScript regex
  /// ("layer4\..*|fc\..*"). A pattern that matches no key of the file or the model is an error.
  std::vector<std::string> exclude;
  /// A key whose shape differs between the file and the model keeps the model's value, with a
  /// warning naming it and both shapes (instead of an error).
  bool skip_mismatched_shapes = false;
};

/// What load_state_dict did besides copying.
struct LoadReport {
  std::vector<std::string> excluded;    ///< model keys left at their values by `exclude`
  std::vector<std::string> mismatched;  ///< "fc.weight: [1000, 512] in the file, [2, 512] in the model"
  /// BatchNorm num_batches_tracked buffers missing from the file, kept at the model's values
  /// (state_dicts from PyTorch < 0.4.1, and dicts written without them).
  std::vector<std::string> defaulted_num_batches_tracked;
};

/// True when `key` matches `pattern` as LoadStateDictOptions::exclude defines. Throws
/// std::invalid_argument naming the pattern when it is not a valid regex.
bool key_matches(const std::string& key, const std::string& pattern);

/// `state` without the keys that match any of `patterns` (key_matches); the removed keys go to
/// `dropped`. Throws std::invalid_argument naming a pattern that matches no key.
StateDict drop_keys(const StateDict& state, const std::vector<std::string>& patterns,
                    std::vector<std::string>* dropped = nullptr);

/// The module's state_dict as torch.nn.Module.state_dict() orders it for our models: parameters
/// then buffers, recursively, detached (not copied; same device).
StateDict module_state_dict(const torch::nn::Module& module);

/// Finds the model state_dict in `loaded` (what load_torch_file returned): `loaded` itself when it
/// is a dict whose values are all tensors; otherwise the first such dict under the keys
/// "state_dict", "model_state_dict", "model", "module", "net", "ema" (searched two levels deep, in
/// that order). Then strips wrapper prefixes (known_key_wrappers) as long as *every* key carries
/// one, in whatever nesting and order they come ("_orig_mod.module.", "model.module.", ...).
/// `name` (the file) only goes into error messages.
/// Throws std::runtime_error naming `name` when no state_dict is found (listing the top-level
/// keys) or a value under it is not a tensor.
StateDict find_state_dict(const c10::IValue& loaded, const std::string& name,
                          StateDictSource* source = nullptr);

/// Copies `state` into `module` by name (values converted to each tensor's dtype and device, in
/// place, so optimizers keep their parameters). Strict, like torch's load_state_dict: throws
/// std::runtime_error naming `name` and the missing keys, unexpected keys, or the mis-shaped
/// keys with both shapes -- except what `options` excludes or skips, and BatchNorm
/// num_batches_tracked buffers missing from the file, which keep the model's values as torch's
/// BatchNorm load does for state_dicts without them (PyTorch < 0.4.1; torch checks the file's
/// _metadata version, which our reader does not keep, so we accept them whatever it says).
/// Logs (warn) every key left at the model's value and why. Returns what it did.
LoadReport load_state_dict(torch::nn::Module& module, const StateDict& state, const std::string& name,
                           const LoadStateDictOptions& options = {});

/// load_torch_file(path) + find_state_dict + load_state_dict; logs (info) where the state_dict
/// was found and which wrapper prefixes were stripped, and returns that (and, when `report` is
/// given, what load_state_dict did). Throws std::runtime_error as those do.
StateDictSource load_state_dict(torch::nn::Module& module, const std::filesystem::path& path,
                                const LoadStateDictOptions& options = {}, LoadReport* report = nullptr);

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
