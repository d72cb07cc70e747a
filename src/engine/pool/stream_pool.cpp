// StreamPool: allocation, free, split and merge, the parked free and pending frees
// (giving memory back: stream_pool_release.cpp; frees during a capture:
// stream_pool_capture.cpp). See stream_pool.hpp for the invariants.
#include "engine/pool/stream_pool.hpp"

#include <algorithm>
#include <new>

#include "engine/pool/expandable_segment.hpp"
#include "reservoir/errors.hpp"
#include "util/checks.hpp"
#include "util/format.hpp"

namespace reservoir::detail {

std::string pool_name(PoolId id) {
  // Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on the chain
  // of operator+ once inlined.
  std::string s = "(";
  s += std::to_string(id.first);
  s += ", ";
  s += std::to_string(id.second);
  s += ")";
  return s;
}

namespace {
// std::set<Block*> nodes are 40 bytes with libstdc++; leave room for other layouts.
constexpr std::size_t kSetNodeSize = 64;
}  // namespace

StreamPool::StreamPool(PoolServices& services, StreamHandle stream)
    : services_(services),
      policy_(services.policy()),
      history_(services.history),
      stream_(stream),
      set_nodes_(kSetNodeSize),
      block_nodes_(sizeof(Block)),
      unmapped_{AddressSet(ByAddress{}, PoolAllocator<Block*>(&set_nodes_)),
                AddressSet(ByAddress{}, PoolAllocator<Block*>(&set_nodes_))} {
  for (FreeIndex& f : free_) f.count_versions_in(&index_version_);
}

StreamPool::~StreamPool() {
  services_.segments.owner_gone(this);
  if (fenced_) services_.events.release(release_fence_);
  // The engine is going away: return every segment, whatever its blocks hold.
  for (auto& q : pending_queues_)
    for (Pending& p : q.entries) services_.events.release(p.event);
  for (int p = 0; p < kPoolCount; ++p) {
    free_[p].clear();
    unmapped_[p].clear();
  }
  Segment* seg = segments_;
  while (seg) {
    Segment* next = seg->next_in_pool;
    if (seg->expandable)
      delete seg->vm;  // unmaps its pages and releases the range
    else
      (void)give_back_segment(seg);
    services_.budget.unreserve(seg->mapped_bytes);
    for (Block* b = seg->head; b;) {
      Block* n = b->next;
      delete_block(b);
      b = n;
    }
    services_.segments.retire(seg);
    seg = next;
  }
}

// ---------------------------------------------------------------- blocks and indexes

void StreamPool::link_segment(Segment* seg) {
  seg->prev_in_pool = nullptr;
  seg->next_in_pool = segments_;
  if (segments_) segments_->prev_in_pool = seg;
  segments_ = seg;
}

void StreamPool::unlink_segment(Segment* seg) {
  if (seg->prev_in_pool)
    seg->prev_in_pool->next_in_pool = seg->next_in_pool;
  else
    segments_ = seg->next_in_pool;
  if (seg->next_in_pool) seg->next_in_pool->prev_in_pool = seg->prev_in_pool;
}

// ---------------------------------------------------------------- allocation

// A free block's size with the unmapped pages after it (expandable segments' best fit).
RESERVOIR_INLINE std::size_t StreamPool::room_after(const Block* b) {
  return b->size + (b->next && b->next->state == BlockState::unmapped ? b->next->size : 0);
}

RESERVOIR_INLINE Block* StreamPool::find_free(PoolIndex pool, std::size_t size) {
  FreeIndex& set = free_[pool];
  if (pool == kLargePool && services_.gc.enabled()) services_.gc.tick();
  if (set.empty()) return nullptr;
  auto it = set.lower_bound(size);
  if (it == set.end()) return nullptr;
  if ((*it)->in_expandable) {
    if (expandable()) {
      // Best fit counts the unmapped room after a block of an expandable segment:
      // prefer a block that would not grow into the segment's open end.
      for (auto next = std::next(it);
           (*it)->in_expandable && next != set.end() && room_after(*next) < room_after(*it); ++next)
        it = next;
    } else {
      // Expandable segments were switched off: their blocks are not handed out.
      do {
        ++it;
      } while (it != set.end() && (*it)->in_expandable);
      if (it == set.end()) return nullptr;
    }
  }
  Block* b = *it;
  if (!policy().may_serve(b->size, size)) return nullptr;
  return b;
}

std::uintptr_t StreamPool::allocate_cached(std::size_t requested, StreamHandle stream,
                                           const Context& context, bool traced) {
  ScopedGuard guard(*this);
  // Found without a lock: the pool may serve another stream by now (recycled).
  if (RESERVOIR_UNLIKELY(stream != stream_.load(std::memory_order_relaxed))) return 0;
  const std::size_t size = policy().round(requested);
  const PoolIndex pool = SizePolicy::pool_for(size);
  last_size_ = size;
  if (parked_) {
    // Pending frees to complete first, or history to record: the plain path.
    if (pending_blocks_ == 0 && !traced) {
      Block* parked = parked_;
      // The steady pair: the same block for the same size, the index unchanged since.
      if (parked == fit_block_ && size == parked->size && free_[pool].version() == fit_version_)
        return take_parked(parked, requested, *guard.stats);
      if (parked_fit(pool, size)) {
        if (!parked->in_expandable) {
          fit_block_ = parked;
          fit_version_ = free_[pool].version();
        }
        return take_parked(parked, requested, *guard.stats);
      }
    }
    settle();
  }
  // No event queries while a capture is under way (illegal then): pending frees wait.
  if (pending_blocks_ != 0 && !services_.capture.underway()) process_events(false);
  if (RESERVOIR_UNLIKELY(capture_marked_ != 0)) reclaim_captured();
  Block* b = find_free(pool, size);
  if (!b) return 0;
  std::uintptr_t address = hand_out(b, size, requested, context, traced, *guard.stats);
  finish_operation();
  return address;
}

std::uintptr_t StreamPool::allocate_new_segment(std::size_t requested, bool retry,
                                                const Context& context) {
  Guard guard(*this);
  const std::size_t size = policy().round(requested);
  Block* b = new_segment_block(guard, size, SizePolicy::pool_for(size), retry, context);
  if (!b) return 0;
  std::uintptr_t address = hand_out(b, size, requested, context, tracing(), stats());
  finish_operation();
  return address;
}

std::uintptr_t StreamPool::allocate_after_release(std::size_t requested, const Context& context) {
  Guard guard(*this);
  if (pending_blocks_ != 0 && !services_.capture.underway()) process_events(false);
  if (capture_marked_ != 0) reclaim_captured();
  const std::size_t size = policy().round(requested);
  const PoolIndex pool = SizePolicy::pool_for(size);
  Block* b = find_free(pool, size);
  if (!b) b = new_segment_block(guard, size, pool, true, context);
  if (!b) return 0;
  std::uintptr_t address = hand_out(b, size, requested, context, tracing(), stats());
  finish_operation();
  return address;
}

// A free block holding the request: a new device allocation (or, for expandable
// segments, newly mapped pages). nullptr when the device or the budget has no room.
Block* StreamPool::new_segment_block(Guard& guard, std::size_t size, PoolIndex pool, bool retry,
                                     const Context& context) {
  if (retry) DeviceCounters::bump(services_.counters.alloc_retries);
  if (expandable() && !source_) return allocate_expandable(size, pool, context);
  const std::size_t alloc_size = SizePolicy::segment_size(size);
  if (!services_.budget.reserve(alloc_size)) return nullptr;  // over the memory fraction
  void* ptr = nullptr;
  auto allocate = [&] {
    return source_ ? source_->allocate(services_.device, alloc_size, stream_, &ptr)
                   : services_.backend.allocate(services_.device, alloc_size, &ptr);
  };
  DeviceStatus status;
  if (services_.settings.release_lock_on_device_alloc) {
    services_.budget.unlocking(alloc_size);  // the validator's reconciliation counts it
    guard.unlock();
    status = allocate();
    guard.lock();
    services_.budget.relocked(alloc_size);
    shard_ = &unowned_shard;  // another thread's operation may have held the lock meanwhile
  } else {
    status = allocate();
  }
  if (status == DeviceStatus::ok && source_ &&
      (ptr == nullptr || reinterpret_cast<std::uintptr_t>(ptr) % SizePolicy::kMinBlockSize != 0)) {
    // A segment the engine cannot use goes straight back (blocks are 512-byte aligned).
    if (ptr) (void)source_->deallocate(services_.device, ptr, alloc_size, stream_);
    services_.budget.unreserve(alloc_size);
    throw DeviceError("reservoir: the segment source of private pool " + pool_name(pool_id_) +
                      " returned " + format_pointer(ptr) + " for " + format_size(alloc_size) +
                      " (a segment must be a non-null, 512-byte aligned address)");
  }
  if (status != DeviceStatus::ok) {
    services_.budget.unreserve(alloc_size);
    if (status == DeviceStatus::out_of_memory) return nullptr;
    if (source_)
      throw DeviceError("reservoir: the segment source of private pool " + pool_name(pool_id_) +
                        " failed to allocate " + format_size(alloc_size) + " on device " +
                        std::to_string(services_.device) + ": " + source_->last_error());
    throw DeviceError("reservoir: allocating a segment of " + format_size(alloc_size) +
                      " on device " + std::to_string(services_.device) + " (" +
                      services_.backend.name() + ") failed: " + services_.backend.last_error());
  }
  Segment* seg = services_.segments.make();
  seg->set_range(reinterpret_cast<std::uintptr_t>(ptr), alloc_size);
  seg->mapped_bytes = alloc_size;
  seg->pool = pool;
  seg->context = context;
  Block* b = block_list::start(block_nodes_, seg, BlockState::free);
  seg->set_owner(this);
  link_segment(seg);
  services_.segments.publish(seg);
  index_free(b);
  stats().add<kSegment>(pool, 1);
  stats().add<kReservedBytes>(pool, static_cast<std::int64_t>(alloc_size));
  seg->oversize = alloc_size >= policy().max_split_size();
  if (seg->oversize) stats().add<kOversizeSegments>(pool, 1);
  DeviceCounters::bump(services_.counters.device_allocs);
  if (tracing()) trace(TraceAction::segment_alloc, seg->base, alloc_size, context);
  return b;
}

// Serves size bytes from the free block b, splitting off the remainder when the
// policy says so; returns the address handed to the program.
RESERVOIR_INLINE std::uintptr_t StreamPool::hand_out(Block* b, std::size_t size,
                                                     std::size_t requested, const Context& context,
                                                     bool traced, ShardCounters& shard) {
  const PoolIndex pool = b->pool();
  const bool counts_split = !b->in_expandable;  // PyTorch counts none in expandable
  const bool already_split = b->is_split();
  SplitChange split;
  Block* out;
  if (!no_split_ && policy().should_split(pool, b->size, size, vmm_)) {
    out = block_list::split_front(block_nodes_, b, size, BlockState::allocated);
    reposition_free(b);
    if (counts_split)
      split = already_split ? SplitChange{0, -static_cast<std::int64_t>(size)}
                            : SplitChange{1, static_cast<std::int64_t>(b->size)};
  } else {
    unindex_free(b);
    if (already_split && counts_split) split = {-1, -static_cast<std::int64_t>(b->size)};
    out = b;
    out->state = BlockState::allocated;
  }
  issue(out, requested, split, shard);
  if (RESERVOIR_UNLIKELY(traced)) {
    trace(TraceAction::alloc, out->address, requested,
          services_.history.level() >= ContextLevel::alloc ? context : nullptr);
    if (context) out->extra().context = context;
  }
  return out->address;
}

// out (allocated, out of every index) goes to the program: into the allocated map,
// with one statistics delta (split: what handing it out did to the inactive splits).
RESERVOIR_INLINE void StreamPool::issue(Block* out, std::size_t requested, SplitChange split,
                                        ShardCounters& shard) {
  const PoolIndex pool = out->pool();
  out->requested = requested;
  allocated_.insert(out->address, out);
  shard.on_allocate(pool, static_cast<std::int64_t>(out->size),
                    static_cast<std::int64_t>(requested), split);
  out->oversize = out->size >= policy().max_split_size();
  if (out->oversize) shard.add<kOversizeAllocations>(pool, 1);
}

// ---------------------------------------------------------------- parked free

// Whether free() may park b: its merge can wait (no neighbour before it to merge
// into, which would move the merged block's start), and nothing else is owed.
RESERVOIR_INLINE bool StreamPool::parks(const Block* b) const noexcept {
  return !b->extras && !(b->prev && b->prev->state == BlockState::free);
}

// b (out of the allocated map, parks(b)) is freed: counted as free_block() would count
// it, merged with a free next, but left where it is.
RESERVOIR_INLINE void StreamPool::park(Block* b, ShardCounters& shard) {
  const PoolIndex pool = b->pool();
  if (b->oversize) shard.add<kOversizeAllocations>(pool, -1);
  const auto bytes = static_cast<std::int64_t>(b->size);
  const auto requested = static_cast<std::int64_t>(b->requested);
  b->requested = 0;
  b->state = BlockState::parked;
  b->gc_stamp = services_.gc.now();
  parked_ = b;
  parked_split_ = parked_merge(b);
  shard.on_free(pool, bytes, requested, parked_split_);
}

// What merging the parked b (with a free next) does to the inactive split blocks, as
// free_block() counts it; taking b back undoes exactly that.
RESERVOIR_INLINE SplitChange StreamPool::parked_merge(const Block* b) {
  if (b->in_expandable) return {};  // PyTorch counts no split blocks there
  const Block* next = b->next;
  const auto bytes = static_cast<std::int64_t>(b->size);
  // The merged block is an inactive split block unless it is the whole segment.
  if (next && next->state == BlockState::free)
    return b->prev || next->next ? SplitChange{0, bytes}
                                 : SplitChange{-1, -static_cast<std::int64_t>(next->size)};
  return b->is_split() ? SplitChange{1, bytes} : SplitChange{};
}

RESERVOIR_INLINE Block* StreamPool::parked_fit(PoolIndex pool, std::size_t size) {
  Block* b = parked_;
  if (b->size != size || b->pool() != pool) return nullptr;  // (taken back as it was)
  const Block* next = b->next;
  const bool merges = next && next->state == BlockState::free;
  const std::size_t merged = b->size + (merges ? next->size : 0);
  if (!policy().may_serve(merged, size)) return nullptr;
  // Expandable segments switched off: best fit skips their blocks.
  if (b->in_expandable && !expandable()) return nullptr;
  // The merged block would be split exactly at b's end, or b taken whole...
  if (merges != (!no_split_ && policy().should_split(pool, merged, size, vmm_))) return nullptr;
  // ...if best fit picks it: no other free block's key lies between size and its key.
  const FreeIndex& set = free_[pool];
  auto it = set.lower_bound(size);
  if (merges && it != set.end() && *it == next) ++it;
  if (it == set.end()) return b;
  if (FreeIndex::less(it.key(), FreeKey{merged, b->address})) return nullptr;
  // In an expandable segment best fit passes on to the next block (*it) when it has
  // less unmapped room after it (find_free()).
  if (b->in_expandable) {
    const Block* after = merges ? next->next : next;
    const std::size_t room =
        merged + (after && after->state == BlockState::unmapped ? after->size : 0);
    if (room_after(*it) < room) return nullptr;
  }
  return b;
}

// parked_fit() said yes: b goes back to the program, and what the free and the
// allocation would have done to the blocks cancels out, but for their statistics.
RESERVOIR_INLINE std::uintptr_t StreamPool::take_parked(Block* b, std::size_t requested,
                                                        ShardCounters& shard) {
  parked_ = nullptr;
  const PoolIndex pool = b->pool();
  if (pool == kLargePool && services_.gc.enabled()) services_.gc.tick();  // as find_free()
  Block* next = b->next;
  if (next && next->state == BlockState::free)
    next->gc_stamp = services_.gc.now();  // the remainder's, as reposition_free()
  // hand_out() splitting the merged block undoes what the merge did.
  b->state = BlockState::allocated;
  issue(b, requested, SplitChange{-parked_split_.blocks, -parked_split_.bytes}, shard);
  finish_operation();
  return b->address;
}

// The merge the parked block's free postponed, as free_block() would have made it
// then (its statistics were counted at the free).
void StreamPool::settle() {
  Block* b = parked_;
  parked_ = nullptr;
  const std::uint64_t stamp = b->gc_stamp;
  std::int64_t merged = 0, merged_bytes = 0;
  Block* keep = coalesce(b, BlockState::free, &merged, &merged_bytes);
  keep->gc_stamp = stamp;
}

bool StreamPool::parked_split_current() {
  const SplitChange split = parked_merge(parked_);
  return split.blocks == parked_split_.blocks && split.bytes == parked_split_.bytes;
}

bool StreamPool::fit_memo_current() {
  const PoolIndex pool = fit_block_->pool();
  return fit_block_ != parked_ || free_[pool].version() != fit_version_ ||
         parked_fit(pool, fit_block_->size) == fit_block_;
}

// ---------------------------------------------------------------- free

bool StreamPool::free(std::uintptr_t address) {
  if (RESERVOIR_UNLIKELY(tracing())) return free_traced(address);
  ScopedGuard guard(*this);
  Block* b = allocated_.erase(address);
  if (!b) return false;
  if (parked_) settle();  // first: b's neighbour may be the parked block
  if (b->size == last_size_ && parks(b))
    park(b, *guard.stats);
  else
    release_block(b, false, *guard.stats);
  finish_operation();
  return true;
}

// free() with history on: the context is gathered before the lock (the user's
// recorder may be slow), and the request is recorded.
bool StreamPool::free_traced(std::uintptr_t address) {
  Context context = services_.history.gather(ContextLevel::all);
  History::Delivery delivery(true);  // the trackers after the lock (history.hpp)
  Guard guard(*this);
  Block* b = allocated_.erase(address);
  if (!b) return false;
  trace(TraceAction::free_requested, b->address, b->requested, context ? context : b->context());
  release_block(b, true, stats());
  finish_operation();
  return true;
}

// The program gave b back (it is out of the allocated map): free it now, or once the
// other streams that used it are done.
RESERVOIR_INLINE void StreamPool::release_block(Block* b, bool traced, ShardCounters& shard) {
  const PoolIndex pool = b->pool();
  if (b->oversize) shard.add<kOversizeAllocations>(pool, -1);
  const auto bytes = static_cast<std::int64_t>(b->size);
  const auto requested = static_cast<std::int64_t>(b->requested);
  if (RESERVOIR_LIKELY(!b->extras || b->extras->uses.empty())) {
    shard.on_free(pool, bytes, requested, free_block(b, traced));
  } else {
    shard.on_defer(pool, bytes);
    if (RESERVOIR_UNLIKELY(services_.capture.underway()))
      defer_past_capture(b);
    else
      defer_free(b);
  }
}

void StreamPool::release_block_outlined(Block* b) {
  release_block(b, tracing(), stats());
}

// The block's memory is free for reuse on this stream: merge with free neighbours
// and put the result in the free set. Returns what that did to the inactive split
// blocks, for the caller's one statistics delta.
RESERVOIR_INLINE SplitChange StreamPool::free_block(Block* b, bool traced) {
  if (RESERVOIR_UNLIKELY(traced))
    trace(TraceAction::free_completed, b->address, b->requested, b->context());
  if (b->extras) b->extras.reset();
  b->requested = 0;
  std::int64_t merged = 0, merged_bytes = 0;
  Block* keep = coalesce(b, BlockState::free, &merged, &merged_bytes);
  if (keep->in_expandable) return {};  // PyTorch counts no split blocks there
  // The merged neighbours were inactive split blocks; the survivor is one if split.
  if (!keep->is_split()) return {-merged, -merged_bytes};
  return {1 - merged, static_cast<std::int64_t>(keep->size) - merged_bytes};
}

// The program freed a block used on other streams: record an event on each and
// complete the free once all have passed.
void StreamPool::defer_free(Block* b) {
  b->state = BlockState::pending;
  std::string failure;
  for (StreamHandle s : b->extras->uses) {
    EventHandle e = 0;
    try {
      e = services_.events.acquire();
    } catch (const DeviceError& err) {
      failure = err.what();
    }
    if (failure.empty()) {
      if (services_.backend.record_event(services_.device, e, s) == DeviceStatus::ok) {
        auto q = std::find_if(pending_queues_.begin(), pending_queues_.end(),
                              [s](const UseQueue& u) { return u.stream == s; });
        if (q == pending_queues_.end()) {
          bool queued = false;
          try {  // out of host memory: the event goes back, the block stays live
            pending_queues_.push_back(UseQueue{s, {}});
            queued = true;
            services_.waiting.add(s, this);
          } catch (...) {
            if (queued) pending_queues_.pop_back();
            services_.events.release(e);
            throw;
          }
          q = std::prev(pending_queues_.end());
        }
        q->entries.push_back(Pending{e, b});
        ++b->event_count;
        continue;
      }
      failure = "recording an event: " + services_.backend.last_error();
      services_.events.release(e);
    }
    // No event: wait for the stream instead; if even that fails the block can
    // never be proven unused, so it is kept out of circulation (stranded).
    if (services_.backend.synchronize_stream(services_.device, s) == DeviceStatus::ok) {
      failure.clear();
      continue;
    }
    break;
  }
  b->extras->uses.clear();
  if (!failure.empty()) {
    // Out of circulation for good: withdraw the events queued above (the newest of
    // their queues), or their completion would free it.
    for (UseQueue& q : pending_queues_)
      while (b->event_count > 0 && !q.entries.empty() && q.entries.back().block == b) {
        services_.events.release(q.entries.back().event);
        q.entries.pop_back();
        --b->event_count;
      }
    stranded_.push_back(b);
    throw DeviceError("reservoir: deferring the free of " +
                      format_pointer(reinterpret_cast<void*>(b->address)) + " on device " +
                      std::to_string(services_.device) + " failed (" + failure +
                      "); the block is kept unused");
  }
  if (b->event_count == 0) {
    complete_pending(b);
  } else {
    ++pending_blocks_;
  }
}

void StreamPool::complete_pending(Block* b) {
  const PoolIndex pool = b->pool();
  stats().on_pending_done(pool, static_cast<std::int64_t>(b->size),
                          static_cast<std::int64_t>(b->requested));
  stats().on_split_change(pool, free_block(b, tracing()));
}

// Completes pending frees whose events have passed; with wait, waits for every one.
// One queue per using stream: an unfinished event only holds back its own stream's.
void StreamPool::process_events(bool wait) {
  for (UseQueue& q : pending_queues_) {
    while (!q.entries.empty()) {
      Pending p = q.entries.front();
      DeviceStatus status = wait ? services_.backend.synchronize_event(services_.device, p.event)
                                 : services_.backend.query_event(services_.device, p.event);
      if (status == DeviceStatus::not_ready) break;
      if (status != DeviceStatus::ok) {
        throw DeviceError(std::string("reservoir: ") + (wait ? "synchronizing" : "querying") +
                          " an event on device " + std::to_string(services_.device) +
                          " failed: " + services_.backend.last_error());
      }
      q.entries.pop_front();
      services_.events.release(p.event);
      Block* b = p.block;
      if (--b->event_count == 0) {
        --pending_blocks_;
        complete_pending(b);
      }
    }
  }
  // A stream's queue goes once empty: a pool keeps nothing of streams it no longer
  // waits for (they come and go by the million in some programs).
  drop_empty_queues();
}

void StreamPool::release_stream(bool fence) {
  Guard guard(*this);
  stream_released_ = true;
  // Only a pool the program is done with (a cache and nothing else): one that still
  // holds blocks gives its cache back when they are (the fence would name a stream
  // the program has destroyed by then, and the device would keep it).
  if (!fence || !segments_ || services_.capture.underway() || owes_blocks()) return;
  EventHandle e = release_fence_;
  if (!fenced_) {
    try {
      e = services_.events.acquire();
    } catch (const DeviceError&) {
      return;  // no fence: the cache goes back at recycling
    }
  }
  if (services_.backend.record_event(services_.device, e, stream()) == DeviceStatus::ok) {
    release_fence_ = e;
    fenced_ = true;
    // Every request sets it (allocate_cached comes first): nonzero at recycling says the
    // stream allocated after its release, work the fence does not cover.
    last_size_ = 0;
    return;
  }
  services_.events.release(e);
  fenced_ = false;
}

// Empty use queues go, and with them the pool's place among the pools waiting on
// their streams.
void StreamPool::drop_empty_queues() {
  std::erase_if(pending_queues_, [this](const UseQueue& q) {
    if (!q.entries.empty()) return false;
    services_.waiting.remove(q.stream, this);
    return true;
  });
}

void StreamPool::process_events_now() {
  Guard guard(*this);
  if (pending_blocks_ != 0 && !services_.capture.underway()) process_events(false);
  finish_operation();
}

void StreamPool::synchronize_pending() {
  Guard guard(*this);
  if (pending_blocks_ != 0) process_events(true);
  finish_operation();
}

bool StreamPool::record_use(std::uintptr_t address, StreamHandle other) {
  Guard guard(*this);
  Block* b = allocated_.find(address);
  if (!b) return false;
  if (other == stream()) return true;
  BlockExtras& x = b->extra();
  if (x.uses.insert(other) && RESERVOIR_UNLIKELY(services_.capture.underway()))
    x.capture_uses.insert(other);
  return true;
}

void StreamPool::set_private(PoolId pool, bool no_split, std::shared_ptr<SegmentSource> source,
                             bool vmm) {
  Guard guard(*this);
  RESERVOIR_ASSERT(segments_ == nullptr);
  pool_id_ = pool;
  no_split_ = no_split;
  vmm_ = vmm;
  asleep_ = false;
  source_ = std::move(source);
  fit_block_ = nullptr;
}

bool StreamPool::holds_segments() {
  Guard guard(*this);
  return segments_ != nullptr;
}

void StreamPool::finish_operation() {
  RESERVOIR_ASSERT_EXPENSIVE({
    ValidationTotals totals;
    validate_locked(&totals);
    const std::string ledger = services_.ledger.problem();
    RESERVOIR_CHECK(ledger.empty(), ledger);
  });
}

}  // namespace reservoir::detail
