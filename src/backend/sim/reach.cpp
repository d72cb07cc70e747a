// SimBackend: the processes using a device (process_memory), and which memory a
// device's work may reach (can_reach, copy): its own segments, pool chunks and IPC
// mappings; a peer's segments and IPC mappings after enable_peer_access; pool memory
// whose pool granted it access (set_pool_access); virtual-memory mappings that granted
// it access (set_access), whoever's they are.
#include <unistd.h>

#include <algorithm>
#include <cstring>

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

std::size_t SimBackend::open_ipc_mappings() const {
  std::lock_guard lock(state_->mutex);
  return state_->opened.size();
}

}  // namespace reservoir
