// gpufeed._C: the loader, the prefetcher and the decoder for Python (nanobind). The Python package
// (python/gpufeed/) wraps this module in PyTorch's vocabulary; everything here is mechanism:
//
// - No LibTorch: this module links the torch-free rooms only, so one build serves every torch
//   release. Tensors cross into Python through DLPack (nanobind's ndarray, which hands its capsule
//   to torch.utils.dlpack.from_dlpack) without copying; their owners keep the memory alive. A CPU
//   batch is a view of the loader's slot: the owners hold the Batch's lease, so the slot returns
//   to the loader only when the last tensor (images or labels) referring to it is freed, and the
//   loader's state outlives the loader object if needed. The package converts CPU batches to
//   float with torch's own ops (python/gpufeed/_loader.py).
// - CUDA batches come from the device room's engine (gpufeed/device/engine.h) on the stream the
//   caller passes (torch.cuda.current_stream().cuda_stream), in device memory from the engine's
//   stream-ordered pool, freed on that stream when torch frees the tensor.
// - Waiting for a batch releases the GIL and waits in short slices (Loader::wait_ready), checking
//   for signals between them (PyErr_CheckSignals), so Ctrl-C raises KeyboardInterrupt promptly;
//   a batch taken when Ctrl-C lands is kept for the next call. Opening a dataset and a remote
//   load_sample run on a helper thread for the same reason (run_interruptibly).
// - No Python object is touched off the calling thread: the loader's workers run C++ only.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gpufeed/decode/decoder.h"
#include "gpufeed/device/cuda.h"
#include "gpufeed/device/engine.h"
#include "gpufeed/profiler/profile_fields.h"
#include "gpufeed/decode/error.h"
#include "gpufeed/datasets/dataset.h"
#include "gpufeed/datasets/mixed.h"
#include "gpufeed/pack/inspect.h"
#include "gpufeed/loader/loader.h"
#include "gpufeed/loader/option_sets.h"
#include "gpufeed/loader/rank_sampler.h"
#include "gpufeed/datasets/remote.h"
#include "gpufeed/datasets/remote_fields.h"
#include "gpufeed/loader/stats_fields.h"
#include "gpufeed/option.h"
#include "gpufeed/sampler/mixing.h"
#include "gpufeed/sampler/resume.h"
#include "gpufeed/sampler/sampler.h"
#include "bindings.h"
#include "fields_dict.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace gpufeed::python {
namespace {

// ---- tensors -> Python ---------------------------------------------------------------------------

using Tensor = nb::ndarray<nb::pytorch>;

/// A capsule owning `value` (deleted when the last tensor viewing it is freed).
template <class T>
nb::capsule owner_of(T value) {
  auto* held = new T(std::move(value));
  return nb::capsule(held, [](void* p) noexcept { delete static_cast<T*>(p); });
}

/// A torch.Tensor viewing `data` (strides in elements; empty: contiguous), kept alive by `owner`.
nb::object tensor(void* data, std::vector<size_t> shape, std::vector<int64_t> strides, nb::dlpack::dtype dtype,
                  nb::handle owner, int device_id = -1) {
  const int device_type = device_id < 0 ? nb::device::cpu::value : nb::device::cuda::value;
  Tensor t(data, shape.size(), shape.data(), owner, strides.empty() ? nullptr : strides.data(), dtype, device_type,
           device_id < 0 ? 0 : device_id);
  return nb::cast(t);
}

nb::dlpack::dtype dlpack_dtype(device::OutputType type) {
  switch (type) {
    case device::OutputType::kUInt8:
      return nb::dtype<uint8_t>();
    case device::OutputType::kFloat32:
      return nb::dtype<float>();
    case device::OutputType::kBFloat16:
      return {static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};
    case device::OutputType::kFloat16:
      return {static_cast<uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
  }
  throw std::invalid_argument("unknown OutputType");
}

/// A slot as tensors that keep its lease: [N, H, W, 3] uint8 (with views, a list of the K views'
/// [N, S_k, S_k, 3]) and [N] int64, CPU.
std::pair<nb::object, nb::object> lease_tensors(const loader::Batch& b) {
  const auto n = static_cast<size_t>(b.size);
  nb::object images;
  if (b.views.empty()) {
    images = tensor(b.images, {n, static_cast<size_t>(b.height), static_cast<size_t>(b.width), 3}, {},
                    nb::dtype<uint8_t>(), owner_of(b.lease));
  } else {
    nb::list views;
    for (const loader::BatchView& v : b.views)
      views.append(tensor(v.images, {n, static_cast<size_t>(v.height), static_cast<size_t>(v.width), 3}, {},
                          nb::dtype<uint8_t>(), owner_of(b.lease)));
    images = std::move(views);
  }
  nb::object labels = tensor(b.labels, {n}, {}, nb::dtype<int64_t>(), owner_of(b.lease));
  return {images, labels};
}

/// One converted device buffer as a tensor: [N, 3, H, W] of the batch's dtype (uint8: [N, H, W, 3],
/// the slot's layout), NCHW or channels_last strides.
nb::object device_images(const device::EngineBatch& b, const std::shared_ptr<device::DeviceBuffer>& buffer,
                         int64_t height, int64_t width, int device_id) {
  const auto n = static_cast<size_t>(b.size), h = static_cast<size_t>(height), w = static_cast<size_t>(width);
  if (b.dtype == device::OutputType::kUInt8)
    return tensor(buffer->data(), {n, h, w, 3}, {}, dlpack_dtype(b.dtype), owner_of(buffer), device_id);
  if (b.channels_last) {
    const auto hw = static_cast<int64_t>(h * w), wi = static_cast<int64_t>(w);
    return tensor(buffer->data(), {n, 3, h, w}, {hw * 3, 1, wi * 3, 3}, dlpack_dtype(b.dtype), owner_of(buffer),
                  device_id);
  }
  return tensor(buffer->data(), {n, 3, h, w}, {}, dlpack_dtype(b.dtype), owner_of(buffer), device_id);
}

/// An engine batch as tensors on its device: images (device_images; with views, a list of the K
/// views') and labels [N] int64.
std::pair<nb::object, nb::object> device_tensors(const device::EngineBatch& b, int device_id) {
  const auto n = static_cast<size_t>(b.size);
  nb::object images;
  if (b.views.empty()) {
    images = device_images(b, b.images, b.height, b.width, device_id);
  } else {
    nb::list views;
    for (const device::EngineView& v : b.views) views.append(device_images(b, v.images, v.height, v.width, device_id));
    images = std::move(views);
  }
  nb::object labels = tensor(b.labels->data(), {n}, {}, nb::dtype<int64_t>(), owner_of(b.labels), device_id);
  return {images, labels};
}

// ---- errors -----------------------------------------------------------------------------------------

nb::object errors_module() { return nb::module_::import_("gpufeed._errors"); }

void translate_errors(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const decode::DecodeError& e) {
    nb::object cls = errors_module().attr("DecodeError");
    nb::object err = cls(e.what(), e.source(), std::string(decode::to_string(e.kind())), e.reason());
    PyErr_SetObject(cls.ptr(), err.ptr());
  } catch (const loader::SkipLimitExceeded& e) {
    nb::object cls = errors_module().attr("SkipLimitExceeded");
    nb::object err = cls(e.what(), to_dict(e.summary()), e.max_skips());
    PyErr_SetObject(cls.ptr(), err.ptr());
  } catch (const std::invalid_argument& e) {
    // Refused options (options::OptionError and the structs' validate()): ValueError, the
    // backticked option names spelled as keywords (`num_workers` -> num_workers=).
    PyErr_SetString(PyExc_ValueError, options::spell_options(e.what(), options::Front::kPython).c_str());
  }
}

// ---- the loader -------------------------------------------------------------------------------------

device::OutputType parse_dtype(const std::string& name) {
  if (name == "uint8") return device::OutputType::kUInt8;
  if (name == "float32") return device::OutputType::kFloat32;
  if (name == "bfloat16") return device::OutputType::kBFloat16;
  if (name == "float16") return device::OutputType::kFloat16;
  throw nb::value_error(("dtype must be torch.uint8, float32, bfloat16 or float16, not " + name).c_str());
}

/// The option as Python sees it: bool, int, float, str, or a tuple of floats.
nb::object to_python(const options::Value& v) {
  struct {
    nb::object operator()(bool b) const { return nb::bool_(b); }
    nb::object operator()(int64_t i) const { return nb::int_(i); }
    nb::object operator()(double d) const { return nb::float_(d); }
    nb::object operator()(const std::string& t) const { return nb::str(t.c_str()); }
    nb::object operator()(const std::vector<double>& l) const {
      nb::list out;
      for (const double d : l) out.append(nb::float_(d));
      return nb::tuple(out);
    }
  } visit;
  return std::visit(visit, v);
}

/// Views as Python dicts of their view keywords (transforms::views_to_rows).
nb::list view_dicts(const transforms::ViewsOptions& views) {
  nb::list out;
  for (const auto& row : transforms::views_to_rows(views)) {
    nb::dict d;
    for (const auto& [key, value] : row) d[key.c_str()] = to_python(value);
    out.append(d);
  }
  return out;
}

/// gpufeed.DataLoader's schema keywords as dicts (name, type, help, unit, min, max, words,
/// sizes, default, derived_default), in the order of its sets (loader::dataloader_option_sets()):
/// the package builds its signature, its checks of Python types and its docstring from them.
nb::list option_specs() {
  nb::list out;
  for (const options::OptionSet& set : loader::dataloader_option_sets()) {
    for (const options::Row& row : set.rows) {
      const options::Spec& s = row.spec;
      nb::dict d;
      d["name"] = s.name;
      d["type"] = options::type_name(s.type);
      d["help"] = s.help;
      d["unit"] = s.unit;
      d["min"] = s.min ? nb::object(nb::float_(*s.min)) : nb::none();
      d["max"] = s.max ? nb::object(nb::float_(*s.max)) : nb::none();
      d["words"] = s.words;
      d["sizes"] = s.sizes;
      d["accepted"] = options::accepted(s);
      d["default"] = row.default_value ? to_python(*row.default_value) : nb::none();
      d["derived_default"] = s.derived_default;
      d["python_default"] = s.python_default ? to_python(*s.python_default) : nb::none();
      d["seed_range"] = s.seed_range;
      out.append(d);
    }
  }
  return out;
}

/// The given keywords of each set, applied: unknown names and refused values raise ValueError
/// naming the keyword.
struct KeywordOptions {
  loader::LoaderOptions loader;
  datasets::DataOptions data;
};

KeywordOptions apply_keywords(const std::map<std::string, options::Value>& given) {
  std::map<std::string, options::Value> for_loader, for_data;
  const options::OptionSet& data_set = options::set_named(loader::dataloader_option_sets(), "data");
  for (const auto& [name, value] : given) (data_set.has(name) ? for_data : for_loader)[name] = value;
  KeywordOptions k;
  loader::loader_options_schema().apply(k.loader, for_loader);
  datasets::data_options_schema().apply(k.data, for_data);
  return k;
}

// `work` on a helper thread while this one, holding the GIL between 100 ms waits, checks for
// signals. On Ctrl-C (a signal whose handler raised), `cancel` makes the work return at once, its
// own error ("cancelled") is dropped and the handler's (KeyboardInterrupt) is raised; nothing
// else is changed, so the caller's object goes on as before the call. Otherwise work's result
// or exception.
template <class R>
R run_interruptibly(std::function<R()> work, const std::function<void()>& cancel) {
  std::packaged_task<R()> task(std::move(work));
  std::future<R> result = task.get_future();
  std::thread worker(std::move(task));
  for (;;) {
    bool ready;
    {
      nb::gil_scoped_release nogil;
      ready = result.wait_for(std::chrono::milliseconds(100)) == std::future_status::ready;
    }
    if (ready) break;
    if (PyErr_CheckSignals() != 0) {
      cancel();
      {
        nb::gil_scoped_release nogil;
        worker.join();  // prompt: the work fails what it waits for
      }
      try {
        static_cast<void>(result.get());  // libc++'s get() is [[nodiscard]]
      } catch (...) {  // the work's own error (cancelled): the signal's is raised
      }
      throw nb::python_error();
    }
  }
  worker.join();
  return result.get();
}

// open_dataset, interruptibly: Ctrl-C while a remote dataset opens (its HEADs and index GETs may
// stall for request_timeout x max_retries) raises KeyboardInterrupt at once, its requests
// cancelled (DataOptions::interrupt, this open's own: the dataset it would have made is dropped).
// Folder listings are waited for the same way.
std::shared_ptr<datasets::Dataset> open_interruptibly(const std::string& path, datasets::DataOptions options,
                                                    const std::vector<std::string>& extensions) {
  auto interrupt = std::make_shared<std::atomic<bool>>(false);
  options.interrupt = interrupt;
  return run_interruptibly<std::shared_ptr<datasets::Dataset>>(
      [&] { return datasets::open_dataset(path, options, extensions); }, [&] { interrupt->store(true); });
}

class PyLoader {
 public:
  /// `keywords`: gpufeed.DataLoader's schema keywords that were given (option_specs()); the rest
  /// are the Python front's own (device, dtype, layout, the sampler's rank, world size, shuffle
  /// and drop_last, the folder listing's extensions).
  /// `paths`: one dataset, or several sources mixed (datasets::MixedDataset) with `weights` and
  /// `epoch_size` (loader::Mixing; None: their defaults).
  PyLoader(const std::vector<std::string>& paths, const std::map<std::string, options::Value>& keywords,
           const std::string& device, const std::string& dtype, bool channels_last, int64_t rank,
           int64_t world_size, bool shuffle, bool sampler_drop_last, bool sample_only,
           const std::vector<std::string>& extensions,
           const std::vector<std::map<std::string, options::Value>>& view_rows,
           const std::optional<std::vector<double>>& weights, std::optional<int64_t> epoch_size) {
    try {
      device_ = device::parse_device(device);
    } catch (const std::invalid_argument&) {
      throw nb::value_error(("device must be 'cpu' or 'cuda[:N]', not '" + device + "'").c_str());
    }
    dtype_ = parse_dtype(dtype);
    KeywordOptions k = apply_keywords(keywords);
    if (!view_rows.empty()) {  // views=[{...}, ...]: described one by one (views=NAME is a keyword)
      k.loader.views = transforms::views_from_rows(view_rows);
      k.loader.validate();
    }
    const loader::LoaderOptions& o = k.loader;
    options_ = o;
    if (paths.empty()) throw nb::value_error("gpufeed.DataLoader: root names no dataset (an empty list)");
    std::vector<std::shared_ptr<datasets::Dataset>> sources;
    for (const std::string& path : paths) sources.push_back(open_interruptibly(path, k.data, extensions));
    if (sources.size() == 1) {
      dataset_ = sources.front();
    } else {
      try {
        dataset_ = std::make_shared<datasets::MixedDataset>(std::move(sources), paths);
      } catch (const std::invalid_argument& e) {
        throw nb::value_error(e.what());
      }
    }
    std::string path = paths.front();  // what messages call the data
    if (paths.size() > 1) {
      path = "[" + path;
      for (size_t s = 1; s < paths.size(); ++s) path += ", " + paths[s];
      path += "]";
    }
    if (weights) mixing_.weights = *weights;
    mixing_.epoch_size = epoch_size;
    epoch_samples_ = loader::epoch_samples(*dataset_, mixing_);
    sample_reader_ = dataset_->reader();
    nb::gil_scoped_release nogil;  // allocating slots takes a while
    sampler::DistributedSamplerOptions& so = distributed_;
    so.num_replicas = world_size;
    so.rank = rank;
    so.shuffle = shuffle;
    so.seed = o.seed;
    so.drop_last = sampler_drop_last;
    try {
      sampler_ = loader::make_rank_sampler(*dataset_, o, so, path, mixing_);
    } catch (const std::invalid_argument& e) {  // weights, epoch_size (OptionError is a ValueError already)
      throw nb::value_error(e.what());
    }
    shuffle_order_ = loader::resolve_shuffle_order(*dataset_, o.shuffle_order, path);
    if (sample_only) return;  // load_sample only: no slots, no threads (a worker's copy of loader.dataset)
    if (device_ < 0) {
      // CPU: the slots' uint8 views; the package converts other dtypes with torch's ops.
      loader_ = std::make_shared<loader::Loader>(dataset_, sampler_, o, loader::default_host_allocator());
      return;
    }
    device::EngineOptions eo;
    eo.device = device_;
    eo.dtype = dtype_;
    // uint8 stays NHWC: the engine's channels_last uint8 result is the copied slot.
    eo.channels_last = dtype_ == device::OutputType::kUInt8 ? true : channels_last;
    eo.normalize.mean = o.transform.augment.mean;
    eo.normalize.std = o.transform.augment.std;
    if (!device::cuda_available())
      throw std::runtime_error(device::built_with_cuda()
                                   ? "no CUDA device is visible; cannot use " + device +
                                         " (check CUDA_VISIBLE_DEVICES and the driver)"
                                   : "gpufeed was built without the CUDA path; cannot use " + device);
    loader_ = std::make_shared<loader::Loader>(dataset_, sampler_, o, device::pinned_host_allocator());
    engine_ = std::make_unique<device::CudaEngine>(loader_, eo);
  }

  ~PyLoader() { close(); }

  /// Cancels the epoch's pending work and frees the slots not held by live tensors.
  void close() {
    nb::gil_scoped_release nogil;
    held_.reset();
    held_engine_.reset();
    engine_.reset();
    loader_.reset();
  }

  std::shared_ptr<loader::Loader> shared_loader() {
    loader();
    return loader_;
  }

  loader::Loader& loader() {
    if (!loader_) throw std::runtime_error("gpufeed.DataLoader: the loader was closed");
    return *loader_;
  }

  void start_epoch(int64_t epoch, int64_t start_batch) {
    loader::Loader& l = loader();
    held_.reset();  // a batch of the epoch before, taken by an interrupted next()
    held_engine_.reset();
    nb::gil_scoped_release nogil;
    if (engine_)
      engine_->start_epoch(epoch, start_batch);
    else
      l.start_epoch(epoch, start_batch);
  }

  /// The next batch as (images, labels, info dict), or None at the epoch's end. CPU: the slot's
  /// [N, H, W, 3] uint8 and [N] int64 views; CUDA: the engine's tensors, ready on `stream` (a
  /// cudaStream_t as an integer: torch.cuda.current_stream().cuda_stream).
  nb::object next(double slice_s, uintptr_t stream) {
    loader::Loader& l = loader();
    const auto slice = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(slice_s));
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      if (held_ || held_engine_) break;  // taken by a call that was interrupted
      bool ready;
      {
        nb::gil_scoped_release nogil;
        ready = engine_ ? engine_->wait_ready(slice) : l.wait_ready(slice);
      }
      if (ready) break;
      if (PyErr_CheckSignals() != 0) throw nb::python_error();
    }
    std::pair<nb::object, nb::object> tensors;
    nb::dict info;
    // Making the tensors runs Python (torch's DLPack import), where a pending Ctrl-C raises: the
    // batch taken stays held and the next call returns it.
    if (!engine_) {
      if (!held_) {
        std::optional<loader::Batch> b;
        {
          nb::gil_scoped_release nogil;
          b = l.next();
        }
        if (!b) return nb::none();
        held_ = std::move(b);
      }
      tensors = lease_tensors(*held_);
      fill_info(info, *held_);
    } else {
      if (!held_engine_) {
        std::optional<device::EngineBatch> b;
        {
          nb::gil_scoped_release nogil;
          b = engine_->next(reinterpret_cast<device::StreamHandle>(stream));
        }
        if (!b) return nb::none();
        held_engine_ = std::move(b);
      }
      tensors = device_tensors(*held_engine_, device_);
      fill_info(info, *held_engine_);
    }
    info["wait_ms"] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    nb::object out = nb::make_tuple(tensors.first, tensors.second, info);
    // A Ctrl-C that came while the tensors were made but ran no Python: raised here, the batch
    // still held, rather than by the interpreter once this returns, which would drop the batch.
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
    held_.reset();
    held_engine_.reset();
    return out;
  }

  /// Batches of a whole epoch of this rank (DistributedSampler's, whatever epoch is resumed).
  int64_t num_batches() {
    loader();
    auto plain = std::make_shared<sampler::DistributedSampler>(epoch_samples_, distributed_);
    return sampler::BatchSampler(plain, options_.batch_size, options_.drop_last).size();
  }
  void set_image_size(int size) { loader().set_image_size(size); }
  int image_size() { return loader().image_size(); }
  std::pair<int64_t, int64_t> state() {
    const sampler::SamplerState s = loader().state();
    return {s.epoch, s.batches_consumed};
  }
  /// This rank's indices of `epoch`: its part of the resumed epoch's remaining positions (set_resume),
  /// else DistributedSampler's.
  std::vector<int64_t> sampler_indices(int64_t epoch) {
    const auto s = sampler_->clone();
    s->set_epoch(epoch);
    return s->indices();
  }
  /// DistributedSampler's samples per epoch for this rank (len(sampler)).
  int64_t sampler_size() const { return sampler::DistributedSampler(epoch_samples_, distributed_).size(); }
  /// The order the sampler deals: "exact" or "shards" (shuffle_order resolved for this dataset).
  std::string shuffle_order() const { return std::string(loader::to_string(shuffle_order_)); }
  /// The epoch the next start_epoch resumes, (epoch, num_replicas of its list, positions consumed),
  /// or None: every epoch is DistributedSampler's (gpufeed/sampler/resume.h).
  void set_resume(std::optional<std::tuple<int64_t, int64_t, int64_t>> resume) {
    if (!resume) return sampler_->set_resume(std::nullopt);
    const auto [epoch, num_replicas, consumed] = *resume;
    sampler_->set_resume(sampler::EpochResume{epoch, num_replicas, consumed});
  }
  /// Positions of an epoch list made for `list_world_size` ranks consumed across all ranks once
  /// rank `rank` of `world_size`, dealt the positions from `start` on, has received
  /// `batches_consumed` of this loader's batches (sampler::consumed_after_batches; ValueError where
  /// it throws).
  int64_t consumed_after_batches(int64_t list_world_size, int64_t start, int64_t world_size, int64_t rank,
                                 int64_t batches_consumed) const {
    if (list_world_size < 1) throw nb::value_error("the epoch list's world size must be >= 1");
    sampler::DistributedSamplerOptions o = distributed_;
    o.num_replicas = list_world_size;
    o.rank = 0;
    const int64_t total = sampler::DistributedSampler(epoch_samples_, o).total_size();
    try {
      return sampler::consumed_after_batches(total, start, world_size, rank, batches_consumed, options_.batch_size,
                                             options_.drop_last);
    } catch (const std::invalid_argument& e) {
      throw nb::value_error(e.what());
    }
  }
  const std::vector<std::string>& classes() const { return dataset_->classes(); }
  nb::list samples() const {
    nb::list out;
    for (int64_t i = 0; i < dataset_->size(); ++i) {
      const datasets::SampleRef s = dataset_->at(i);
      out.append(nb::make_tuple(s.source(), s.label));
    }
    return out;
  }
  nb::dict stats() {
    nb::dict d = to_dict(loader().stats());
    d["threads"] = loader().num_threads();
    d["prefetch_depth"] = loader().prefetch_depth();
    d["thread_decisions"] = to_py(loader().thread_decisions());
    d["slots"] = to_dict(loader().slot_counts());
    if (const auto* remote = dynamic_cast<const datasets::RemoteShards*>(dataset_.get())) d["remote"] = to_dict(remote->stats());
    if (const auto* mixed = dynamic_cast<const datasets::MixedDataset*>(dataset_.get())) {
      nb::list sources;
      for (size_t s = 0; s < mixed->sources().size(); ++s) {
        nb::dict one;
        one["name"] = mixed->names()[s];
        one["size"] = mixed->sources()[s]->size();
        if (const auto* remote = dynamic_cast<const datasets::RemoteShards*>(mixed->sources()[s].get()))
          one["remote"] = to_dict(remote->stats());
        sources.append(one);
      }
      d["sources"] = sources;
    }
    return d;
  }
  /// Each source's samples per epoch (k_s) when the sampler mixes, else None.
  std::optional<std::vector<int64_t>> mixing_counts() const {
    return loader::mixing_counts(*dataset_, options_, distributed_, mixing_);
  }
  /// Samples one epoch covers across all ranks (epoch_size when mixing, else the dataset's size).
  int64_t epoch_samples() const { return epoch_samples_; }
  /// [S + 1] the sources' sample offsets (ConcatDataset's numbering); [0, size] for one dataset.
  std::vector<int64_t> source_offsets() const {
    if (const auto* mixed = dynamic_cast<const datasets::MixedDataset*>(dataset_.get())) return mixed->offsets();
    return {0, dataset_->size()};
  }
  /// Each source's samples in `epoch`: (the epoch's global list before padding, this rank's indices
  /// of it, its resumed share included), or None when the sampler does not mix.
  /// Kept for the last (epoch, resume) asked: stats() calls it, and the list is O(epoch_size).
  std::optional<std::pair<std::vector<int64_t>, std::vector<int64_t>>> source_counts(int64_t epoch) {
    const auto s = sampler_->clone();
    const auto* mixing = dynamic_cast<const sampler::MixingSampler*>(s.get());
    if (mixing == nullptr) return std::nullopt;
    if (counts_cache_ && counts_cache_->epoch == epoch && counts_cache_->resume == s->resume())
      return counts_cache_->counts;
    s->set_epoch(epoch);
    counts_cache_ = CountsCache{epoch, s->resume(), {mixing->per_source_counts(epoch), mixing->rank_source_counts()}};
    return counts_cache_->counts;
  }
  nb::dict epoch_summary() { return to_dict(loader().epoch_summary()); }
  /// The views in force (LoaderOptions::views), one dict of view keywords each; [] without views.
  nb::list views() const { return view_dicts(options_.views); }
  /// Decodes sample `index` of `epoch` exactly as a worker does, at train side `size` (0: the
  /// options' own): [S, S, 3] uint8 capsule (with views, a list of the K views' [S_k, S_k, 3]).
  /// Needs no loader (threads, slots), so it works in a sample-only object and in a fork() child.
  nb::object load_sample(int64_t index, int64_t epoch, int size) {
    if (index < 0 || index >= dataset_->size())
      throw nb::index_error(("sample index " + std::to_string(index) + " out of range for " +
                             std::to_string(dataset_->size()) + " samples").c_str());
    loader::LoaderOptions o = options_;
    if (size > 0 && o.transform.kind == transforms::TransformOptions::Kind::kTrain) o.transform.rrc.size = size;
    const auto s = static_cast<size_t>(o.transform.output_size());
    auto out = std::make_unique<std::vector<uint8_t>>(static_cast<size_t>(loader::sample_bytes(o)));
    uint8_t* data = out->data();
    if (!sample_reader_) {
      nb::gil_scoped_release nogil;
      loader::load_sample(*dataset_, index, epoch, o, data);
    } else {
      // Remote: read through this object's own reader, so Ctrl-C while the read waits (a stalled
      // server retried for up to request_timeout x max_retries) forgets just this read and raises
      // KeyboardInterrupt at once; the dataset's client and the loader go on unchanged.
      const uint64_t tag = ++sample_tags_;
      sample_reader_->announce(tag, {index});
      run_interruptibly<void>([&] { loader::load_sample(*dataset_, *sample_reader_, tag, index, epoch, o, data); },
                              [&] { sample_reader_->forget(tag); });
    }
    if (o.views.empty()) return tensor(data, {s, s, 3}, {}, nb::dtype<uint8_t>(), owner_of(std::move(out)));
    nb::object owner = owner_of(std::move(out));
    nb::list views;
    for (const transforms::ViewOptions& v : o.views.views) {
      const auto side = static_cast<size_t>(v.rrc.size);
      views.append(tensor(data, {side, side, 3}, {}, nb::dtype<uint8_t>(), owner));
      data += side * side * 3;
    }
    return views;
  }

 private:
  template <class B>
  static void fill_info(nb::dict& info, const B& b) {
    info["epoch"] = b.epoch;
    info["batch_index"] = b.batch_index;
    info["indices"] = b.indices;
    info["skipped"] = to_py(b.skipped);
  }

  int device_ = -1;  // CUDA device; -1: the CPU
  loader::LoaderOptions options_;
  device::OutputType dtype_ = device::OutputType::kUInt8;
  std::shared_ptr<datasets::Dataset> dataset_;
  loader::Mixing mixing_;      // weights and epoch_size as given
  struct CountsCache {
    int64_t epoch = 0;
    std::optional<sampler::EpochResume> resume;
    std::pair<std::vector<int64_t>, std::vector<int64_t>> counts;
  };
  std::optional<CountsCache> counts_cache_;  // source_counts' last answer
  int64_t epoch_samples_ = 0;  // loader::epoch_samples: the sampler's samples per epoch, all ranks
  // load_sample's reads of a dataset with a reader of its own (remote), one tag per call; null for
  // the others. Destroyed before the dataset.
  std::unique_ptr<datasets::SampleReader> sample_reader_;
  uint64_t sample_tags_ = 0;  // changed with the GIL held
  // The sampler's order (ResumedDistributedSampler's or ShardAwareSampler's); distributed_ holds
  // the DistributedSampler options both take, whose sizes and total_size they share.
  std::shared_ptr<sampler::ResumableSampler> sampler_;
  sampler::DistributedSamplerOptions distributed_;
  loader::ShuffleOrder shuffle_order_ = loader::ShuffleOrder::kExact;
  std::shared_ptr<loader::Loader> loader_;
  std::unique_ptr<device::CudaEngine> engine_;  // CUDA only; destroyed before loader_
  std::optional<loader::Batch> held_;                // taken by an interrupted next(): the next one's
  std::optional<device::EngineBatch> held_engine_;  // the same, CUDA; both destroyed first
};

/// Decodes a whole image (file path or bytes) to an [H, W, 3] uint8 capsule.
nb::object decode_image(nb::object source, bool apply_exif_orientation) {
  std::vector<uint8_t> bytes;
  std::string label;
  if (nb::isinstance<nb::bytes>(source) || PyByteArray_Check(source.ptr()) || PyMemoryView_Check(source.ptr())) {
    nb::bytes b(PyBytes_FromObject(source.ptr()), nb::detail::steal_t{});
    bytes.assign(static_cast<const uint8_t*>(b.data()), static_cast<const uint8_t*>(b.data()) + b.size());
    label = "<bytes>";
  } else {
    label = nb::cast<std::string>(nb::module_::import_("os").attr("fsdecode")(source));
  }
  decode::ImageBuffer image;
  {
    nb::gil_scoped_release nogil;
    if (label != "<bytes>") decode::read_file(label, bytes);
    decode::DecodeOptions options;
    options.apply_exif_orientation = apply_exif_orientation;
    decode::Decoder decoder;
    decoder.decode(bytes, label, options, image);
  }
  const auto h = static_cast<size_t>(image.height), w = static_cast<size_t>(image.width);
  auto pixels = std::make_unique<std::vector<uint8_t>>(h * w * 3);
  std::memcpy(pixels->data(), image.pixels.data(), h * w * 3);
  uint8_t* data = pixels->data();
  return tensor(data, {h, w, 3}, {}, nb::dtype<uint8_t>(), owner_of(std::move(pixels)));
}

/// `gpufeed inspect --json`'s document for `paths` (loader/inspect.h), as a JSON string.
std::string inspect_json(const std::vector<std::string>& paths, bool all_files, bool apply_exif_orientation,
                         bool strict, bool allow_truncated, int64_t max_pixels, const std::string& write_png) {
  pack::InspectOptions o;
  o.all_files = all_files;
  o.decode.apply_exif_orientation = apply_exif_orientation;
  o.decode.strict = strict;
  o.decode.allow_truncated = allow_truncated;
  if (max_pixels > 0) o.decode.max_pixels = max_pixels;
  o.write_png = write_png;
  nb::gil_scoped_release nogil;
  return pack::inspect_json(pack::inspect_paths(paths, o));
}

// The reported structs' field names (gpufeed/fields.h), for the tests that check each front.
nb::dict reported_fields() {
  nb::dict d;
  d["LoaderStats"] = field_names<loader::LoaderStats>();
  d["SlotCounts"] = field_names<loader::SlotCounts>();
  d["ThreadDecision"] = field_names<loader::ThreadDecision>();
  d["SkippedSample"] = field_names<loader::SkippedSample>();
  d["EpochSummary"] = field_names<loader::EpochSummary>();
  d["RemoteStats"] = field_names<datasets::RemoteStats>();
  d["Verdict"] = field_names<profiler::Verdict>();
  return d;
}

}  // namespace

std::shared_ptr<loader::Loader> loader_of(nb::handle py_loader) {
  return nb::cast<PyLoader&>(py_loader).shared_loader();
}

}  // namespace gpufeed::python

NB_MODULE(_C, m) {
  using namespace gpufeed::python;
  m.doc() = "gpufeed's C++ core; use the gpufeed package (gpufeed.DataLoader) rather than this module.";
  nb::register_exception_translator(translate_errors);
  nb::class_<PyLoader>(m, "_Loader")
      .def(nb::init<const std::vector<std::string>&, const std::map<std::string, gpufeed::options::Value>&,
                    const std::string&, const std::string&, bool, int64_t, int64_t, bool, bool, bool,
                    const std::vector<std::string>&, const std::vector<std::map<std::string, gpufeed::options::Value>>&,
                    const std::optional<std::vector<double>>&, std::optional<int64_t>>(),
           "paths"_a, "keywords"_a, "device"_a, "dtype"_a, "channels_last"_a, "rank"_a, "world_size"_a, "shuffle"_a,
           "sampler_drop_last"_a, "sample_only"_a, "extensions"_a, "view_rows"_a, "weights"_a.none() = nb::none(),
           "epoch_size"_a.none() = nb::none())
      .def("close", &PyLoader::close)
      .def("start_epoch", &PyLoader::start_epoch, "epoch"_a, "start_batch"_a)
      .def("next", &PyLoader::next, "slice_s"_a, "stream"_a = 0)
      .def("num_batches", &PyLoader::num_batches)
      .def("set_image_size", &PyLoader::set_image_size, "size"_a)
      .def("image_size", &PyLoader::image_size)
      .def("state", &PyLoader::state)
      .def("sampler_indices", &PyLoader::sampler_indices, "epoch"_a)
      .def("sampler_size", &PyLoader::sampler_size)
      .def("shuffle_order", &PyLoader::shuffle_order)
      .def("epoch_samples", &PyLoader::epoch_samples)
      .def("mixing_counts", &PyLoader::mixing_counts)
      .def("source_offsets", &PyLoader::source_offsets)
      .def("source_counts", &PyLoader::source_counts, "epoch"_a)
      .def("set_resume", &PyLoader::set_resume, "resume"_a.none())
      .def("consumed_after_batches", &PyLoader::consumed_after_batches, "list_world_size"_a, "start"_a,
           "world_size"_a, "rank"_a, "batches_consumed"_a)
      .def("classes", &PyLoader::classes)
      .def("samples", &PyLoader::samples)
      .def("stats", &PyLoader::stats)
      .def("epoch_summary", &PyLoader::epoch_summary)
      .def("views", &PyLoader::views)
      .def("load_sample", &PyLoader::load_sample, "index"_a, "epoch"_a, "size"_a);
  m.def("decode_image", &decode_image, "source"_a, "apply_exif_orientation"_a = false);
  m.def("cuda_available", &gpufeed::device::cuda_available);
  m.def("built_with_cuda", &gpufeed::device::built_with_cuda);
  m.def("normalize_constants", [](const std::array<float, 3>& mean, const std::array<float, 3>& std) {
    const gpufeed::device::NormalizeConstants c = gpufeed::device::normalize_constants({mean, std});
    return std::make_pair(std::array<float, 3>{c.scale[0], c.scale[1], c.scale[2]},
                          std::array<float, 3>{c.shift[0], c.shift[1], c.shift[2]});
  }, "mean"_a, "std"_a);
  m.def("inspect_json", &inspect_json, "paths"_a, "all_files"_a, "apply_exif_orientation"_a, "strict"_a,
        "allow_truncated"_a, "max_pixels"_a, "write_png"_a);
  m.def("option_specs", &option_specs);
  m.def(
      "views_preset",
      [](const std::string& name, int local_crops_number) {
        return view_dicts(gpufeed::transforms::views_preset(name, local_crops_number));
      },
      "name"_a, "local_crops_number"_a = -1);
  m.def("views_preset_names", [] { return gpufeed::transforms::views_preset_names(); });
  m.def("spell_options", [](const std::string& text) {
    return gpufeed::options::spell_options(text, gpufeed::options::Front::kPython);
  }, "text"_a);
  m.attr("IMAGE_EXTENSIONS") = gpufeed::datasets::default_image_extensions();
  m.attr("TORCHVISION_IMG_EXTENSIONS") = gpufeed::datasets::torchvision_image_extensions();
  m.attr("DEFAULT_MAX_PIXELS") = gpufeed::decode::DecodeOptions{}.max_pixels;
  m.def("_reported_fields", &reported_fields);
  bind_profiler(m);
}
