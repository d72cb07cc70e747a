// SimBackend: a deterministic simulated device, so every engine behaviour can be
// tested (and every trace replayed) on a machine without a GPU.
//
// - Capacity per device (default kDefaultSimCapacity, an H200). Segments and
//   reservations are placed where the CUDA driver would place them (SimOptions::
//   placement, include/reservoir/sim_placement.hpp): new address chunks top-down,
//   reuse newest chunk first; segment addresses are 512-byte aligned, 2 MiB aligned
//   from 2 MiB up; live ranges never overlap; freed ranges are reused.
// - Addresses are synthetic (not dereferenceable) unless host_backed is set, in
//   which case they point into a host mapping (MAP_NORESERVE) that tests may write.
// - When work completes (SimOptions::completion; docs/simulated_device.md): work
//   submitted to a stream (kernels, recorded events) completes at a host wait for it —
//   synchronize_stream, synchronize_event, synchronize_device (every stream), and the
//   program's own waits, which it reports through Allocator::notify_host_wait
//   (host_waited) — and when a test calls advance(stream) or advance_all(). Other modes:
//   eager (all work completes at once), paced (an event also completes at its pace-th
//   query: the device keeps up with a host that polls) and manual (a program's reported
//   waits complete nothing: only the test controls and the device's own synchronize
//   calls do).
// - Fault injection: fail the Nth raw allocation, fail allocations above a size,
//   make event queries (or any named operation) return an error. Cleanup calls
//   (unmap, release_physical, release_address_range, deallocate) can be failed like
//   any other: a real driver can refuse them too, and the engine must keep what it
//   could not give back on its books (docs/reliability.md).
// - Counters and a cost model (µs per raw alloc/free/map/unmap) so tools can report
//   the device time a workload would spend.
// - Stream-ordered pools (create_pool ... free_async) follow a model of the CUDA
//   driver's pool (SimPoolOptions; docs/async.md), so backend:cudaMallocAsync runs
//   and replays here too.
// - IPC: export_ipc / open_ipc and export_shareable / import_shareable work between
//   SimBackends of one process and with forked children. Synthetic addresses carry
//   no data; with host_backed and shared_memory the memory is shared (memfd), so a
//   child that opens a handle sees the parent's writes and the parent the child's.
//   Shareable handles are real file descriptors (they travel over SCM_RIGHTS).
// - process_memory reports this process (its used memory) and synthetic others.
// - copy() models a kernel of one device reading and writing memory: it checks that
//   the device may reach both ranges (its own memory, a peer's ordinary memory after
//   enable_peer_access, mappings set_access granted, IPC mappings it opened).
// - Host memory and copies: allocate_host gives real host memory (page-aligned, mapped
//   MAP_NORESERVE: only what is touched costs memory), whatever host_backed says;
//   free_host takes back only what allocate_host gave. copy_to_host / copy_to_device
//   check that the device range is memory the device reaches (as copy() does: its
//   segments, pool chunks, IPC mappings, mappings set_access granted it) and wait for
//   nothing else (no other work completes: the caller synchronized what used the
//   memory, as on CUDA; refused while a capture is under way). With
//   host_backed they copy the bytes; without it device contents are not modelled, so a
//   copy succeeds without touching memory (the host buffer keeps what it held).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "reservoir/backend.hpp"
#include "reservoir/sim_placement.hpp"

namespace reservoir {

// The simulated device's memory unless told otherwise: an NVIDIA H200 as cudaMemGetInfo
// reports its total (150,109,880,320 bytes = 139.80 GiB, measured in GPU run A;
// nvidia-smi says 143,771 MiB, a different number). The one default of SimOptions, of
// the sim_capacity setting and of reservoir-replay --capacity; memory-fraction fits
// multiply it, as PyTorch multiplies the cudaMemGetInfo total.
inline constexpr std::size_t kDefaultSimCapacity = 150109880320;

// The simulated driver pool (src/backend/sim/memory_pool.hpp): how allocations are
// rounded and placed and how the pool grows. The defaults are the model compared with
// cudaMallocAsync on an H200 (docs/async.md says how close it comes).
struct SimPoolOptions {
  std::size_t alignment = 512;                            // sizes round up to this
  std::size_t chunk_min = std::size_t{32} << 20;          // smallest chunk mapped
  std::size_t chunk_granularity = std::size_t{32} << 20;  // chunks are multiples of this
  bool best_fit = false;                                  // else first fit (lowest address)
  bool reuse_free_chunks = true;  // give entirely free chunks back before growing
};

// When submitted work completes (besides advance / advance_all and the synchronize
// calls, which always complete what they wait for). The config key sim_completion
// names them (docs/config.md).
enum class SimCompletion : std::uint8_t {
  manual,      // a host wait the program reports (host_waited) completes nothing
  host_waits,  // it completes the stream's work (the default)
  paced,       // as host_waits, and an event completes at its pace-th query
  eager,       // all work completes as it is submitted
};
// "manual", "host_waits", "paced", "eager".
RESERVOIR_API const char* to_string(SimCompletion completion) noexcept;

struct SimOptions {
  std::size_t capacity = kDefaultSimCapacity;  // bytes per device
  int device_count = 1;
  SimCompletion completion = SimCompletion::host_waits;
  std::uint32_t pace = 4;                          // paced: queries until an event completes
  bool host_backed = false;                        // addresses point into real host memory
  bool virtual_memory = true;                      // advertise Capability kVirtualMemory
  std::size_t granularity = std::size_t{2} << 20;  // VMM mapping granularity
  SimPlacement placement;                          // where segments and reservations go
  // host_backed memory is shared (memfd), so IPC shares data with other processes;
  // without it host-backed memory is private and IPC is not offered.
  bool shared_memory = false;
  SimPoolOptions pool;
  // Cost model, in microseconds of device time per call.
  double alloc_us = 150.0;
  double free_us = 100.0;
  double map_us = 30.0;
  double unmap_us = 30.0;
};

// Counters of calls the engine made, per SimBackend (all devices).
struct SimCounters {
  std::uint64_t allocs = 0, frees = 0;
  std::uint64_t alloc_bytes = 0, free_bytes = 0;
  std::uint64_t failed_allocs = 0;  // out_of_memory answers (real or injected)
  std::uint64_t events_created = 0, events_destroyed = 0, events_recorded = 0;
  std::uint64_t event_queries = 0, event_syncs = 0, stream_waits = 0;
  std::uint64_t stream_syncs = 0, device_syncs = 0;
  std::uint64_t host_waits = 0;  // host_waited calls that completed work (not manual)
  std::uint64_t physical_creates = 0, physical_releases = 0, maps = 0, unmaps = 0;
  std::uint64_t reservations = 0;
  std::uint64_t pool_allocs = 0, pool_frees = 0;           // allocate_from_pool / free_async
  std::uint64_t pool_chunks = 0, pool_chunk_releases = 0;  // chunks mapped / given back
  std::uint64_t ipc_exports = 0, ipc_opens = 0, ipc_closes = 0;
  std::uint64_t shareable_exports = 0, shareable_imports = 0;
  std::uint64_t host_allocs = 0, host_frees = 0;           // allocate_host / free_host
  std::uint64_t host_alloc_bytes = 0;                      // bytes allocate_host gave
  std::uint64_t copies_to_host = 0, copies_to_device = 0;  // copy_to_host / copy_to_device
  std::uint64_t bytes_to_host = 0, bytes_to_device = 0;    // bytes those copies moved
  std::uint64_t async_copies_to_device = 0;                // of them by copy_to_device_async
  double device_time_us = 0;                               // the cost model's total
};

// Operations that fault injection can target.
enum class SimOp {
  allocate,
  deallocate,
  create_event,
  record_event,
  query_event,
  synchronize_event,
  create_physical,
  map,
  unmap,
  set_access,
  reserve_address_range,
  release_physical,
  release_address_range,
  synchronize_stream,
  stream_wait_event,
  allocate_from_pool,
  free_async,
  export_ipc,
  open_ipc,
  export_shareable,
  import_shareable,
  process_memory,
  synchronize_device,
  capture_point,
  capture_follows,
  allocate_host,
  free_host,
  copy_to_host,
  copy_to_device,
  copy_to_device_async,
};
// The operation's name ("unmap"), as injected failures report it.
RESERVOIR_API const char* to_string(SimOp op) noexcept;

class RESERVOIR_API SimBackend final : public Backend {
 public:
  explicit SimBackend(const SimOptions& options = {});
  ~SimBackend() override;
  SimBackend(const SimBackend&) = delete;
  SimBackend& operator=(const SimBackend&) = delete;

  // ---- Backend ----
  const char* name() const noexcept override { return "sim"; }
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
  DeviceStatus synchronize_device(int device) override;
  DeviceStatus host_waited(int device, StreamHandle stream) override;
  // While a capture is under way every stream counts as capturing in it, and a stream's
  // point is its position (work submitted so far): work captured on a stream follows a
  // point once the stream waited, directly or through other streams' waits, for an
  // event recorded at or after it (or that work completed).
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
  // Host memory and copies: see the header comment ("Host memory and copies").
  DeviceStatus allocate_host(int device, std::size_t size, void** ptr) override;
  DeviceStatus free_host(int device, void* ptr) override;
  DeviceStatus copy_to_host(int device, void* dst, const void* src, std::size_t bytes) override;
  DeviceStatus copy_to_device(int device, void* dst, const void* src, std::size_t bytes) override;
  DeviceStatus copy_to_device_async(int device, void* dst, const void* src, std::size_t bytes,
                                    StreamHandle stream) override;
  DeviceStatus can_access_peer(int device, int peer, bool* can) override;
  DeviceStatus enable_peer_access(int device, int peer) override;
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
  std::uint64_t now_us() const override;

  // ---- Test controls ----
  // The calling thread's current device (thread-local, default 0).
  void set_current_device(int device);
  // Completes all work submitted to stream so far (on every device), up to the first
  // device-side wait (stream_wait_event) on work of another stream that has not
  // completed: work queued after such a wait cannot run before it.
  void advance(StreamHandle stream);
  // Work items submitted to stream so far (kernels and recorded events), and those
  // completed.
  std::uint64_t submitted(StreamHandle stream) const;
  std::uint64_t completed(StreamHandle stream) const;
  // Whether work submitted to waiter from now on runs after stream's work up to
  // position (1-based, as submitted() counts it): the same stream, that work already
  // completed, or waiter was made to wait for an event recorded at or after it.
  bool ordered_after(StreamHandle waiter, StreamHandle stream, std::uint64_t position) const;
  // Completes all work on every stream.
  void advance_all();
  // In eager mode all work completes at once (switching on completes pending work);
  // switching off returns to the options' completion (host_waits if that was eager).
  void set_eager(bool eager);
  // Events recorded on stream that have not completed yet.
  std::size_t pending_events(StreamHandle stream) const;
  // Device-side waits of stream on work not known to be complete (stream_wait_event),
  // which advance(stream) stops at. At most kMaxDeviceWaits per other stream waited for
  // stand apart: beyond, a new wait joins the stream's last one on that other stream
  // (the work after it waits a little longer, never less).
  std::size_t device_waits(StreamHandle stream) const;
  static constexpr std::size_t kMaxDeviceWaits = 64;
  // Models a kernel launch on stream: work that an event recorded later captures.
  void submit_work(StreamHandle stream);
  // Models cudaStreamDestroy: work already submitted still completes; a later call
  // naming the stream (record_event, stream_wait_event as the waiter,
  // synchronize_stream) answers error — undefined in CUDA, where the driver may crash.
  void destroy_stream(StreamHandle stream);
  using Backend::destroy_stream;  // the contract's (a tool's own streams; no model)

  // ---- Graph capture (cudaStreamBeginCapture in global mode, modeled) ----
  // While any stream captures, the calls a capture forbids answer error ("sim: ...
  // not permitted while stream S is capturing") and count as capture violations:
  // deallocate, unmap, release_physical, release_address_range, query_event,
  // synchronize_event, synchronize_stream, synchronize_device, copy_to_host and
  // copy_to_device. An event recorded on a capturing stream is part of the graph:
  // querying or waiting for it later is an error (and a violation) too.
  void begin_capture(StreamHandle stream);
  void end_capture(StreamHandle stream);
  bool capturing(StreamHandle stream) const;
  std::uint64_t capture_violations() const;

  // ---- Fault injection (each persists until cleared) ----
  // The nth allocate() call from now (1 = the next) answers out_of_memory.
  void fail_allocation_number(std::uint64_t n);
  // Every allocate() of more than bytes answers out_of_memory.
  void fail_allocations_above(std::size_t bytes);
  // Every call of op answers status (error: last_error() says "injected ...").
  void fail_operation(SimOp op, DeviceStatus status);
  // The nth call of op from now (1 = the next) answers status, once.
  void fail_operation_number(SimOp op, std::uint64_t n, DeviceStatus status);
  // Once the next injected failure (of any kind) has answered, the following count
  // calls of op answer status too: the calls that undo or clean up after a failure
  // fail as well, as on a device that keeps refusing. Armed once.
  void fail_after_fault(SimOp op, std::uint64_t count, DeviceStatus status);
  void clear_faults();
  // Called inside allocate() before it answers (for tests of lock release).
  void set_allocate_hook(std::function<void()> hook);

  // ---- Processes, access and copies ----
  // Other processes process_memory reports on device (besides this one).
  void set_other_processes(int device, std::vector<ProcessMemory> processes);
  // Whether work on device may read and write [ptr, ptr + size); *why says why not.
  bool can_reach(int device, const void* ptr, std::size_t size, std::string* why = nullptr) const;
  // A copy by work on device (a kernel or cudaMemcpyAsync): checks that device
  // reaches both ranges, then copies when the memory is host-backed. Returns "" or
  // why the device could not (nothing copied then).
  std::string copy(int device, void* dst, const void* src, std::size_t size);
  // IPC mappings this backend opened and has not closed (open_ipc, on every device).
  std::size_t open_ipc_mappings() const;
  // Stream-ordered pools not destroyed, on every device.
  std::size_t live_pools() const;
  // Host memory allocate_host gave and free_host has not taken back, on every device.
  std::size_t live_host_allocations() const;

  // ---- Capacity and clock ----
  void set_capacity(int device, std::size_t bytes);
  std::size_t capacity(int device) const;
  std::size_t used(int device) const;  // bytes of live segments + physical memory
  std::size_t live_segments(int device) const;
  // Address ranges reserved on device and not released yet.
  std::size_t live_reservations(int device) const;
  // The devices set_access granted on the mapping that holds ptr (sorted; empty when
  // nothing is mapped there).
  std::vector<int> access(void* ptr) const;
  // Fake clock: now_us() returns this value plus the cost model's device time.
  void set_clock_us(std::uint64_t us);
  void advance_clock_us(std::uint64_t us);

  SimCounters counters() const;
  // Calls of op since construction that named a valid device, failed ones included:
  // what fail_operation_number counts (never reset).
  std::uint64_t calls(SimOp op) const;
  void reset_counters();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace reservoir
