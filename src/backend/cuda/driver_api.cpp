// Loads libcuda.so.1 once per process and resolves the driver entry points.
#include "backend/cuda/driver_api.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <mutex>

namespace reservoir::detail::cuda {

namespace {

// The ABI every entry point is resolved at: the signatures in DriverApi are those of
// CUDA 12.0 (identical back to 11.3 for the calls used here).
constexpr int kAbiVersion = 12000;
// cuGetProcAddress first appeared in CUDA 11.3.
constexpr int kMinDriverVersion = 11030;

// cuGetProcAddress_v2 (CUDA 12.0+) reports why a symbol is missing; the original
// (11.3+) does not. Both are looked up by name with dlsym, so declare them here.
using GetProcAddressV2 = CUresult (*)(const char*, void**, int, cuuint64_t,
                                      CUdriverProcAddressQueryResult*);
using GetProcAddressV1 = CUresult (*)(const char*, void**, int, cuuint64_t);

struct Loaded {
  DriverApi api;
  bool ok = false;
  std::string why;
};

std::string version_string(int v) {
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

void load(Loaded& out) {
  // RTLD_LOCAL: the symbols stay private to us; the runtime (libcudart) opens the same
  // library itself and gets the same instance.
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = dlerror();
    out.why = std::string("cannot load the CUDA driver: dlopen(\"libcuda.so.1\") failed: ") +
              (err ? err : "unknown error") + " (is the NVIDIA driver installed?)";
    return;
  }
  auto v2 = reinterpret_cast<GetProcAddressV2>(dlsym(lib, "cuGetProcAddress_v2"));
  auto v1 = v2 ? nullptr : reinterpret_cast<GetProcAddressV1>(dlsym(lib, "cuGetProcAddress"));
  if (v2 == nullptr && v1 == nullptr) {
    out.why =
        "the CUDA driver is too old: libcuda.so.1 has no cuGetProcAddress (driver for CUDA 11.3 "
        "or newer needed)";
    return;
  }
  auto resolve = [&](const char* name, int version, void** fn) -> bool {
    *fn = nullptr;
    CUresult r = v2 ? v2(name, fn, version, CU_GET_PROC_ADDRESS_DEFAULT, nullptr)
                    : v1(name, fn, version, CU_GET_PROC_ADDRESS_DEFAULT);
    return r == CUDA_SUCCESS && *fn != nullptr;
  };

  // The driver's version decides the ABI to ask for: asking a driver for a version
  // newer than itself fails.
  DriverApi& api = out.api;
  if (!resolve("cuDriverGetVersion", 2020, reinterpret_cast<void**>(&api.DriverGetVersion)) ||
      api.DriverGetVersion(&api.driver_version) != CUDA_SUCCESS) {
    out.why = "the CUDA driver does not report its version (cuDriverGetVersion failed)";
    return;
  }
  if (api.driver_version < kMinDriverVersion) {
    out.why = "the CUDA driver is too old: it supports CUDA " + version_string(api.driver_version) +
              "; CUDA 11.3 or newer is needed";
    return;
  }
  api.abi_version = std::min(api.driver_version, kAbiVersion);

#define RESERVOIR_CUDA_RESOLVE(field, symbol)                                                      \
  if (!resolve("cu" #field, api.abi_version, reinterpret_cast<void**>(&api.field))) {              \
    out.why = "the CUDA driver (CUDA " + version_string(api.driver_version) + ") lacks cu" #field; \
    return;                                                                                        \
  }
  RESERVOIR_CUDA_DRIVER_API(RESERVOIR_CUDA_RESOLVE)
#undef RESERVOIR_CUDA_RESOLVE
  if (api.abi_version == kAbiVersion) {  // optional: their absence leaves them null
    if (!resolve("cuStreamGetCaptureInfo", kAbiVersion,
                 reinterpret_cast<void**>(&api.StreamGetCaptureInfo)) ||
        !resolve("cuGraphNodeGetDependencies", kAbiVersion,
                 reinterpret_cast<void**>(&api.GraphNodeGetDependencies))) {
      api.StreamGetCaptureInfo = nullptr;
      api.GraphNodeGetDependencies = nullptr;
    }
  }

  CUresult r = api.Init(0);
  if (r == CUDA_ERROR_NO_DEVICE) {
    // A driver without devices is usable: device_count() reports 0.
    api.has_device = false;
    api.init_error = "cuInit: " + describe(api, r);
  } else if (r != CUDA_SUCCESS) {
    out.why = "the CUDA driver failed to initialise: cuInit: " + describe(api, r);
    return;
  } else {
    api.has_device = true;
  }
  out.ok = true;
  // lib is never closed: function pointers into it live as long as the process.
}

}  // namespace

const DriverApi* driver(std::string* why) {
  static Loaded loaded;
  static std::once_flag once;
  std::call_once(once, [] { load(loaded); });
  if (!loaded.ok) {
    if (why) *why = loaded.why;
    return nullptr;
  }
  return &loaded.api;
}

std::string describe(const DriverApi& api, CUresult result) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (api.GetErrorName == nullptr || api.GetErrorName(result, &name) != CUDA_SUCCESS)
    name = nullptr;
  if (api.GetErrorString == nullptr || api.GetErrorString(result, &text) != CUDA_SUCCESS)
    text = nullptr;
  std::string out = name ? name : "CUDA error " + std::to_string(static_cast<int>(result));
  out += ": ";
  out += text ? text : "unknown error";
  return out;
}

}  // namespace reservoir::detail::cuda
