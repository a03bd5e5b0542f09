#pragma once
// Reading and writing the files Python's torch.save writes, without Python.
//
// LibTorch's own reader (torch::pickle_load) cannot read what people actually have: it turns a
// collections.OrderedDict -- the type of every model.state_dict() -- into None (pytorch#100741).
// load_torch_file parses the archive's data.pkl itself, with a restricted unpickler that
// understands the objects torch.save writes (dicts, OrderedDicts, lists, tuples, numbers,
// strings, tensors and their storages, nn.Parameters) and executes nothing: any other class
// (argparse.Namespace, numpy scalars, ...) becomes an inert dict that names it, as
// torch.load(weights_only=True) would refuse to build it. Tensors always load onto the CPU,
// whatever device they were saved from (map_location="cpu").

#include <ATen/core/ivalue.h>

#include "gpufeed/profiler/atomic_file.h"  // write_file_atomically, set_write_fault_hook

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace gpufeed::harness {

/// What torch.load(path, map_location="cpu", weights_only=True) returns, as an IValue:
///   dict / OrderedDict -> GenericDict (key order kept), list / set -> GenericList,
///   tuple -> Tuple, int -> Int, float -> Double, bool -> Bool, None -> None, str / bytes ->
///   String, tensor / nn.Parameter -> Tensor (CPU, dtype and strides as saved; tensors saved
///   from one storage share it), torch.Size -> Tuple, torch.device -> String ("cuda:0").
///   An object of any other class -> GenericDict {"__class__": "module.Name", ...its pickled
///   state...}; a reference to a class or function -> String "<global module.Name>".
/// Reads the zip format torch.save has written since PyTorch 1.6 (pickle protocols 2 to 5);
/// gpufeed's own files (save_torch_file) are the same format.
/// Throws std::runtime_error naming the file and the reason: missing file, not a zip archive
/// (the legacy pre-1.6 format or a non-torch file), a TorchScript archive, big-endian data, an
/// unsupported tensor storage type, or a malformed pickle.
c10::IValue load_torch_file(const std::filesystem::path& path);

/// The same, from the bytes of such a file.
c10::IValue load_torch_bytes(const std::vector<char>& bytes, const std::string& name = "<memory>");

/// Writes `value` as torch.save does (zip archive, data.pkl with pickle protocol 2, one record
/// per tensor storage, tensors copied to the CPU), without TorchScript's type tags, so Python
/// reads it with torch.load(path, weights_only=True). Supports what load_torch_file returns
/// except opaque objects: dicts (string or int keys), lists, tuples, numbers, strings, None and
/// tensors. The write is atomic and durable: a temporary file in the same folder (written,
/// fsync'ed), then rename over `path`, then fsync of the folder, so a crash at any point leaves
/// either the old file or the new one. Throws std::runtime_error naming the path on I/O failure
/// (the temporary file is removed).
void save_torch_file(const c10::IValue& value, const std::filesystem::path& path);

}  // namespace gpufeed::harness
