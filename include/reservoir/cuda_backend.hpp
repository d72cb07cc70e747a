// CudaBackend: the device seam over the CUDA driver API.
//
// The driver (libcuda.so.1) is loaded at run time, so the library also loads on a
// machine without one; this header includes no CUDA header. The backend exists only
// in builds that found a CUDA toolkit (RESERVOIR_HAVE_CUDA).
//
// - Devices are the driver's ordinals (the runtime's cudaSetDevice numbers). Each
//   device's primary context (the one the CUDA runtime uses) is retained on first use
//   and made current around calls for that device when another context is current;
//   the caller's context is then restored, so the runtime's current device does not
//   change behind the program's back. A thread with no current context is left with
//   the primary context current, as the runtime itself does.
// - StreamHandle is a cudaStream_t / CUstream value; 0 is the legacy default stream
//   (pass cudaStreamPerThread, 0x2, for the per-thread default stream).
// - Segments come from cuMemAlloc; deallocate synchronizes the device first (as
//   cudaFree does) so that no submitted work still uses the range.
// - Host memory comes from cuMemHostAlloc (page-locked; portable to every device's
//   context under unified addressing). copy_to_host / copy_to_device copy with
//   cuMemcpyDtoHAsync / cuMemcpyHtoDAsync on a non-blocking stream of the backend's own
//   (one per device) and wait for that stream alone: not for other work, which the
//   caller has synchronized. copy_to_device_async is cuMemcpyHtoDAsync on the given
//   stream.
// - Capabilities: kVirtualMemory when every device supports the virtual memory
//   management API, kIpc (cuIpc* on Linux), kPeerAccess; kShareablePosixFd when every
//   device exports physical memory as file descriptors, kShareableFabric when every
//   device supports fabric handles (physical memory then requests them, falling back
//   to descriptors only where the system refuses: no IMEX channel); kStreamOrderedPool
//   when every device supports memory pools (cuMemPoolCreate); kProcessMemory always:
//   process_memory asks NVML (libnvidia-ml.so.1, loaded on first use) and answers
//   unsupported, saying why, where NVML cannot be loaded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "reservoir/backend.hpp"
#include "reservoir/export.hpp"

namespace reservoir {

class RESERVOIR_API CudaBackend final : public Backend {
 public:
  // Loads the driver (once per process) and retains nothing yet. Throws DeviceError
  // with unavailable_reason() when the driver cannot be loaded or initialised. A
  // driver without devices is not an error: device_count() then reports 0.
  CudaBackend();
  // Releases the primary contexts this backend retained.
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  // True when the driver loads, initialises and reports at least one device: the test
  // the default backend selection uses. Never throws; cheap after the first call.
  static bool available() noexcept;
  // Why available() is false ("" when it is true), e.g. "cannot load the CUDA driver:
  // dlopen("libcuda.so.1") failed: ... (is the NVIDIA driver installed?)".
  static std::string unavailable_reason();

  // ---- Backend ----
  const char* name() const noexcept override { return "cuda"; }
  std::uint32_t capabilities() const noexcept override;
  DeviceStatus device_count(int* count) override;
  DeviceStatus current_device(int* device) override;
  DeviceStatus memory_info(int device, MemoryInfo* info) override;
  DeviceStatus allocate(int device, std::size_t size, void** ptr) override;
  DeviceStatus deallocate(int device, void* ptr, std::size_t size) override;
  DeviceStatus create_event(int device, EventHandle* event) override;
  DeviceStatus destroy_event(int device, EventHandle event) override;
  DeviceStatus record_event(int device, EventHandle event, StreamHandle stream) override;
  DeviceStatus query_event(int device, EventHandle event) override;
  DeviceStatus synchronize_event(int device, EventHandle event) override;
  DeviceStatus stream_wait_event(int device, StreamHandle stream, EventHandle event) override;
  DeviceStatus synchronize_stream(int device, StreamHandle stream) override;
  DeviceStatus create_stream(int device, StreamHandle* stream) override;
  DeviceStatus destroy_stream(int device, StreamHandle stream) override;
  DeviceStatus synchronize_device(int device) override;
  DeviceStatus capture_point(int device, StreamHandle stream, CapturePoint* out) override;
  DeviceStatus capture_follows(int device, StreamHandle stream, const CapturePoint* points,
                               std::size_t count, bool* follows) override;
  DeviceStatus granularity(int device, std::size_t* bytes) override;
  DeviceStatus reserve_address_range(int device, std::size_t size, std::size_t alignment,
                                     void** ptr) override;
  DeviceStatus release_address_range(int device, void* ptr, std::size_t size) override;
  DeviceStatus create_physical(int device, std::size_t size, PhysicalHandle* handle) override;
  DeviceStatus release_physical(int device, PhysicalHandle handle) override;
  DeviceStatus map(int device, void* ptr, std::size_t size, PhysicalHandle handle) override;
  DeviceStatus unmap(int device, void* ptr, std::size_t size) override;
  DeviceStatus set_access(int device, void* ptr, std::size_t size, const int* devices,
                          int count) override;
  DeviceStatus allocate_host(int device, std::size_t size, void** ptr) override;
  DeviceStatus free_host(int device, void* ptr) override;
  DeviceStatus copy_to_host(int device, void* dst, const void* src, std::size_t bytes) override;
  DeviceStatus copy_to_device(int device, void* dst, const void* src, std::size_t bytes) override;
  DeviceStatus copy_to_device_async(int device, void* dst, const void* src, std::size_t bytes,
                                    StreamHandle stream) override;
  DeviceStatus export_ipc(int device, void* base, IpcHandle* handle) override;
  DeviceStatus open_ipc(int device, const IpcHandle& handle, void** ptr) override;
  DeviceStatus close_ipc(int device, void* ptr) override;
  DeviceStatus export_shareable(int device, PhysicalHandle handle, ShareableHandle::Kind kind,
                                ShareableHandle* out) override;
  DeviceStatus import_shareable(int device, const ShareableHandle& shared,
                                PhysicalHandle* handle) override;
  DeviceStatus create_pool(int device, PoolHandle* pool) override;
  DeviceStatus destroy_pool(int device, PoolHandle pool) override;
  DeviceStatus allocate_from_pool(int device, PoolHandle pool, std::size_t size,
                                  StreamHandle stream, void** ptr) override;
  DeviceStatus free_async(int device, void* ptr, StreamHandle stream) override;
  DeviceStatus set_pool_release_threshold(int device, PoolHandle pool,
                                          std::uint64_t bytes) override;
  DeviceStatus trim_pool(int device, PoolHandle pool, std::size_t keep) override;
  DeviceStatus pool_usage(int device, PoolHandle pool, PoolUsage* out) override;
  DeviceStatus reset_pool_peaks(int device, PoolHandle pool) override;
  DeviceStatus set_pool_access(int device, PoolHandle pool, const int* devices, int count) override;
  DeviceStatus process_memory(int device, std::vector<ProcessMemory>* out) override;
  DeviceStatus can_access_peer(int device, int peer, bool* can) override;
  DeviceStatus enable_peer_access(int device, int peer) override;

  // The device's name as the driver reports it ("NVIDIA H200"), "" on failure.
  std::string device_name(int device);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace reservoir
