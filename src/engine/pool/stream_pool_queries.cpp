// StreamPool: reading the books (sizes, segments, snapshots, error explanations) and
// the age-based garbage collection of cached blocks; recycling an empty pool.
#include <algorithm>

#include "engine/pool/expandable_segment.hpp"
#include "engine/pool/stream_pool.hpp"
#include "reservoir/errors.hpp"
#include "util/checks.hpp"
#include "util/format.hpp"

namespace reservoir::detail {

std::size_t StreamPool::largest_free_block(PoolIndex pool) {
  Guard guard(*this);
  if (asleep_) return 0;  // its free blocks have no memory under them until wake
  const FreeIndex& set = free_[pool];
  return set.empty() ? 0 : set.largest()->size;
}

std::size_t StreamPool::cached_bytes() {
  Guard guard(*this);
  if (asleep_) return 0;  // as largest_free_block
  std::size_t total = 0;
  for (const FreeIndex& set : free_)
    for (const Block* b : set) total += b->size;
  return total;
}

std::size_t StreamPool::reserved_bytes() {
  std::lock_guard<Lock> guard(lock_);
  std::size_t total = 0;
  for (const Segment* seg = segments_; seg; seg = seg->next_in_pool)
    total += seg->mapped_bytes + (seg->expandable ? seg->vm->held_bytes() : 0);
  return total;
}

bool StreamPool::block_sizes(std::uintptr_t address, std::size_t* size, std::size_t* requested) {
  Guard guard(*this);
  Block* b = allocated_.find(address);
  if (!b) return false;
  if (size) *size = b->size;
  if (requested) *requested = b->requested;
  return true;
}

bool StreamPool::segment_of(std::uintptr_t address, BaseAllocation* out) {
  Guard guard(*this);
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
  Guard guard(*this);
  std::size_t active_total = 0;
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
        info->device = services_.device;
        info->address = b->address;
        info->stream = stream();
        info->is_large = !seg->is_small();
        info->is_expandable = seg->expandable;
        info->pool = pool_id_;
        info->context = seg->context;
      }
      BlockInfo block;
      block.address = b->address;
      block.size = b->size;
      block.context = b->context();
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
  Guard guard(*this);
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
  Guard guard(*this);
  for (const Block* b : free_[kLargePool]) {
    if (b->is_split() || b->in_expandable) continue;
    tally->total_age += now - b->gc_stamp;
    tally->count += 1;
  }
}

void StreamPool::gc_release(std::uint64_t now, double age_threshold, GcTally* tally) {
  Guard guard(*this);
  std::vector<Segment*> victims;
  for (const Block* b : free_[kLargePool]) {
    if (b->is_split() || b->in_expandable) continue;
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

void StreamPool::add_peer(int device) {
  Guard guard(*this);
  for (Segment* seg = segments_; seg; seg = seg->next_in_pool)
    if (seg->expandable) seg->vm->add_peer(device);
}

// ---------------------------------------------------------------- recycling

bool StreamPool::recycle(StreamHandle next, bool give_back) {
  Guard guard(*this);
  // No memory may go back during a capture, nor may events be queried.
  if (services_.capture.underway()) return false;
  if (pending_blocks_ != 0) process_events(false);
  if (pins_.load(std::memory_order_relaxed) != 0 || owes_blocks()) {
    finish_operation();
    return false;
  }
  bool keep = false;  // the cache serves the next stream
  if (fenced_) {
    // Used after its release (last_size_, release_stream): the fence is stale.
    const DeviceStatus done = !segments_ || last_size_ != 0
                                  ? DeviceStatus::error
                                  : services_.backend.query_event(services_.device, release_fence_);
    if (done == DeviceStatus::not_ready && !give_back) {
      finish_operation();
      return false;
    }
    keep = done == DeviceStatus::ok;  // a failed query: the device takes it back
    services_.events.release(release_fence_);
    fenced_ = false;
  }
  if (!keep) release_cached_locked();
  finish_operation();
  if (!keep && segments_) return false;  // memory the device refused to take back
  serve(next);
  return true;
}

bool StreamPool::holds_blocks() {
  Guard guard(*this);
  return owes_blocks() || fenced_;
}

void StreamPool::assign(StreamHandle stream) {
  Guard guard(*this);
  serve(stream);
}

// What the pool knew of its stream goes: a new stream starts afresh.
void StreamPool::serve(StreamHandle stream) {
  RESERVOIR_CHECK(allocated_.size() == 0 && pending_blocks_ == 0 && !fenced_,
                  "a stream pool changes stream while in use");
  drop_empty_queues();  // every queue is empty (no pending block)
  stream_released_ = false;
  last_size_ = 0;
  fit_block_ = nullptr;
  stream_.store(stream, std::memory_order_relaxed);
}

}  // namespace reservoir::detail
