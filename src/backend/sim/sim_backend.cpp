// SimBackend: the deterministic simulated device (include/reservoir/sim_backend.hpp):
// devices, segments, events and streams, virtual memory and the test controls. IPC is
// in ipc.cpp, stream-ordered pools in pools.cpp, process memory, reachability, host
// memory and copies in reach.cpp; the state they share in state.hpp.
//
// One mutex guards all state; the allocate hook runs outside it. Address layout
// (synthetic mode): device d owns the window [kBase + d * stride, kBase + (d + 1) *
// stride), where the placement model (placement.hpp) puts segments and pool chunks
// top-down and reservations bottom-up, as the CUDA driver does; IPC mappings this
// backend opens come from the window after the last device. In host_backed mode
// segments are placed the same way inside one host mapping per device (a memfd with
// shared_memory), and each reservation is its
// own PROT_NONE host mapping.
//
// Counters count calls that succeeded (for query_event: answered ok or not_ready),
// except failed_allocs, which counts out_of_memory answers of allocate and
// create_physical, real or injected. For fault injection, "the nth call of op"
// counts the calls that named a valid device (allocate: also size > 0).
// deallocate does not complete stream work: no simulated kernel touches memory, so
// the engine cannot tell, and tests keep explicit control of event completion.
#include "reservoir/sim_backend.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

#include "backend/sim/placement.hpp"
#include "backend/sim/state.hpp"
#include "reservoir/errors.hpp"

namespace reservoir {

using namespace sim;

namespace {

// clang-format off
constexpr std::array<const char*, kOpCount> kOpNames = {
    "allocate", "deallocate", "create_event", "record_event", "query_event",
    "synchronize_event", "create_physical", "map", "unmap", "set_access",
    "reserve_address_range", "release_physical", "release_address_range", "synchronize_stream",
    "stream_wait_event", "allocate_from_pool", "free_async", "export_ipc", "open_ipc", "export_shareable",
    "import_shareable", "process_memory", "synchronize_device", "capture_point", "capture_follows",
    "allocate_host", "free_host", "copy_to_host", "copy_to_device",
    "copy_to_device_async"};
// clang-format on
// A name left out would be a null pointer at the end (kOpCount counts every SimOp).
static_assert(kOpNames.back() != nullptr, "a name for every SimOp");

const SimOptions& validated(const SimOptions& o) {
  const std::size_t g = o.granularity;
  if (o.device_count < 0) throw InvalidArgumentError("SimOptions: device_count is negative");
  if (g == 0 || (g & (g - 1)) != 0) {
    throw InvalidArgumentError("SimOptions: granularity " + std::to_string(g) +
                               " is not a power of two");
  }
  if (o.host_backed && g % static_cast<std::size_t>(sysconf(_SC_PAGESIZE)) != 0) {
    throw InvalidArgumentError("SimOptions: host_backed needs a granularity of whole pages");
  }
  if (o.shared_memory && !o.host_backed) {
    throw InvalidArgumentError("SimOptions: shared_memory needs host_backed");
  }
  const SimPoolOptions& p = o.pool;
  if (p.alignment == 0 || p.chunk_granularity == 0 || p.chunk_min == 0 ||
      p.chunk_min % kLargeAlignment != 0 || p.chunk_granularity % kLargeAlignment != 0) {
    throw InvalidArgumentError(
        "SimOptions: pool alignment must be positive and chunk sizes positive multiples of 2 MiB");
  }
  if (o.completion == SimCompletion::paced && o.pace == 0) {
    throw InvalidArgumentError(
        "SimOptions: pace 0: a paced device completes an event at its pace-th query (1 or more)");
  }
  if (std::string problem = sim::placement_problem(o.placement); !problem.empty()) {
    throw InvalidArgumentError(problem);
  }
  const std::size_t stride = device_stride(o.capacity);
  // One window per device, and one more for IPC mappings opened here.
  if (static_cast<std::size_t>(o.device_count) + 1 > (kAddressLimit - kBase) / stride) {
    throw InvalidArgumentError("SimOptions: too many devices for the address space");
  }
  return o;
}

// The host mapping of a host_backed device: twice the capacity (alignment padding and
// fragmentation), whole chunks, and the context's part of the window.
std::size_t host_window(const SimOptions& o) {
  const std::size_t chunk = o.placement.chunk;
  return round_up(2 * o.capacity, chunk) + 2 * chunk + o.placement.context_bytes;
}

std::atomic<std::uint64_t> g_next_instance{1};
// The current device of this thread, per SimBackend instance (keyed by instance id,
// never by address, so a new backend at a recycled address starts from device 0).
thread_local std::unordered_map<std::uint64_t, int> t_current_device;

}  // namespace

SimBackend::State::Device& SimBackend::State::device_or_throw(int device) {
  if (!valid(device)) {
    throw InvalidArgumentError("SimBackend: device " + std::to_string(device) +
                               " does not exist (device_count " +
                               std::to_string(options.device_count) + ")");
  }
  return devices[static_cast<std::size_t>(device)];
}

SimBackend::State::Event* SimBackend::State::find_event(const char* op, int device,
                                                        EventHandle event) {
  auto it = events.find(event);
  if (it == events.end()) {
    error(std::string("sim: ") + op + ": unknown event " + std::to_string(event) +
          " (destroyed or never created)");
    return nullptr;
  }
  if (it->second.device != device) {
    error(std::string("sim: ") + op + ": event " + std::to_string(event) + " belongs to device " +
          std::to_string(it->second.device) + ", not " + std::to_string(device));
    return nullptr;
  }
  return &it->second;
}

SimBackend::State::State(const SimOptions& o)
    : options(validated(o)),
      id(g_next_instance.fetch_add(1)),
      devices(static_cast<std::size_t>(o.device_count)),
      vm(o.host_backed, o.shared_memory, o.granularity,
         {[this](int d, std::size_t size, std::size_t alignment) {
            return devices[static_cast<std::size_t>(d)].space.reserve(size, alignment);
          },
          [this](int d, std::uintptr_t start) {
            devices[static_cast<std::size_t>(d)].space.release(start);
          }}),
      eager(o.completion == SimCompletion::eager),
      imports(kBase + static_cast<std::size_t>(o.device_count) * device_stride(o.capacity),
              kBase + static_cast<std::size_t>(o.device_count + 1) * device_stride(o.capacity),
              o.placement) {
  const std::size_t stride = device_stride(o.capacity);
  if (o.host_backed) host.resize(devices.size());
  for (std::size_t d = 0; d < devices.size(); ++d) {
    Device& device = devices[d];
    device.capacity = o.capacity;
    device.peers.assign(devices.size(), false);
    if (!o.host_backed) {
      device.space =
          sim::DriverPlacement(kBase + d * stride, kBase + (d + 1) * stride, o.placement);
      continue;
    }
    // MAP_NORESERVE: only what is touched costs memory.
    const std::size_t size = host_window(o);
    if (!host[d].map(size, kLargeAlignment, PROT_READ | PROT_WRITE, o.shared_memory)) {
      throw DeviceError("SimBackend: mmap of " + bytes(size) + " for host_backed failed");
    }
    device.space = sim::DriverPlacement(host[d].begin(), host[d].begin() + size, o.placement);
  }
}

SimBackend::State::~State() {
  for (auto& [start, o] : opened)
    if (o.view != nullptr) munmap(o.view, o.view_bytes);
}

std::optional<DeviceStatus> SimBackend::State::injected(SimOp op, std::size_t size) {
  const auto i = static_cast<std::size_t>(op);
  const std::uint64_t call = ++calls[i];
  std::optional<DeviceStatus> answer;
  for (auto it = numbered.begin(); it != numbered.end();) {
    if (it->op == op && it->call == call) {
      answer = it->status;  // once: consumed here
      it = numbered.erase(it);
    } else {
      ++it;
    }
  }
  if (!answer && persistent[i]) answer = persistent[i];
  if (!answer && op == SimOp::allocate && fail_above && size > *fail_above) {
    answer = DeviceStatus::out_of_memory;
  }
  if (answer == DeviceStatus::out_of_memory &&
      (op == SimOp::allocate || op == SimOp::create_physical)) {
    ++counters.failed_allocs;
  }
  if (answer) {
    // The calls that follow this failure (undo, clean-up) fail too.
    for (const FaultCascade& f : after_fault) {
      const std::uint64_t next = calls[static_cast<std::size_t>(f.op)];
      for (std::uint64_t k = 1; k <= f.count; ++k) numbered.push_back({f.op, next + k, f.status});
    }
    after_fault.clear();
  }
  return answer;
}

// ---- Devices and segments ----------------------------------------------------------

const char* to_string(SimCompletion completion) noexcept {
  switch (completion) {
    case SimCompletion::manual:
      return "manual";
    case SimCompletion::host_waits:
      return "host_waits";
    case SimCompletion::paced:
      return "paced";
    case SimCompletion::eager:
      return "eager";
  }
  return "?";
}

const char* to_string(SimOp op) noexcept {
  return kOpNames[static_cast<std::size_t>(op)];
}

SimBackend::SimBackend(const SimOptions& options) : state_(std::make_unique<State>(options)) {}

SimBackend::~SimBackend() = default;

std::uint32_t SimBackend::capabilities() const noexcept {
  const SimOptions& o = state_->options;
  // IPC needs memory another process can reach: synthetic (no data) or shared.
  const bool shareable = !o.host_backed || o.shared_memory;
  std::uint32_t caps = kPeerAccess | kStreamOrderedPool | kProcessMemory;
  if (o.virtual_memory) caps |= kVirtualMemory;
  if (shareable) caps |= kIpc | (o.virtual_memory ? kShareablePosixFd : 0u);
  return caps;
}

DeviceStatus SimBackend::device_count(int* count) {
  if (count == nullptr) return error("sim: device_count: null count");
  *count = state_->options.device_count;
  return DeviceStatus::ok;
}

DeviceStatus SimBackend::current_device(int* device) {
  const State& s = *state_;
  if (device == nullptr) return error("sim: current_device: null device");
  if (s.options.device_count == 0) return error("sim: current_device: there is no device");
  auto it = t_current_device.find(s.id);
  *device = it == t_current_device.end() ? 0 : it->second;
  return DeviceStatus::ok;
}

DeviceStatus SimBackend::memory_info(int device, MemoryInfo* info) {
  return state_->call(device, std::nullopt, [&](State::Device& d) {
    if (info == nullptr) return error("sim: memory_info: null info");
    info->total = d.capacity;
    info->free = d.free();
    return DeviceStatus::ok;
  });
}

DeviceStatus SimBackend::allocate(int device, std::size_t size, void** ptr) {
  State& s = *state_;
  if (!s.valid(device)) return bad_device(device, s.options.device_count);
  if (size == 0 || ptr == nullptr) return error("sim: allocate: size 0 or null ptr");
  std::shared_ptr<const std::function<void()>> hook;
  {
    std::lock_guard lock(s.mutex);
    hook = s.hook;
  }
  if (hook && *hook) (*hook)();  // outside the mutex: the hook may block or call us

  std::lock_guard lock(s.mutex);
  if (auto status = s.injected(SimOp::allocate, size)) {
    return injected_failure(SimOp::allocate, *status);
  }
  State::Device& d = s.devices[device];
  const std::size_t free = d.free();
  if (size > free) {
    ++s.counters.failed_allocs;
    return Failer::fail(DeviceStatus::out_of_memory,
                        "sim: device " + std::to_string(device) + " out of memory: " + bytes(size) +
                            " requested, " + bytes(free) + " free of " + bytes(d.capacity));
  }
  const std::uintptr_t start = d.space.allocate(size);
  if (start == 0) {
    ++s.counters.failed_allocs;
    return Failer::fail(
        DeviceStatus::out_of_memory,
        "sim: device " + std::to_string(device) + " has no free address range for " + bytes(size));
  }
  d.live.emplace(start, size);
  d.used += size;
  ++s.counters.allocs;
  s.counters.alloc_bytes += size;
  s.charge(s.options.alloc_us);
  *ptr = reinterpret_cast<void*>(start);
  return DeviceStatus::ok;
}

DeviceStatus SimBackend::deallocate(int device, void* ptr, std::size_t size) {
  State& s = *state_;
  return s.call(device, SimOp::deallocate, [&](State::Device& d) {
    if (auto refused = s.refused_by_capture("deallocate")) return *refused;
    const auto start = reinterpret_cast<std::uintptr_t>(ptr);
    auto it = d.live.find(start);
    if (it == d.live.end()) {
      return error("sim: deallocate: " + sim::hex(start) + " is not a live segment of device " +
                   std::to_string(device));
    }
    if (it->second != size) {
      return error("sim: deallocate: " + sim::hex(start) + " was allocated with " +
                   bytes(it->second) + ", not " + bytes(size));
    }
    if (s.options.host_backed)
      sim::host_discard(start, round_up(size, kSmallAlignment), s.options.shared_memory);
    d.space.release(start);
    d.live.erase(it);
    d.used -= size;
    ++s.counters.frees;
    s.counters.free_bytes += size;
    s.charge(s.options.free_us);
    return DeviceStatus::ok;
  });
}

// ---- Events and streams --------------------------------------------------------------

DeviceStatus SimBackend::create_event(int device, EventHandle* event) {
  State& s = *state_;
  return s.call(device, SimOp::create_event, [&](State::Device&) {
    if (event == nullptr) return error("sim: create_event: null event");
    *event = s.next_event++;
    s.events.emplace(*event, State::Event{device, false, 0, 0});
    ++s.counters.events_created;
    return DeviceStatus::ok;
  });
}

DeviceStatus SimBackend::destroy_event(int device, EventHandle event) {
  State& s = *state_;
  return s.call(device, std::nullopt, [&](State::Device&) {
    if (s.find_event("destroy_event", device, event) == nullptr) return DeviceStatus::error;
    s.events.erase(event);
    ++s.counters.events_destroyed;
    return DeviceStatus::ok;
  });
}

DeviceStatus SimBackend::record_event(int device, EventHandle event, StreamHandle stream) {
  State& s = *state_;
  return s.call(device, SimOp::record_event, [&](State::Device&) {
    State::Event* e = s.find_event("record_event", device, event);
    if (e == nullptr) return DeviceStatus::error;
    State::Stream& st = s.streams[stream];
    if (st.destroyed) return s.destroyed_stream("record_event", stream);
    e->captured = s.capturing.count(stream) != 0;
    e->recorded = true;
    e->stream = stream;
    e->position = ++st.submitted;  // the event is a marker after the work so far
    e->queries = 0;
    if (s.eager) st.completed = st.submitted;
    ++s.counters.events_recorded;
    return DeviceStatus::ok;
  });
}

DeviceStatus SimBackend::query_event(int device, EventHandle event) {
  State& s = *state_;
  return s.call(device, SimOp::query_event, [&](State::Device&) {
    State::Event* e = s.find_event("query_event", device, event);
    if (e == nullptr) return DeviceStatus::error;
    if (auto refused = s.refused_by_capture("query_event")) return *refused;
    if (auto refused = s.refused_captured_event("query_event", *e)) return *refused;
    ++s.counters.event_queries;
    if (!e->recorded) return DeviceStatus::ok;
    State::Stream& st = s.streams[e->stream];
    if (st.completed >= e->position) return DeviceStatus::ok;
    // Paced: the device gets through the stream's work up to the event while the host
    // polls it pace times.
    if (s.options.completion == SimCompletion::paced && !s.eager &&
        ++e->queries >= s.options.pace) {
      st.completed = e->position;
      return DeviceStatus::ok;
    }
    return DeviceStatus::not_ready;
  });
}

DeviceStatus SimBackend::synchronize_event(int device, EventHandle event) {
  State& s = *state_;
  return s.call(device, SimOp::synchronize_event, [&](State::Device&) {
    const State::Event* e = s.find_event("synchronize_event", device, event);
    if (e == nullptr) return DeviceStatus::error;
    if (auto refused = s.refused_by_capture("synchronize_event")) return *refused;
    if (auto refused = s.refused_captured_event("synchronize_event", *e)) return *refused;
    if (e->recorded) {
      // The host waits, so the stream's work up to the marker finishes.
      State::Stream& st = s.streams[e->stream];
      st.completed = std::max(st.completed, e->position);
    }
    ++s.counters.event_syncs;
    s.apply_release_thresholds(device);
    return DeviceStatus::ok;
  });
}

DeviceStatus SimBackend::stream_wait_event(int device, StreamHandle stream, EventHandle event) {
  State& s = *state_;
  return s.call(device, SimOp::stream_wait_event, [&](State::Device&) {
    const State::Event* e = s.find_event("stream_wait_event", device, event);
    if (e == nullptr) return DeviceStatus::error;
    State::Stream& waiter = s.streams[stream];
    if (waiter.destroyed) return s.destroyed_stream("stream_wait_event", stream);
    ++s.counters.stream_waits;
    if (!e->recorded || e->stream == stream) return DeviceStatus::ok;
    std::uint64_t& w = waiter.waited[e->stream];
    w = std::max(w, e->position);
    if (s.streams[e->stream].completed < e->position) {
      // Work that never completes must not make the list grow without bound: past the
      // cap, the last wait on the same stream takes the new position.
      auto last = std::find_if(waiter.waits.rbegin(), waiter.waits.rend(),
                               [&](const State::Wait& x) { return x.stream == e->stream; });
      if (waiter.waits.size() >= kMaxDeviceWaits && last != waiter.waits.rend())
        last->position = std::max(last->position, e->position);
      else
        waiter.waits.push_back(State::Wait{waiter.submitted, e->stream, e->position});
    }
    return DeviceStatus::ok;
  });
}

DeviceStatus SimBackend::synchronize_stream(int device, StreamHandle stream) {
  State& s = *state_;
  return s.call(device, SimOp::synchronize_stream, [&](State::Device&) {
    if (auto refused = s.refused_by_capture("synchronize_stream")) return *refused;
    auto it = s.streams.find(stream);
    if (it != s.streams.end() && it->second.destroyed)
      return s.destroyed_stream("synchronize_stream", stream);
    if (it != s.streams.end()) State::finish(it->second);
    ++s.counters.stream_syncs;
    s.apply_release_thresholds(device);
    return DeviceStatus::ok;
  });
}

DeviceStatus SimBackend::synchronize_device(int device) {
  State& s = *state_;
  return s.call(device, SimOp::synchronize_device, [&](State::Device&) {
    if (auto refused = s.refused_by_capture("synchronize_device")) return *refused;
    s.complete_all();  // streams are not per device: all of them finish
    ++s.counters.device_syncs;
    s.apply_release_thresholds(device);
    return DeviceStatus::ok;
  });
}

DeviceStatus SimBackend::host_waited(int device, StreamHandle stream) {
  State& s = *state_;
  return s.call(device, std::nullopt, [&](State::Device&) {
    // manual: tests keep explicit control; the program's word completes nothing.
    if (s.options.completion == SimCompletion::manual) return DeviceStatus::ok;
    auto it = s.streams.find(stream);
    if (it != s.streams.end()) State::finish(it->second);
    ++s.counters.host_waits;
    s.apply_release_thresholds(device);
    return DeviceStatus::ok;
  });
}

// ---- Virtual memory ------------------------------------------------------------------

DeviceStatus SimBackend::granularity(int device, std::size_t* bytes) {
  if (!state_->options.virtual_memory) return Backend::granularity(device, bytes);
  return state_->call(device, std::nullopt, [&](State::Device&) {
    if (bytes == nullptr) return error("sim: granularity: null bytes");
    *bytes = state_->options.granularity;
    return DeviceStatus::ok;
  });
}

DeviceStatus SimBackend::reserve_address_range(int device, std::size_t size, std::size_t alignment,
                                               void** ptr) {
  State& s = *state_;
  if (!s.options.virtual_memory)
    return Backend::reserve_address_range(device, size, alignment, ptr);
  return s.call(device, SimOp::reserve_address_range, [&](State::Device&) {
    if (ptr == nullptr) return error("sim: reserve_address_range: null ptr");
    bool no_room = false;
    if (std::string problem = s.vm.reserve(device, size, alignment, ptr, &no_room);
        !problem.empty()) {
      // cuMemAddressReserve answers CUDA_ERROR_OUT_OF_MEMORY when the space is used up.
      return no_room ? Failer::fail(DeviceStatus::out_of_memory, problem) : error(problem);
    }
    ++s.counters.reservations;
    return DeviceStatus::ok;
  });
}

DeviceStatus SimBackend::release_address_range(int device, void* ptr, std::size_t size) {
  State& s = *state_;
  if (!s.options.virtual_memory) return Backend::release_address_range(device, ptr, size);
  return s.call(device, SimOp::release_address_range, [&](State::Device&) {
    if (auto refused = s.refused_by_capture("release_address_range")) return *refused;
    std::string problem = s.vm.release(device, ptr, size);
    return problem.empty() ? DeviceStatus::ok : error(problem);
  });
}

DeviceStatus SimBackend::create_physical(int device, std::size_t size, PhysicalHandle* handle) {
  State& s = *state_;
  if (!s.options.virtual_memory) return Backend::create_physical(device, size, handle);
  return s.call(device, SimOp::create_physical, [&](State::Device& d) {
    if (handle == nullptr) return error("sim: create_physical: null handle");
    if (size == 0 || size % s.options.granularity != 0) {
      return error("sim: create_physical: size " + std::to_string(size) +
                   " is not a positive multiple of the granularity " +
                   std::to_string(s.options.granularity));
    }
    const std::size_t free = d.free();
    if (size > free) {
      ++s.counters.failed_allocs;
      return Failer::fail(DeviceStatus::out_of_memory,
                          "sim: create_physical: device " + std::to_string(device) +
                              " out of memory: " + bytes(size) + " requested, " + bytes(free) +
                              " free of " + bytes(d.capacity));
    }
    const PhysicalHandle made = s.vm.create(device, size);
    if (made == 0) return error("sim: create_physical: memfd_create for shared memory failed");
    *handle = made;
    d.used += size;
    ++s.counters.physical_creates;
    return DeviceStatus::ok;
  });
}

DeviceStatus SimBackend::release_physical(int device, PhysicalHandle handle) {
  State& s = *state_;
  if (!s.options.virtual_memory) return Backend::release_physical(device, handle);
  return s.call(device, SimOp::release_physical, [&](State::Device& d) {
    if (auto refused = s.refused_by_capture("release_physical")) return *refused;
    std::size_t freed = 0;
    if (std::string problem = s.vm.release_physical(device, handle, &freed); !problem.empty()) {
      return error(problem);
    }
    d.used -= freed;
    ++s.counters.physical_releases;
    return DeviceStatus::ok;
  });
}

DeviceStatus SimBackend::map(int device, void* ptr, std::size_t size, PhysicalHandle handle) {
  State& s = *state_;
  if (!s.options.virtual_memory) return Backend::map(device, ptr, size, handle);
  return s.call(device, SimOp::map, [&](State::Device&) {
    if (std::string problem = s.vm.map(device, ptr, size, handle); !problem.empty()) {
      return error(problem);
    }
    ++s.counters.maps;
    s.charge(s.options.map_us);
    return DeviceStatus::ok;
  });
}

DeviceStatus SimBackend::unmap(int device, void* ptr, std::size_t size) {
  State& s = *state_;
  if (!s.options.virtual_memory) return Backend::unmap(device, ptr, size);
  return s.call(device, SimOp::unmap, [&](State::Device& d) {
    if (auto refused = s.refused_by_capture("unmap")) return *refused;
    if (size == 0) return error("sim: unmap: size 0");
    std::size_t freed = 0;
    if (std::string problem = s.vm.unmap(device, ptr, size, &freed); !problem.empty()) {
      return error(problem);
    }
    d.used -= freed;  // handles released earlier, now unmapped everywhere
    ++s.counters.unmaps;
    s.charge(s.options.unmap_us);
    return DeviceStatus::ok;
  });
}

DeviceStatus SimBackend::set_access(int device, void* ptr, std::size_t size, const int* devices,
                                    int count) {
  State& s = *state_;
  if (!s.options.virtual_memory) return Backend::set_access(device, ptr, size, devices, count);
  return s.call(device, SimOp::set_access, [&](State::Device&) {
    if (size == 0) return error("sim: set_access: size 0");
    std::string problem =
        s.vm.set_access(device, ptr, size, devices, count, s.options.device_count);
    return problem.empty() ? DeviceStatus::ok : error(problem);
  });
}

// ---- Peer access and clock -----------------------------------------------------------

DeviceStatus SimBackend::can_access_peer(int device, int peer, bool* can) {
  State& s = *state_;
  if (!s.valid(peer)) return bad_device(peer, s.options.device_count);
  return s.call(device, std::nullopt, [&](State::Device&) {
    if (can == nullptr) return error("sim: can_access_peer: null can");
    *can = device != peer;
    return DeviceStatus::ok;
  });
}

DeviceStatus SimBackend::enable_peer_access(int device, int peer) {
  State& s = *state_;
  if (!s.valid(peer)) return bad_device(peer, s.options.device_count);
  return s.call(device, std::nullopt, [&](State::Device& d) {
    if (device == peer) {
      return error("sim: enable_peer_access: device " + std::to_string(device) +
                   " cannot be its own peer");
    }
    d.peers[static_cast<std::size_t>(peer)] = true;  // enabling twice is fine
    return DeviceStatus::ok;
  });
}

std::uint64_t SimBackend::now_us() const {
  std::lock_guard lock(state_->mutex);
  return state_->clock_us + static_cast<std::uint64_t>(state_->device_time_us);
}

// ---- Test controls -------------------------------------------------------------------

void SimBackend::set_current_device(int device) {
  state_->device_or_throw(device);
  t_current_device[state_->id] = device;
}

void SimBackend::advance(StreamHandle stream) {
  std::lock_guard lock(state_->mutex);
  auto it = state_->streams.find(stream);
  if (it == state_->streams.end()) return;
  State::Stream& st = it->second;
  // Work after a wait on an unfinished stream cannot complete: the stream stops there.
  std::uint64_t target = st.submitted;
  std::erase_if(st.waits, [&](const State::Wait& w) {
    if (state_->streams[w.stream].completed >= w.position) return true;
    target = std::min(target, w.at);
    return false;
  });
  st.completed = std::max(st.completed, target);
}

std::uint64_t SimBackend::submitted(StreamHandle stream) const {
  std::lock_guard lock(state_->mutex);
  auto it = state_->streams.find(stream);
  return it == state_->streams.end() ? 0 : it->second.submitted;
}

std::uint64_t SimBackend::completed(StreamHandle stream) const {
  std::lock_guard lock(state_->mutex);
  auto it = state_->streams.find(stream);
  return it == state_->streams.end() ? 0 : it->second.completed;
}

bool SimBackend::ordered_after(StreamHandle waiter, StreamHandle stream,
                               std::uint64_t position) const {
  std::lock_guard lock(state_->mutex);
  if (waiter == stream) return true;  // one stream's work runs in order
  auto s = state_->streams.find(stream);
  if (s == state_->streams.end() || s->second.completed >= position) return true;
  auto w = state_->streams.find(waiter);
  if (w == state_->streams.end()) return false;
  auto it = w->second.waited.find(stream);
  return it != w->second.waited.end() && it->second >= position;
}

void SimBackend::advance_all() {
  std::lock_guard lock(state_->mutex);
  state_->complete_all();
}

void SimBackend::begin_capture(StreamHandle stream) {
  std::lock_guard lock(state_->mutex);
  if (state_->capturing.empty()) ++state_->capture_id;
  state_->capturing.insert(stream);
}

void SimBackend::end_capture(StreamHandle stream) {
  std::lock_guard lock(state_->mutex);
  state_->capturing.erase(stream);
}

bool SimBackend::capturing(StreamHandle stream) const {
  std::lock_guard lock(state_->mutex);
  return state_->capturing.count(stream) != 0;
}

std::uint64_t SimBackend::capture_violations() const {
  std::lock_guard lock(state_->mutex);
  return state_->capture_violations;
}

void SimBackend::set_eager(bool eager) {
  std::lock_guard lock(state_->mutex);
  state_->eager = eager;
  if (eager) state_->complete_all();
}

std::size_t SimBackend::pending_events(StreamHandle stream) const {
  std::lock_guard lock(state_->mutex);
  auto st = state_->streams.find(stream);
  if (st == state_->streams.end()) return 0;
  return static_cast<std::size_t>(
      std::count_if(state_->events.begin(), state_->events.end(), [&](const auto& entry) {
        const State::Event& e = entry.second;
        return e.recorded && e.stream == stream && e.position > st->second.completed;
      }));
}

std::size_t SimBackend::device_waits(StreamHandle stream) const {
  std::lock_guard lock(state_->mutex);
  auto st = state_->streams.find(stream);
  return st == state_->streams.end() ? 0 : st->second.waits.size();
}

void SimBackend::submit_work(StreamHandle stream) {
  std::lock_guard lock(state_->mutex);
  State::Stream& st = state_->streams[stream];
  ++st.submitted;
  if (state_->eager) st.completed = st.submitted;
}

void SimBackend::destroy_stream(StreamHandle stream) {
  std::lock_guard lock(state_->mutex);
  state_->streams[stream].destroyed = true;  // its work still completes, as in CUDA
}

void SimBackend::fail_allocation_number(std::uint64_t n) {
  fail_operation_number(SimOp::allocate, n, DeviceStatus::out_of_memory);
}

void SimBackend::fail_allocations_above(std::size_t bytes) {
  std::lock_guard lock(state_->mutex);
  state_->fail_above = bytes;
}

void SimBackend::fail_operation(SimOp op, DeviceStatus status) {
  std::lock_guard lock(state_->mutex);
  auto& slot = state_->persistent[static_cast<std::size_t>(op)];
  if (status == DeviceStatus::ok) {
    slot.reset();  // "fail with ok" means: stop failing
  } else {
    slot = status;
  }
}

void SimBackend::fail_operation_number(SimOp op, std::uint64_t n, DeviceStatus status) {
  if (n == 0 || status == DeviceStatus::ok) return;
  std::lock_guard lock(state_->mutex);
  const std::uint64_t call = state_->calls[static_cast<std::size_t>(op)] + n;
  state_->numbered.push_back({op, call, status});
}

void SimBackend::fail_after_fault(SimOp op, std::uint64_t count, DeviceStatus status) {
  if (count == 0 || status == DeviceStatus::ok) return;
  std::lock_guard lock(state_->mutex);
  state_->after_fault.push_back({op, count, status});
}

void SimBackend::clear_faults() {
  std::lock_guard lock(state_->mutex);
  state_->persistent = {};
  state_->numbered.clear();
  state_->after_fault.clear();
  state_->fail_above.reset();
}

void SimBackend::set_allocate_hook(std::function<void()> hook) {
  auto shared = std::make_shared<const std::function<void()>>(std::move(hook));
  std::lock_guard lock(state_->mutex);
  state_->hook = std::move(shared);
}

void SimBackend::set_capacity(int device, std::size_t bytes) {
  std::lock_guard lock(state_->mutex);
  state_->device_or_throw(device).capacity = bytes;
}

std::size_t SimBackend::capacity(int device) const {
  std::lock_guard lock(state_->mutex);
  return state_->device_or_throw(device).capacity;
}

std::size_t SimBackend::used(int device) const {
  std::lock_guard lock(state_->mutex);
  return state_->device_or_throw(device).used;
}

std::size_t SimBackend::live_segments(int device) const {
  std::lock_guard lock(state_->mutex);
  return state_->device_or_throw(device).live.size();
}

std::size_t SimBackend::live_reservations(int device) const {
  std::lock_guard lock(state_->mutex);
  state_->device_or_throw(device);
  return state_->vm.reservations(device);
}

std::vector<int> SimBackend::access(void* ptr) const {
  std::lock_guard lock(state_->mutex);
  return state_->vm.access(ptr);
}

void SimBackend::set_clock_us(std::uint64_t us) {
  std::lock_guard lock(state_->mutex);
  state_->clock_us = us;
}

void SimBackend::advance_clock_us(std::uint64_t us) {
  std::lock_guard lock(state_->mutex);
  state_->clock_us += us;
}

std::uint64_t SimBackend::calls(SimOp op) const {
  std::lock_guard lock(state_->mutex);
  return state_->calls[static_cast<std::size_t>(op)];
}

SimCounters SimBackend::counters() const {
  std::lock_guard lock(state_->mutex);
  return state_->counters;
}

void SimBackend::reset_counters() {
  std::lock_guard lock(state_->mutex);
  state_->counters = {};  // the clock keeps its device time: now_us() stays monotonic
}

}  // namespace reservoir
