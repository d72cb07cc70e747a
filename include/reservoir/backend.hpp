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
//     create): the engine then walks its out-of-memory ladder;
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
};

struct MemoryInfo {
  std::size_t free = 0;
  std::size_t total = 0;
};

// An inter-process handle for a segment (cudaIpcMemHandle_t is 64 bytes).
struct IpcHandle {
  unsigned char bytes[64] = {};
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

  // ---- IPC (Capability kIpc) ----------------------------------------------------
  // pre: base is the start of a live segment from allocate().
  virtual DeviceStatus export_ipc(int device, void* base, IpcHandle* handle);
  virtual DeviceStatus open_ipc(int device, const IpcHandle& handle, void** ptr);
  virtual DeviceStatus close_ipc(int device, void* ptr);

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
  static DeviceStatus fail(DeviceStatus status, std::string message);
};

}  // namespace reservoir
