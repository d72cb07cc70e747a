// SimBackend's state (internal), shared by its translation units: sim_backend.cpp
// (devices, segments, events, virtual memory, test controls), ipc.cpp (IPC and
// shareable handles), pools.cpp (stream-ordered pools) and reach.cpp
// (process memory, reachability, copies, host memory).
//
// One mutex guards all state. Address layout (synthetic mode): device d owns
// [kBase + d * stride, kBase + (d + 1) * stride), placed by the driver's placement
// model (placement.hpp: segments and pool chunks top-down, reservations
// bottom-up); IPC mappings this backend opens come from the window after the last
// device.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/sim/address_space.hpp"
#include "backend/sim/memory_pool.hpp"
#include "backend/sim/placement.hpp"
#include "reservoir/sim_backend.hpp"

namespace reservoir {

namespace sim {

inline constexpr std::uintptr_t kBase = 0x7f0000000000;
inline constexpr std::size_t kSmallAlignment = 512;
inline constexpr std::size_t kLargeAlignment = std::size_t{2} << 20;
// SimOp's last enumerator + 1 (sim_backend.cpp names every one of them).
inline constexpr std::size_t kOpCount = static_cast<std::size_t>(SimOp::copy_to_device_async) + 1;

inline std::size_t round_up(std::size_t value, std::size_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

inline std::string bytes(std::size_t n) {
  return std::to_string(n) + " bytes";
}

// Synthetic address window per device, like a GPU's virtual address space: far beyond
// its memory (an H200's 140 GB get 2^49 bytes, the 49-bit space of NVIDIA GPUs), at
// least 2048x the capacity, so segments (from the top) and the expandable-segment
// reservations of hundreds of streams (each stream and pool device memory + 1/8, from
// the bottom) find room; the limit past them is an out-of-memory answer.
inline std::size_t device_stride(std::size_t capacity) {
  std::size_t stride = std::size_t{1} << 48;
  while (stride / 2048 < capacity && stride < (std::size_t{1} << 52)) stride *= 2;
  return stride;
}

// Synthetic addresses stay below 2^57 (the 57-bit virtual addresses of 5-level
// paging), which Reservoir's segment map covers.
inline constexpr std::uintptr_t kAddressLimit = std::uintptr_t{1} << 57;

// Backend::fail is protected; this lets the helpers (not members) use it.
struct Failer : Backend {
  using Backend::fail;
};

inline DeviceStatus bad_device(int device, int count) {
  return Failer::fail(DeviceStatus::error, "sim: device " + std::to_string(device) +
                                               " does not exist (device_count " +
                                               std::to_string(count) + ")");
}

inline DeviceStatus error(const std::string& message) {
  return Failer::fail(DeviceStatus::error, message);
}

inline DeviceStatus unsupported(const std::string& message) {
  return Failer::fail(DeviceStatus::unsupported, message);
}

inline DeviceStatus injected_failure(SimOp op, DeviceStatus status) {
  return Failer::fail(status,
                      std::string("sim: injected ") + to_string(status) + " in " + to_string(op));
}

}  // namespace sim

struct SimBackend::State {
  // Invariants: used == sum of live segment sizes + bytes of physical allocations not
  // yet freed (imported ones excluded) + bytes of pool chunks; each live segment
  // [start, start + round_up(size, 512)) and each pool chunk is taken from space, and
  // none overlap (space hands out disjoint runs).
  struct Device {
    std::size_t capacity = 0;
    std::size_t used = 0;  // may exceed capacity after set_capacity lowers it
    sim::DriverPlacement space;
    std::map<std::uintptr_t, std::size_t> live;  // segment start -> requested size
    std::vector<bool> peers;                     // enable_peer_access(this, peer)
    std::vector<ProcessMemory> others;           // set_other_processes
    std::size_t free() const { return used < capacity ? capacity - used : 0; }
  };
  // Invariant: completed <= submitted. Work item n (1-based) has completed iff
  // n <= completed; an event recorded at position p completed iff p <= completed.
  // waits: the device-side waits inserted on this stream (stream_wait_event), in
  // order: work after position `at` cannot complete before `stream` completes
  // `position`. waited: per other stream, the highest position this stream was made to
  // wait for (ordered_after, and the pools' reuse after event dependencies).
  struct Wait {
    std::uint64_t at;
    StreamHandle stream;
    std::uint64_t position;
  };
  struct Stream {
    std::uint64_t submitted = 0;
    std::uint64_t completed = 0;
    bool destroyed = false;  // destroy_stream: calls naming it answer error
    std::vector<Wait> waits;
    std::map<StreamHandle, std::uint64_t> waited;
  };
  // Invariant: recorded implies position >= 1 and streams contains stream.
  struct Event {
    int device = 0;
    bool recorded = false;
    StreamHandle stream = 0;
    std::uint64_t position = 0;
    bool captured = false;      // recorded on a capturing stream: part of a graph
    std::uint32_t queries = 0;  // not_ready answers since recorded (paced completion)
  };
  // Answers status on call number `call` of op (call counts from construction).
  struct NumberedFault {
    SimOp op;
    std::uint64_t call;
    DeviceStatus status;
  };
  // Armed by fail_after_fault: count calls of op fail once the next fault fires.
  struct FaultCascade {
    SimOp op;
    std::uint64_t count;
    DeviceStatus status;
  };
  // A stream-ordered pool. Invariant: pool_of[a] == handle for every live
  // allocation a of model, and chunks[c].device == device for each of its chunks.
  struct Pool {
    int device = 0;
    std::unique_ptr<sim::PoolModel> model;
    std::vector<int> access;  // devices set_pool_access granted (besides device)
  };
  // An IPC mapping this backend opened: [start, start + size) in the imports window
  // (synthetic) or a host view of the exporter's shared memory.
  struct OpenIpc {
    int device = 0;
    std::size_t size = 0;
    std::string key;             // the handle's identity (one open per handle)
    void* view = nullptr;        // host view (munmap on close), or nullptr
    std::size_t view_bytes = 0;  // its length
  };

  explicit State(const SimOptions& o);
  ~State();

  bool valid(int device) const { return device >= 0 && device < options.device_count; }
  // Counts a call of op; returns the injected answer, or nullopt.
  std::optional<DeviceStatus> injected(SimOp op, std::size_t size = 0);
  void charge(double us) {
    counters.device_time_us += us;
    device_time_us += us;
  }
  // Checks device, locks, counts a call of op (when given) and answers its injected
  // fault; otherwise runs body(device) under the lock.
  template <typename Body>
  DeviceStatus call(int device, std::optional<SimOp> op, Body&& body) {
    if (!valid(device)) return sim::bad_device(device, options.device_count);
    std::lock_guard lock(mutex);
    if (op) {
      if (auto status = injected(*op)) return sim::injected_failure(*op, *status);
    }
    return body(devices[static_cast<std::size_t>(device)]);
  }
  // For test controls, which have no status to answer with.
  Device& device_or_throw(int device);
  // The event, or nullptr after setting the error (unknown, or of another device).
  Event* find_event(const char* op, int device, EventHandle event);
  // Under the lock: an error when a capture forbids op now (counted), else nullopt.
  std::optional<DeviceStatus> refused_by_capture(const char* op) {
    if (capturing.empty()) return std::nullopt;
    ++capture_violations;
    return sim::error(std::string("sim: ") + op + " is not permitted while stream " +
                      std::to_string(*capturing.begin()) + " is capturing");
  }
  std::optional<DeviceStatus> refused_captured_event(const char* op, const Event& e) {
    if (!e.captured) return std::nullopt;
    ++capture_violations;
    return sim::error(std::string("sim: ") + op + ": the event was recorded during a capture");
  }
  // The error of a call naming a destroyed stream (undefined in CUDA: the driver may
  // crash; the simulated device says so).
  DeviceStatus destroyed_stream(const char* op, StreamHandle stream) {
    return sim::error(std::string("sim: ") + op + " on stream " + std::to_string(stream) +
                      ", which was destroyed");
  }
  // A host wait for the stream: all its work so far completes.
  static void finish(Stream& stream) {
    stream.completed = stream.submitted;
    stream.waits.clear();
  }
  void complete_all() {
    for (auto& [handle, stream] : streams) finish(stream);
  }
  // How far streams have got, for the pools (valid under the mutex).
  sim::StreamProgress progress();
  // After a synchronization: every pool of device (-1: all) gives back what exceeds
  // its release threshold.
  void apply_release_thresholds(int device);
  // A chunk of a pool: grow / shrink for device d's pools.
  bool take_chunk(int device, PoolHandle pool, std::size_t size, std::uintptr_t* address);
  void give_chunk(int device, std::uintptr_t address, std::size_t size);
  // Whether device reaches [p, p + size); "" or why not.
  std::string reach(int device, std::uintptr_t p, std::size_t size) const;
  // copy_to_host (to_host), copy_to_device and, with a stream, copy_to_device_async
  // (reach.cpp).
  DeviceStatus host_copy(int device, bool to_host, void* dst, const void* src, std::size_t bytes,
                         const StreamHandle* stream = nullptr);

  const SimOptions options;
  const std::uint64_t id;
  mutable std::mutex mutex;
  std::vector<Device> devices;
  std::vector<sim::HostMapping> host;  // host_backed: device d's segment memory
  sim::VirtualSpace vm;
  std::unordered_map<StreamHandle, Stream> streams;
  std::unordered_map<EventHandle, Event> events;
  EventHandle next_event = 1;
  bool eager = false;
  std::set<StreamHandle> capturing;
  std::uint64_t capture_id = 0;  // counts captures begun while none was (capture_point)
  std::uint64_t capture_violations = 0;

  std::unordered_map<PoolHandle, Pool> pools;
  PoolHandle next_pool = 1;
  std::unordered_map<std::uintptr_t, PoolHandle> pool_of;  // live pool allocation -> pool
  struct Chunk {
    int device;
    std::size_t size;
    PoolHandle pool;
  };
  std::map<std::uintptr_t, Chunk> chunks;  // every pool chunk, by start

  sim::DriverPlacement imports;              // synthetic addresses of opened IPC mappings
  std::map<std::uintptr_t, OpenIpc> opened;  // by start
  std::set<std::string> open_keys;

  // allocate_host's memory, by start (HostMapping::begin()), until free_host.
  struct HostAllocation {
    int device = 0;
    sim::HostMapping memory;
  };
  std::unordered_map<std::uintptr_t, HostAllocation> host_allocations;

  std::array<std::uint64_t, sim::kOpCount> calls{};
  std::array<std::optional<DeviceStatus>, sim::kOpCount> persistent{};
  std::vector<NumberedFault> numbered;
  std::vector<FaultCascade> after_fault;
  std::optional<std::size_t> fail_above;
  std::shared_ptr<const std::function<void()>> hook;

  SimCounters counters;
  double device_time_us = 0;  // like counters.device_time_us, but never reset (clock)
  std::uint64_t clock_us = 0;
};

}  // namespace reservoir
