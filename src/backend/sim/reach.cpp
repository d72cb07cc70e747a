// SimBackend: the processes using a device (process_memory), and which memory a
// device's work may reach (can_reach, copy): its own segments, pool chunks and IPC
// mappings; a peer's segments and IPC mappings after enable_peer_access; pool memory
// whose pool granted it access (set_pool_access); virtual-memory mappings that granted
// it access (set_access), whoever's they are. Also host memory (allocate_host,
// free_host) and the synchronous copies between it and the device (copy_to_host,
// copy_to_device), whose device range must be memory the device reaches.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "backend/sim/state.hpp"

namespace reservoir {

using namespace sim;

namespace {
// The entry of ranges (start -> value) holding [p, p + size), or ranges.end().
template <typename Map, typename SizeOf>
auto holding(const Map& ranges, std::uintptr_t p, std::size_t size, SizeOf size_of) {
  auto it = ranges.upper_bound(p);
  if (it == ranges.begin()) return ranges.end();
  --it;
  const std::size_t n = size_of(it->second);
  return p - it->first < n && size <= n - (p - it->first) ? it : ranges.end();
}
}  // namespace

std::string SimBackend::State::reach(int device, std::uintptr_t p, std::size_t size) const {
  const auto& self = devices[static_cast<std::size_t>(device)];
  auto owned_by = [&](int owner, const char* what) -> std::string {
    if (owner == device || self.peers[static_cast<std::size_t>(owner)]) return "";
    return "device " + std::to_string(device) + " may not reach " + what + " of device " +
           std::to_string(owner) + " at " + hex(p) + " (no peer access: enable_peer_access)";
  };
  for (std::size_t d = 0; d < devices.size(); ++d) {
    const auto& live = devices[d].live;
    if (holding(live, p, size, [](std::size_t n) { return round_up(n, kSmallAlignment); }) !=
        live.end())
      return owned_by(static_cast<int>(d), "a segment");
  }
  if (auto c = holding(chunks, p, size, [](const Chunk& k) { return k.size; }); c != chunks.end()) {
    // Pool memory is reached by its device and the devices the pool granted access
    // (cuMemPoolSetAccess); peer access does not extend to it.
    auto pool = pools.find(c->second.pool);
    if (c->second.device == device ||
        (pool != pools.end() && std::find(pool->second.access.begin(), pool->second.access.end(),
                                          device) != pool->second.access.end()))
      return "";
    return "device " + std::to_string(device) + " may not reach pool memory of device " +
           std::to_string(c->second.device) + " at " + hex(p) + " (set_pool_access)";
  }
  if (auto o = holding(opened, p, size, [](const OpenIpc& m) { return m.size; }); o != opened.end())
    return owned_by(o->second.device, "an IPC mapping");
  std::string mapped = vm.reach(device, p, size);
  if (mapped != "none") return mapped;
  return hex(p) + " (" + bytes(size) + ") is not device memory of this simulated device";
}

DeviceStatus SimBackend::process_memory(int device, std::vector<ProcessMemory>* out) {
  State& s = *state_;
  return s.call(device, SimOp::process_memory, [&](State::Device& d) {
    if (out == nullptr) return error("sim: process_memory: null out");
    out->clear();
    out->push_back(ProcessMemory{static_cast<std::uint32_t>(getpid()), d.used});
    out->insert(out->end(), d.others.begin(), d.others.end());
    return DeviceStatus::ok;
  });
}

void SimBackend::set_other_processes(int device, std::vector<ProcessMemory> processes) {
  std::lock_guard lock(state_->mutex);
  state_->device_or_throw(device).others = std::move(processes);
}

bool SimBackend::can_reach(int device, const void* ptr, std::size_t size, std::string* why) const {
  std::lock_guard lock(state_->mutex);
  const State& s = *state_;
  std::string problem = !s.valid(device) ? "device " + std::to_string(device) + " does not exist"
                        : size == 0      ? std::string("size 0")
                                    : s.reach(device, reinterpret_cast<std::uintptr_t>(ptr), size);
  if (why) *why = problem;
  return problem.empty();
}

std::string SimBackend::copy(int device, void* dst, const void* src, std::size_t size) {
  std::string why;
  if (!can_reach(device, src, size, &why)) return "sim: copy: source: " + why;
  if (!can_reach(device, dst, size, &why)) return "sim: copy: destination: " + why;
  if (state_->options.host_backed) std::memmove(dst, src, size);
  return "";
}

// ---- Host memory and copies ------------------------------------------------------------

DeviceStatus SimBackend::allocate_host(int device, std::size_t size, void** ptr) {
  State& s = *state_;
  return s.call(device, SimOp::allocate_host, [&](State::Device&) {
    if (size == 0 || ptr == nullptr) return error("sim: allocate_host: size 0 or null ptr");
    // Page-aligned, as pinned memory is; MAP_NORESERVE: a synthetic device's copies never
    // touch it, so even buffers the size of the device's memory cost nothing untouched.
    State::HostAllocation a{device, HostMapping()};
    if (!a.memory.map(size, 0, PROT_READ | PROT_WRITE)) {
      return Failer::fail(DeviceStatus::out_of_memory,
                          "sim: allocate_host: the host has no " + bytes(size) + " to give");
    }
    const std::uintptr_t start = a.memory.begin();
    s.host_allocations.emplace(start, std::move(a));
    ++s.counters.host_allocs;
    s.counters.host_alloc_bytes += size;
    *ptr = reinterpret_cast<void*>(start);
    return DeviceStatus::ok;
  });
}

DeviceStatus SimBackend::free_host(int device, void* ptr) {
  State& s = *state_;
  return s.call(device, SimOp::free_host, [&](State::Device&) {
    auto it = s.host_allocations.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == s.host_allocations.end()) {
      return error("sim: free_host: " + hex(reinterpret_cast<std::uintptr_t>(ptr)) +
                   " was not allocated by allocate_host (or was freed already)");
    }
    s.host_allocations.erase(it);  // unmaps it
    ++s.counters.host_frees;
    return DeviceStatus::ok;
  });
}

// copy_to_host (to_host) or copy_to_device: the device range (src, or dst) must be
// memory the device reaches. Waits for nothing else.
DeviceStatus SimBackend::State::host_copy(int device, bool to_host, void* dst, const void* src,
                                          std::size_t bytes, const StreamHandle* stream) {
  const SimOp op = to_host  ? SimOp::copy_to_host
                   : stream ? SimOp::copy_to_device_async
                            : SimOp::copy_to_device;
  const char* name = to_string(op);
  return call(device, op, [&](Device&) {
    if (auto refused = refused_by_capture(name)) return *refused;
    if (bytes > 0 && (dst == nullptr || src == nullptr))
      return error(std::string("sim: ") + name + ": null " + (dst == nullptr ? "dst" : "src"));
    const auto p = reinterpret_cast<std::uintptr_t>(to_host ? src : dst);
    if (bytes > 0) {
      if (std::string why = reach(device, p, bytes); !why.empty()) {
        std::string message = "sim: ";
        message += name;
        message += ": [";
        message += hex(p);
        message += ", ";
        message += hex(p + bytes);
        message += ") is not mapped device memory of device ";
        message += std::to_string(device);
        message += ": ";
        message += why;
        return error(message);
      }
    }
    // Not ordered after other work (the caller synchronized what used the memory): the
    // copy completes nothing else, as CUDA's copy on a stream of its own.
    // The bytes land at once; an asynchronous copy is also work on its stream, so that
    // what is recorded after it completes only as that stream's work does.
    if (options.host_backed && bytes > 0) std::memcpy(dst, src, bytes);
    if (stream) {
      Stream& st = streams[*stream];
      ++st.submitted;
      if (eager) st.completed = st.submitted;
      ++counters.async_copies_to_device;
    }
    if (to_host) {
      ++counters.copies_to_host;
      counters.bytes_to_host += bytes;
    } else {
      ++counters.copies_to_device;
      counters.bytes_to_device += bytes;
    }
    return DeviceStatus::ok;
  });
}

DeviceStatus SimBackend::copy_to_host(int device, void* dst, const void* src, std::size_t bytes) {
  return state_->host_copy(device, true, dst, src, bytes);
}

DeviceStatus SimBackend::copy_to_device(int device, void* dst, const void* src, std::size_t bytes) {
  return state_->host_copy(device, false, dst, src, bytes);
}

DeviceStatus SimBackend::copy_to_device_async(int device, void* dst, const void* src,
                                              std::size_t bytes, StreamHandle stream) {
  return state_->host_copy(device, false, dst, src, bytes, &stream);
}

std::size_t SimBackend::live_host_allocations() const {
  std::lock_guard lock(state_->mutex);
  return state_->host_allocations.size();
}

std::size_t SimBackend::open_ipc_mappings() const {
  std::lock_guard lock(state_->mutex);
  return state_->opened.size();
}

}  // namespace reservoir
