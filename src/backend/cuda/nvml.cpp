// NVML loaded at run time: see nvml.hpp. Loaded and initialised once per process,
// never unloaded (nvmlShutdown at exit could race with other users of NVML).
#include "backend/cuda/nvml.hpp"

#include <dlfcn.h>

#include <cstdint>
#include <mutex>

namespace reservoir::detail::cuda {

namespace {

// The few NVML types used, as nvml.h declares them (ABI-stable since NVML 2).
using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr nvmlReturn_t kNvmlInsufficientSize = 7;
constexpr unsigned long long kNvmlValueNotAvailable = ~0ull;
struct ProcessInfoV1 {  // nvmlProcessInfo_v1_t, what the unversioned symbol fills
  unsigned int pid;
  unsigned long long usedGpuMemory;
};

struct Nvml {
  nvmlReturn_t (*init)() = nullptr;
  const char* (*error_string)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*by_pci)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*processes)(nvmlDevice_t, unsigned int*, ProcessInfoV1*) = nullptr;
  bool ok = false;
  std::string why;

  std::string describe(nvmlReturn_t r) const {
    const char* text = error_string ? error_string(r) : nullptr;
    return "NVML error " + std::to_string(r) + (text ? std::string(": ") + text : "");
  }
};

template <typename F>
bool resolve(void* lib, const char* name, F* fn, std::string* why) {
  *fn = reinterpret_cast<F>(dlsym(lib, name));
  if (*fn == nullptr) *why = std::string("NVML is unavailable: libnvidia-ml.so.1 lacks ") + name;
  return *fn != nullptr;
}

void load(Nvml& n) {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = dlerror();
    n.why = std::string("NVML is unavailable: dlopen(\"libnvidia-ml.so.1\") failed: ") +
            (err ? err : "unknown error");
    return;
  }
  if (!resolve(lib, "nvmlInit_v2", &n.init, &n.why) ||
      !resolve(lib, "nvmlErrorString", &n.error_string, &n.why) ||
      !resolve(lib, "nvmlDeviceGetHandleByPciBusId_v2", &n.by_pci, &n.why) ||
      !resolve(lib, "nvmlDeviceGetComputeRunningProcesses", &n.processes, &n.why))
    return;
  if (nvmlReturn_t r = n.init(); r != kNvmlSuccess) {
    n.why = "NVML is unavailable: nvmlInit failed: " + n.describe(r);
    return;
  }
  n.ok = true;
}

const Nvml& nvml() {
  static Nvml n;
  static std::once_flag once;
  std::call_once(once, [] { load(n); });
  return n;
}

}  // namespace

bool nvml_processes(const std::string& pci_bus_id, std::vector<ProcessMemory>* out,
                    std::string* why) {
  const Nvml& n = nvml();
  if (!n.ok) {
    *why = n.why;
    return false;
  }
  nvmlDevice_t device = nullptr;
  if (nvmlReturn_t r = n.by_pci(pci_bus_id.c_str(), &device); r != kNvmlSuccess) {
    *why = "NVML does not know the device at PCI " + pci_bus_id + ": " + n.describe(r);
    return false;
  }
  std::vector<ProcessInfoV1> procs(8);
  unsigned int count = static_cast<unsigned int>(procs.size());
  nvmlReturn_t r;
  while ((r = n.processes(device, &count, procs.data())) == kNvmlInsufficientSize) {
    procs.resize(count + 4);  // processes may start meanwhile
    count = static_cast<unsigned int>(procs.size());
  }
  if (r != kNvmlSuccess) {
    *why = "nvmlDeviceGetComputeRunningProcesses failed: " + n.describe(r);
    return false;
  }
  out->clear();
  for (unsigned int i = 0; i < count; ++i) {
    const auto used = procs[i].usedGpuMemory;
    out->push_back(ProcessMemory{procs[i].pid, used == kNvmlValueNotAvailable
                                                   ? UINT64_MAX
                                                   : static_cast<std::uint64_t>(used)});
  }
  return true;
}

}  // namespace reservoir::detail::cuda
