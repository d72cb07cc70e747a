// The out-of-memory ladder: what a request does when no cached block serves it, in
// the spec's order (its malloc path), each rung a locked step of the pool or a
// device-wide operation of the engine:
//   1. the program's free-memory callbacks, then the cache again (only if any freed);
//   2. age-based garbage collection (garbage_collection_threshold with a fraction);
//   3. a new device allocation (or mapped pages);
//   4. release of cached oversize blocks of this pool, then a new allocation;
//   5. wait for every pending free and release every cache of the device, then the
//      cache again and a new allocation (counted as a retry);
//   6. the free blocks of private pools made with use_on_oom (default requests only);
//   7. out of memory: the report, the observers, OutOfMemoryError.
// While a capture may be under way (CaptureState) the rungs that return memory to
// the device or wait for events (2, 4, 5) are skipped, as the spec skips its
// release_cached_blocks: a capture forbids cudaFree and host waits.
// The pool lock is not held between rungs: each rung takes it itself, so calls go
// one way (ladder -> engine and pool) and device-wide rungs can lock other pools.
#include <algorithm>
#include <cstdio>

#include "engine/device/device_engine.hpp"
#include "engine/device/oom_report.hpp"
#include "reservoir/errors.hpp"
#include "util/format.hpp"

namespace reservoir::detail {

namespace {

// What the report says besides PyTorch's first sentences.
struct OomFacts {
  int device;
  const char* backend;
  std::size_t requested, alloc_size;
  StreamHandle stream;
  bool have_info;
  MemoryInfo info;
  bool limited;
  bool capturing;  // a capture under way: nothing could go back to the device
  std::size_t allowed;
  double fraction;
  std::uint64_t allocated, reserved;
  std::size_t largest_small, largest_large, cached_elsewhere;
};

// PyTorch's wording first (tools and tests match "CUDA out of memory. Tried to
// allocate ..."), with the processes using the device (oom_report.hpp), then what
// Reservoir knows and what to try.
std::string oom_message(Backend& backend, const OomFacts& f) {
  OomOpening o;
  o.device = f.device;
  o.alloc_size = f.alloc_size;
  o.have_info = f.have_info;
  o.info = f.info;
  o.limited = f.limited;
  o.allowed = f.allowed;
  o.allocated = f.allocated;
  o.reserved = f.reserved;
  std::string m = oom_opening(backend, o);
  m += "Reservoir (" + std::string(f.backend) + " device " + std::to_string(f.device) +
       "): the request of " + format_size(f.requested) + " on stream " +
       format_pointer(reinterpret_cast<void*>(f.stream)) + " needed a new segment of " +
       format_size(f.alloc_size);
  if (f.limited) {
    char share[32];
    std::snprintf(share, sizeof share, "%.4g", f.fraction);
    m += std::string(" beyond the memory fraction (") + share + " of the device, " +
         format_size(f.allowed) + ")";
  }
  m += "; largest free block on this stream: small pool " + format_size(f.largest_small) +
       ", large pool " + format_size(f.largest_large) + "; " + format_size(f.cached_elsewhere) +
       " cached on other streams. What to try: free tensors or buffers you no longer need; if "
       "reserved-but-unallocated memory is large, set "
       "RESERVOIR_ALLOC_CONF=expandable_segments:True (or max_split_size_mb:N) to reduce "
       "fragmentation";
  if (f.limited) m += "; raise the memory fraction";
  if (f.capturing)
    m += "; a CUDA graph capture is under way on this device: cached memory cannot go back "
         "to the device (nor policy:compact's free pages move) until it ends";
  m += "; replay a trace of this workload with reservoir-replay --fit to see how much memory "
       "it needs.";
  return m;
}

}  // namespace

std::uintptr_t DeviceEngine::allocate_slow(StreamPool& pool, std::size_t requested,
                                           const Context& context, bool private_request) {
  // 1. The program's free-memory callbacks (outside every lock: they may free memory
  //    through this allocator).
  if (hooks_.has_callbacks.load(std::memory_order_acquire) && hooks_.run_free_memory_callbacks())
    if (std::uintptr_t a = pool.allocate_cached(requested, context)) return a;
  // 2. Age-based garbage collection of cached blocks.
  const bool capturing = capture_.underway();
  if (gc_.enabled() && !capturing) garbage_collect();
  // 3. A new segment.
  if (std::uintptr_t a = pool.allocate_new_segment(requested, false, context)) return a;
  // 4. Cached oversize blocks of this pool make room.
  if (!capturing && pool.release_oversize(requested))
    if (std::uintptr_t a = pool.allocate_new_segment(requested, false, context)) return a;
  // 5. Every pending free waited for and every cache of the device released; frees
  //    completed meanwhile may already satisfy the request.
  if (!capturing) {
    release_cached_everywhere();
    if (std::uintptr_t a = pool.allocate_after_release(requested, context)) return a;
  }
  // 6. Private pools that lend their free blocks when the device is out of memory.
  if (!private_request && private_registry_.any_use_on_oom())
    if (std::uintptr_t a = allocate_from_use_on_oom(requested, pool.stream(), context)) return a;

  // 7. Out of memory.
  std::size_t rounded;
  {
    std::lock_guard<std::mutex> guard(config_mutex_);
    rounded = settings_.policy.round(requested);
  }
  raise_out_of_memory(pool.stream(), requested, SizePolicy::segment_size(rounded),
                      pool.largest_free_block(kSmallPool), pool.largest_free_block(kLargePool),
                      cached_elsewhere(&pool));
}

// policy:compact's ladder: the free-memory callbacks, then every fence waited for so
// that every free page's memory can move to where it is needed (and every other
// pool's cached memory given back), then the private pools made with use_on_oom, then
// out of memory. (No device allocation is retried after releasing caches: the pool
// already takes physical memory from free pages before asking the device.) While a
// capture is under way the pool's shared path is closed: what no stream cache serves
// goes to allocate_default.
std::uintptr_t DeviceEngine::allocate_compact(std::size_t requested, StreamHandle stream,
                                              const Context& context) {
  CompactPool& c = compact();
  auto attempt = [&]() -> std::uintptr_t {
    const std::uintptr_t a = c.allocate(requested, stream, context);
    return a == CompactPool::kClosedForCapture ? allocate_default(requested, stream, context) : a;
  };
  if (std::uintptr_t a = attempt()) return a;
  if (hooks_.has_callbacks.load(std::memory_order_acquire) && hooks_.run_free_memory_callbacks())
    if (std::uintptr_t a = attempt()) return a;
  if (!capture_.underway()) {  // nothing goes back to the device during a capture
    release_cached_everywhere(false);
    DeviceCounters::bump(counters_.alloc_retries);
    if (std::uintptr_t a = attempt()) return a;
  }
  if (private_registry_.any_use_on_oom())
    if (std::uintptr_t a = allocate_from_use_on_oom(requested, stream, context)) return a;
  std::size_t page;
  {
    std::lock_guard<std::mutex> guard(config_mutex_);
    page = settings_.policy.round(requested);
  }
  raise_out_of_memory(stream, requested, page, 0, c.largest_free_block(),
                      cached_elsewhere(nullptr));
}

// The stream's default pool: its cache, then its ladder. Also where policy:compact
// sends a request no stream cache serves while a capture is under way (a capture
// forbids what the compact pool's shared path does: event queries, pages unmapped and
// moved); those blocks stay there, freed there, and go back to the device when caches
// are released.
std::uintptr_t DeviceEngine::allocate_default(std::size_t requested, StreamHandle stream,
                                              const Context& context) {
  StreamPool& p = pool(stream);
  if (std::uintptr_t a = p.allocate_cached(requested, stream, context, history_.active())) return a;
  return allocate_missed(p, requested, stream, context);
}

void DeviceEngine::raise_out_of_memory(StreamHandle stream, std::size_t requested,
                                       std::size_t alloc_size, std::size_t largest_small,
                                       std::size_t largest_large, std::size_t cached) {
  DeviceCounters::bump(counters_.ooms);
  OomFacts f{};
  f.device = device_;
  f.backend = backend_.name();
  f.requested = requested;
  f.alloc_size = alloc_size;
  f.stream = stream;
  f.have_info = backend_.memory_info(device_, &f.info) == DeviceStatus::ok;
  f.limited = budget_.limited();
  f.capturing = capture_.underway();
  f.allowed = budget_.limit();
  f.fraction = memory_fraction();
  DeviceStats s = stats();
  f.allocated = static_cast<std::uint64_t>(s.allocated_bytes.all().current);
  f.reserved = static_cast<std::uint64_t>(s.reserved_bytes.all().current);
  f.largest_small = largest_small;
  f.largest_large = largest_large;
  f.cached_elsewhere = cached;
  if (history_.active())
    services_.trace(TraceAction::oom, f.info.free, f.alloc_size, stream, nullptr);
  for (auto& observer : hooks_.observers())
    observer(device_, f.alloc_size, f.limited ? f.allowed : f.info.total, f.info.free);
  throw OutOfMemoryError(oom_message(backend_, f));
}

}  // namespace reservoir::detail
