// GpuDecoder (gpufeed/device/gpu_decode.h): nvImageCodec's C API, opened with dlopen, so that
// neither the build's binaries nor the wheel depend on it: only a decode_device other than "cpu"
// needs the library, and its absence is a clear error then.
#include "gpufeed/device/gpu_decode.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nvimgcodec.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <string>

#include "cuda_check.h"
#include "gpufeed/device/engine.h"
#include "gpufeed/log.h"
#include "roi_resize.h"

namespace gpufeed::device {
namespace {

// The entry points GpuDecoder calls, resolved from the library at run time.
struct Api {
  void* handle = nullptr;
  std::string path;
#define GPUFEED_NVIMGCODEC_FN(name) decltype(&::name) name = nullptr;
  GPUFEED_NVIMGCODEC_FN(nvimgcodecGetProperties)
  GPUFEED_NVIMGCODEC_FN(nvimgcodecInstanceCreate)
  GPUFEED_NVIMGCODEC_FN(nvimgcodecInstanceDestroy)
  GPUFEED_NVIMGCODEC_FN(nvimgcodecDecoderCreate)
  GPUFEED_NVIMGCODEC_FN(nvimgcodecDecoderDestroy)
  GPUFEED_NVIMGCODEC_FN(nvimgcodecDecoderDecode)
  GPUFEED_NVIMGCODEC_FN(nvimgcodecCodeStreamCreateFromHostMem)
  GPUFEED_NVIMGCODEC_FN(nvimgcodecCodeStreamGetSubCodeStream)
  GPUFEED_NVIMGCODEC_FN(nvimgcodecCodeStreamGetImageInfo)
  GPUFEED_NVIMGCODEC_FN(nvimgcodecCodeStreamDestroy)
  GPUFEED_NVIMGCODEC_FN(nvimgcodecImageCreate)
  GPUFEED_NVIMGCODEC_FN(nvimgcodecImageDestroy)
  GPUFEED_NVIMGCODEC_FN(nvimgcodecFutureWaitForAll)
  GPUFEED_NVIMGCODEC_FN(nvimgcodecFutureGetProcessingStatus)
  GPUFEED_NVIMGCODEC_FN(nvimgcodecFutureDestroy)
#undef GPUFEED_NVIMGCODEC_FN
};

[[noreturn]] void missing(const std::string& what) {
  throw std::runtime_error("GPU decode needs nvImageCodec with its nvJPEG extension (pip install " +
                           std::string(kNvImageCodecPackage) + ", or gpufeed[gpu-decode]; or set " +
                           "GPUFEED_NVIMGCODEC_LIBRARY to libnvimgcodec.so.0): " + what);
}

// Opened once per process and kept: nvImageCodec's extensions stay loaded while any instance lives.
const Api& api() {
  static std::once_flag once;
  static Api a;
  static std::string error;
  std::call_once(once, [] {
    const std::string path = nvimgcodec_library();
    a.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (a.handle == nullptr) {
      const char* e = dlerror();
      error = "cannot load " + path + ": " + (e ? e : "unknown error");
      return;
    }
#define GPUFEED_NVIMGCODEC_SYM(name)                                             \
  a.name = reinterpret_cast<decltype(a.name)>(dlsym(a.handle, #name));           \
  if (a.name == nullptr) {                                                       \
    error = path + " has no " #name " (nvImageCodec 0.9 or newer is needed)";    \
    return;                                                                      \
  }
    GPUFEED_NVIMGCODEC_SYM(nvimgcodecGetProperties)
    GPUFEED_NVIMGCODEC_SYM(nvimgcodecInstanceCreate)
    GPUFEED_NVIMGCODEC_SYM(nvimgcodecInstanceDestroy)
    GPUFEED_NVIMGCODEC_SYM(nvimgcodecDecoderCreate)
    GPUFEED_NVIMGCODEC_SYM(nvimgcodecDecoderDestroy)
    GPUFEED_NVIMGCODEC_SYM(nvimgcodecDecoderDecode)
    GPUFEED_NVIMGCODEC_SYM(nvimgcodecCodeStreamCreateFromHostMem)
    GPUFEED_NVIMGCODEC_SYM(nvimgcodecCodeStreamGetSubCodeStream)
    GPUFEED_NVIMGCODEC_SYM(nvimgcodecCodeStreamGetImageInfo)
    GPUFEED_NVIMGCODEC_SYM(nvimgcodecCodeStreamDestroy)
    GPUFEED_NVIMGCODEC_SYM(nvimgcodecImageCreate)
    GPUFEED_NVIMGCODEC_SYM(nvimgcodecImageDestroy)
    GPUFEED_NVIMGCODEC_SYM(nvimgcodecFutureWaitForAll)
    GPUFEED_NVIMGCODEC_SYM(nvimgcodecFutureGetProcessingStatus)
    GPUFEED_NVIMGCODEC_SYM(nvimgcodecFutureDestroy)
#undef GPUFEED_NVIMGCODEC_SYM
    // The extensions (nvJPEG, libjpeg-turbo) live in extensions/ beside the library.
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(a.nvimgcodecInstanceCreate), &info) != 0 && info.dli_fname != nullptr) {
      a.path = std::filesystem::weakly_canonical(info.dli_fname).string();
    } else {
      a.path = path;
    }
  });
  if (!error.empty()) missing(error);
  return a;
}

const char* status_name(nvimgcodecStatus_t s) {
  switch (s) {
    case NVIMGCODEC_STATUS_SUCCESS: return "success";
    case NVIMGCODEC_STATUS_INVALID_PARAMETER: return "invalid parameter";
    case NVIMGCODEC_STATUS_BAD_CODESTREAM: return "bad code stream";
    case NVIMGCODEC_STATUS_CODESTREAM_UNSUPPORTED: return "code stream unsupported";
    case NVIMGCODEC_STATUS_ALLOCATOR_FAILURE: return "allocator failure";
    case NVIMGCODEC_STATUS_EXECUTION_FAILED: return "execution failed";
    case NVIMGCODEC_STATUS_ARCH_MISMATCH: return "architecture mismatch";
    case NVIMGCODEC_STATUS_MISSED_DEPENDENCIES: return "missing dependencies";
    default: return "error";
  }
}

// nvImageCodec's per-sample processing status in words.
std::string processing_reason(nvimgcodecProcessingStatus_t s) {
  switch (s) {
    case NVIMGCODEC_PROCESSING_STATUS_IMAGE_CORRUPTED: return "corrupt (nvImageCodec: image corrupted)";
    case NVIMGCODEC_PROCESSING_STATUS_CODEC_UNSUPPORTED: return "unsupported (nvImageCodec: codec unsupported)";
    case NVIMGCODEC_PROCESSING_STATUS_ENCODING_UNSUPPORTED: return "unsupported (nvImageCodec: JPEG encoding)";
    case NVIMGCODEC_PROCESSING_STATUS_BACKEND_UNSUPPORTED: return "unsupported (nvImageCodec: no allowed backend decodes it)";
    case NVIMGCODEC_PROCESSING_STATUS_RESOLUTION_UNSUPPORTED: return "unsupported (nvImageCodec: resolution)";
    case NVIMGCODEC_PROCESSING_STATUS_CODESTREAM_UNSUPPORTED: return "unsupported (nvImageCodec: code stream feature)";
    case NVIMGCODEC_PROCESSING_STATUS_COLOR_SPEC_UNSUPPORTED: return "unsupported (nvImageCodec: colour specification)";
    case NVIMGCODEC_PROCESSING_STATUS_ROI_UNSUPPORTED: return "unsupported (nvImageCodec: region of interest)";
    case NVIMGCODEC_PROCESSING_STATUS_SAMPLING_UNSUPPORTED: return "unsupported (nvImageCodec: chroma subsampling)";
    case NVIMGCODEC_PROCESSING_STATUS_SAMPLE_FORMAT_UNSUPPORTED: return "unsupported (nvImageCodec: sample format)";
    case NVIMGCODEC_PROCESSING_STATUS_NUM_CHANNELS_UNSUPPORTED: return "unsupported (nvImageCodec: channels)";
    default: return "failed (nvImageCodec processing status " + std::to_string(s) + ")";
  }
}

template <typename T>
T zeroed(nvimgcodecStructureType_t type) {
  T v;
  std::memset(&v, 0, sizeof(v));
  v.struct_type = type;
  v.struct_size = sizeof(T);
  return v;
}

// Handles of one decode() call, destroyed on every way out.
struct CallHandles {
  const Api& a;
  std::vector<nvimgcodecCodeStream_t> parents, streams;
  std::vector<nvimgcodecImage_t> images;
  nvimgcodecFuture_t future = nullptr;
  ~CallHandles() {
    if (future) a.nvimgcodecFutureDestroy(future);
    for (auto* i : images) a.nvimgcodecImageDestroy(i);
    for (auto* s : streams) a.nvimgcodecCodeStreamDestroy(s);
    for (auto* s : parents) a.nvimgcodecCodeStreamDestroy(s);
  }
};

}  // namespace

struct GpuDecoder::Impl {
  GpuDecoderOptions options;
  nvimgcodecInstance_t instance = nullptr;
  nvimgcodecDecoder_t decoder = nullptr;
  bool use_regions = true;  // region decode; off once nvImageCodec refused it and whole images worked
  std::vector<uint8_t> host_scratch, host_scratch_whole;  // kCpuOnly: the decoded pixels
  mutable std::mutex stats_mu;
  GpuDecodeStats stats;

  bool cpu_only() const { return options.device == kCpuOnly; }
};

GpuDecoder::GpuDecoder(GpuDecoderOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  const Api& a = api();
  if (options.device != kCpuOnly && !options.allocator) options.allocator = stream_ordered_allocator(options.device);
  m.options = std::move(options);
  m.use_regions = m.options.region_decode;
  const std::string ext_dir = (std::filesystem::path(a.path).parent_path() / "extensions").string();
  auto create = zeroed<nvimgcodecInstanceCreateInfo_t>(NVIMGCODEC_STRUCTURE_TYPE_INSTANCE_CREATE_INFO);
  create.load_builtin_modules = 1;
  create.load_extension_modules = 1;
  create.extension_modules_path = ext_dir.c_str();
  create.create_debug_messenger = 0;
  if (const nvimgcodecStatus_t s = a.nvimgcodecInstanceCreate(&m.instance, &create); s != NVIMGCODEC_STATUS_SUCCESS)
    missing(std::string("nvimgcodecInstanceCreate: ") + status_name(s));
  // The GPU path leaves the CPU backend out: what the GPU cannot decode comes back as failed, and
  // the loader's own CPU decode (the torchvision-exact one) takes it.
  std::vector<nvimgcodecBackend_t> backends;
  auto backend = [&](nvimgcodecBackendKind_t kind) {
    auto b = zeroed<nvimgcodecBackend_t>(NVIMGCODEC_STRUCTURE_TYPE_BACKEND);
    b.kind = kind;
    b.params = zeroed<nvimgcodecBackendParams_t>(NVIMGCODEC_STRUCTURE_TYPE_BACKEND_PARAMS);
    b.params.load_hint = 1.0f;
    b.params.load_hint_policy = NVIMGCODEC_LOAD_HINT_POLICY_FIXED;
    backends.push_back(b);
  };
  if (m.cpu_only()) {
    backend(NVIMGCODEC_BACKEND_KIND_CPU_ONLY);
  } else {
    backend(NVIMGCODEC_BACKEND_KIND_HW_GPU_ONLY);
    backend(NVIMGCODEC_BACKEND_KIND_GPU_ONLY);
    backend(NVIMGCODEC_BACKEND_KIND_HYBRID_CPU_GPU);
  }
  auto exec = zeroed<nvimgcodecExecutionParams_t>(NVIMGCODEC_STRUCTURE_TYPE_EXECUTION_PARAMS);
  exec.device_id = m.cpu_only() ? NVIMGCODEC_DEVICE_CPU_ONLY : m.options.device;
  exec.max_num_cpu_threads = std::max(1, m.options.max_cpu_threads);
  exec.num_backends = static_cast<int>(backends.size());
  exec.backends = backends.data();
  exec.pre_init = 1;
  std::unique_ptr<detail::DeviceGuard> guard;
  if (!m.cpu_only()) guard = std::make_unique<detail::DeviceGuard>(m.options.device);
  if (const nvimgcodecStatus_t s = a.nvimgcodecDecoderCreate(m.instance, &m.decoder, &exec, nullptr);
      s != NVIMGCODEC_STATUS_SUCCESS) {
    a.nvimgcodecInstanceDestroy(m.instance);
    missing(std::string("nvimgcodecDecoderCreate: ") + status_name(s) + " (extensions looked for in " + ext_dir + ")");
  }
}

GpuDecoder::~GpuDecoder() {
  Impl& m = *impl_;
  const Api& a = api();
  if (m.decoder) a.nvimgcodecDecoderDestroy(m.decoder);
  if (m.instance) a.nvimgcodecInstanceDestroy(m.instance);
}

// One nvImageCodec batch over some of the items (run_pass): each decoded either inside its region
// or whole, into one scratch allocation; results for them and, for the decoded ones, their resize
// jobs (src origin set by how they were decoded). `status[i]` keeps nvImageCodec's per-sample
// status (0 where the sample never reached the decoder).
struct GpuDecoder::Pass {
  std::vector<detail::RoiResizeJob> jobs;
  std::vector<nvimgcodecProcessingStatus_t> status;
  std::shared_ptr<DeviceBuffer> scratch;  // freed in the stream's order after the resize
};

std::vector<GpuDecodeResult> GpuDecoder::decode(std::span<const GpuDecodeItem> items, std::span<uint8_t* const> out,
                                                StreamHandle stream) {
  Impl& m = *impl_;
  if (out.size() != items.size()) throw std::invalid_argument("GpuDecoder::decode: one output row per item");
  std::vector<GpuDecodeResult> results(items.size());
  if (items.empty()) return results;
  std::unique_ptr<detail::DeviceGuard> guard;
  if (!m.cpu_only()) guard = std::make_unique<detail::DeviceGuard>(m.options.device);

  std::vector<size_t> all(items.size());
  for (size_t i = 0; i < items.size(); ++i) all[i] = i;
  std::vector<detail::RoiResizeJob> jobs;
  std::vector<Pass> passes;
  int64_t whole = 0;
  if (m.use_regions) {
    passes.push_back(run_pass(items, out, all, /*regions=*/true, stream, results));
    // Region decode refused (not a damaged file): those samples again, decoded whole and cropped by
    // the resize. Once that works where the region did not, every later call decodes whole images.
    std::vector<size_t> again;
    for (size_t i = 0; i < items.size(); ++i) {
      const nvimgcodecProcessingStatus_t st = passes[0].status[i];
      if (!results[i].ok && st != 0 && st != NVIMGCODEC_PROCESSING_STATUS_IMAGE_CORRUPTED) again.push_back(i);
    }
    if (!again.empty()) {
      const std::string first_reason = results[again[0]].reason;
      passes.push_back(run_pass(items, out, again, /*regions=*/false, stream, results));
      int64_t rescued = 0;
      for (size_t i : again) rescued += results[i].ok ? 1 : 0;
      whole += rescued;
      if (rescued > 0) {
        m.use_regions = false;
        gpufeed::log()->info("GPU decode: nvImageCodec refused region decode ({}); decoding whole images and "
                             "cropping in the resize from now on",
                             first_reason);
      }
    }
  } else {
    passes.push_back(run_pass(items, out, all, /*regions=*/false, stream, results));
    for (size_t i = 0; i < items.size(); ++i) whole += results[i].ok ? 1 : 0;
  }
  for (Pass& p : passes) jobs.insert(jobs.end(), p.jobs.begin(), p.jobs.end());

  int max_side = 0;
  for (const auto& j : jobs) max_side = std::max(max_side, j.out_size);
  if (m.cpu_only()) {
    for (const auto& j : jobs)
      for (int y = 0; y < j.out_size; ++y)
        for (int x = 0; x < j.out_size; ++x) detail::resize_pixel(j, x, y);
  } else if (!jobs.empty()) {
    const size_t job_bytes = jobs.size() * sizeof(detail::RoiResizeJob);
    std::shared_ptr<DeviceBuffer> dev_jobs = m.options.allocator->allocate(job_bytes, m.options.device, stream);
    // From pageable memory: returns once the bytes are staged, so `jobs` may go.
    detail::check(cudaMemcpyAsync(dev_jobs->data(), jobs.data(), job_bytes, cudaMemcpyHostToDevice,
                                  static_cast<cudaStream_t>(stream)),
                  "cudaMemcpyAsync (resize jobs)");
    detail::check(static_cast<cudaError_t>(detail::launch_roi_resize(static_cast<const detail::RoiResizeJob*>(dev_jobs->data()),
                                                                     static_cast<int>(jobs.size()), max_side, stream)),
                  "GPU decode resize kernel launch");
    // dev_jobs and the passes' scratch are freed in the stream's order, after the kernel.
  }

  std::lock_guard<std::mutex> lk(m.stats_mu);
  ++m.stats.calls;
  m.stats.whole_images += whole;
  for (size_t i = 0; i < items.size(); ++i) {
    if (results[i].ok) {
      ++m.stats.samples;
      m.stats.encoded_bytes += static_cast<int64_t>(items[i].size);
    } else {
      ++m.stats.failed;
    }
  }
  return results;
}

GpuDecoder::Pass GpuDecoder::run_pass(std::span<const GpuDecodeItem> items, std::span<uint8_t* const> out,
                                      const std::vector<size_t>& which, bool regions, StreamHandle stream,
                                      std::vector<GpuDecodeResult>& results) {
  Impl& m = *impl_;
  const Api& a = api();
  Pass pass;
  pass.status.assign(items.size(), 0);
  CallHandles h{a, {}, {}, {}, nullptr};
  struct Entry {
    size_t item;
    int w, h;          // the decoded rectangle's size
    int x0, y0;        // its corner in source pixels
    size_t offset = 0;
  };
  std::vector<Entry> entries;
  std::vector<nvimgcodecCodeStream_t> batch_streams;  // paired with h.images
  for (size_t i : which) {
    const GpuDecodeItem& it = items[i];
    results[i] = GpuDecodeResult{};
    nvimgcodecCodeStream_t parent = nullptr;
    nvimgcodecStatus_t s = a.nvimgcodecCodeStreamCreateFromHostMem(m.instance, &parent, it.data, it.size, nullptr);
    if (s != NVIMGCODEC_STATUS_SUCCESS) {
      if (parent) a.nvimgcodecCodeStreamDestroy(parent);
      results[i].reason = std::string("corrupt (nvImageCodec cannot parse it: ") + status_name(s) + ")";
      continue;
    }
    h.parents.push_back(parent);
    // Parsed here, so that a region's sub-stream takes over this parse (its header fields included).
    auto pinfo = zeroed<nvimgcodecImageInfo_t>(NVIMGCODEC_STRUCTURE_TYPE_IMAGE_INFO);
    if (const nvimgcodecStatus_t si = a.nvimgcodecCodeStreamGetImageInfo(parent, &pinfo); si != NVIMGCODEC_STATUS_SUCCESS) {
      results[i].reason = std::string("corrupt (nvImageCodec image info: ") + status_name(si) + ")";
      continue;
    }
    Entry e{i, it.roi.width, it.roi.height, it.roi.x, it.roi.y};
    nvimgcodecCodeStream_t decode_from = parent;
    if (regions) {
      auto view = zeroed<nvimgcodecCodeStreamView_t>(NVIMGCODEC_STRUCTURE_TYPE_CODE_STREAM_VIEW);
      view.region = zeroed<nvimgcodecRegion_t>(NVIMGCODEC_STRUCTURE_TYPE_REGION);
      view.region.ndim = 2;
      view.region.start[0] = it.roi.y;
      view.region.start[1] = it.roi.x;
      view.region.end[0] = it.roi.y + it.roi.height;
      view.region.end[1] = it.roi.x + it.roi.width;
      nvimgcodecCodeStream_t sub = nullptr;
      s = a.nvimgcodecCodeStreamGetSubCodeStream(parent, &sub, &view);
      if (s != NVIMGCODEC_STATUS_SUCCESS) {
        if (sub) a.nvimgcodecCodeStreamDestroy(sub);
        results[i].reason = std::string("unsupported (nvImageCodec region: ") + status_name(s) + ")";
        pass.status[i] = NVIMGCODEC_PROCESSING_STATUS_ROI_UNSUPPORTED;
        continue;
      }
      h.streams.push_back(sub);
      decode_from = sub;
    } else {
      e.w = static_cast<int>(pinfo.plane_info[0].width);
      e.h = static_cast<int>(pinfo.plane_info[0].height);
      e.x0 = e.y0 = 0;
    }
    entries.push_back(e);
    batch_streams.push_back(decode_from);
  }

  // One scratch allocation for the pass: offsets first.
  size_t total = 0;
  for (Entry& e : entries) {
    e.offset = total;
    total += static_cast<size_t>(e.w) * e.h * 3;
    total = (total + 255) & ~size_t{255};
  }
  uint8_t* base = nullptr;
  if (m.cpu_only()) {
    auto& buf = regions ? m.host_scratch : m.host_scratch_whole;
    if (buf.size() < total) buf.resize(total);
    base = buf.data();
  } else if (total > 0) {
    pass.scratch = m.options.allocator->allocate(total, m.options.device, stream);
    base = static_cast<uint8_t*>(pass.scratch->data());
  }

  std::vector<Entry> decoded;  // entries whose image was created, paired with batch entries
  std::vector<nvimgcodecCodeStream_t> streams;
  for (size_t k = 0; k < entries.size(); ++k) {
    const Entry& e = entries[k];
    // Interleaved 8-bit sRGB, whatever the stream holds (grey is replicated, as PIL's convert("RGB")).
    auto out_info = zeroed<nvimgcodecImageInfo_t>(NVIMGCODEC_STRUCTURE_TYPE_IMAGE_INFO);
    out_info.color_spec = NVIMGCODEC_COLORSPEC_SRGB;
    out_info.chroma_subsampling = NVIMGCODEC_SAMPLING_444;
    out_info.sample_format = NVIMGCODEC_SAMPLEFORMAT_I_RGB;
    out_info.orientation = zeroed<nvimgcodecOrientation_t>(NVIMGCODEC_STRUCTURE_TYPE_ORIENTATION);
    out_info.num_planes = 1;
    out_info.plane_info[0] = zeroed<nvimgcodecImagePlaneInfo_t>(NVIMGCODEC_STRUCTURE_TYPE_IMAGE_PLANE_INFO);
    out_info.plane_info[0].width = static_cast<uint32_t>(e.w);
    out_info.plane_info[0].height = static_cast<uint32_t>(e.h);
    out_info.plane_info[0].row_stride = static_cast<size_t>(e.w) * 3;
    out_info.plane_info[0].num_channels = 3;
    out_info.plane_info[0].sample_type = NVIMGCODEC_SAMPLE_DATA_TYPE_UINT8;
    out_info.plane_info[0].precision = 8;
    out_info.buffer = base + e.offset;
    out_info.buffer_kind = m.cpu_only() ? NVIMGCODEC_IMAGE_BUFFER_KIND_STRIDED_HOST : NVIMGCODEC_IMAGE_BUFFER_KIND_STRIDED_DEVICE;
    out_info.cuda_stream = m.cpu_only() ? nullptr : static_cast<cudaStream_t>(stream);
    nvimgcodecImage_t image = nullptr;
    if (const nvimgcodecStatus_t si = a.nvimgcodecImageCreate(m.instance, &image, &out_info); si != NVIMGCODEC_STATUS_SUCCESS) {
      results[e.item].reason = std::string("unsupported (nvImageCodec output image: ") + status_name(si) + ")";
      continue;
    }
    h.images.push_back(image);
    streams.push_back(batch_streams[k]);
    decoded.push_back(e);
  }
  if (decoded.empty()) return pass;

  auto params = zeroed<nvimgcodecDecodeParams_t>(NVIMGCODEC_STRUCTURE_TYPE_DECODE_PARAMS);
  params.apply_exif_orientation = 0;  // the plan is made in the stored frame (loader::plan_for)
  nvimgcodecStatus_t s = a.nvimgcodecDecoderDecode(m.decoder, streams.data(), h.images.data(),
                                                    static_cast<int>(streams.size()), &params, &h.future);
  if (s != NVIMGCODEC_STATUS_SUCCESS) throw std::runtime_error(std::string("nvimgcodecDecoderDecode: ") + status_name(s));
  if ((s = a.nvimgcodecFutureWaitForAll(h.future)) != NVIMGCODEC_STATUS_SUCCESS)
    throw std::runtime_error(std::string("nvimgcodecFutureWaitForAll: ") + status_name(s));
  std::vector<nvimgcodecProcessingStatus_t> status(decoded.size());
  size_t count = status.size();
  if ((s = a.nvimgcodecFutureGetProcessingStatus(h.future, status.data(), &count)) != NVIMGCODEC_STATUS_SUCCESS)
    throw std::runtime_error(std::string("nvimgcodecFutureGetProcessingStatus: ") + status_name(s));
  for (size_t k = 0; k < decoded.size(); ++k) {
    const Entry& e = decoded[k];
    const size_t i = e.item;
    pass.status[i] = k < count ? status[k] : static_cast<nvimgcodecProcessingStatus_t>(NVIMGCODEC_PROCESSING_STATUS_FAIL);
    if (pass.status[i] != NVIMGCODEC_PROCESSING_STATUS_SUCCESS) {
      results[i].reason = k < count ? processing_reason(status[k]) : "failed (no status from nvImageCodec)";
      continue;
    }
    const GpuDecodeItem& it = items[i];
    detail::RoiResizeJob j;
    j.src = base + e.offset;
    j.src_stride = static_cast<int64_t>(e.w) * 3;
    j.src_x = e.x0;
    j.src_y = e.y0;
    j.roi_x = it.roi.x;
    j.roi_y = it.roi.y;
    j.roi_w = it.roi.width;
    j.roi_h = it.roi.height;
    j.rx0 = static_cast<float>(it.region.x0);
    j.ry0 = static_cast<float>(it.region.y0);
    j.rw = static_cast<float>(it.region.width());
    j.rh = static_cast<float>(it.region.height());
    j.out_size = it.output_size;
    j.flip = it.flip ? 1 : 0;
    j.bicubic = it.filter == transforms::ResizeFilter::kBicubic ? 1 : 0;
    j.dst = out[i];
    pass.jobs.push_back(j);
    results[i].ok = true;
  }
  return pass;
}

const GpuDecoderOptions& GpuDecoder::options() const { return impl_->options; }

GpuDecodeStats GpuDecoder::stats() const {
  std::lock_guard<std::mutex> lk(impl_->stats_mu);
  return impl_->stats;
}

bool built_with_gpu_decode() { return true; }

}  // namespace gpufeed::device
