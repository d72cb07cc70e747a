// CompactPool: arenas, their blocks, and the requests over them (the physical memory
// under the blocks is ExtentMap's, extent_map.hpp). See compact_pool.hpp.
#include "engine/compact/compact_pool.hpp"

#include <algorithm>

#include "reservoir/errors.hpp"
#include "util/checks.hpp"
#include "util/format.hpp"

namespace reservoir::detail {

namespace {
// Free blocks after the best fit examined for one whose memory is all there.
constexpr int kPlacementProbes = 32;
// A cache line (x86, Arm servers).
constexpr std::size_t kCacheLine = 64;

// The device's mapping granularity; throws when it has no virtual memory management.
std::size_t device_page(PoolServices& services) {
  std::size_t page = 0;
  if (services.backend.granularity(services.device, &page) != DeviceStatus::ok || page == 0)
    throw DeviceError(
        "reservoir: policy:compact needs the device's virtual memory management "
        "(mapping pages), which device " +
        std::to_string(services.device) + " (" + services.backend.name() +
        ") lacks: " + services.backend.last_error() + "; use policy:pytorch on this device");
  return page;
}
}  // namespace

CompactPool::CompactPool(PoolServices& services)
    : services_(services),
      // Every stream's blocks come from this one pool, and threads working on their own
      // streams write their blocks at once: a block per cache line, none shared.
      block_nodes_(sizeof(Block), 256, kCacheLine),
      fences_(services.backend, services.device, services.events),
      extents_(services, fences_, device_page(services)) {}

CompactPool::~CompactPool() {
  services_.segments.owner_gone(this);
  // The engine is going away: every extent and range goes back, whatever it holds
  // (the extents' memory when extents_ goes, after every arena).
  for (auto& a : arenas_) {
    extents_.abandon(*a);
    for (Block* b = a->segment->head; b;) {
      Block* n = b->next;
      block_list::destroy(block_nodes_, b);
      b = n;
    }
    (void)services_.backend.release_address_range(
        services_.device, reinterpret_cast<void*>(a->segment->base), a->segment->size);
    services_.segments.retire_part(a->segment, a->pages.size() * extents_.page());
  }
}

// ---------------------------------------------------------------- blocks

void CompactPool::index_free(Block* b) {
  b->state = BlockState::free;
  free_.insert(b);
}

void CompactPool::reposition_free(Block* b) {
  free_.reposition(b);
}

// b (allocated until now, in no index) becomes free, merged with free neighbours
// (block_list::coalesce over the free index; nothing counted).
Block* CompactPool::coalesce_free(Block* b) {
  struct Hooks {
    CompactPool& pool;
    void drop(Block* x) { block_list::destroy(pool.block_nodes_, x); }
    void unindex(Block* x) { pool.free_.erase(x); }
    void index(Block* x) { pool.index_free(x); }
    void reposition(Block* x) { pool.reposition_free(x); }
    void absorbed(const Block&) {}
  };
  Hooks hooks{*this};
  return block_list::coalesce(b, BlockState::free, hooks);
}

// Twice the device's memory of address space (pages are mapped only where blocks
// live, so the range costs nothing); a request larger than that gets its own.
CompactPool::Arena* CompactPool::new_arena(std::size_t at_least) {
  MemoryInfo info;
  if (services_.backend.memory_info(services_.device, &info) != DeviceStatus::ok)
    throw DeviceError("reservoir: reading memory info of device " +
                      std::to_string(services_.device) +
                      " failed: " + services_.backend.last_error());
  std::size_t size = std::max(2 * info.total, at_least);
  const std::size_t page = extents_.page();
  size = (size + page - 1) / page * page;
  void* ptr = nullptr;
  if (services_.backend.reserve_address_range(services_.device, size, page, &ptr) !=
      DeviceStatus::ok)
    throw DeviceError("reservoir: reserving " + format_size(size) +
                      " of address space for policy:compact on device " +
                      std::to_string(services_.device) +
                      " failed: " + services_.backend.last_error());
  auto arena = std::make_unique<Arena>();
  Segment* seg = services_.segments.make();
  seg->set_range(reinterpret_cast<std::uintptr_t>(ptr), size);
  seg->pool = kLargePool;
  seg->expandable = true;  // no single base allocation (and no IPC handle)
  Block* b = block_list::start(block_nodes_, seg, BlockState::free);
  seg->set_owner(this);
  arena->segment = seg;
  // Pages (and the segment map's entries) follow the highest block in use (grow_pages):
  // an arena is far larger than what it holds.
  index_free(b);
  stats().add<kSegment>(kLargePool, 1);
  arenas_.push_back(std::move(arena));
  return arenas_.back().get();
}

// Best fit, but where the best-fitting block would need new pages and a slightly
// larger free block already has all its memory, the latter: moving memory costs
// device calls every time the program's layout drifts, while the address space a
// larger block leaves free costs nothing.
Block* CompactPool::choose(FreeIndex::iterator best, std::size_t size) const {
  Block* chosen = *best;
  std::size_t fewest = unbacked_pages(chosen, size);
  int looked = 0;
  for (auto it = std::next(best); fewest > 0 && it != free_.end() && looked < kPlacementProbes;
       ++it, ++looked) {
    const std::size_t missing = unbacked_pages(*it, size);
    if (missing < fewest) {
      fewest = missing;
      chosen = *it;
    }
  }
  return chosen;
}

// Whether a request of b's size, made right after b's free, would be placed at b by the
// pool (b merged with its free neighbours; best fit by size, then address): then b may
// wait in its stream's cache for that request, and the placement is the pool's. Only
// when no free block precedes b (it would move the hole's start) and no other free
// block fits the size more tightly than the merged hole.
bool CompactPool::best_fit_stays(const Block* b) const {
  if (b->prev && b->prev->state == BlockState::free) return false;
  const Block* after = b->next && b->next->state == BlockState::free ? b->next : nullptr;
  const std::size_t merged = b->size + (after ? after->size : 0);
  auto it = free_.lower_bound(b->size);
  if (it != free_.end() && *it == after) ++it;
  if (it == free_.end()) return true;
  const Block* other = *it;
  return other->size > merged || (other->size == merged && other->address > b->address);
}

// ---------------------------------------------------------------- requests

Block* CompactPool::pick(std::size_t size) {
  auto it = free_.lower_bound(size);
  if (it == free_.end()) return nullptr;
  // Under a memory fraction every byte counts: best fit. Without one, moving memory
  // less is worth a little address space (choose).
  return services_.budget.limited() ? *it : choose(it, size);
}

std::uintptr_t CompactPool::allocate(std::size_t requested, StreamHandle stream,
                                     const Context& context) {
  if (std::uintptr_t address = allocate_cached(requested, stream, context)) return address;
  Guard guard(*this);
  if (services_.capture.underway()) return kClosedForCapture;
  // A new arena or extent counted, then the request refused (out of memory or a
  // device error): the guard's scope settles the ledger on the way out all the same.
  const std::size_t size = services_.policy().round(requested);
  fences_.settle(stream);  // frees on this stream before now are fenced from here
  // The pool decides over every block the program has freed: a request no cache
  // serves first returns every cached block (a cache holds blocks only between
  // requests that caches serve; what differs from a pool without caches is that such
  // a request gets the block its stream freed last, not the best fit at that moment),
  // but for blocks of the request's own size, which other streams' caches keep while
  // the pool has memory for it where it is mapped already: streams taking turns with
  // one size would otherwise hand one block back and forth, a device-side wait a turn.
  caches_.drain_all([this](Block* c) { return_cached(c); }, size);
  Block* b = pick(size);
  if (caches_.any() && (!b || unbacked_pages(b, taken_of(b, size)) > 0)) {
    drain_caches();  // before any physical memory is taken: every freed block counts
    b = pick(size);
  }
  if (!b) {
    // More than the device has can never be backed: out of memory, not a device error.
    MemoryInfo info;
    if (services_.backend.memory_info(services_.device, &info) == DeviceStatus::ok &&
        size > info.total)
      return 0;
    b = new_arena(size)->segment->head;
  }
  Arena& a = *arena_of(b);
  const std::uintptr_t address = b->address;
  const std::size_t taken = taken_of(b, size);
  auto [first, end] = extents_.page_span(a, address, taken);
  extents_.grow_pages(a, end);
  // Memory last used on other streams: this stream waits for that work (on the device).
  // First, as it may throw: nothing has changed yet (a wait inserted for a request that
  // then fails costs nothing but the wait).
  bool foreign = false;
  for (std::size_t i = first; i < end && !foreign; ++i) foreign = !a.pages[i].fence.only_on(stream);
  if (foreign) {
    const std::size_t from = first, to = end;  // (structured bindings: not captured)
    const int waits = fences_.order_after_all(stream, [&](auto&& visit) {
      for (std::size_t i = from; i < to; ++i) visit(a.pages[i].fence);
    });
    if (waits) DeviceCounters::bump(services_.counters.stream_waits, waits);
  }
  if (!extents_.back_pages(a, address, taken)) return 0;
  Block* out;
  if (taken < b->size) {
    out = block_list::split_front(block_nodes_, b, taken, BlockState::allocated);
    reposition_free(b);
  } else {
    free_.erase(b);
    out = b;
    out->state = BlockState::allocated;
  }
  out->requested = requested;
  out->stream = stream;
  allocated_.insert(address, out);
  extents_.add_live(a, address, taken);
  stats().on_allocate(SizePolicy::pool_for(taken), static_cast<std::int64_t>(taken),
                      static_cast<std::int64_t>(requested));
  trace_alloc(out, requested, stream, context);
  finish_operation();
  return address;
}

bool CompactPool::free(std::uintptr_t address) {
  // The history flag read once (as StreamPool::free): the context gathered before the
  // lock and the records under it agree.
  if (RESERVOIR_UNLIKELY(services_.history.active())) return free_traced(address);
  return free_as(address, false, Context{});
}

bool CompactPool::free_traced(std::uintptr_t address) {
  const Context context = services_.history.gather(ContextLevel::all);
  History::Delivery delivery(true);  // the trackers after the locks (history.hpp)
  return free_as(address, true, context);
}

bool CompactPool::free_as(std::uintptr_t address, bool traced, const Context& context) {
  switch (free_cached(address, traced, context)) {
    case CachedFree::kept:
      return true;
    case CachedFree::not_allocated:
      return false;
    case CachedFree::declined:
    case CachedFree::retry:
      break;
  }
  Guard guard(*this);
  Block* b = allocated_.erase(address);
  if (!b) return false;
  if (b->size > StreamCaches::kMaxBlock && cacheable(*b)) {
    StreamCaches::Cache* c = caches_.lock(b->stream);
    std::unique_lock<Lock> held(c->lock, std::adopt_lock);
    if (StreamCaches::wants(*c, b->size) && best_fit_stays(b)) {
      keep_cached(*c, b, traced, context);
      c->large_kept = b;
      c->large_epoch = operations_.load(std::memory_order_relaxed);
      return true;
    }
  }
  Arena& a = *arena_of(b);
  if (traced) trace_free(b, context);
  // The memory's users so far: its own stream and those record_stream named.
  extents_.remove_live(a, *b);
  stats().on_free(SizePolicy::pool_for(b->size), static_cast<std::int64_t>(b->size),
                  static_cast<std::int64_t>(b->requested));
  b->extras.reset();
  b->requested = 0;
  coalesce_free(b);
  finish_operation();
  return true;
}

// ---------------------------------------------------------------- stream caches

RESERVOIR_INLINE std::uintptr_t CompactPool::allocate_cached(std::size_t requested,
                                                             StreamHandle stream,
                                                             const Context& context) {
  StreamCaches::Cache* c = caches_.lock(stream);
  std::unique_lock<Lock> held(c->lock, std::adopt_lock);
  // The settings change only while every cache is locked (DeviceEngine::update_config).
  const std::size_t size = services_.policy().round(requested);
  Block* b = StreamCaches::take(*c, size);
  if (!b) return 0;
  // The statistics settle before the cache's lock goes (the validator holds it); the
  // thread's shard found once.
  ShardScope scope(services_.ledger.mine());
  b->requested = requested;
  allocated_.insert(b->address, b);
  scope->on_allocate(SizePolicy::pool_for(b->size), static_cast<std::int64_t>(b->size),
                     static_cast<std::int64_t>(requested));
  trace_alloc(b, requested, stream, context);
  return b->address;
}

// The common way: under the block's stripe, its stream's cache taken without waiting
// (the stripe comes after the caches in the lock order), the block moved from the
// one to the other at once. retry: the cache was busy or not made yet.
RESERVOIR_INLINE CompactPool::CachedFree CompactPool::free_cached_at_once(std::uintptr_t address,
                                                                          bool traced,
                                                                          const Context& context) {
  return allocated_.with_stripe(address, [&](AddressMap<Block>& map) {
    Block* b = map.find(address);
    if (!b) return CachedFree::not_allocated;
    if (!cacheable(*b)) return CachedFree::declined;
    const bool small = b->size <= StreamCaches::kMaxBlock;
    StreamCaches::Cache* c = caches_.try_lock(b->stream);
    if (!c) return small ? CachedFree::retry : CachedFree::declined;
    std::unique_lock<Lock> held(c->lock, std::adopt_lock);
    if (!StreamCaches::wants(*c, b->size) || !kept_at_once(*c, *b)) return CachedFree::declined;
    map.erase(address);
    keep_cached(*c, b, traced, context);
    return CachedFree::kept;
  });
}

RESERVOIR_INLINE void CompactPool::keep_cached(StreamCaches::Cache& c, Block* b, bool traced,
                                               const Context& context) {
  ShardScope scope(services_.ledger.mine());  // settled before the cache's lock goes
  if (traced) trace_free(b, context);
  scope->on_free(SizePolicy::pool_for(b->size), static_cast<std::int64_t>(b->size),
                 static_cast<std::int64_t>(b->requested));
  b->extras.reset();
  b->requested = 0;
  caches_.put(c, b);
}

RESERVOIR_INLINE CompactPool::CachedFree CompactPool::free_cached(std::uintptr_t address,
                                                                  bool traced,
                                                                  const Context& context) {
  if (CachedFree r = free_cached_at_once(address, traced, context); r != CachedFree::retry)
    return r;
  // A look at the block first (its stream names the cache); the block is taken out
  // of the stripes only under the cache's lock, so a walk holding every lock finds it
  // in one place or the other.
  StreamHandle stream;
  std::size_t size;
  {
    Block* b = allocated_.find(address);
    if (!b) return CachedFree::not_allocated;
    if (!small_cacheable(*b)) return CachedFree::declined;
    stream = b->stream;
    size = b->size;
  }
  StreamCaches::Cache* c = caches_.lock(stream);
  std::unique_lock<Lock> held(c->lock, std::adopt_lock);
  if (!StreamCaches::wants(*c, size)) return CachedFree::declined;
  Block* b = allocated_.erase(address);
  if (!b) return CachedFree::not_allocated;  // freed meanwhile by another thread
  if (b->stream != stream || b->size != size || !cacheable(*b)) {
    allocated_.insert(address, b);  // another block by now: the pool's free takes it
    return CachedFree::declined;
  }
  keep_cached(*c, b, traced, context);
  return CachedFree::kept;
}

void CompactPool::return_cached(Block* b) {
  Arena& a = *arena_of(b);
  extents_.remove_live(a, *b);  // fenced on its stream from now: later than its free
  coalesce_free(b);
}

void CompactPool::drain_caches() {
  caches_.drain_all([this](Block* b) { return_cached(b); });
}

void CompactPool::trace_alloc_on(Block* b, std::size_t requested, StreamHandle stream,
                                 const Context& context) {
  services_.trace(TraceAction::alloc, b->address, requested, stream,
                  services_.history.level() >= ContextLevel::alloc ? context : nullptr);
  if (context) b->extra().context = context;
}

void CompactPool::trace_free(const Block* b, const Context& context) {
  services_.trace(TraceAction::free_requested, b->address, b->requested, b->stream,
                  context ? context : b->context());
  services_.trace(TraceAction::free_completed, b->address, b->requested, b->stream, b->context());
}

// ---------------------------------------------------------------- other calls

bool CompactPool::record_use(std::uintptr_t address, StreamHandle other) {
  Guard guard(*this);
  Block* b = allocated_.find(address);
  if (!b) return false;
  if (other == b->stream) return true;
  b->extra().uses.insert(other);
  return true;
}

void CompactPool::host_waited(StreamHandle stream) {
  Guard guard(*this);
  // Checked later: a capture forbids event queries (and a missed hint only waits longer).
  if (services_.capture.underway()) return;
  fences_.host_waited(stream);
}

void CompactPool::release_stream(StreamHandle stream) {
  Guard guard(*this);
  caches_.release(stream, [this](Block* b) { return_cached(b); });
  // After the drain: its fences want a marker there.
  fences_.release(stream, !services_.capture.underway());
}

std::size_t CompactPool::release_free_pages(bool give_back) {
  Guard guard(*this);
  if (services_.capture.underway()) return 0;  // no wait, no unmap, nothing back then
  drain_caches();
  fences_.synchronize_all();
  std::size_t released = 0;
  // Ghosts first: memory goes back only once unmapped everywhere, and an arena only
  // once nothing is mapped in it.
  for (auto& a : arenas_) extents_.unmap_ghosts(*a);
  for (auto& a : arenas_) extents_.unmap_unused(*a);
  if (give_back) {
    released = extents_.release_spares();
    // Arenas holding nothing go back too (a new one is reserved when needed). A range
    // the device refuses to release stays, counted as a segment, and is retried by the
    // next release.
    std::string failure;
    for (auto it = arenas_.begin(); it != arenas_.end();) {
      Arena& a = **it;
      Block* head = a.segment->head;
      if (head->next || head->state != BlockState::free || a.segment->mapped_bytes != 0) {
        ++it;
        continue;
      }
      // Out of the map before the range goes back (see StreamPool::release_segment).
      const std::size_t published = a.pages.size() * extents_.page();
      services_.segments.unpublish_part(a.segment, published);
      if (services_.backend.release_address_range(services_.device,
                                                  reinterpret_cast<void*>(a.segment->base),
                                                  a.segment->size) != DeviceStatus::ok) {
        services_.segments.publish_part(a.segment, a.segment->base, published);
        if (failure.empty()) failure = services_.backend.last_error();
        ++it;
        continue;
      }
      free_.erase(head);
      block_list::destroy(block_nodes_, head);
      stats().add<kSegment>(kLargePool, -1);
      services_.segments.recycle(a.segment);
      it = arenas_.erase(it);
    }
    if (!failure.empty()) {
      finish_operation();
      throw DeviceError("reservoir: releasing policy:compact address space on device " +
                        std::to_string(services_.device) + " failed: " + failure);
    }
  }
  finish_operation();
  return released;
}

void CompactPool::finish_operation() {
  RESERVOIR_ASSERT_EXPENSIVE({
    ValidationTotals totals;
    RequestsHeld held(*this);
    validate_locked(&totals, held);
  });
}

}  // namespace reservoir::detail
