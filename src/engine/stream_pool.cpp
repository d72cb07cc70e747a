// StreamPool: allocation, free, split/merge and the pool's rungs of the
// out-of-memory ladder. See stream_pool.hpp for the invariants.
#include "engine/stream_pool.hpp"

#include <algorithm>
#include <new>

#include "engine/device_engine.hpp"
#include "engine/expandable_segment.hpp"
#include "engine/segment_map.hpp"
#include "engine/size_policy.hpp"
#include "util/checks.hpp"
#include "util/format.hpp"

namespace reservoir::detail {

namespace {
// std::set<Block*> nodes are 40 bytes with libstdc++; leave room for other layouts.
constexpr std::size_t kSetNodeSize = 64;
inline int pool_of(const Block* b) {
  return b->segment->small ? 0 : 1;
}
}  // namespace

StreamPool::StreamPool(DeviceEngine& engine, StreamHandle stream)
    : engine_(engine),
      stream_(stream),
      set_nodes_(kSetNodeSize),
      block_nodes_(sizeof(Block)),
      free_{FreeSet(BySizeThenAddress{}, PoolAllocator<Block*>(&set_nodes_)),
            FreeSet(BySizeThenAddress{}, PoolAllocator<Block*>(&set_nodes_))},
      unmapped_{AddressSet(ByAddress{}, PoolAllocator<Block*>(&set_nodes_)),
                AddressSet(ByAddress{}, PoolAllocator<Block*>(&set_nodes_))} {}

StreamPool::~StreamPool() {
  // The engine is going away: return every segment, whatever its blocks hold.
  for (auto& q : pending_queues_)
    for (Pending& p : q.entries) engine_.events().release(p.event);
  free_[0].clear();
  free_[1].clear();
  unmapped_[0].clear();
  unmapped_[1].clear();
  Segment* seg = segments_;
  while (seg) {
    Segment* next = seg->next_in_pool;
    if (seg->expandable)
      delete seg->vm;  // unmaps its pages and releases the range
    else
      (void)engine_.backend().deallocate(engine_.device(), reinterpret_cast<void*>(seg->base),
                                         seg->size);
    engine_.segments().erase(seg);
    engine_.unreserve(seg->mapped_bytes);
    for (Block* b = seg->head; b;) {
      Block* n = b->next;
      delete_block(b);
      b = n;
    }
    seg = next;
  }
}

// ---------------------------------------------------------------- blocks and index

Block* StreamPool::new_block() {
  return new (block_nodes_.get()) Block();
}

void StreamPool::delete_block(Block* b) {
  b->~Block();
  block_nodes_.put(b);
}

void StreamPool::index_insert(Block* b) {
  b->state = BlockState::free;
  b->gc_stamp = engine_.gc_now();
  b->free_at = free_set(b).insert(b).first;
}

void StreamPool::index_erase(Block* b) {
  free_set(b).erase(b->free_at);
}

// b's size or address changed while in the set: keep its node when the order still
// holds (the common case of splitting or merging the same block), else re-insert.
void StreamPool::index_reposition(Block* b) {
  FreeSet& set = free_set(b);
  b->gc_stamp = engine_.gc_now();
  if (set.size() == 1) return;  // a lone block is always in order
  BySizeThenAddress less;
  auto it = b->free_at;
  bool ordered = true;
  if (it != set.begin() && !less(*std::prev(it), b)) ordered = false;
  auto after = std::next(it);
  if (ordered && after != set.end() && !less(b, *after)) ordered = false;
  if (ordered) return;
  set.erase(it);
  b->free_at = set.insert(b).first;
}

// keep absorbs its neighbour gone (adjacent, same segment); gone is deleted.
Block* StreamPool::merge_into(Block* keep, Block* gone) {
  if (gone->state == BlockState::free) index_erase(gone);
  if (gone->state == BlockState::unmapped) unmapped_set(gone).erase(gone->unmapped_at);
  if (gone == keep->prev) {
    keep->address = gone->address;
    keep->prev = gone->prev;
    if (keep->prev)
      keep->prev->next = keep;
    else
      keep->segment->head = keep;
  } else {
    keep->next = gone->next;
    if (keep->next) keep->next->prev = keep;
  }
  keep->size += gone->size;
  delete_block(gone);
  return keep;
}

// ---------------------------------------------------------------- allocation

Block* StreamPool::find_free(bool small, std::size_t size) {
  FreeSet& set = free_[small ? 0 : 1];
  if (!small && engine_.gc_enabled()) engine_.gc_tick();
  if (set.empty()) return nullptr;
  Block key;
  key.size = size;
  auto it = set.lower_bound(&key);
  if (it == set.end()) return nullptr;
  if ((*it)->segment->expandable) {
    if (engine_.policy().expandable()) {
      // Best fit counts the unmapped room after a block of an expandable segment:
      // prefer a block that would not grow into the segment's open end.
      auto room = [](const Block* b) {
        return b->size + (b->next && b->next->state == BlockState::unmapped ? b->next->size : 0);
      };
      for (auto next = std::next(it);
           (*it)->segment->expandable && next != set.end() && room(*next) < room(*it); ++next)
        it = next;
    } else {
      // Expandable segments were switched off: their blocks are not handed out.
      do {
        ++it;
      } while (it != set.end() && (*it)->segment->expandable);
      if (it == set.end()) return nullptr;
    }
  }
  Block* b = *it;
  if (!engine_.policy().may_serve(b->size, size)) return nullptr;
  return b;
}

std::uintptr_t StreamPool::allocate(std::size_t requested) {
  // The user's context recorder may be slow or take its own locks: call it first.
  Context context;
  if (__builtin_expect(engine_.history().active(), 0))
    context = engine_.history().gather(ContextLevel::state);
  Guard guard(lock_);
  if (pending_blocks_ != 0) process_events(false);
  const std::size_t size = engine_.policy().round(requested);
  const bool small = SizePolicy::is_small(size);
  Block* b = find_free(small, size);
  if (!b) b = allocate_slow(guard, requested, size, small, context);
  Block* out = take(b, size, requested, small, context);
  std::uintptr_t address = out->address;
  finish_operation();
  return address;
}

Block* StreamPool::allocate_slow(Guard& guard, std::size_t requested, std::size_t size, bool small,
                                 const Context& context) {
  // Rung 1: the program's free-memory callbacks (outside the lock: they may free
  // memory through this allocator).
  if (engine_.has_free_memory_callbacks()) {
    guard.unlock();
    bool freed = engine_.run_free_memory_callbacks();
    guard.lock();
    if (freed)
      if (Block* b = find_free(small, size)) return b;
  }
  // Rung 2: age-based garbage collection of cached blocks.
  if (engine_.gc_enabled()) {
    guard.unlock();
    engine_.garbage_collect();
    guard.lock();
  }
  // Rung 3: a new segment.
  if (Block* b = allocate_segment(guard, size, small, false, context)) return b;
  // Rung 4: release cached oversize blocks of this pool, retry.
  if (release_oversize(size, small))
    if (Block* b = allocate_segment(guard, size, small, false, context)) return b;
  // Rung 5: wait for pending frees and release every unsplit cached segment of every
  // stream, retry. Frees completed meanwhile may already satisfy the request.
  guard.unlock();
  engine_.release_cached_everywhere();
  guard.lock();
  if (pending_blocks_ != 0) process_events(false);
  if (Block* b = find_free(small, size)) return b;
  if (Block* b = allocate_segment(guard, size, small, true, context)) return b;
  // Rung 6: out of memory.
  guard.unlock();
  engine_.raise_out_of_memory(*this, requested, SizePolicy::segment_size(size));
}

Block* StreamPool::allocate_segment(Guard& guard, std::size_t size, bool small, bool retry,
                                    const Context& context) {
  if (retry) engine_.count_retry();
  if (engine_.policy().expandable()) return allocate_expandable(size, small, context);
  const std::size_t alloc_size = SizePolicy::segment_size(size);
  if (!engine_.reserve(alloc_size)) return nullptr;  // over the memory fraction
  void* ptr = nullptr;
  DeviceStatus status;
  if (engine_.config().release_lock_on_cudamalloc) {
    guard.unlock();
    status = engine_.backend().allocate(engine_.device(), alloc_size, &ptr);
    guard.lock();
  } else {
    status = engine_.backend().allocate(engine_.device(), alloc_size, &ptr);
  }
  if (status != DeviceStatus::ok) {
    engine_.unreserve(alloc_size);
    if (status == DeviceStatus::out_of_memory) return nullptr;
    throw DeviceError("reservoir: allocating a segment of " + format_size(alloc_size) +
                      " on device " + std::to_string(engine_.device()) + " (" +
                      engine_.backend().name() + ") failed: " + engine_.backend().last_error());
  }
  Segment* seg = engine_.new_segment();
  seg->set_range(reinterpret_cast<std::uintptr_t>(ptr), alloc_size);
  seg->mapped_bytes = alloc_size;
  seg->set_owner(this);
  seg->small = small;
  seg->expandable = false;
  Block* b = new_block();
  b->address = seg->base;
  b->size = alloc_size;
  b->segment = seg;
  seg->head = b;
  seg->prev_in_pool = nullptr;
  seg->next_in_pool = segments_;
  if (segments_) segments_->prev_in_pool = seg;
  segments_ = seg;
  engine_.segments().insert(seg);
  index_insert(b);
  const int pool = small ? 0 : 1;
  counters_.add(kSegment, pool, 1);
  counters_.add(kReservedBytes, pool, static_cast<std::int64_t>(alloc_size));
  seg->oversize = alloc_size >= engine_.policy().max_split_size();
  if (seg->oversize) counters_.add(kOversizeSegments, pool, 1);
  engine_.count_device_alloc();
  seg->context = context;
  engine_.trace(TraceAction::segment_alloc, seg->base, alloc_size, stream_, context);
  return b;
}

// Serves size bytes from the free block b, splitting off the remainder when the
// policy says so; returns the allocated block.
Block* StreamPool::take(Block* b, std::size_t size, std::size_t requested, bool small,
                        const Context& context) {
  const SizePolicy& policy = engine_.policy();
  const int pool = pool_of(b);
  const bool expandable = b->segment->expandable;
  const bool already_split = b->is_split();
  Block* out;
  if (policy.should_split(small, b->size, size)) {
    Block* a = new_block();
    a->address = b->address;
    a->size = size;
    a->segment = b->segment;
    a->prev = b->prev;
    if (a->prev)
      a->prev->next = a;
    else
      b->segment->head = a;
    a->next = b;
    b->prev = a;
    b->address += size;
    b->size -= size;
    index_reposition(b);
    if (!expandable) {
      if (already_split) {
        counters_.add(kInactiveSplitBytes, pool, -static_cast<std::int64_t>(size));
      } else {
        counters_.add(kInactiveSplitBytes, pool, static_cast<std::int64_t>(b->size));
        counters_.add(kInactiveSplit, pool, 1);
      }
    }
    out = a;
  } else {
    index_erase(b);
    if (already_split && !expandable) {
      counters_.add(kInactiveSplitBytes, pool, -static_cast<std::int64_t>(b->size));
      counters_.add(kInactiveSplit, pool, -1);
    }
    out = b;
  }
  out->state = BlockState::allocated;
  out->requested = requested;
  allocated_.insert(out->address, out);
  const auto bytes = static_cast<std::int64_t>(out->size);
  counters_.add(kAllocation, pool, 1);
  counters_.add(kAllocatedBytes, pool, bytes);
  counters_.add(kActive, pool, 1);
  counters_.add(kActiveBytes, pool, bytes);
  counters_.add(kRequestedBytes, pool, static_cast<std::int64_t>(requested));
  out->oversize = out->size >= policy.max_split_size();
  if (out->oversize) counters_.add(kOversizeAllocations, pool, 1);
  if (__builtin_expect(engine_.history().active(), 0)) {
    engine_.trace(TraceAction::alloc, out->address, requested, stream_,
                  engine_.history().level() >= ContextLevel::alloc ? context : nullptr);
    out->context = context;
  }
  return out;
}

// ---------------------------------------------------------------- free

bool StreamPool::free(std::uintptr_t address) {
  Context context;
  if (__builtin_expect(engine_.history().active(), 0))
    context = engine_.history().gather(ContextLevel::all);
  Guard guard(lock_);
  Block* b = allocated_.erase(address);
  if (!b) return false;
  if (__builtin_expect(engine_.history().active(), 0))
    engine_.trace(TraceAction::free_requested, b->address, b->requested, stream_,
                  context ? context : b->context);
  const int pool = pool_of(b);
  counters_.add(kAllocation, pool, -1);
  counters_.add(kAllocatedBytes, pool, -static_cast<std::int64_t>(b->size));
  if (b->oversize) counters_.add(kOversizeAllocations, pool, -1);
  if (b->uses.empty())
    free_block(b);
  else
    defer_free(b);
  finish_operation();
  return true;
}

// The block's memory is free for reuse on this stream: merge with free neighbours
// and put the result in the free set.
void StreamPool::free_block(Block* b) {
  const int pool = pool_of(b);
  if (__builtin_expect(engine_.history().active(), 0))
    engine_.trace(TraceAction::free_completed, b->address, b->requested, stream_, b->context);
  b->context.reset();
  const bool expandable = b->segment->expandable;
  counters_.add(kActive, pool, -1);
  counters_.add(kActiveBytes, pool, -static_cast<std::int64_t>(b->size));
  counters_.add(kRequestedBytes, pool, -static_cast<std::int64_t>(b->requested));
  b->requested = 0;
  // b keeps its old state until it is indexed or absorbed, so merge_into() knows it
  // is not in the free set.
  std::int64_t split_blocks = 0, split_bytes = 0;
  Block* keep = b;
  bool indexed = false;
  if (b->prev && b->prev->state == BlockState::free) {
    split_blocks -= 1;
    split_bytes -= static_cast<std::int64_t>(b->prev->size);
    Block* prev = b->prev;
    prev->size += b->size;  // prev absorbs b and keeps its place in the set
    prev->next = b->next;
    if (prev->next) prev->next->prev = prev;
    delete_block(b);
    keep = prev;
    indexed = true;
  }
  if (keep->next && keep->next->state == BlockState::free) {
    Block* next = keep->next;
    split_blocks -= 1;
    split_bytes -= static_cast<std::int64_t>(next->size);
    if (indexed) {
      merge_into(keep, next);
    } else {
      merge_into(next, keep);  // next keeps its node; its key grows
      keep = next;
      indexed = true;
    }
  }
  if (indexed)
    index_reposition(keep);
  else
    index_insert(keep);
  if (keep->is_split()) {
    split_blocks += 1;
    split_bytes += static_cast<std::int64_t>(keep->size);
  }
  if (!expandable) {
    if (split_blocks) counters_.add(kInactiveSplit, pool, split_blocks);
    if (split_bytes) counters_.add(kInactiveSplitBytes, pool, split_bytes);
  }
}

// The program freed a block used on other streams: record an event on each and
// complete the free once all have passed.
void StreamPool::defer_free(Block* b) {
  b->state = BlockState::pending;
  std::string failure;
  for (StreamHandle s : b->uses) {
    EventHandle e = 0;
    try {
      e = engine_.events().acquire();
    } catch (const DeviceError& err) {
      failure = err.what();
    }
    if (failure.empty()) {
      if (engine_.backend().record_event(engine_.device(), e, s) == DeviceStatus::ok) {
        auto q = std::find_if(pending_queues_.begin(), pending_queues_.end(),
                              [s](const UseQueue& u) { return u.stream == s; });
        if (q == pending_queues_.end()) {
          pending_queues_.push_back(UseQueue{s, {}});
          q = std::prev(pending_queues_.end());
        }
        q->entries.push_back(Pending{e, b});
        ++b->event_count;
        continue;
      }
      failure = "recording an event: " + engine_.backend().last_error();
      engine_.events().release(e);
    }
    // No event: wait for the stream instead; if even that fails the block can
    // never be proven unused, so it is kept out of circulation (stranded).
    if (engine_.backend().synchronize_stream(engine_.device(), s) == DeviceStatus::ok) {
      failure.clear();
      continue;
    }
    break;
  }
  b->uses.clear();
  if (!failure.empty()) {
    // Out of circulation for good: withdraw the events queued above (the newest of
    // their queues), or their completion would free it.
    for (UseQueue& q : pending_queues_)
      while (b->event_count > 0 && !q.entries.empty() && q.entries.back().block == b) {
        engine_.events().release(q.entries.back().event);
        q.entries.pop_back();
        --b->event_count;
      }
    stranded_.push_back(b);
    throw DeviceError("reservoir: deferring the free of " +
                      format_pointer(reinterpret_cast<void*>(b->address)) + " on device " +
                      std::to_string(engine_.device()) + " failed (" + failure +
                      "); the block is kept unused");
  }
  if (b->event_count == 0)
    free_block(b);
  else
    ++pending_blocks_;
}

// Completes pending frees whose events have passed; with wait, waits for every one.
// One queue per using stream: an unfinished event only holds back its own stream's.
void StreamPool::process_events(bool wait) {
  for (UseQueue& q : pending_queues_) {
    while (!q.entries.empty()) {
      Pending p = q.entries.front();
      DeviceStatus status = wait ? engine_.backend().synchronize_event(engine_.device(), p.event)
                                 : engine_.backend().query_event(engine_.device(), p.event);
      if (status == DeviceStatus::not_ready) break;
      if (status != DeviceStatus::ok)
        throw DeviceError(std::string("reservoir: ") + (wait ? "synchronizing" : "querying") +
                          " an event on device " + std::to_string(engine_.device()) +
                          " failed: " + engine_.backend().last_error());
      q.entries.pop_front();
      engine_.events().release(p.event);
      if (--p.block->event_count == 0) {
        --pending_blocks_;
        free_block(p.block);
      }
    }
  }
}

void StreamPool::process_events_now() {
  Guard guard(lock_);
  if (pending_blocks_ != 0) process_events(false);
  finish_operation();
}

void StreamPool::synchronize_pending() {
  Guard guard(lock_);
  if (pending_blocks_ != 0) process_events(true);
  finish_operation();
}

bool StreamPool::record_use(std::uintptr_t address, StreamHandle other) {
  Guard guard(lock_);
  Block* b = allocated_.find(address);
  if (!b) return false;
  if (other != stream_ && std::find(b->uses.begin(), b->uses.end(), other) == b->uses.end())
    b->uses.push_back(other);
  return true;
}

// ---------------------------------------------------------------- release

void StreamPool::release_segment(Segment* seg) {
  Block* b = seg->head;
  RESERVOIR_ASSERT(b && !b->is_split() && b->state == BlockState::free && !seg->expandable);
  engine_.trace(TraceAction::segment_free, seg->base, seg->size, stream_, seg->context);
  if (engine_.backend().deallocate(engine_.device(), reinterpret_cast<void*>(seg->base),
                                   seg->size) != DeviceStatus::ok)
    throw DeviceError("reservoir: freeing a segment of " + format_size(seg->size) + " on device " +
                      std::to_string(engine_.device()) +
                      " failed: " + engine_.backend().last_error());
  index_erase(b);
  delete_block(b);
  engine_.segments().erase(seg);
  if (seg->prev_in_pool)
    seg->prev_in_pool->next_in_pool = seg->next_in_pool;
  else
    segments_ = seg->next_in_pool;
  if (seg->next_in_pool) seg->next_in_pool->prev_in_pool = seg->prev_in_pool;
  const int pool = seg->small ? 0 : 1;
  counters_.add(kSegment, pool, -1);
  counters_.add(kReservedBytes, pool, -static_cast<std::int64_t>(seg->size));
  if (seg->oversize) counters_.add(kOversizeSegments, pool, -1);
  engine_.unreserve(seg->size);
  engine_.count_device_free();
  engine_.recycle_segment(seg);
}

std::size_t StreamPool::release_cached() {
  Guard guard(lock_);
  std::size_t released = 0;
  std::vector<Segment*> whole;
  std::vector<Block*> expandable;
  for (FreeSet& set : free_)
    for (Block* b : set) {
      if (b->segment->expandable)
        expandable.push_back(b);
      else if (!b->is_split())
        whole.push_back(b->segment);
    }
  for (Segment* seg : whole) {
    released += seg->size;
    release_segment(seg);
  }
  // Expandable segments give back every whole free page, and the address range
  // once nothing is mapped.
  for (Block* b : expandable) {
    Segment* seg = b->segment;
    std::size_t before = seg->mapped_bytes;
    unmap_block(b);
    released += before - seg->mapped_bytes;
  }
  released += release_idle_expandable();
  finish_operation();
  return released;
}

// The spec's release_available_cached_blocks: free one cached oversize block large
// enough for the request, or else the largest ones until enough was freed.
bool StreamPool::release_oversize(std::size_t size, bool small) {
  const SizePolicy& policy = engine_.policy();
  if (!policy.has_max_split_size()) return false;
  FreeSet& set = free_[small ? 0 : 1];
  Block key;
  key.size = std::max(size, policy.max_split_size());
  auto it = set.lower_bound(&key);
  std::vector<Segment*> victims;
  bool enough;
  if (it != set.end() && !(*it)->segment->expandable) {
    if ((*it)->is_split()) return false;
    victims.push_back((*it)->segment);
    enough = true;
  } else {
    if (it == set.begin()) return false;
    std::size_t released = 0;
    --it;
    while (released < key.size && (*it)->size >= policy.max_split_size()) {
      Block* b = *it;
      bool first = it == set.begin();
      if (!first) --it;
      if (!b->segment->expandable && !b->is_split()) {
        victims.push_back(b->segment);
        released += b->size;
      }
      if (first) break;
    }
    enough = released >= key.size;
  }
  for (Segment* seg : victims) release_segment(seg);
  return enough;
}

// ---------------------------------------------------------------- queries

std::size_t StreamPool::largest_free_block(bool small) {
  Guard guard(lock_);
  const FreeSet& set = free_[small ? 0 : 1];
  return set.empty() ? 0 : (*set.rbegin())->size;
}

std::size_t StreamPool::cached_bytes() {
  Guard guard(lock_);
  std::size_t total = 0;
  for (const FreeSet& set : free_)
    for (const Block* b : set) total += b->size;
  return total;
}

bool StreamPool::block_sizes(std::uintptr_t address, std::size_t* size, std::size_t* requested) {
  Guard guard(lock_);
  Block* b = allocated_.find(address);
  if (!b) return false;
  if (size) *size = b->size;
  if (requested) *requested = b->requested;
  return true;
}

bool StreamPool::segment_of(std::uintptr_t address, BaseAllocation* out) {
  Guard guard(lock_);
  for (Segment* seg = segments_; seg; seg = seg->next_in_pool) {
    if (address >= seg->base && address - seg->base < seg->size) {
      if (seg->expandable)
        throw InvalidArgumentError(
            "reservoir: " + format_pointer(reinterpret_cast<void*>(address)) +
            " lies in an expandable segment, which has no single base allocation (and cannot "
            "be shared with other processes); allocate it with expandable_segments:False");
      out->base = reinterpret_cast<void*>(seg->base);
      out->size = seg->size;
      return true;
    }
  }
  return false;
}

std::size_t StreamPool::snapshot(std::vector<SegmentInfo>* out) {
  Guard guard(lock_);
  std::size_t active_total = 0;
  const int device = engine_.device();
  for (Segment* seg = segments_; seg; seg = seg->next_in_pool) {
    SegmentInfo* info = nullptr;
    for (Block* b = seg->head; b; b = b->next) {
      if (!b->mapped()) {  // expandable: each mapped run is reported as a segment
        info = nullptr;
        continue;
      }
      if (!info) {
        out->emplace_back();
        info = &out->back();
        info->device = device;
        info->address = b->address;
        info->stream = stream_;
        info->is_large = !seg->small;
        info->is_expandable = seg->expandable;
        info->context = seg->context;
      }
      BlockInfo block;
      block.address = b->address;
      block.size = b->size;
      block.context = b->context;
      if (b->state == BlockState::allocated) {
        block.state = BlockStateInfo::active_allocated;
        block.requested_size = b->requested;
        info->allocated_size += b->size;
      } else if (b->state == BlockState::pending) {
        block.state = BlockStateInfo::active_pending_free;
        block.requested_size = b->requested;
      }
      if (block.state != BlockStateInfo::inactive) {
        info->active_size += b->size;
        info->requested_size += b->requested;
        active_total += b->size;
      }
      info->total_size += b->size;
      info->blocks.push_back(std::move(block));
    }
  }
  return active_total;
}

std::string StreamPool::explain_not_allocated(std::uintptr_t address) {
  Guard guard(lock_);
  for (Segment* seg = segments_; seg; seg = seg->next_in_pool) {
    if (address < seg->base || address - seg->base >= seg->size) continue;
    for (Block* b = seg->head; b; b = b->next) {
      if (address < b->address || address - b->address >= b->size) continue;
      std::string where = format_pointer(reinterpret_cast<void*>(b->address));
      switch (b->state) {
        case BlockState::allocated:
          return "it points " + std::to_string(address - b->address) +
                 " bytes inside the allocated block at " + where + " (" + format_size(b->size) +
                 "); free the pointer that allocate() returned";
        case BlockState::pending:
          return "the block at " + where +
                 " was already freed (it waits for work on other streams); double free?";
        default:
          return "no block is allocated there: it was freed already (double free?) or never "
                 "handed out";
      }
    }
  }
  return "no Reservoir segment holds it any more";
}

void StreamPool::gc_scan(std::uint64_t now, GcTally* tally) {
  Guard guard(lock_);
  for (const Block* b : free_[1]) {
    if (b->is_split() || b->segment->expandable) continue;
    tally->total_age += now - b->gc_stamp;
    tally->count += 1;
  }
}

void StreamPool::gc_release(std::uint64_t now, double age_threshold, GcTally* tally) {
  Guard guard(lock_);
  std::vector<Segment*> victims;
  for (const Block* b : free_[1]) {
    if (b->is_split() || b->segment->expandable) continue;
    std::uint64_t age = now - b->gc_stamp;
    if (static_cast<double>(age) >= age_threshold) {
      victims.push_back(b->segment);
      tally->total_age -= age;
      tally->count -= 1;
      tally->reclaimed += b->size;
      tally->freed_any = true;
    }
  }
  for (Segment* seg : victims) release_segment(seg);
  finish_operation();
}

void StreamPool::reset_accumulated() {
  Guard guard(lock_);
  StatLedger::reset_accumulated(&counters_);
}

void StreamPool::finish_operation() {
  if (counters_.over) engine_.ledger().rebalance(&counters_);
  RESERVOIR_ASSERT_EXPENSIVE({
    ValidationTotals totals;
    validate_locked(&totals);
  });
}

}  // namespace reservoir::detail
