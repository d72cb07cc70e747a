// StreamPool giving memory back: a segment to the device (or its pool's source), the
// cached segments (empty_cache, the out-of-memory ladder's release of caches) and the
// oversize blocks (the ladder's rung before it).
#include <string>
#include <vector>

#include "engine/pool/stream_pool.hpp"
#include "reservoir/errors.hpp"
#include "util/checks.hpp"
#include "util/format.hpp"

namespace reservoir::detail {

// The device call (or the source's) that gives seg's memory back; why it failed, or
// "". A source may unmap at once: the pool's stream is waited for first (the device's
// free waits for all work on its own).
std::string StreamPool::give_back_segment(Segment* seg) {
  void* base = reinterpret_cast<void*>(seg->base);
  if (!source_)
    return services_.backend.deallocate(services_.device, base, seg->size) == DeviceStatus::ok
               ? std::string()
               : services_.backend.last_error();
  // (A released stream may be gone: the whole device is waited for then.)
  const DeviceStatus waited = stream_released_
                                  ? services_.backend.synchronize_device(services_.device)
                                  : services_.backend.synchronize_stream(services_.device, stream_);
  if (waited != DeviceStatus::ok)
    return "waiting for stream " + std::to_string(stream_) +
           " before giving the segment back: " + services_.backend.last_error();
  if (source_->deallocate(services_.device, base, seg->size, stream_) != DeviceStatus::ok)
    return "the segment source of private pool " + pool_name(pool_id_) + ": " +
           source_->last_error();
  return {};
}

void StreamPool::release_segment(Segment* seg) {
  Block* b = seg->head;
  RESERVOIR_ASSERT(b && !b->is_split() && b->state == BlockState::free && !seg->expandable);
  // Out of the map first: once the range is back, the device may hand it to another
  // thread's new segment, which must be the only one found there.
  services_.segments.unpublish(seg);
  if (std::string failure = give_back_segment(seg); !failure.empty()) {
    services_.segments.publish(seg);
    throw DeviceError("reservoir: freeing a segment of " + format_size(seg->size) + " on device " +
                      std::to_string(services_.device) + " failed: " + failure);
  }
  // Only memory that went back is reported gone (a tracker deregisters it).
  if (tracing()) trace(TraceAction::segment_free, seg->base, seg->size, seg->context);
  unindex_free(b);
  delete_block(b);
  unlink_segment(seg);
  stats().add<kSegment>(seg->pool, -1);
  stats().add<kReservedBytes>(seg->pool, -static_cast<std::int64_t>(seg->size));
  if (seg->oversize) stats().add<kOversizeSegments>(seg->pool, -1);
  services_.budget.unreserve(seg->size);
  DeviceCounters::bump(services_.counters.device_frees);
  services_.segments.recycle(seg);
}

std::size_t StreamPool::release_cached() {
  Guard guard(*this);
  const std::size_t released = release_cached_locked();
  finish_operation();
  return released;
}

std::size_t StreamPool::release_cached_locked() {
  if (asleep_) return 0;  // its pages are asleep, its free blocks kept for wake
  std::size_t released = 0;
  std::vector<Segment*> whole;
  std::vector<Block*> expandable;
  for (FreeIndex& set : free_)
    for (Block* b : set) {
      if (b->in_expandable)
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
  return released;
}

bool StreamPool::release_oversize(std::size_t requested) {
  const SizePolicy& p = policy();
  if (!p.has_max_split_size()) return false;
  Guard guard(*this);
  const std::size_t size = p.round(requested);
  FreeIndex& set = free_[SizePolicy::pool_for(size)];
  const std::size_t key = std::max(size, p.max_split_size());
  auto it = set.lower_bound(key);
  std::vector<Segment*> victims;
  bool enough;
  if (it != set.end() && !(*it)->in_expandable) {
    if ((*it)->is_split()) return false;
    victims.push_back((*it)->segment);
    enough = true;
  } else {
    // Else the largest ones, from the top, until enough is released.
    if (it == set.begin()) return false;
    std::size_t released = 0;
    --it;
    while (released < key && (*it)->size >= p.max_split_size()) {
      Block* b = *it;
      bool first = it == set.begin();
      if (!first) --it;
      if (!b->in_expandable && !b->is_split()) {
        victims.push_back(b->segment);
        released += b->size;
      }
      if (first) break;
    }
    enough = released >= key;
  }
  for (Segment* seg : victims) release_segment(seg);
  finish_operation();
  return enough;
}

}  // namespace reservoir::detail
