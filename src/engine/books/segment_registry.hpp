// SegmentRegistry: the Segment objects of one device, and their entries in the
// process-wide SegmentMap (address -> segment, read without locks by the free path).
//
// Segment objects are recycled, never freed before the registry: a racing lock-free
// lookup of a stale address then reads a live object (whose range or owner no longer
// match) and reports a clean error instead of touching freed memory.
// Invariants: every segment handed out by make() and not yet retired is either
//   unregistered (being built) or registered with its final range;
//   spare_ holds exactly the retired objects.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/books/block.hpp"
#include "engine/books/segment_map.hpp"

namespace reservoir::detail {

class SegmentRegistry {
 public:
  explicit SegmentRegistry(SegmentMap& map) : map_(map) {}
  SegmentRegistry(const SegmentRegistry&) = delete;
  SegmentRegistry& operator=(const SegmentRegistry&) = delete;

  // A blank segment (serial set, everything else reset), not yet in the map.
  Segment* make() {
    std::lock_guard<std::mutex> guard(mutex_);
    Segment* seg;
    if (!spare_.empty()) {
      seg = spare_.back();
      spare_.pop_back();
      // Field by field: base, size and owner may be read concurrently.
      seg->set_range(0, 0);
      seg->set_owner(nullptr);
      seg->head = nullptr;
      seg->mapped_bytes = 0;
      seg->pool = kLargePool;
      seg->expandable = seg->oversize = false;
      seg->vm = nullptr;
      seg->prev_in_pool = seg->next_in_pool = nullptr;
      seg->context.reset();
    } else {
      objects_.push_back(std::make_unique<Segment>());
      seg = objects_.back().get();
    }
    seg->serial = ++next_serial_;
    return seg;
  }
  // pre: segment's range is final and overlaps no registered segment.
  void publish(Segment* segment) { map_.insert(segment); }
  // Registers only [address, address + bytes) of segment's range (grown later by
  // more calls over the following bytes); retire_part undoes it.
  void publish_part(Segment* segment, std::uintptr_t address, std::size_t bytes) {
    map_.insert(segment, address, bytes);
  }
  void retire_part(Segment* segment, std::size_t published_bytes) {
    unpublish_part(segment, published_bytes);
    recycle(segment);
  }
  // Removes segment from the map and keeps the object for reuse.
  void retire(Segment* segment) {
    map_.erase(segment);
    recycle(segment);
  }
  // The two halves of retire, for a segment whose range goes back to the device: out
  // of the map before the range is given back (else another thread may be handed the
  // same range and find this segment there), recycled after. A failed give-back
  // publishes it again.
  void unpublish(Segment* segment) { map_.erase(segment); }
  void unpublish_part(Segment* segment, std::size_t published_bytes) {
    map_.erase(segment, segment->base, published_bytes);
  }
  BlockOwner* sole_owner() const noexcept { return map_.sole_owner(); }
  // An owner's destructor: the free path must no longer go to it directly.
  void owner_gone(BlockOwner* owner) { map_.owner_gone(owner); }
  void recycle(Segment* segment) {
    std::lock_guard<std::mutex> guard(mutex_);
    spare_.push_back(segment);
  }
  // Whether the map resolves the segment's base to it (for the validator).
  bool published(const Segment* segment) const { return map_.find(segment->base) == segment; }

 private:
  SegmentMap& map_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<Segment>> objects_;
  std::vector<Segment*> spare_;
  std::uint64_t next_serial_ = 0;
};

}  // namespace reservoir::detail
