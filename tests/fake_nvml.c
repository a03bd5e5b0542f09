/* A stand-in for libnvidia-ml.so.1 with fixed readings, so the NVML sampler's dlopen path, entry
 * points and parsing are tested on machines without a GPU (test_profiler.cpp). The signatures are
 * NVML's (API version 12); the one device answers to index 0 and PCI bus id 00000000:3b:00.0. */
#include <string.h>

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st* nvmlDevice_t;
typedef struct {
  unsigned int gpu, memory;
} nvmlUtilization_t;
typedef struct {
  unsigned long long total, free, used;
} nvmlMemory_t;

static int the_device;
static int initialised;

nvmlReturn_t nvmlInit_v2(void) {
  initialised = 1;
  return 0;
}
nvmlReturn_t nvmlShutdown(void) {
  initialised = 0;
  return 0;
}
const char* nvmlErrorString(nvmlReturn_t rc) { return rc == 6 ? "Not Found" : "Unknown Error"; }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  if (!initialised) return 1; /* NVML_ERROR_UNINITIALIZED */
  if (index != 0) return 2;   /* NVML_ERROR_INVALID_ARGUMENT */
  *device = (nvmlDevice_t)&the_device;
  return 0;
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char* bus, nvmlDevice_t* device) {
  if (!initialised) return 1;
  if (strcmp(bus, "00000000:3b:00.0") != 0) return 6; /* NVML_ERROR_NOT_FOUND */
  *device = (nvmlDevice_t)&the_device;
  return 0;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t* u) {
  if (device != (nvmlDevice_t)&the_device) return 2;
  u->gpu = 42;
  u->memory = 17;
  return 0;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* m) {
  if (device != (nvmlDevice_t)&the_device) return 2;
  m->total = 8ull << 30;
  m->used = 3ull << 30;
  m->free = m->total - m->used;
  return 0;
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned int* mhz) {
  if (device != (nvmlDevice_t)&the_device) return 2;
  *mhz = type == 1 ? 1410u : type == 2 ? 2619u : 1200u; /* SM, memory, graphics */
  return 0;
}
