// CudaBackend: the device seam over the CUDA driver API (loaded by driver_api.cpp).
#include "reservoir/cuda_backend.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/capture_order.hpp"
#include "backend/cuda/driver_api.hpp"
#include "backend/cuda/nvml.hpp"
#include "reservoir/errors.hpp"

namespace reservoir {

namespace {

using detail::cuda::DriverApi;

constexpr std::uintptr_t kSegmentAlignment = 512;
constexpr std::uintptr_t kLargeAlignment = std::uintptr_t{2} << 20;

static_assert(sizeof(CUipcMemHandle) == sizeof(IpcHandle::bytes), "IPC handle size");
static_assert(sizeof(CUmemGenericAllocationHandle) <= sizeof(PhysicalHandle), "handle size");

CUdeviceptr to_dptr(const void* p) {
  return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p));
}
void* to_ptr(CUdeviceptr d) {
  return reinterpret_cast<void*>(static_cast<std::uintptr_t>(d));
}
CUstream to_stream(StreamHandle s) {
  return reinterpret_cast<CUstream>(s);
}
CUevent to_event(EventHandle e) {
  return reinterpret_cast<CUevent>(e);
}
// The calls that allocate or map memory are refused on a thread whose stream-capture
// mode is global or thread-local while a CUDA graph capture is under way; PyTorch's
// allocator makes them in relaxed mode (what is allocated during a capture belongs to
// the graph's pool), and so does this guard, restoring the thread's mode after.
class RelaxedCapture {
 public:
  explicit RelaxedCapture(const DriverApi* api) : api_(api) {
    exchanged_ = api_->ThreadExchangeStreamCaptureMode(&mode_) == CUDA_SUCCESS;
  }
  ~RelaxedCapture() {
    if (exchanged_) (void)api_->ThreadExchangeStreamCaptureMode(&mode_);
  }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  const DriverApi* api_;
  CUstreamCaptureMode mode_ = CU_STREAM_CAPTURE_MODE_RELAXED;
  bool exchanged_ = false;
};

// RESERVOIR_FABRIC_HANDLES=1: physical pages are also exportable as fabric handles
// (multi-node NVLink; needs an IMEX channel).
bool fabric_requested() {
  const char* v = std::getenv("RESERVOIR_FABRIC_HANDLES");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

std::string hex(const void* p) {
  char buf[2 + 2 * sizeof(void*) + 1];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

// Makes a context current for the scope's lifetime and puts the caller's back after.
// When the thread had no context, the new one stays current (the runtime does the
// same on first use), which saves two calls on every later operation of that thread.
class ContextScope {
 public:
  explicit ContextScope(const DriverApi& api) : api_(api) {}
  ~ContextScope() {
    if (restore_) api_.CtxSetCurrent(previous_);
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

  CUresult enter(CUcontext ctx) {
    CUcontext current = nullptr;
    CUresult r = api_.CtxGetCurrent(&current);
    if (r != CUDA_SUCCESS || current == ctx) return r;
    r = api_.CtxSetCurrent(ctx);
    if (r == CUDA_SUCCESS && current != nullptr) {
      previous_ = current;
      restore_ = true;
    }
    return r;
  }

 private:
  const DriverApi& api_;
  CUcontext previous_ = nullptr;
  bool restore_ = false;
};

// What available() answers, computed once per process.
struct Availability {
  bool available = false;
  std::string reason;
};

const Availability& availability() {
  static const Availability answer = [] {
    Availability a;
    try {
      std::string why;
      const DriverApi* api = detail::cuda::driver(&why);
      if (api == nullptr) {
        a.reason = why;
      } else if (!api->has_device) {
        a.reason = "the CUDA driver reports no device (" + api->init_error + ")";
      } else {
        int count = 0;
        CUresult r = api->DeviceGetCount(&count);
        if (r != CUDA_SUCCESS) {
          a.reason = "cuDeviceGetCount: " + detail::cuda::describe(*api, r);
        } else if (count <= 0) {
          a.reason = "the CUDA driver reports no device (cuDeviceGetCount: 0)";
        } else {
          a.available = true;
        }
      }
    } catch (const std::exception& e) {
      a.reason = std::string("CUDA driver check failed: ") + e.what();
    }
    return a;
  }();
  return answer;
}

}  // namespace

struct CudaBackend::State {
  const DriverApi* api = nullptr;
  int count = 0;
  std::vector<CUdevice> devices;  // by ordinal
  std::vector<char> vmm;          // virtual memory management supported
  std::vector<char> posix_fd;     // cuMemCreate can request POSIX fd handles
  std::vector<char> fabric;       // ... and fabric handles
  // cuMemCreate refused fabric handles on the device (no IMEX channel): not asked again.
  std::unique_ptr<std::atomic<bool>[]> fabric_refused;
  std::uint32_t caps = 0;
  detail::cuda::CaptureOrder capture_order;
  // Primary contexts, retained on first use. Read without the lock on every call.
  std::unique_ptr<std::atomic<CUcontext>[]> contexts;
  std::mutex retain_mutex;
  // A non-blocking stream per device for copy_to_host / copy_to_device, so that a copy
  // waits for itself only, not for the whole context. Made on first use (under
  // retain_mutex, in the device's context), destroyed with the backend.
  std::unique_ptr<std::atomic<CUstream>[]> copy_streams;

  // The handle in slot, made by make(&handle) on first use: read without the lock once
  // made, made once under retain_mutex.
  template <class Handle, class Make>
  CUresult made_once(std::atomic<Handle>& slot, Handle* out, Make&& make) {
    Handle h = slot.load(std::memory_order_acquire);
    if (h == nullptr) {
      std::lock_guard<std::mutex> lock(retain_mutex);
      h = slot.load(std::memory_order_relaxed);
      if (h == nullptr) {
        if (CUresult r = make(&h); r != CUDA_SUCCESS) return r;
        slot.store(h, std::memory_order_release);
      }
    }
    *out = h;
    return CUDA_SUCCESS;
  }

  // The device's copy stream; its context is current (drive's call).
  CUresult copy_stream(int device, CUstream* out) {
    return made_once(copy_streams[device], out,
                     [&](CUstream* c) { return api->StreamCreate(c, CU_STREAM_NON_BLOCKING); });
  }

  // "<call> on device N: CUDA_ERROR_X: text", recorded for last_error().
  DeviceStatus error(CUresult r, const std::string& call, int device) const {
    return CudaBackend::fail(DeviceStatus::error, call + " on device " + std::to_string(device) +
                                                      ": " + detail::cuda::describe(*api, r));
  }

  DeviceStatus check_device(int device, const char* call) const {
    if (device >= 0 && device < count) return DeviceStatus::ok;
    return CudaBackend::fail(DeviceStatus::error, std::string(call) + ": invalid device " +
                                                      std::to_string(device) + " (" +
                                                      std::to_string(count) + " CUDA devices)");
  }

  DeviceStatus primary_context(int device, CUcontext* ctx) {
    const CUresult r = made_once(contexts[device], ctx, [&](CUcontext* c) {
      return api->DevicePrimaryCtxRetain(c, devices[device]);
    });
    return r == CUDA_SUCCESS ? DeviceStatus::ok : error(r, "cuDevicePrimaryCtxRetain", device);
  }

  // Validates device and makes its primary context current within scope.
  DeviceStatus enter(int device, ContextScope& scope, const char* call) {
    if (DeviceStatus st = check_device(device, call); st != DeviceStatus::ok) return st;
    CUcontext ctx = nullptr;
    if (DeviceStatus st = primary_context(device, &ctx); st != DeviceStatus::ok) return st;
    CUresult r = scope.enter(ctx);
    if (r != CUDA_SUCCESS)
      return error(r, std::string("cuCtxSetCurrent (for ") + call + ")", device);
    return DeviceStatus::ok;
  }

  // The one shape of every driver call: validate the device (and its VMM support when
  // asked), make its primary context current for the call, run call() (a CUresult),
  // and turn a failure into a status whose message describe() builds (only then).
  // The result `soft` is answered as soft_status instead of an error (out of memory,
  // not ready).
  template <typename Call, typename Describe>
  DeviceStatus drive(int device, const char* name, bool needs_vmm, Call&& call, Describe&& describe,
                     CUresult soft = CUDA_SUCCESS, DeviceStatus soft_status = DeviceStatus::ok) {
    ContextScope scope(*api);
    if (DeviceStatus st = enter(device, scope, name); st != DeviceStatus::ok) return st;
    if (needs_vmm && !vmm[device]) return no_vmm(device, name);
    const CUresult r = call();
    if (r == CUDA_SUCCESS) return DeviceStatus::ok;
    if (soft != CUDA_SUCCESS && r == soft) return soft_status;
    return error(r, describe(), device);
  }
  template <typename Call>
  DeviceStatus drive(int device, const char* name, bool needs_vmm, Call&& call) {
    return drive(device, name, needs_vmm, std::forward<Call>(call),
                 [name] { return std::string(name); });
  }

  // copy_to_host (to_host) or copy_to_device: an asynchronous copy on the device's copy
  // stream, then a wait for that stream alone (which also covers a copy from pageable
  // memory returning once staged). Not ordered after other work: the caller has
  // synchronized whatever used the memory.
  DeviceStatus host_copy(int device, bool to_host, void* dst, const void* src, std::size_t bytes) {
    const char* call = to_host ? "cuMemcpyDtoHAsync" : "cuMemcpyHtoDAsync";
    enum Step { stream, copy, wait } step = stream;
    return drive(
        device, call, false,
        [&] {
          CUstream st = nullptr;
          CUresult r = copy_stream(device, &st);
          if (r != CUDA_SUCCESS) return r;
          step = copy;
          r = to_host ? api->MemcpyDtoHAsync(dst, to_dptr(src), bytes, st)
                      : api->MemcpyHtoDAsync(to_dptr(dst), src, bytes, st);
          if (r != CUDA_SUCCESS) return r;
          step = wait;
          return api->StreamSynchronize(st);
        },
        [&] {
          const std::string what = std::string(call) + "(" + hex(dst) + " <- " + hex(src) + ", " +
                                   std::to_string(bytes) + " bytes)";
          if (step == stream) return "cuStreamCreate (a copy stream) for " + what;
          return step == copy ? what : "cuStreamSynchronize (the copy stream) after " + what;
        });
  }

  DeviceStatus no_vmm(int device, const char* call) const {
    return CudaBackend::fail(DeviceStatus::unsupported,
                             std::string(call) + ": device " + std::to_string(device) +
                                 " does not support CUDA virtual memory management");
  }

  CUmemAllocationProp physical_properties(int device) const {
    CUmemAllocationProp prop;
    std::memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = devices[device];
    // Exportable as a file descriptor (and a fabric handle where the system allows)
    // so that IPC of expandable segments works; only what the device supports, else
    // cuMemCreate would refuse.
    unsigned types = posix_fd[device] ? unsigned{CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR} : 0u;
    if (wants_fabric(device)) types |= CU_MEM_HANDLE_TYPE_FABRIC;
    prop.requestedHandleTypes = static_cast<CUmemAllocationHandleType>(types);
    return prop;
  }
  // Read/write access descriptors for devices[0..count), checked.
  DeviceStatus access(const char* call, const int* devices, int count,
                      std::vector<CUmemAccessDesc>* desc) const {
    if (count < 0 || (count > 0 && devices == nullptr))
      return CudaBackend::fail(DeviceStatus::error, std::string(call) + ": bad device list");
    desc->assign(static_cast<std::size_t>(count), CUmemAccessDesc{});
    for (int i = 0; i < count; ++i) {
      if (DeviceStatus st = check_device(devices[i], call); st != DeviceStatus::ok) return st;
      (*desc)[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      (*desc)[i].location.id = this->devices[devices[i]];
      (*desc)[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
    return DeviceStatus::ok;
  }
  bool wants_fabric(int device) const {
    return fabric[device] && !fabric_refused[device].load(std::memory_order_relaxed);
  }
};

bool CudaBackend::available() noexcept {
  return availability().available;
}

std::string CudaBackend::unavailable_reason() {
  return availability().reason;
}

CudaBackend::CudaBackend() : state_(std::make_unique<State>()) {
  State& s = *state_;
  std::string why;
  s.api = detail::cuda::driver(&why);
  if (s.api == nullptr) throw DeviceError("CUDA backend unavailable: " + why);
  const DriverApi& api = *s.api;
  if (api.has_device) {
    CUresult r = api.DeviceGetCount(&s.count);
    if (r != CUDA_SUCCESS)
      throw DeviceError("CUDA backend unavailable: cuDeviceGetCount: " +
                        detail::cuda::describe(api, r));
  }
  s.devices.resize(s.count);
  s.vmm.resize(s.count);
  s.posix_fd.resize(s.count);
  s.fabric.resize(s.count);
  s.fabric_refused = std::make_unique<std::atomic<bool>[]>(s.count > 0 ? s.count : 1);
  s.contexts = std::make_unique<std::atomic<CUcontext>[]>(s.count > 0 ? s.count : 1);
  s.copy_streams = std::make_unique<std::atomic<CUstream>[]>(s.count > 0 ? s.count : 1);
  bool all_vmm = s.count > 0, all_fd = s.count > 0, all_fabric = s.count > 0,
       all_pools = s.count > 0;
  for (int i = 0; i < s.count; ++i) {
    CUresult r = api.DeviceGet(&s.devices[i], i);
    if (r != CUDA_SUCCESS)
      throw DeviceError("CUDA backend unavailable: cuDeviceGet(" + std::to_string(i) +
                        "): " + detail::cuda::describe(api, r));
    int value = 0;
    s.vmm[i] = static_cast<char>(
        api.DeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                               s.devices[i]) == CUDA_SUCCESS &&
        value != 0);
    value = 0;
    s.posix_fd[i] = static_cast<char>(
        api.DeviceGetAttribute(&value,
                               CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                               s.devices[i]) == CUDA_SUCCESS &&
        value != 0);
    auto attribute = [&](CUdevice_attribute a) {
      int v = 0;
      return api.DeviceGetAttribute(&v, a, s.devices[i]) == CUDA_SUCCESS && v != 0;
    };
    // Fabric handles only on request (RESERVOIR_FABRIC_HANDLES=1): without an IMEX
    // channel cuMemCreate refuses them, and a refused call is an API error that
    // tools like compute-sanitizer report (docs/ipc.md).
    s.fabric[i] = static_cast<char>(fabric_requested() &&
                                    attribute(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED));
    s.fabric_refused[i].store(false);
    all_vmm = all_vmm && s.vmm[i];
    all_fd = all_fd && s.posix_fd[i];
    all_fabric = all_fabric && s.fabric[i];
    all_pools = all_pools && attribute(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED);
  }
  s.caps = kIpc | kPeerAccess | kProcessMemory | (all_vmm ? kVirtualMemory : 0u) |
           (all_vmm && all_fd ? kShareablePosixFd : 0u) |
           (all_vmm && all_fabric ? kShareableFabric : 0u) | (all_pools ? kStreamOrderedPool : 0u);
}

CudaBackend::~CudaBackend() {
  State& s = *state_;
  // Balances the retains; errors are ignored (at process exit the driver may
  // already be shut down).
  for (int i = 0; i < s.count; ++i) {
    if (CUstream c = s.copy_streams[i].load(std::memory_order_acquire)) s.api->StreamDestroy(c);
    if (s.contexts[i].load(std::memory_order_acquire) != nullptr)
      s.api->DevicePrimaryCtxRelease(s.devices[i]);
  }
}

std::uint32_t CudaBackend::capabilities() const noexcept {
  return state_->caps;
}

// ---- Devices ------------------------------------------------------------------

DeviceStatus CudaBackend::device_count(int* count) {
  *count = state_->count;
  return DeviceStatus::ok;
}

DeviceStatus CudaBackend::current_device(int* device) {
  State& s = *state_;
  if (s.count == 0) return fail(DeviceStatus::error, "current_device: no CUDA device");
  CUcontext ctx = nullptr;
  CUresult r = s.api->CtxGetCurrent(&ctx);
  if (r != CUDA_SUCCESS) return s.error(r, "cuCtxGetCurrent", 0);
  if (ctx == nullptr) {  // no context yet: the runtime would pick device 0 too
    *device = 0;
    return DeviceStatus::ok;
  }
  CUdevice dev = 0;
  r = s.api->CtxGetDevice(&dev);
  if (r != CUDA_SUCCESS) {
    return fail(DeviceStatus::error,
                "cuCtxGetDevice (current context): " + detail::cuda::describe(*s.api, r));
  }
  for (int i = 0; i < s.count; ++i) {
    if (s.devices[i] == dev) {
      *device = i;
      return DeviceStatus::ok;
    }
  }
  return fail(DeviceStatus::error, "cuCtxGetDevice: the current context's device " +
                                       std::to_string(dev) + " is not a known ordinal");
}

DeviceStatus CudaBackend::memory_info(int device, MemoryInfo* info) {
  std::size_t free_bytes = 0, total_bytes = 0;
  DeviceStatus st = state_->drive(device, "cuMemGetInfo", false, [&] {
    return state_->api->MemGetInfo(&free_bytes, &total_bytes);
  });
  if (st != DeviceStatus::ok) return st;
  info->free = free_bytes;
  info->total = total_bytes;
  return DeviceStatus::ok;
}

// ---- Segments -----------------------------------------------------------------

DeviceStatus CudaBackend::allocate(int device, std::size_t size, void** ptr) {
  State& s = *state_;
  CUdeviceptr d = 0;
  // The driver API keeps no sticky "last error" (unlike cudaGetLastError), so an
  // out-of-memory answer leaves nothing behind to clear.
  DeviceStatus st = s.drive(
      device, "cuMemAlloc", false,
      [&] {
        RelaxedCapture relaxed(s.api);
        return s.api->MemAlloc(&d, size);
      },
      [&] { return "cuMemAlloc(" + std::to_string(size) + " bytes)"; }, CUDA_ERROR_OUT_OF_MEMORY,
      DeviceStatus::out_of_memory);
  if (st != DeviceStatus::ok) return st;
  // The engine relies on this alignment (the driver gives it; check, never assume).
  const std::uintptr_t need = size >= kLargeAlignment ? kLargeAlignment : kSegmentAlignment;
  if (static_cast<std::uintptr_t>(d) % need != 0) {
    (void)s.drive(device, "cuMemFree", false, [&] { return s.api->MemFree(d); });
    return fail(DeviceStatus::error, "cuMemAlloc(" + std::to_string(size) + " bytes) on device " +
                                         std::to_string(device) + " returned " + hex(to_ptr(d)) +
                                         ", not aligned to " + std::to_string(need) + " bytes");
  }
  *ptr = to_ptr(d);
  return DeviceStatus::ok;
}

DeviceStatus CudaBackend::deallocate(int device, void* ptr, std::size_t size) {
  State& s = *state_;
  // cuMemFree only "may" synchronize; the contract says work using the range completes
  // first, so wait for the device explicitly (cudaFree's behaviour).
  bool synchronized = false;
  return s.drive(
      device, "cuMemFree", false,
      [&] {
        CUresult r = s.api->CtxSynchronize();
        synchronized = r == CUDA_SUCCESS;
        return synchronized ? s.api->MemFree(to_dptr(ptr)) : r;
      },
      [&] {
        return (synchronized ? "cuMemFree(" : "cuCtxSynchronize before cuMemFree(") + hex(ptr) +
               ", " + std::to_string(size) + " bytes)";
      });
}

// ---- Events -------------------------------------------------------------------

DeviceStatus CudaBackend::create_event(int device, EventHandle* event) {
  CUevent ev = nullptr;
  DeviceStatus st = state_->drive(device, "cuEventCreate", false, [&] {
    return state_->api->EventCreate(&ev, CU_EVENT_DISABLE_TIMING);
  });
  if (st == DeviceStatus::ok) *event = reinterpret_cast<EventHandle>(ev);
  return st;
}

DeviceStatus CudaBackend::destroy_event(int device, EventHandle event) {
  return state_->drive(device, "cuEventDestroy", false,
                       [&] { return state_->api->EventDestroy(to_event(event)); });
}

DeviceStatus CudaBackend::record_event(int device, EventHandle event, StreamHandle stream) {
  return state_->drive(
      device, "cuEventRecord", false,
      [&] { return state_->api->EventRecord(to_event(event), to_stream(stream)); },
      [&] { return "cuEventRecord(stream " + hex(to_stream(stream)) + ")"; });
}

DeviceStatus CudaBackend::query_event(int device, EventHandle event) {
  return state_->drive(
      device, "cuEventQuery", false, [&] { return state_->api->EventQuery(to_event(event)); },
      [] { return std::string("cuEventQuery"); }, CUDA_ERROR_NOT_READY, DeviceStatus::not_ready);
}

DeviceStatus CudaBackend::synchronize_event(int device, EventHandle event) {
  return state_->drive(device, "cuEventSynchronize", false,
                       [&] { return state_->api->EventSynchronize(to_event(event)); });
}

DeviceStatus CudaBackend::stream_wait_event(int device, StreamHandle stream, EventHandle event) {
  return state_->drive(
      device, "cuStreamWaitEvent", false,
      [&] { return state_->api->StreamWaitEvent(to_stream(stream), to_event(event), 0); },
      [&] { return "cuStreamWaitEvent(stream " + hex(to_stream(stream)) + ")"; });
}

DeviceStatus CudaBackend::synchronize_stream(int device, StreamHandle stream) {
  return state_->drive(
      device, "cuStreamSynchronize", false,
      [&] { return state_->api->StreamSynchronize(to_stream(stream)); },
      [&] { return "cuStreamSynchronize(stream " + hex(to_stream(stream)) + ")"; });
}

DeviceStatus CudaBackend::create_stream(int device, StreamHandle* stream) {
  CUstream created = nullptr;
  DeviceStatus st = state_->drive(device, "cuStreamCreate", false, [&] {
    return state_->api->StreamCreate(&created, CU_STREAM_NON_BLOCKING);
  });
  if (st == DeviceStatus::ok) *stream = reinterpret_cast<StreamHandle>(created);
  return st;
}

DeviceStatus CudaBackend::destroy_stream(int device, StreamHandle stream) {
  return state_->drive(device, "cuStreamDestroy", false,
                       [&] { return state_->api->StreamDestroy(to_stream(stream)); });
}

DeviceStatus CudaBackend::synchronize_device(int device) {
  return state_->drive(device, "cuCtxSynchronize", false,
                       [&] { return state_->api->CtxSynchronize(); });
}

// ---- Order inside a graph capture -----------------------------------------------

DeviceStatus CudaBackend::capture_point(int device, StreamHandle stream, CapturePoint* out) {
  State& s = *state_;
  if (s.api->StreamGetCaptureInfo == nullptr) return Backend::capture_point(device, stream, out);
  bool capturing = false;
  const DeviceStatus st = s.drive(
      device, "cuStreamGetCaptureInfo", false,
      [&] { return s.capture_order.point(*s.api, to_stream(stream), &capturing, out); },
      [&] { return "cuStreamGetCaptureInfo(stream " + hex(to_stream(stream)) + ")"; });
  if (st == DeviceStatus::ok && !capturing)
    return fail(DeviceStatus::error,
                "capture_point: stream " + hex(to_stream(stream)) + " is not capturing");
  return st;
}

DeviceStatus CudaBackend::capture_follows(int device, StreamHandle stream,
                                          const CapturePoint* points, std::size_t count,
                                          bool* follows) {
  State& s = *state_;
  if (s.api->StreamGetCaptureInfo == nullptr || s.api->GraphNodeGetDependencies == nullptr)
    return Backend::capture_follows(device, stream, points, count, follows);
  bool capturing = false;
  const DeviceStatus st = s.drive(
      device, "cuGraphNodeGetDependencies", false,
      [&] {
        return s.capture_order.follows(*s.api, to_stream(stream), points, count, &capturing,
                                       follows);
      },
      [&] { return "capture_follows(stream " + hex(to_stream(stream)) + ")"; });
  if (st == DeviceStatus::ok && !capturing)
    return fail(DeviceStatus::error,
                "capture_follows: stream " + hex(to_stream(stream)) + " is not capturing");
  return st;
}

// ---- Virtual memory -------------------------------------------------------------

DeviceStatus CudaBackend::granularity(int device, std::size_t* bytes) {
  State& s = *state_;
  const char* call = "cuMemGetAllocationGranularity";
  if (DeviceStatus st = s.check_device(device, call); st != DeviceStatus::ok) return st;
  if (!s.vmm[device]) return s.no_vmm(device, call);
  CUmemAllocationProp prop = s.physical_properties(device);
  std::size_t g = 0;
  CUresult r = s.api->MemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (r != CUDA_SUCCESS) return s.error(r, call, device);
  *bytes = g;
  return DeviceStatus::ok;
}

DeviceStatus CudaBackend::reserve_address_range(int device, std::size_t size, std::size_t alignment,
                                                void** ptr) {
  CUdeviceptr d = 0;
  DeviceStatus st = state_->drive(
      device, "cuMemAddressReserve", true,
      [&] {
        RelaxedCapture relaxed(state_->api);
        return state_->api->MemAddressReserve(&d, size, alignment, 0, 0);
      },
      [&] {
        return "cuMemAddressReserve(" + std::to_string(size) + " bytes, alignment " +
               std::to_string(alignment) + ")";
      });
  if (st == DeviceStatus::ok) *ptr = to_ptr(d);
  return st;
}

DeviceStatus CudaBackend::release_address_range(int device, void* ptr, std::size_t size) {
  return state_->drive(
      device, "cuMemAddressFree", true,
      [&] { return state_->api->MemAddressFree(to_dptr(ptr), size); },
      [&] { return "cuMemAddressFree(" + hex(ptr) + ", " + std::to_string(size) + " bytes)"; });
}

DeviceStatus CudaBackend::create_physical(int device, std::size_t size, PhysicalHandle* handle) {
  State& s = *state_;
  CUmemGenericAllocationHandle h = 0;
  DeviceStatus st = s.drive(
      device, "cuMemCreate", true,
      [&] {
        RelaxedCapture relaxed(s.api);
        CUmemAllocationProp prop = s.physical_properties(device);
        CUresult r = s.api->MemCreate(&h, size, &prop, 0);
        // (The request's own handle types decide: another thread may have turned
        // fabric off meanwhile.)
        if ((r == CUDA_ERROR_NOT_PERMITTED || r == CUDA_ERROR_NOT_SUPPORTED) &&
            (prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_FABRIC) != 0) {
          // Fabric handles need an IMEX channel the system may not give: descriptors
          // only from now on.
          s.fabric_refused[device].store(true, std::memory_order_relaxed);
          prop = s.physical_properties(device);
          r = s.api->MemCreate(&h, size, &prop, 0);
        }
        return r;
      },
      [&] { return "cuMemCreate(" + std::to_string(size) + " bytes)"; }, CUDA_ERROR_OUT_OF_MEMORY,
      DeviceStatus::out_of_memory);
  if (st == DeviceStatus::ok) *handle = static_cast<PhysicalHandle>(h);
  return st;
}

DeviceStatus CudaBackend::release_physical(int device, PhysicalHandle handle) {
  return state_->drive(device, "cuMemRelease", true, [&] {
    return state_->api->MemRelease(static_cast<CUmemGenericAllocationHandle>(handle));
  });
}

DeviceStatus CudaBackend::map(int device, void* ptr, std::size_t size, PhysicalHandle handle) {
  return state_->drive(
      device, "cuMemMap", true,
      [&] {
        RelaxedCapture relaxed(state_->api);
        return state_->api->MemMap(to_dptr(ptr), size, 0,
                                   static_cast<CUmemGenericAllocationHandle>(handle), 0);
      },
      [&] { return "cuMemMap(" + hex(ptr) + ", " + std::to_string(size) + " bytes)"; });
}

DeviceStatus CudaBackend::unmap(int device, void* ptr, std::size_t size) {
  return state_->drive(
      device, "cuMemUnmap", true, [&] { return state_->api->MemUnmap(to_dptr(ptr), size); },
      [&] { return "cuMemUnmap(" + hex(ptr) + ", " + std::to_string(size) + " bytes)"; });
}

DeviceStatus CudaBackend::set_access(int device, void* ptr, std::size_t size, const int* devices,
                                     int count) {
  State& s = *state_;
  const char* call = "cuMemSetAccess";
  std::vector<CUmemAccessDesc> desc;
  if (DeviceStatus st = s.access(call, devices, count, &desc); st != DeviceStatus::ok) return st;
  return s.drive(
      device, call, true,
      [&] {
        RelaxedCapture relaxed(s.api);
        return count == 0 ? CUDA_SUCCESS
                          : s.api->MemSetAccess(to_dptr(ptr), size, desc.data(), desc.size());
      },
      [&] {
        return "cuMemSetAccess(" + hex(ptr) + ", " + std::to_string(size) + " bytes, " +
               std::to_string(count) + " devices)";
      });
}

// ---- Host memory and copies ------------------------------------------------------

DeviceStatus CudaBackend::allocate_host(int device, std::size_t size, void** ptr) {
  State& s = *state_;
  void* p = nullptr;
  CUresult result = CUDA_SUCCESS;
  // Not through drive's soft status: out of memory keeps last_error's description too.
  const DeviceStatus st = s.drive(
      device, "cuMemHostAlloc", false,
      [&] {
        RelaxedCapture relaxed(s.api);
        // Flags 0: under unified addressing (every 64-bit Linux device) the memory is
        // pinned for every context anyway.
        result = s.api->MemHostAlloc(&p, size, 0);
        return result;
      },
      [&] { return "cuMemHostAlloc(" + std::to_string(size) + " bytes)"; });
  if (st == DeviceStatus::error && result == CUDA_ERROR_OUT_OF_MEMORY)
    return DeviceStatus::out_of_memory;
  if (st == DeviceStatus::ok) *ptr = p;
  return st;
}

DeviceStatus CudaBackend::free_host(int device, void* ptr) {
  return state_->drive(
      device, "cuMemFreeHost", false, [&] { return state_->api->MemFreeHost(ptr); },
      [&] { return "cuMemFreeHost(" + hex(ptr) + ")"; });
}

DeviceStatus CudaBackend::copy_to_host(int device, void* dst, const void* src, std::size_t bytes) {
  return state_->host_copy(device, true, dst, src, bytes);
}

DeviceStatus CudaBackend::copy_to_device(int device, void* dst, const void* src,
                                         std::size_t bytes) {
  return state_->host_copy(device, false, dst, src, bytes);
}

DeviceStatus CudaBackend::copy_to_device_async(int device, void* dst, const void* src,
                                               std::size_t bytes, StreamHandle stream) {
  return state_->drive(
      device, "cuMemcpyHtoDAsync", false,
      [&] { return state_->api->MemcpyHtoDAsync(to_dptr(dst), src, bytes, to_stream(stream)); },
      [&] {
        return "cuMemcpyHtoDAsync(" + hex(dst) + " <- " + hex(src) + ", " + std::to_string(bytes) +
               " bytes, stream " + hex(to_stream(stream)) + ")";
      });
}

// ---- IPC ------------------------------------------------------------------------

DeviceStatus CudaBackend::export_ipc(int device, void* base, IpcHandle* handle) {
  CUipcMemHandle h;
  DeviceStatus st = state_->drive(
      device, "cuIpcGetMemHandle", false,
      [&] { return state_->api->IpcGetMemHandle(&h, to_dptr(base)); },
      [&] { return "cuIpcGetMemHandle(" + hex(base) + ")"; });
  if (st == DeviceStatus::ok) std::memcpy(handle->bytes, &h, sizeof h);
  return st;
}

DeviceStatus CudaBackend::open_ipc(int device, const IpcHandle& handle, void** ptr) {
  CUipcMemHandle h;
  std::memcpy(&h, handle.bytes, sizeof h);
  CUdeviceptr d = 0;
  DeviceStatus st = state_->drive(device, "cuIpcOpenMemHandle", false, [&] {
    return state_->api->IpcOpenMemHandle(&d, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  });
  if (st == DeviceStatus::ok) *ptr = to_ptr(d);
  return st;
}

DeviceStatus CudaBackend::close_ipc(int device, void* ptr) {
  return state_->drive(
      device, "cuIpcCloseMemHandle", false,
      [&] { return state_->api->IpcCloseMemHandle(to_dptr(ptr)); },
      [&] { return "cuIpcCloseMemHandle(" + hex(ptr) + ")"; });
}

// ---- Shareable physical memory ----------------------------------------------------

DeviceStatus CudaBackend::export_shareable(int device, PhysicalHandle handle,
                                           ShareableHandle::Kind kind, ShareableHandle* out) {
  State& s = *state_;
  ShareableHandle result;
  result.kind = kind;
  const bool fd = kind == ShareableHandle::posix_fd;
  CUmemFabricHandle fabric{};
  DeviceStatus st = s.drive(
      device, "cuMemExportToShareableHandle", true,
      [&] {
        return s.api->MemExportToShareableHandle(
            fd ? static_cast<void*>(&result.fd) : static_cast<void*>(&fabric),
            static_cast<CUmemGenericAllocationHandle>(handle),
            fd ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_FABRIC, 0);
      },
      [&] {
        return std::string("cuMemExportToShareableHandle(") +
               (fd ? "POSIX file descriptor" : "fabric handle") + ")";
      });
  if (st != DeviceStatus::ok) return st;
  static_assert(sizeof fabric == sizeof result.fabric_bytes, "fabric handle size");
  if (!fd) std::memcpy(result.fabric_bytes, &fabric, sizeof fabric);
  *out = result;
  return DeviceStatus::ok;
}

DeviceStatus CudaBackend::import_shareable(int device, const ShareableHandle& shared,
                                           PhysicalHandle* handle) {
  State& s = *state_;
  CUmemGenericAllocationHandle h = 0;
  const bool fd = shared.kind == ShareableHandle::posix_fd;
  CUmemFabricHandle fabric{};
  std::memcpy(&fabric, shared.fabric_bytes, sizeof fabric);
  DeviceStatus st = s.drive(
      device, "cuMemImportFromShareableHandle", true,
      [&] {
        void* os_handle = fd ? reinterpret_cast<void*>(static_cast<std::intptr_t>(shared.fd))
                             : static_cast<void*>(&fabric);
        return s.api->MemImportFromShareableHandle(
            &h, os_handle,
            fd ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_FABRIC);
      },
      [&] {
        return std::string("cuMemImportFromShareableHandle(") +
               (fd ? "descriptor " + std::to_string(shared.fd) : std::string("fabric handle")) +
               ")";
      });
  if (st == DeviceStatus::ok) *handle = static_cast<PhysicalHandle>(h);
  return st;
}

// ---- Stream-ordered pools ------------------------------------------------------------

namespace {
CUmemoryPool to_pool(PoolHandle p) {
  return reinterpret_cast<CUmemoryPool>(p);
}
}  // namespace

DeviceStatus CudaBackend::create_pool(int device, PoolHandle* pool) {
  State& s = *state_;
  CUmemoryPool created = nullptr;
  DeviceStatus st = s.drive(device, "cuMemPoolCreate", false, [&] {
    CUmemPoolProps props;
    std::memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = s.devices[device];
    return s.api->MemPoolCreate(&created, &props);
  });
  if (st == DeviceStatus::ok) *pool = reinterpret_cast<PoolHandle>(created);
  return st;
}

DeviceStatus CudaBackend::destroy_pool(int device, PoolHandle pool) {
  return state_->drive(device, "cuMemPoolDestroy", false,
                       [&] { return state_->api->MemPoolDestroy(to_pool(pool)); });
}

DeviceStatus CudaBackend::allocate_from_pool(int device, PoolHandle pool, std::size_t size,
                                             StreamHandle stream, void** ptr) {
  State& s = *state_;
  CUdeviceptr d = 0;
  DeviceStatus st = s.drive(
      device, "cuMemAllocFromPoolAsync", false,
      [&] { return s.api->MemAllocFromPoolAsync(&d, size, to_pool(pool), to_stream(stream)); },
      [&] {
        return "cuMemAllocFromPoolAsync(" + std::to_string(size) + " bytes, stream " +
               hex(to_stream(stream)) + ")";
      },
      CUDA_ERROR_OUT_OF_MEMORY, DeviceStatus::out_of_memory);
  if (st == DeviceStatus::ok) *ptr = to_ptr(d);
  return st;
}

DeviceStatus CudaBackend::free_async(int device, void* ptr, StreamHandle stream) {
  return state_->drive(
      device, "cuMemFreeAsync", false,
      [&] { return state_->api->MemFreeAsync(to_dptr(ptr), to_stream(stream)); },
      [&] { return "cuMemFreeAsync(" + hex(ptr) + ", stream " + hex(to_stream(stream)) + ")"; });
}

DeviceStatus CudaBackend::set_pool_release_threshold(int device, PoolHandle pool,
                                                     std::uint64_t bytes) {
  return state_->drive(device, "cuMemPoolSetAttribute(RELEASE_THRESHOLD)", false, [&] {
    cuuint64_t value = bytes;
    return state_->api->MemPoolSetAttribute(to_pool(pool), CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                                            &value);
  });
}

DeviceStatus CudaBackend::trim_pool(int device, PoolHandle pool, std::size_t keep) {
  return state_->drive(device, "cuMemPoolTrimTo", false,
                       [&] { return state_->api->MemPoolTrimTo(to_pool(pool), keep); });
}

DeviceStatus CudaBackend::pool_usage(int device, PoolHandle pool, PoolUsage* out) {
  State& s = *state_;
  PoolUsage u;
  auto read = [&](CUmemPool_attribute a, std::uint64_t* v) {
    cuuint64_t value = 0;
    CUresult r = s.api->MemPoolGetAttribute(to_pool(pool), a, &value);
    *v = value;
    return r;
  };
  DeviceStatus st = s.drive(device, "cuMemPoolGetAttribute", false, [&] {
    CUresult r = read(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &u.reserved);
    if (r == CUDA_SUCCESS) r = read(CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &u.reserved_high);
    if (r == CUDA_SUCCESS) r = read(CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &u.used);
    if (r == CUDA_SUCCESS) r = read(CU_MEMPOOL_ATTR_USED_MEM_HIGH, &u.used_high);
    return r;
  });
  if (st == DeviceStatus::ok) *out = u;
  return st;
}

DeviceStatus CudaBackend::reset_pool_peaks(int device, PoolHandle pool) {
  State& s = *state_;
  return s.drive(device, "cuMemPoolSetAttribute(*_MEM_HIGH)", false, [&] {
    cuuint64_t zero = 0;  // the only value allowed: resets the high mark to current
    CUresult r =
        s.api->MemPoolSetAttribute(to_pool(pool), CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &zero);
    return r != CUDA_SUCCESS
               ? r
               : s.api->MemPoolSetAttribute(to_pool(pool), CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero);
  });
}

DeviceStatus CudaBackend::set_pool_access(int device, PoolHandle pool, const int* devices,
                                          int count) {
  State& s = *state_;
  const char* call = "cuMemPoolSetAccess";
  std::vector<CUmemAccessDesc> desc;
  if (DeviceStatus st = s.access(call, devices, count, &desc); st != DeviceStatus::ok) return st;
  return s.drive(device, call, false, [&] {
    return count == 0 ? CUDA_SUCCESS
                      : s.api->MemPoolSetAccess(to_pool(pool), desc.data(), desc.size());
  });
}

// ---- Processes ---------------------------------------------------------------------

DeviceStatus CudaBackend::process_memory(int device, std::vector<ProcessMemory>* out) {
  State& s = *state_;
  const char* call = "process_memory";
  if (DeviceStatus st = s.check_device(device, call); st != DeviceStatus::ok) return st;
  char pci[32] = {};
  CUresult r = s.api->DeviceGetPCIBusId(pci, static_cast<int>(sizeof pci), s.devices[device]);
  if (r != CUDA_SUCCESS) return s.error(r, "cuDeviceGetPCIBusId", device);
  std::string why;
  if (!detail::cuda::nvml_processes(pci, out, &why)) return fail(DeviceStatus::unsupported, why);
  return DeviceStatus::ok;
}

// ---- Peer access ----------------------------------------------------------------

DeviceStatus CudaBackend::can_access_peer(int device, int peer, bool* can) {
  State& s = *state_;
  *can = false;
  const char* call = "cuDeviceCanAccessPeer";
  if (DeviceStatus st = s.check_device(device, call); st != DeviceStatus::ok) return st;
  if (DeviceStatus st = s.check_device(peer, call); st != DeviceStatus::ok) return st;
  if (device == peer) {  // a device always reaches its own memory
    *can = true;
    return DeviceStatus::ok;
  }
  int value = 0;
  CUresult r = s.api->DeviceCanAccessPeer(&value, s.devices[device], s.devices[peer]);
  if (r != CUDA_SUCCESS)
    return s.error(r, "cuDeviceCanAccessPeer(peer " + std::to_string(peer) + ")", device);
  *can = value != 0;
  return DeviceStatus::ok;
}

DeviceStatus CudaBackend::enable_peer_access(int device, int peer) {
  State& s = *state_;
  const char* call = "cuCtxEnablePeerAccess";
  if (DeviceStatus st = s.check_device(peer, call); st != DeviceStatus::ok) return st;
  if (device == peer) return s.check_device(device, call);
  CUcontext peer_ctx = nullptr;
  if (DeviceStatus st = s.primary_context(peer, &peer_ctx); st != DeviceStatus::ok) return st;
  return s.drive(
      device, call, false,
      [&] {
        CUresult r = s.api->CtxEnablePeerAccess(peer_ctx, 0);
        return r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED ? CUDA_SUCCESS : r;
      },
      [&] { return "cuCtxEnablePeerAccess(peer " + std::to_string(peer) + ")"; });
}

std::string CudaBackend::device_name(int device) {
  State& s = *state_;
  if (device < 0 || device >= s.count) return "";
  char name[256] = {};
  if (s.api->DeviceGetName(name, static_cast<int>(sizeof name) - 1, s.devices[device]) !=
      CUDA_SUCCESS)
    return "";
  return name;
}

}  // namespace reservoir
