// gpufeed ckpt: look into and convert checkpoint files without Python.
//   gpufeed ckpt list FILE             where the state_dict is, the wrapper prefixes found on its
//                                      keys, every key's shape/dtype
//   gpufeed ckpt convert IN OUT        the state_dict alone, as a plain {name: tensor} dict
//        [--strip-prefix P] [--add-prefix P] [--drop PATTERN ...]
// IN may be anything load_torch_file reads: Python's torch.save(model.state_dict()) (an
// OrderedDict, from CUDA or not), a dict holding it under "state_dict"/"model"/... next to
// optimizer state, keys with wrapper prefixes in any nesting ("module.", "_orig_mod.", "model.":
// find_state_dict strips them all), or a gpufeed file. OUT loads with torch::pickle_load /
// torch.load(weights_only=True) alike (no OrderedDict, no type tags).
// Torch translation unit: no fmt/spdlog here (see CMakeLists.txt).
#include <iostream>
#include <sstream>

#include "commands.h"
#include "torch_errors.h"
#include "gpufeed/harness/checkpoint.h"
#include "gpufeed/harness/torch_file.h"

namespace gpufeed::tools {
namespace {

std::string shape_of(const at::Tensor& t) {
  std::ostringstream os;
  os << "[";
  for (int64_t i = 0; i < t.dim(); ++i) os << (i ? ", " : "") << t.size(i);
  os << "]";
  return os.str();
}

// A one-line summary of a non-tensor value.
std::string summary(const c10::IValue& v) {
  if (v.isTensor())
    return "tensor " + shape_of(v.toTensor()) + " " +
           std::string(c10::toString(v.toTensor().scalar_type()));
  if (v.isGenericDict()) {
    const auto d = v.toGenericDict();
    if (auto it = d.find("__class__"); it != d.end() && it->value().isString()) {
      return "object of " + it->value().toStringRef() + " (not loaded)";
    }
    return "dict with " + std::to_string(d.size()) + " entries";
  }
  if (v.isList()) return "list of " + std::to_string(v.toList().size());
  if (v.isTuple()) return "tuple of " + std::to_string(v.toTupleRef().elements().size());
  std::ostringstream os;
  os << v;
  std::string s = os.str();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return v.tagKind() + " " + s;
}

int list(const std::string& file) {
  const c10::IValue loaded = harness::load_torch_file(file);
  if (loaded.isGenericDict()) {
    std::cout << file << ": dict with " << loaded.toGenericDict().size() << " entries\n";
  }
  harness::StateDictSource src;
  const harness::StateDict sd = harness::find_state_dict(loaded, file, &src);
  if (loaded.isGenericDict() && !src.location.empty()) {
    for (const auto& kv : loaded.toGenericDict()) {
      std::ostringstream key;
      key << kv.key();
      std::cout << "  " << key.str() << ": " << summary(kv.value()) << "\n";
    }
  }
  std::cout << src.describe() << "\n";
  int64_t numel = 0;
  for (const auto& kv : sd) {
    const at::Tensor& t = kv.value();
    numel += t.numel();
    std::cout << kv.key() << "\t" << shape_of(t) << "\t" << c10::toString(t.scalar_type()) << "\n";
  }
  std::cout << sd.size() << " tensors, " << numel << " elements\n";
  return 0;
}

int convert(const std::string& in, const std::string& out, const std::string& strip,
            const std::string& add, const std::vector<std::string>& drop) {
  harness::StateDictSource src;
  harness::StateDict sd = harness::find_state_dict(harness::load_torch_file(in), in, &src);
  std::cout << in << ": " << src.describe() << "\n";
  if (!strip.empty()) sd = harness::strip_key_prefix(sd, strip);
  if (!drop.empty()) {
    std::vector<std::string> dropped;
    sd = harness::drop_keys(sd, drop, &dropped);
    std::cout << "dropped " << dropped.size() << " keys:";
    for (const auto& k : dropped) std::cout << " " << k;
    std::cout << "\n";
  }
  if (!add.empty()) sd = harness::add_key_prefix(sd, add);
  harness::save_torch_file(harness::state_dict_to_ivalue(sd), out);
  std::cout << "wrote " << out << ": " << sd.size() << " tensors, plain dict, "
            << (add.empty() ? "keys without a wrapper prefix" : "keys prefixed with '" + add + "'") << "\n";
  return 0;
}

}  // namespace

Run add_ckpt(CLI::App& app) {
  app.require_subcommand(1);
  auto in = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto strip = std::make_shared<std::string>();
  auto add = std::make_shared<std::string>();
  auto drop = std::make_shared<std::vector<std::string>>();
  CLI::App* l = app.add_subcommand(
      "list", "where the state_dict is, the wrapper prefixes on its keys (module., _orig_mod., "
      "model.), every key's shape and dtype");
  l->add_option("file", *in, "a torch.save file (Python or gpufeed)")->required();
  CLI::App* c =
      app.add_subcommand("convert", "write the state_dict alone as a plain {name: tensor} dict");
  c->add_option("input", *in, "a torch.save file (Python or gpufeed)")->required();
  c->add_option("output", *out, "where to write (atomically)")->required();
  c->add_option("--strip-prefix", *strip,
                "remove this prefix from keys that have it (wrapper prefixes on every key -- "
                "module., _orig_mod., model., in any nesting -- are always removed)");
  c->add_option("--drop", *drop,
                "leave out keys matching this pattern (the key itself, a module prefix such as fc, "
                "or a whole-key regex); repeatable. A pattern matching no key is an error");
  c->add_option("--add-prefix", *add,
                "prepend this to every key (e.g. module. for a DDP-wrapped model)");
  return without_backtrace([l, c, in, out, strip, add, drop] {
    if (l->parsed()) return list(*in);
    if (c->parsed()) return convert(*in, *out, *strip, *add, *drop);
    return 2;
  });
}

}  // namespace gpufeed::tools
