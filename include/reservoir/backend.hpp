// The device seam: everything the engine needs from a device.
//
// The engine is written against this interface and nothing else; it includes no
// CUDA header. Two implementations ship: SimBackend (a deterministic simulated
// device, include/reservoir/sim_backend.hpp) and CudaBackend (the CUDA driver API,
// loaded at run time). The backend is picked at run time (GPU present or not), so
// the seam is a small virtual interface; the cache-hit path never calls it.
//
// Conventions for every operation:
//   - returns DeviceStatus::ok on success;
//   - DeviceStatus::out_of_memory only where noted (segment allocate, physical
//     create, allocate_from_pool, allocate_host): for device memory the engine
//     then walks its out-of-memory ladder;
//   - DeviceStatus::not_ready only from query_event;
//   - DeviceStatus::unsupported for an optional capability the backend lacks;
//   - DeviceStatus::error for anything else; last_error() then names the call and
//     the device's reason, e.g. "cuEventQuery: an illegal memory access...".
//   - A failed call changes nothing the engine can observe (no half-made segment).
// Thread safety: every operation may be called from any thread concurrently.
// See docs/PORTING.md for what a new backend must guarantee.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "reservoir/export.hpp"
#include "reservoir/types.hpp"

namespace reservoir {

enum class DeviceStatus : int {
  ok = 0,
  out_of_memory = 1,
  not_ready = 2,
  error = 3,
  unsupported = 4,
};

RESERVOIR_API const char* to_string(DeviceStatus status) noexcept;

// Optional abilities, advertised by capabilities() as a bit set.
enum Capability : std::uint32_t {
  kVirtualMemory = 1u << 0,  // reserve/create/map/unmap/set_access/release
  kIpc = 1u << 1,            // export_ipc / open_ipc / close_ipc
  kPeerAccess = 1u << 2,     // can_access_peer / enable_peer_access
  // export_shareable / import_shareable of physical memory (expandable segments' IPC)
  kShareablePosixFd = 1u << 3,   // as a POSIX file descriptor (Linux)
  kShareableFabric = 1u << 4,    // as a fabric handle (multi-node NVLink, IMEX)
  kStreamOrderedPool = 1u << 5,  // create_pool ... free_async (cudaMallocAsync's pools)
  kProcessMemory = 1u << 6,      // process_memory (NVML on CUDA)
};

// A position in a CUDA graph capture (Backend::capture_point): the capture's id and
// the backend's names of the graph nodes that work captured next would depend on.
struct CapturePoint {
  std::uint64_t capture = 0;
  std::vector<std::uintptr_t> nodes;
};

struct MemoryInfo {
  std::size_t free = 0;
  std::size_t total = 0;
};

// An inter-process handle for a segment (cudaIpcMemHandle_t is 64 bytes).
struct IpcHandle {
  unsigned char bytes[64] = {};
};

// Physical memory exported for another process (cuMemExportToShareableHandle): a
// POSIX file descriptor, which travels between processes over a Unix socket
// (SCM_RIGHTS), or a fabric handle, which travels as plain bytes.
struct ShareableHandle {
  enum Kind : std::uint8_t { posix_fd = 1, fabric = 2 };
  Kind kind = posix_fd;
  int fd = -1;                          // posix_fd: owned by whoever holds the handle
  unsigned char fabric_bytes[64] = {};  // fabric: CUmemFabricHandle's bytes
};

// A driver memory pool (cudaMemPool_t / CUmemoryPool). Opaque to the engine.
using PoolHandle = std::uintptr_t;

// What a pool holds (cudaMemPoolAttr{Reserved,Used}Mem{Current,High}): reserved is
// the device memory the pool has mapped, used what its live allocations take.
// Invariant: used <= reserved, used_high <= reserved_high, current <= high.
struct PoolUsage {
  std::uint64_t reserved = 0, reserved_high = 0;
  std::uint64_t used = 0, used_high = 0;
};

// A process using a device and the device memory it holds (NVML's
// nvmlDeviceGetComputeRunningProcesses).
struct ProcessMemory {
  std::uint32_t pid = 0;
  std::uint64_t used_bytes = 0;
};

class RESERVOIR_API Backend {
 public:
  virtual ~Backend();

  // A short name for messages and reports ("sim", "cuda").
  virtual const char* name() const noexcept = 0;
  // Bit set of Capability.
  virtual std::uint32_t capabilities() const noexcept { return 0; }
  bool has(Capability c) const noexcept { return (capabilities() & c) != 0; }

  // ---- Devices ---------------------------------------------------------------
  // post(ok): *count >= 0. A backend with no usable device reports 0.
  virtual DeviceStatus device_count(int* count) = 0;
  // The calling thread's current device. post(ok): 0 <= *device < device_count.
  virtual DeviceStatus current_device(int* device) = 0;
  // pre: 0 <= device < device_count. post(ok): info->free <= info->total.
  virtual DeviceStatus memory_info(int device, MemoryInfo* info) = 0;

  // ---- Segments (cudaMalloc / cudaFree semantics) -----------------------------
  // pre: size > 0, device valid.
  // post(ok): *ptr != nullptr, [*ptr, *ptr+size) overlaps no other live range of
  //   this backend, *ptr is 512-byte aligned, and 2 MiB aligned when size >= 2 MiB.
  // out_of_memory: the device cannot provide size bytes now; *ptr untouched.
  virtual DeviceStatus allocate(int device, std::size_t size, void** ptr) = 0;
  // pre: ptr came from allocate(device, size) and was not deallocated since.
  // Work already submitted that uses the range completes first (cudaFree syncs).
  virtual DeviceStatus deallocate(int device, void* ptr, std::size_t size) = 0;

  // ---- Events (the engine pools them; it never creates one per free) -----------
  // post(ok): *event is a fresh, unrecorded event (query on it returns ok).
  virtual DeviceStatus create_event(int device, EventHandle* event) = 0;
  virtual DeviceStatus destroy_event(int device, EventHandle event) = 0;
  // Captures the work submitted to stream so far.
  virtual DeviceStatus record_event(int device, EventHandle event, StreamHandle stream) = 0;
  // ok: the captured work has completed; not_ready: it has not.
  virtual DeviceStatus query_event(int device, EventHandle event) = 0;
  // Blocks the host until the captured work has completed.
  virtual DeviceStatus synchronize_event(int device, EventHandle event) = 0;
  // Future work on stream waits for the event's captured work (no host wait).
  virtual DeviceStatus stream_wait_event(int device, StreamHandle stream, EventHandle event);
  virtual DeviceStatus synchronize_stream(int device, StreamHandle stream) = 0;
  // Streams of the backend's own, for tools that replay work (the engine itself only
  // uses the program's streams). post(ok): *stream is a new non-blocking stream.
  virtual DeviceStatus create_stream(int device, StreamHandle* stream);
  virtual DeviceStatus destroy_stream(int device, StreamHandle stream);
  virtual DeviceStatus synchronize_device(int device) = 0;
  // The program says the host waited for stream's work (Allocator::notify_host_wait:
  // it synchronized the stream, an event of it, or the device). A real device needs
  // nothing (its events already say so; the default answers ok); the simulated device
  // completes the stream's work there, as its completion model says.
  virtual DeviceStatus host_waited(int device, StreamHandle stream);

  // ---- Order inside a CUDA graph capture ---------------------------------------
  // Where stream's captured work stands: the graph nodes that work captured on it next
  // would depend on. error when stream is not capturing (nothing can be proved then);
  // unsupported when the backend cannot say (the default).
  virtual DeviceStatus capture_point(int device, StreamHandle stream, CapturePoint* out);
  // *follows: whether work captured on stream from now on depends on every node of
  // points[0..count) (each is one of stream's current dependencies or an ancestor of
  // one); false for a point of another capture. error when stream is not capturing.
  virtual DeviceStatus capture_follows(int device, StreamHandle stream, const CapturePoint* points,
                                       std::size_t count, bool* follows);

  // ---- Virtual memory (Capability kVirtualMemory) ------------------------------
  // post(ok): *bytes is the mapping granularity (a power of two; 2 MiB on CUDA).
  virtual DeviceStatus granularity(int device, std::size_t* bytes);
  // Reserves address space only. pre: size and alignment multiples of granularity.
  virtual DeviceStatus reserve_address_range(int device, std::size_t size, std::size_t alignment,
                                             void** ptr);
  // pre: nothing mapped in [ptr, ptr+size).
  virtual DeviceStatus release_address_range(int device, void* ptr, std::size_t size);
  // Physical memory of size bytes (multiple of granularity). out_of_memory possible.
  virtual DeviceStatus create_physical(int device, std::size_t size, PhysicalHandle* handle);
  // The memory is freed once it is also unmapped everywhere.
  virtual DeviceStatus release_physical(int device, PhysicalHandle handle);
  // Maps the whole of handle at ptr (inside a reservation, unmapped there).
  virtual DeviceStatus map(int device, void* ptr, std::size_t size, PhysicalHandle handle);
  // Unmaps [ptr, ptr+size); the caller synchronizes users of the range first.
  virtual DeviceStatus unmap(int device, void* ptr, std::size_t size);
  // Makes [ptr, ptr+size) readable and writable from each of devices[0..count).
  virtual DeviceStatus set_access(int device, void* ptr, std::size_t size, const int* devices,
                                  int count);

  // ---- Host memory and copies (optional) --------------------------------------
  // Page-locked host memory for copies to and from the device (cudaHostAlloc /
  // cuMemHostAlloc on CUDA): at least size bytes in *ptr. out_of_memory when the host
  // has none. Default: unsupported.
  virtual DeviceStatus allocate_host(int device, std::size_t size, void** ptr);
  virtual DeviceStatus free_host(int device, void* ptr);  // ptr from allocate_host
  // Copies bytes from device memory at src to host memory at dst (or the other way),
  // returning once the bytes have landed (synchronous with respect to the host, from
  // pageable host memory too). Not ordered after other work: the caller has finished
  // (synchronized) whatever used the device memory. On CUDA an asynchronous copy on a
  // stream of the backend's own and a wait for that stream alone, so that the copy does
  // not wait for the whole device. Default: unsupported.
  virtual DeviceStatus copy_to_host(int device, void* dst, const void* src, std::size_t bytes);
  virtual DeviceStatus copy_to_device(int device, void* dst, const void* src, std::size_t bytes);
  // Enqueues a copy of bytes from host memory at src (from allocate_host) to device
  // memory at dst on stream and returns without waiting for it: ordered as any work on
  // stream, so src must stay allocated until work recorded on stream after the copy
  // (an event) has completed. cuMemcpyHtoDAsync on CUDA. Default: unsupported.
  virtual DeviceStatus copy_to_device_async(int device, void* dst, const void* src,
                                            std::size_t bytes, StreamHandle stream);

  // ---- IPC (Capability kIpc) ----------------------------------------------------
  // pre: base is the start of a live segment from allocate().
  virtual DeviceStatus export_ipc(int device, void* base, IpcHandle* handle);
  // Maps another process's segment; post(ok): *ptr is its start in this process. A
  // handle opens once per process and device (a second open fails: callers cache).
  virtual DeviceStatus open_ipc(int device, const IpcHandle& handle, void** ptr);
  // pre: ptr came from open_ipc and is not used any more.
  virtual DeviceStatus close_ipc(int device, void* ptr);

  // ---- Shareable physical memory (kShareablePosixFd / kShareableFabric) ---------
  // Exports handle (from create_physical on device) as kind. post(ok): out->kind ==
  // kind; a posix_fd out->fd is a new descriptor the caller closes. The memory lives
  // until it is released here and in every importer.
  virtual DeviceStatus export_shareable(int device, PhysicalHandle handle,
                                        ShareableHandle::Kind kind, ShareableHandle* out);
  // A physical handle in this process for memory another process exported (fd is not
  // consumed). It maps and releases like one from create_physical; it does not count
  // against this process's device memory. error when the handle names nothing.
  virtual DeviceStatus import_shareable(int device, const ShareableHandle& shared,
                                        PhysicalHandle* handle);

  // ---- Stream-ordered pools (Capability kStreamOrderedPool) ---------------------
  // A new pool of device memory (cuMemPoolCreate: pinned, on device, readable and
  // writable by device). Its release threshold starts at 0 (memory goes back to the
  // device at every synchronization) until set_pool_release_threshold.
  virtual DeviceStatus create_pool(int device, PoolHandle* pool);
  // pre: nothing allocated from pool is live.
  virtual DeviceStatus destroy_pool(int device, PoolHandle pool);
  // Stream-ordered allocation of size > 0 bytes (cuMemAllocFromPoolAsync): usable by
  // work submitted to stream from now on. The pool reuses memory freed on stream at
  // once, and memory freed on other streams once their free is known to be complete
  // (an event dependency, or the free's work has finished). out_of_memory possible.
  virtual DeviceStatus allocate_from_pool(int device, PoolHandle pool, std::size_t size,
                                          StreamHandle stream, void** ptr);
  // pre: ptr came from allocate_from_pool on device and is not freed yet. Frees after
  // the work submitted to stream so far (cuMemFreeAsync).
  virtual DeviceStatus free_async(int device, void* ptr, StreamHandle stream);
  // Memory the pool keeps mapped past a synchronization (UINT64_MAX: all of it).
  virtual DeviceStatus set_pool_release_threshold(int device, PoolHandle pool, std::uint64_t bytes);
  // Gives unused memory back until the pool reserves at most keep bytes, or nothing
  // more can be given (cuMemPoolTrimTo).
  virtual DeviceStatus trim_pool(int device, PoolHandle pool, std::size_t keep);
  virtual DeviceStatus pool_usage(int device, PoolHandle pool, PoolUsage* out);
  // Resets reserved_high and used_high to the current values.
  virtual DeviceStatus reset_pool_peaks(int device, PoolHandle pool);
  // Makes the pool's memory readable and writable from each of devices[0..count)
  // (cuMemPoolSetAccess), now and for memory it maps later.
  virtual DeviceStatus set_pool_access(int device, PoolHandle pool, const int* devices, int count);

  // ---- Processes (Capability kProcessMemory) ------------------------------------
  // Every process using device and its device memory, this one included when it
  // uses the device. unsupported (last_error says why) when the list cannot be had,
  // e.g. without NVML.
  virtual DeviceStatus process_memory(int device, std::vector<ProcessMemory>* out);

  // ---- Peer access (Capability kPeerAccess) -------------------------------------
  virtual DeviceStatus can_access_peer(int device, int peer, bool* can);
  // Lets device read and write memory allocated on peer.
  virtual DeviceStatus enable_peer_access(int device, int peer);

  // ---- Diagnostics --------------------------------------------------------------
  // Description of the last call that returned error/unsupported on this thread.
  std::string last_error() const;
  // Monotonic microseconds, for history timestamps (SimBackend makes it injectable).
  virtual std::uint64_t now_us() const;

 protected:
  // Records the description that last_error() returns on this thread; returns status.
  static DeviceStatus fail(DeviceStatus status, const std::string& message);
};

}  // namespace reservoir
