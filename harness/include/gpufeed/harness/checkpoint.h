#pragma once
#include <filesystem>

#include <torch/nn/module.h>

namespace gpufeed::harness {

/// Writes module's state_dict (parameters then buffers, torchvision's names) as a plain dict
/// {name: tensor} in the zip format torch.save writes, so Python reads it with
/// torch.load(path) and model.load_state_dict(...). Tensors are saved from the CPU. The write is
/// atomic: a temporary file in the same folder, then rename, so a crash never leaves a torn file.
/// Throws std::runtime_error naming the path on I/O failure.
void save_state_dict(const torch::nn::Module& module, const std::filesystem::path& path);

/// Loads a file written by save_state_dict (or by Python's torch.save of a plain dict of tensors)
/// into module, by name, copying values in place. A "module." prefix on every key (DataParallel
/// and DDP saves) is stripped. Throws std::runtime_error naming the file and the first missing,
/// unexpected or mis-shaped key.
void load_state_dict(torch::nn::Module& module, const std::filesystem::path& path);

}  // namespace gpufeed::harness
