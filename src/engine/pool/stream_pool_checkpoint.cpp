// StreamPool: checkpoints of a private pool's cache (the spec's getCheckpointState /
// setCheckpointPoolState, which CUDA graph trees use to roll a graph pool back to
// the state right after a recording). A checkpoint lists each segment and the extent
// and state of its blocks; restoring frees every allocated block, then splits each
// recorded segment as recorded and allocates the blocks recorded as allocated, with
// the statistics moved as the same frees and allocations would move them. An expandable
// segment's checkpoint lists its mapped blocks; its restore carves the allocated ones
// out of the free memory the frees left, wherever the mapping grew since (a live
// pool's pages are never unmapped: neither empty_cache nor the out-of-memory ladder
// takes them).
#include <algorithm>

#include "engine/books/block_list.hpp"
#include "engine/pool/stream_pool.hpp"
#include "reservoir/errors.hpp"
#include "util/checks.hpp"
#include "util/format.hpp"

namespace reservoir::detail {

namespace {
std::string at(std::uintptr_t a) {
  return format_pointer(reinterpret_cast<void*>(a));
}
}  // namespace

void StreamPool::checkpoint(std::vector<CheckpointSegment>* out) {
  Guard guard(*this);
  for (Segment* seg = segments_; seg; seg = seg->next_in_pool) {
    CheckpointSegment record;
    record.stream = stream();
    record.base = seg->base;
    record.size = seg->size;
    record.is_small = seg->is_small();
    record.expandable = seg->expandable;
    for (const Block* b = seg->head; b; b = b->next) {
      if (!b->mapped()) continue;
      if (b->state == BlockState::pending)
        throw InvalidArgumentError("reservoir: cannot checkpoint private pool: block " +
                                   at(b->address) +
                                   " was freed but waits for work on other streams (a capture "
                                   "is under way, or the device failed)");
      record.blocks.push_back(
          CheckpointBlock{b->address, b->size, b->requested, b->state == BlockState::allocated});
    }
    out->push_back(std::move(record));
  }
}

Segment* StreamPool::segment_at(std::uintptr_t base) {
  for (Segment* seg = segments_; seg; seg = seg->next_in_pool)
    if (seg->base == base) return seg;
  return nullptr;
}

void StreamPool::check_restorable(const std::vector<const CheckpointSegment*>& segments) {
  // A segment listed twice (or two that overlap: forged, or of another process) would
  // pass the checks below once per listing and fail half-way through the restore.
  std::vector<const CheckpointSegment*> by_base = segments;
  std::sort(
      by_base.begin(), by_base.end(),
      [](const CheckpointSegment* x, const CheckpointSegment* y) { return x->base < y->base; });
  for (std::size_t i = 1; i < by_base.size(); ++i) {
    const CheckpointSegment& prev = *by_base[i - 1];
    const CheckpointSegment& next = *by_base[i];
    if (next.base == prev.base)
      throw InvalidArgumentError("reservoir: cannot restore the checkpoint: segment " +
                                 at(next.base) + " is listed twice");
    if (next.base - prev.base < prev.size)
      throw InvalidArgumentError("reservoir: cannot restore the checkpoint: segments " +
                                 at(prev.base) + " and " + at(next.base) + " overlap");
  }
  Guard guard(*this);
  for (const CheckpointSegment* record : segments) {
    const std::string where =
        "reservoir: cannot restore the checkpoint: segment " + at(record->base);
    Segment* seg = segment_at(record->base);
    if (!seg || seg->expandable != record->expandable || seg->size != record->size)
      throw InvalidArgumentError(where +
                                 " is not a segment of the pool any more (released, or the "
                                 "checkpoint is of another pool)");
    if (seg->is_small() != record->is_small)
      throw InvalidArgumentError(where + " changed pool (small/large)");
    if (seg->expandable) {
      check_restorable_expandable(seg, *record, where);
      continue;
    }
    std::uintptr_t next = record->base;
    bool previous_free = false;
    for (const CheckpointBlock& b : record->blocks) {
      if (b.address != next || b.size == 0 || b.size % SizePolicy::kMinBlockSize != 0 ||
          (b.allocated && (b.requested == 0 || b.requested > b.size)) ||
          (!b.allocated && previous_free))
        throw InvalidArgumentError(where + ": its blocks do not tile it as recorded (at " +
                                   at(b.address) + ")");
      next += b.size;
      previous_free = !b.allocated;
    }
    if (next != record->base + record->size || record->blocks.empty())
      throw InvalidArgumentError(where + ": its blocks do not cover it");
    for (const Block* b = seg->head; b; b = b->next)
      if (b->state == BlockState::pending && b->event_count == 0 &&
          std::find(capture_deferred_.begin(), capture_deferred_.end(), b) ==
              capture_deferred_.end())
        throw InvalidArgumentError(where + " holds block " + at(b->address) +
                                   ", kept out of use after a device error");
  }
}

// pre: guarded. The blocks of an expandable segment's checkpoint are in address order,
// inside it, and each allocated one lies in memory mapped now (after the restore's
// frees, inside one free block).
void StreamPool::check_restorable_expandable(Segment* seg, const CheckpointSegment& record,
                                             const std::string& where) {
  std::uintptr_t next = record.base;
  const Block* b = seg->head;
  for (const CheckpointBlock& r : record.blocks) {
    if (r.address < next || r.size == 0 || r.size % SizePolicy::kMinBlockSize != 0 ||
        r.size > record.base + record.size - r.address ||
        (r.allocated && (r.requested == 0 || r.requested > r.size)))
      throw InvalidArgumentError(where + ": its blocks are not in order inside it (at " +
                                 at(r.address) + ")");
    next = r.address + r.size;
    if (!r.allocated) continue;
    while (b && b->address + b->size <= r.address) b = b->next;
    for (const Block* c = b; c && c->address < next; c = c->next) {
      if (!c->mapped())
        throw InvalidArgumentError(where + ": block " + at(r.address) +
                                   " of the checkpoint is not mapped memory of it (forged, "
                                   "or of another pool)");
      if (c->state == BlockState::pending && c->event_count == 0 &&
          std::find(capture_deferred_.begin(), capture_deferred_.end(), c) ==
              capture_deferred_.end())
        throw InvalidArgumentError(where + " holds block " + at(c->address) +
                                   ", kept out of use after a device error");
    }
  }
}

void StreamPool::free_all_allocated(std::vector<void*>* freed) {
  Guard guard(*this);
  std::vector<std::uintptr_t> addresses;
  for (Segment* seg = segments_; seg; seg = seg->next_in_pool)
    for (const Block* b = seg->head; b; b = b->next)
      if (b->state == BlockState::allocated) addresses.push_back(b->address);
  std::string failure;
  for (std::uintptr_t address : addresses) {
    Block* b = allocated_.erase(address);
    RESERVOIR_ASSERT(b);
    freed->push_back(reinterpret_cast<void*>(address));
    if (tracing()) trace(TraceAction::free_requested, b->address, b->requested, b->context());
    try {
      release_block_outlined(b);  // a failed event record strands the block (DeviceError)
    } catch (const DeviceError& e) {
      if (failure.empty()) failure = e.what();
    }
  }
  finish_operation();
  if (failure.empty() && pending_blocks_ != 0) process_events(true);
  finish_operation();
  if (!failure.empty()) throw DeviceError(failure);
}

void StreamPool::restore(const std::vector<const CheckpointSegment*>& segments,
                         std::vector<void*>* allocated) {
  Guard guard(*this);
  for (const CheckpointSegment* record : segments) {
    Segment* seg = segment_at(record->base);
    RESERVOIR_ASSERT(seg);
    if (seg->expandable)
      restore_expandable_segment(seg, *record, allocated);
    else
      restore_segment(seg, *record, allocated);
  }
  finish_operation();
}

// b (out of every index) is the checkpoint's allocated block again: into the allocated
// map, counted as handing it out counts it (StreamPool::issue, the hot path's), with no
// change to the inactive splits.
void StreamPool::restore_allocated(Block* b, std::size_t requested, std::vector<void*>* allocated) {
  const PoolIndex pool = b->pool();
  b->state = BlockState::allocated;
  b->requested = requested;
  allocated_.insert(b->address, b);
  stats().on_allocate(pool, static_cast<std::int64_t>(b->size),
                      static_cast<std::int64_t>(requested));
  b->oversize = b->size >= policy().max_split_size();
  if (b->oversize) stats().add<kOversizeAllocations>(pool, 1);
  allocated->push_back(reinterpret_cast<void*>(b->address));
  if (tracing()) trace(TraceAction::alloc, b->address, requested, nullptr);
}

// pre: every block of seg is free (so seg is one free block). Rebuilds the recorded
// blocks in place of it.
void StreamPool::restore_segment(Segment* seg, const CheckpointSegment& record,
                                 std::vector<void*>* allocated) {
  Block* whole = seg->head;
  if (whole->next || whole->state != BlockState::free)
    throw DeviceError("reservoir: restoring segment " + at(seg->base) +
                      ": a block of it is still in use after its frees (device error?)");
  const PoolIndex pool = seg->pool;
  unindex_free(whole);
  Block* prev = nullptr;
  const bool split = record.blocks.size() > 1;
  for (std::size_t i = 0; i < record.blocks.size(); ++i) {
    const CheckpointBlock& r = record.blocks[i];
    Block* b = i == 0 ? whole : new_block(r.address, r.size, seg, BlockState::free);
    b->address = r.address;
    b->size = r.size;
    b->prev = prev;
    b->next = nullptr;
    if (prev)
      prev->next = b;
    else
      seg->head = b;
    prev = b;
    if (r.allocated) {
      restore_allocated(b, r.requested, allocated);
    } else {
      b->requested = 0;
      index_free(b);
      if (split) {
        stats().add<kInactiveSplit>(pool, 1);
        stats().add<kInactiveSplitBytes>(pool, static_cast<std::int64_t>(b->size));
      }
    }
  }
}

// pre: seg is expandable and holds no allocated block; each allocated block of record
// lies inside one free block (check_restorable_expandable, then the frees). Carves
// them out, the rest staying free; PyTorch counts no inactive splits in expandable
// segments.
void StreamPool::restore_expandable_segment(Segment* seg, const CheckpointSegment& record,
                                            std::vector<void*>* allocated) {
  Block* b = seg->head;
  for (const CheckpointBlock& r : record.blocks) {
    if (!r.allocated) continue;
    while (b && b->address + b->size <= r.address) b = b->next;
    if (!b || b->state != BlockState::free || b->address > r.address ||
        b->address + b->size < r.address + r.size)
      throw DeviceError("reservoir: restoring segment " + at(seg->base) + ": block " +
                        at(r.address) + " is not free memory after the frees (device error?)");
    unindex_free(b);
    if (b->address < r.address)
      index_free(
          block_list::split_front(block_nodes_, b, r.address - b->address, BlockState::free));
    if (b->size > r.size)
      index_free(block_list::split_back(block_nodes_, b, r.size, BlockState::free));
    restore_allocated(b, r.requested, allocated);
    b = b->next;
  }
}

void StreamPool::allocated_addresses(std::vector<std::uintptr_t>* out) {
  Guard guard(*this);
  allocated_.for_each([out](std::uintptr_t address, Block*) { out->push_back(address); });
}

}  // namespace reservoir::detail
