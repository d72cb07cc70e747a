// backend:cudaMallocAsync: see async_pool_allocator.hpp. The out-of-memory ladder
// here: the program's free-memory callbacks, then waiting for the device (every
// pending free completes) and trimming the pool (what it keeps unused goes back, so
// it can map what this request needs), then the report.
#include "engine/allocators/async_pool_allocator.hpp"

#include <cstdio>
#include <limits>

#include "engine/device/oom_report.hpp"
#include "reservoir/errors.hpp"
#include "util/format.hpp"

namespace reservoir::detail {

namespace {
std::string where(int device) {
  return " on device " + std::to_string(device) + " (backend:cudaMallocAsync)";
}
}  // namespace

AsyncPoolAllocator::AsyncPoolAllocator(Backend& backend, CachingAllocator& engines)
    : backend_(backend), engines_(engines) {
  if (!backend.has(kStreamOrderedPool))
    throw ConfigError(std::string("backend:cudaMallocAsync needs stream-ordered memory pools "
                                  "(cuMemPoolCreate), which the ") +
                      backend.name() + " backend does not offer; use backend:native");
  devices_.resize(
      static_cast<std::size_t>(engines.device_count() > 0 ? engines.device_count() : 1));
}

AsyncPoolAllocator::~AsyncPoolAllocator() {
  std::lock_guard<std::mutex> guard(mutex_);
  for (auto& [address, l] : live_)
    (void)backend_.free_async(l.device, reinterpret_cast<void*>(address), l.stream);
  for (std::size_t d = 0; d < devices_.size(); ++d) {
    Device& dev = devices_[d];
    if (!dev.made) continue;
    const int device = static_cast<int>(d);
    (void)backend_.synchronize_device(device);
    (void)backend_.destroy_pool(device, dev.pool);
    (void)backend_.destroy_event(device, dev.event);
  }
}

AsyncPoolAllocator::Device& AsyncPoolAllocator::device_state(int device) {
  Device& d = devices_[static_cast<std::size_t>(device)];
  if (d.made) return d;
  auto fail = [&](const char* what) {
    throw DeviceError(std::string("reservoir: ") + what + where(device) +
                      " failed: " + backend_.last_error());
  };
  PoolHandle pool = 0;
  if (backend_.create_pool(device, &pool) != DeviceStatus::ok) fail("creating the memory pool");
  // The pool keeps what it maps (PyTorch's setting): memory goes back on empty_cache.
  if (backend_.set_pool_release_threshold(
          device, pool, std::numeric_limits<std::uint64_t>::max()) != DeviceStatus::ok ||
      (!d.peers.empty() &&
       backend_.set_pool_access(device, pool, d.peers.data(), static_cast<int>(d.peers.size())) !=
           DeviceStatus::ok)) {
    (void)backend_.destroy_pool(device, pool);
    fail("setting up the memory pool");
  }
  EventHandle event = 0;
  if (backend_.create_event(device, &event) != DeviceStatus::ok) {
    (void)backend_.destroy_pool(device, pool);
    fail("creating an event");
  }
  if (!d.shard) {
    d.shard = std::make_unique<ShardCounters>();
    engines_.engine(device).ledger().attach(d.shard.get());
  }
  d.pool = pool;
  d.event = event;
  d.made = true;
  return d;
}

void AsyncPoolAllocator::trace(int device, TraceAction action, std::uintptr_t address,
                               std::size_t size, StreamHandle stream, Context context) {
  History& h = engines_.engine(device).history();
  if (!h.active()) return;
  h.record(TraceEntry{action, device, address, size, stream, backend_.now_us(), std::move(context),
                      PoolId{}});  // the driver's pool is not a private pool
}

bool AsyncPoolAllocator::try_allocate(int device, std::size_t size, StreamHandle stream,
                                      void** ptr) {
  std::lock_guard<std::mutex> guard(mutex_);
  Device& d = device_state(device);
  const DeviceStatus st = backend_.allocate_from_pool(device, d.pool, size, stream, ptr);
  if (st == DeviceStatus::out_of_memory) return false;
  if (st != DeviceStatus::ok)
    throw DeviceError("reservoir: allocating " + format_size(size) + where(device) +
                      " failed: " + backend_.last_error());
  DeviceEngine& e = engines_.engine(device);
  live_.emplace(reinterpret_cast<std::uintptr_t>(*ptr), Live{size, device, stream, {}, {}});
  d.used += size;
  ShardScope s(*d.shard);
  const auto bytes = static_cast<std::int64_t>(size);
  s->on_allocate(SizePolicy::pool_for(size), bytes, bytes);  // the caching engine's pool
  DeviceCounters::bump(e.counters().device_allocs);
  return true;
}

void* AsyncPoolAllocator::allocate(std::size_t size, StreamHandle stream, int device) {
  DeviceEngine& e = engines_.engine(device);
  const Context context =
      e.history().active() ? e.history().gather(ContextLevel::state) : Context{};
  if (e.budget().limited()) {
    std::size_t used;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      used = devices_[static_cast<std::size_t>(device)].used;
    }
    if (used + size > e.budget().limit()) out_of_memory(device, size, stream, true);
  }
  void* ptr = nullptr;
  bool ok = try_allocate(device, size, stream, &ptr);
  EngineHooks& hooks = e.hooks();
  if (!ok && hooks.has_callbacks.load(std::memory_order_acquire) &&
      hooks.run_free_memory_callbacks())
    ok = try_allocate(device, size, stream, &ptr);
  if (!ok) {
    DeviceCounters::bump(e.counters().sync_all_streams);
    PoolHandle pool;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      pool = device_state(device).pool;
    }
    if (backend_.synchronize_device(device) != DeviceStatus::ok ||
        backend_.trim_pool(device, pool, 0) != DeviceStatus::ok)
      throw DeviceError("reservoir: making room for " + format_size(size) + where(device) +
                        " failed: " + backend_.last_error());
    DeviceCounters::bump(e.counters().alloc_retries);
    ok = try_allocate(device, size, stream, &ptr);
  }
  if (!ok) out_of_memory(device, size, stream, false);
  if (context) {
    std::lock_guard<std::mutex> guard(mutex_);
    auto it = live_.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it != live_.end()) it->second.context = context;
  }
  trace(device, TraceAction::alloc, reinterpret_cast<std::uintptr_t>(ptr), size, stream, context);
  return ptr;
}

void AsyncPoolAllocator::out_of_memory(int device, std::size_t size, StreamHandle stream,
                                       bool over_fraction) {
  // Called without mutex_: the observers may call back into the allocator.
  DeviceEngine& e = engines_.engine(device);
  DeviceCounters::bump(e.counters().ooms);
  PoolUsage usage;
  std::size_t used;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    const Device& d = devices_[static_cast<std::size_t>(device)];
    if (d.made) (void)backend_.pool_usage(device, d.pool, &usage);
    used = d.used;
  }
  OomOpening o;
  o.device = device;
  o.alloc_size = size;
  o.have_info = backend_.memory_info(device, &o.info) == DeviceStatus::ok;
  o.limited = e.budget().limited();
  o.allowed = e.budget().limit();
  o.allocated = used;
  o.reserved = usage.reserved;
  std::string m = oom_opening(backend_, o);
  m += "Reservoir (" + std::string(backend_.name()) + " device " + std::to_string(device) +
       ", backend:cudaMallocAsync): ";
  const std::string request = "the request of " + format_size(size) + " on stream " +
                              format_pointer(reinterpret_cast<void*>(stream));
  if (over_fraction) {
    char share[32];
    std::snprintf(share, sizeof share, "%.4g", e.memory_fraction());
    m += request + " would take allocated memory beyond the memory fraction (" + share +
         " of the device, " + format_size(o.allowed) + ")";
  } else {
    m += "the driver's memory pool could not serve " + request +
         ", even after waiting for the device and giving its unused memory back";
  }
  m += "; the pool reserves " + format_size(usage.reserved) + ", of which " +
       format_size(usage.used) +
       " is in use. What to try: free tensors or buffers you no longer need; Reservoir's own "
       "engine (backend:native, with expandable_segments:True) often needs less memory";
  if (o.limited) m += "; raise the memory fraction";
  m += "; replay a trace of this workload with reservoir-replay --fit to see how much memory it "
       "needs.";
  trace(device, TraceAction::oom, o.info.free, size, stream, nullptr);
  for (auto& observer : e.hooks().observers())
    observer(device, size, o.limited ? o.allowed : o.info.total, o.info.free);
  throw OutOfMemoryError(m);
}

std::map<std::uintptr_t, AsyncPoolAllocator::Live>::iterator AsyncPoolAllocator::find(
    void* ptr, const char* action) {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  auto it = live_.find(address);
  if (it != live_.end()) return it;
  std::string why = "it is not a live allocation (backend:cudaMallocAsync)";
  auto next = live_.upper_bound(address);
  if (next != live_.begin()) {
    auto prev = std::prev(next);
    if (address - prev->first < prev->second.size)
      why = "it is inside the allocation at " +
            format_pointer(reinterpret_cast<void*>(prev->first)) + " (backend:cudaMallocAsync)";
  }
  throw InvalidPointerError(std::string("reservoir: cannot ") + action + " " + format_pointer(ptr) +
                            ": " + why);
}

void AsyncPoolAllocator::deallocate(void* ptr) {
  std::uintptr_t address;
  std::size_t size;
  int device;
  StreamHandle stream;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    auto it = find(ptr, "free");
    Live& l = it->second;
    Device& d = devices_[static_cast<std::size_t>(l.device)];
    DeviceEngine& e = engines_.engine(l.device);
    // The free is ordered after the work of every stream that used the block.
    for (StreamHandle u : l.uses) {
      if (backend_.record_event(l.device, d.event, u) != DeviceStatus::ok ||
          backend_.stream_wait_event(l.device, l.stream, d.event) != DeviceStatus::ok)
        throw DeviceError("reservoir: ordering the free of " + format_pointer(ptr) +
                          " after stream " + format_pointer(reinterpret_cast<void*>(u)) +
                          " failed: " + backend_.last_error());
      DeviceCounters::bump(e.counters().stream_waits);
    }
    if (backend_.free_async(l.device, ptr, l.stream) != DeviceStatus::ok)
      throw DeviceError("reservoir: freeing " + format_pointer(ptr) + where(l.device) +
                        " failed: " + backend_.last_error());
    const auto bytes = static_cast<std::int64_t>(l.size);
    ShardScope(*d.shard)->on_free(SizePolicy::pool_for(l.size), bytes, bytes);
    d.used -= l.size;
    DeviceCounters::bump(e.counters().device_frees);
    address = it->first;
    size = l.size;
    device = l.device;
    stream = l.stream;
    live_.erase(it);
  }
  trace(device, TraceAction::free_requested, address, size, stream, nullptr);
  trace(device, TraceAction::free_completed, address, size, stream, nullptr);
}

void AsyncPoolAllocator::record_stream(void* ptr, StreamHandle stream) {
  std::lock_guard<std::mutex> guard(mutex_);
  Live& l = find(ptr, "record a stream use of")->second;
  if (stream != l.stream) l.uses.insert(stream);
}

BaseAllocation AsyncPoolAllocator::base_allocation(void* ptr) {
  std::lock_guard<std::mutex> guard(mutex_);
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  auto next = live_.upper_bound(address);
  if (next != live_.begin()) {
    auto prev = std::prev(next);
    if (address - prev->first < prev->second.size)
      return BaseAllocation{reinterpret_cast<void*>(prev->first), prev->second.size};
  }
  (void)find(ptr, "find the allocation of");  // throws
  return {};
}

std::size_t AsyncPoolAllocator::requested_size(void* ptr) {
  std::lock_guard<std::mutex> guard(mutex_);
  return find(ptr, "size")->second.size;
}

void AsyncPoolAllocator::empty_cache(int device) {
  std::lock_guard<std::mutex> guard(mutex_);
  for (std::size_t i = 0; i < devices_.size(); ++i) {
    const int d = static_cast<int>(i);
    if ((device >= 0 && d != device) || !devices_[i].made) continue;
    if (backend_.synchronize_device(d) != DeviceStatus::ok ||
        backend_.trim_pool(d, devices_[i].pool, 0) != DeviceStatus::ok)
      throw DeviceError("reservoir: emptying the memory pool" + where(d) +
                        " failed: " + backend_.last_error());
  }
}

const EngineTraits& AsyncPoolAllocator::traits() const {
  static const EngineTraits kAsync{
      "cudaMallocAsync", true,
      "backend:cudaMallocAsync memory cannot be shared (PyTorch's cannot either)",
      "reservoir: private pools need Reservoir's caching engine, and backend:cudaMallocAsync is "
      "set (its memory comes from the driver's pool); use backend:native for CUDA graphs and "
      "memory pools"};
  return kAsync;
}

PoolUsage AsyncPoolAllocator::usage(int device) {
  std::lock_guard<std::mutex> guard(mutex_);
  PoolUsage u;
  const Device& d = devices_[static_cast<std::size_t>(device)];
  if (d.made && backend_.pool_usage(device, d.pool, &u) != DeviceStatus::ok)
    throw DeviceError("reservoir: reading the memory pool" + where(device) +
                      " failed: " + backend_.last_error());
  return u;
}

void AsyncPoolAllocator::adjust_stats(int device, DeviceStats* stats) {
  const PoolUsage u = usage(device);
  for (int kind : {0, 2}) {
    Stat& r = stats->reserved_bytes.pool[static_cast<std::size_t>(kind)];
    r.current = static_cast<std::int64_t>(u.reserved);
    r.peak = static_cast<std::int64_t>(u.reserved_high);
  }
  stats->reserved_bytes.pool[1] = Stat{};
}

void AsyncPoolAllocator::reset_peaks(int device) {
  std::lock_guard<std::mutex> guard(mutex_);
  const Device& d = devices_[static_cast<std::size_t>(device)];
  if (d.made && backend_.reset_pool_peaks(device, d.pool) != DeviceStatus::ok)
    throw DeviceError("reservoir: resetting the memory pool's peaks" + where(device) +
                      " failed: " + backend_.last_error());
}

void AsyncPoolAllocator::snapshot(std::vector<SegmentInfo>* out) {
  std::lock_guard<std::mutex> guard(mutex_);
  for (const auto& [address, l] : live_) {
    SegmentInfo seg;
    seg.device = l.device;
    seg.address = address;
    seg.total_size = seg.allocated_size = seg.active_size = seg.requested_size = l.size;
    seg.stream = l.stream;
    seg.is_large = SizePolicy::pool_for(l.size) == kLargePool;
    seg.context = l.context;
    seg.blocks.push_back(
        BlockInfo{address, l.size, l.size, BlockStateInfo::active_allocated, l.context});
    out->push_back(std::move(seg));
  }
}

void AsyncPoolAllocator::add_peer(int device, int peer) {
  std::lock_guard<std::mutex> guard(mutex_);
  Device& d = devices_[static_cast<std::size_t>(device)];
  for (int p : d.peers)
    if (p == peer) return;
  if (d.made && backend_.set_pool_access(device, d.pool, &peer, 1) != DeviceStatus::ok)
    throw DeviceError("reservoir: granting device " + std::to_string(peer) +
                      " access to the memory pool" + where(device) +
                      " failed: " + backend_.last_error());
  d.peers.push_back(peer);
}

}  // namespace reservoir::detail
