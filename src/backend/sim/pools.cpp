// SimBackend's stream-ordered pools (create_pool ... free_async): each pool is a
// sim::PoolModel (the driver pool's model, memory_pool.hpp) whose chunks come from
// the device's address window (placed as reservations are, bottom-up: the driver builds
// its pools on virtual memory), so they count as device memory like segments and are
// host-backed when the device is.
#include "backend/sim/state.hpp"

namespace reservoir {

using namespace sim;

sim::StreamProgress SimBackend::State::progress() {
  sim::StreamProgress p;
  p.completed = [this](StreamHandle s) -> std::uint64_t {
    auto it = streams.find(s);
    return it == streams.end() ? 0 : it->second.completed;
  };
  p.waited = [this](StreamHandle t, StreamHandle s) -> std::uint64_t {
    auto it = streams.find(t);
    if (it == streams.end()) return 0;
    auto w = it->second.waited.find(s);
    return w == it->second.waited.end() ? 0 : w->second;
  };
  return p;
}

bool SimBackend::State::take_chunk(int device, PoolHandle pool, std::size_t size,
                                   std::uintptr_t* address) {
  Device& d = devices[static_cast<std::size_t>(device)];
  if (size > d.free()) return false;
  const std::uintptr_t start = d.space.reserve(size, kLargeAlignment);
  if (start == 0) return false;
  d.used += size;
  chunks.emplace(start, Chunk{device, size, pool});
  ++counters.pool_chunks;
  charge(options.alloc_us);
  *address = start;
  return true;
}

void SimBackend::State::give_chunk(int device, std::uintptr_t address, std::size_t size) {
  Device& d = devices[static_cast<std::size_t>(device)];
  if (options.host_backed) host_discard(address, size, options.shared_memory);
  d.space.release(address);
  d.used -= size;
  chunks.erase(address);
  ++counters.pool_chunk_releases;
  charge(options.free_us);
}

void SimBackend::State::apply_release_thresholds(int device) {
  if (pools.empty()) return;
  const sim::StreamProgress p = progress();
  for (auto& [handle, pool] : pools) {
    if (device >= 0 && pool.device != device) continue;
    const int dev = pool.device;
    if (pool.model->usage().reserved > pool.model->release_threshold)
      pool.model->trim(static_cast<std::size_t>(
                           std::min<std::uint64_t>(pool.model->release_threshold, SIZE_MAX)),
                       p, [&](std::uintptr_t a, std::size_t n) { give_chunk(dev, a, n); });
  }
}

namespace {
// The pool named, on device, or nullptr after setting the error.
template <typename Pools>
auto* find_pool(Pools& pools, const char* op, int device, PoolHandle pool) {
  auto it = pools.find(pool);
  if (it == pools.end() || it->second.device != device) {
    error(std::string("sim: ") + op + ": " + std::to_string(pool) + " is not a pool of device " +
          std::to_string(device));
    return static_cast<decltype(&it->second)>(nullptr);
  }
  return &it->second;
}
}  // namespace

DeviceStatus SimBackend::create_pool(int device, PoolHandle* pool) {
  State& s = *state_;
  return s.call(device, std::nullopt, [&](State::Device&) {
    if (pool == nullptr) return error("sim: create_pool: null pool");
    *pool = s.next_pool++;
    s.pools.emplace(*pool, State::Pool{device, std::make_unique<PoolModel>(s.options.pool), {}});
    return DeviceStatus::ok;
  });
}

DeviceStatus SimBackend::destroy_pool(int device, PoolHandle pool) {
  State& s = *state_;
  return s.call(device, std::nullopt, [&](State::Device&) {
    State::Pool* p = find_pool(s.pools, "destroy_pool", device, pool);
    if (p == nullptr) return DeviceStatus::error;
    if (p->model->live() != 0)
      return error("sim: destroy_pool: " + std::to_string(p->model->live()) +
                   " allocations of the pool are still live");
    p->model->release_all([&](std::uintptr_t a, std::size_t n) { s.give_chunk(device, a, n); });
    s.pools.erase(pool);
    return DeviceStatus::ok;
  });
}

DeviceStatus SimBackend::allocate_from_pool(int device, PoolHandle pool, std::size_t size,
                                            StreamHandle stream, void** ptr) {
  State& s = *state_;
  if (size == 0 || ptr == nullptr) return error("sim: allocate_from_pool: size 0 or null ptr");
  return s.call(device, SimOp::allocate_from_pool, [&](State::Device& d) {
    State::Pool* p = find_pool(s.pools, "allocate_from_pool", device, pool);
    if (p == nullptr) return DeviceStatus::error;
    const std::uintptr_t address = p->model->allocate(
        size, stream, s.progress(),
        [&](std::size_t n, std::uintptr_t* a) { return s.take_chunk(device, pool, n, a); },
        [&](std::uintptr_t a, std::size_t n) { s.give_chunk(device, a, n); });
    if (address == 0) {
      ++s.counters.failed_allocs;
      return Failer::fail(DeviceStatus::out_of_memory,
                          "sim: allocate_from_pool: device " + std::to_string(device) +
                              " out of memory: " + bytes(size) + " requested, " + bytes(d.free()) +
                              " free of " + bytes(d.capacity) + ", the pool reserves " +
                              bytes(static_cast<std::size_t>(p->model->usage().reserved)));
    }
    s.pool_of.emplace(address, pool);
    ++s.counters.pool_allocs;
    *ptr = reinterpret_cast<void*>(address);
    return DeviceStatus::ok;
  });
}

DeviceStatus SimBackend::free_async(int device, void* ptr, StreamHandle stream) {
  State& s = *state_;
  return s.call(device, SimOp::free_async, [&](State::Device&) {
    const auto address = reinterpret_cast<std::uintptr_t>(ptr);
    auto owner = s.pool_of.find(address);
    if (owner == s.pool_of.end())
      return error("sim: free_async: " + hex(address) + " is not a live pool allocation");
    State::Pool* p = find_pool(s.pools, "free_async", device, owner->second);
    if (p == nullptr) return DeviceStatus::error;
    // The free is an operation of its own on stream (ordered after what came before,
    // and distinct from events recorded before it); an idle stream does it at once.
    // Waits of stream on unfinished work do not hold the free back here: they are
    // its dependencies (after), so it completes once that work has.
    State::Stream& st = s.streams[stream];
    auto done = [&s](StreamHandle other, std::uint64_t at) {
      auto o = s.streams.find(other);
      return o != s.streams.end() && o->second.completed >= at;
    };
    const bool idle = st.completed == st.submitted;
    const std::uint64_t position = ++st.submitted;
    if (idle || s.eager) st.completed = st.submitted;
    // The free comes after the work stream waited for (events): it completes only
    // when that work has, whatever stream's own progress.
    PoolModel::Dependencies after;
    for (const auto& [other, at] : st.waited)
      if (!done(other, at)) after.emplace_back(other, at);
    if (std::string problem =
            p->model->free(address, stream, position, std::move(after), s.progress());
        !problem.empty())
      return error(problem);
    s.pool_of.erase(owner);
    ++s.counters.pool_frees;
    return DeviceStatus::ok;
  });
}

DeviceStatus SimBackend::set_pool_release_threshold(int device, PoolHandle pool,
                                                    std::uint64_t bytes) {
  State& s = *state_;
  return s.call(device, std::nullopt, [&](State::Device&) {
    State::Pool* p = find_pool(s.pools, "set_pool_release_threshold", device, pool);
    if (p == nullptr) return DeviceStatus::error;
    p->model->release_threshold = bytes;
    return DeviceStatus::ok;
  });
}

DeviceStatus SimBackend::trim_pool(int device, PoolHandle pool, std::size_t keep) {
  State& s = *state_;
  return s.call(device, std::nullopt, [&](State::Device&) {
    State::Pool* p = find_pool(s.pools, "trim_pool", device, pool);
    if (p == nullptr) return DeviceStatus::error;
    p->model->trim(keep, s.progress(),
                   [&](std::uintptr_t a, std::size_t n) { s.give_chunk(device, a, n); });
    return DeviceStatus::ok;
  });
}

DeviceStatus SimBackend::pool_usage(int device, PoolHandle pool, PoolUsage* out) {
  State& s = *state_;
  return s.call(device, std::nullopt, [&](State::Device&) {
    if (out == nullptr) return error("sim: pool_usage: null out");
    State::Pool* p = find_pool(s.pools, "pool_usage", device, pool);
    if (p == nullptr) return DeviceStatus::error;
    *out = p->model->usage();
    return DeviceStatus::ok;
  });
}

DeviceStatus SimBackend::reset_pool_peaks(int device, PoolHandle pool) {
  State& s = *state_;
  return s.call(device, std::nullopt, [&](State::Device&) {
    State::Pool* p = find_pool(s.pools, "reset_pool_peaks", device, pool);
    if (p == nullptr) return DeviceStatus::error;
    p->model->reset_peaks();
    return DeviceStatus::ok;
  });
}

DeviceStatus SimBackend::set_pool_access(int device, PoolHandle pool, const int* devices,
                                         int count) {
  State& s = *state_;
  return s.call(device, std::nullopt, [&](State::Device&) {
    State::Pool* p = find_pool(s.pools, "set_pool_access", device, pool);
    if (p == nullptr) return DeviceStatus::error;
    if (count < 0 || (count > 0 && devices == nullptr))
      return error("sim: set_pool_access: bad device list");
    for (int i = 0; i < count; ++i) {
      if (!s.valid(devices[i])) return bad_device(devices[i], s.options.device_count);
    }
    for (int i = 0; i < count; ++i) {
      if (std::find(p->access.begin(), p->access.end(), devices[i]) == p->access.end())
        p->access.push_back(devices[i]);
    }
    return DeviceStatus::ok;
  });
}

std::size_t SimBackend::live_pools() const {
  std::lock_guard lock(state_->mutex);
  return state_->pools.size();
}

}  // namespace reservoir
