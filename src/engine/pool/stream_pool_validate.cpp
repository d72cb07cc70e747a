// The validator: walks every segment and block of a stream pool and checks the
// books against each other (the invariants written on Block, Segment, StreamPool,
// ShardCounters). Tests call it; the checks build (RESERVOIR_CHECKS) runs it after
// every operation.
#include <string>

#include "engine/pool/expandable_segment.hpp"
#include "engine/pool/stream_pool.hpp"
#include "util/checks.hpp"
#include "util/format.hpp"

namespace reservoir::detail {

namespace {
std::string at(std::uintptr_t a) {
  return format_pointer(reinterpret_cast<void*>(a));
}
}  // namespace

void StreamPool::validate_locked(ValidationTotals* totals) {
  // What the blocks add up to, per pool, by stored statistic kind.
  std::int64_t expected[kStatKinds][kPoolCount] = {};
  std::size_t free_blocks[kPoolCount] = {}, unmapped_blocks[kPoolCount] = {}, allocated_blocks = 0,
              pending_with_events = 0, parked_blocks = 0;
  bool fit_block_seen = false;
  const Block* merged_into_parked = nullptr;  // the free next of the parked block
  for (Segment* seg = segments_; seg; seg = seg->next_in_pool) {
    const int pool = seg->pool;
    RESERVOIR_CHECK(seg->owner == this, "segment " + at(seg->base) + " has another owner");
    // An expandable segment is registered only as far as it ever mapped pages
    // (ExpandableSegment::reach): not at all before its first page.
    const std::size_t registered = seg->expandable ? seg->vm->reach() : seg->size;
    const BlockOwner* sole = services_.segments.sole_owner();
    RESERVOIR_CHECK(registered == 0 || sole == nullptr || sole == this,
                    "segment " + at(seg->base) + " is findable, but frees go to another owner");
    RESERVOIR_CHECK(services_.segments.published(seg) == (registered > 0),
                    "segment " + at(seg->base) +
                        (registered > 0 ? " missing from the segment map"
                                        : " in the segment map before its first page"));
    RESERVOIR_CHECK(seg->head && seg->head->prev == nullptr,
                    "segment " + at(seg->base) + " has no head block");
    RESERVOIR_CHECK(seg->head->address == seg->base, "head block does not start the segment");
    std::size_t tiled = 0;
    for (Block* b = seg->head; b; b = b->next) {
      // Built only when a check fails: the checks build validates after every operation.
      auto where = [&] { return "block " + at(b->address) + " of segment " + at(seg->base); };
      const auto size = static_cast<std::int64_t>(b->size);
      if (b == fit_block_) fit_block_seen = true;
      RESERVOIR_CHECK(b->segment == seg, where() + " points to another segment");
      RESERVOIR_CHECK(b->pool_index == seg->pool && b->in_expandable == seg->expandable,
                      where() + "'s copies of its segment's pool and kind are stale");
      RESERVOIR_CHECK(b->size > 0 && b->size % 512 == 0, where() + " has a bad size");
      RESERVOIR_CHECK(b->address == seg->base + tiled, where() + " leaves a gap or overlaps");
      if (b->next) {
        RESERVOIR_CHECK(b->next->prev == b, where() + ": next->prev != block");
        RESERVOIR_CHECK(!(b->state == BlockState::free && b->next->state == BlockState::free),
                        where() + " and its successor are both free but not merged");
        RESERVOIR_CHECK(
            !(b->state == BlockState::unmapped && b->next->state == BlockState::unmapped),
            where() + " and its successor are both unmapped but not merged");
      }
      tiled += b->size;
      RESERVOIR_CHECK(
          b->state == BlockState::unmapped || b->address + b->size <= seg->base + registered,
          where() + " lies beyond the part of its segment in the segment map");
      switch (b->state) {
        case BlockState::free:
          ++free_blocks[pool];
          RESERVOIR_CHECK(free_[pool].holds(b),
                          where() + " is free but not in its pool's free set");
          if (b->is_split() && !seg->expandable && b != merged_into_parked) {
            expected[kInactiveSplit][pool] += 1;
            expected[kInactiveSplitBytes][pool] += size;
          }
          break;
        case BlockState::allocated:
          ++allocated_blocks;
          RESERVOIR_CHECK(allocated_.find(b->address) == b,
                          where() + " is allocated but not in the allocated map");
          expected[kAllocation][pool] += 1;
          expected[kAllocatedBytes][pool] += size;
          expected[kRequestedBytes][pool] += static_cast<std::int64_t>(b->requested);
          if (b->oversize) expected[kOversizeAllocations][pool] += 1;
          break;
        case BlockState::pending:
          RESERVOIR_CHECK(allocated_.find(b->address) == nullptr,
                          where() + " is pending but still in the allocated map");
          if (b->event_count > 0) ++pending_with_events;
          expected[kPending][pool] += 1;
          expected[kPendingBytes][pool] += size;
          expected[kRequestedBytes][pool] += static_cast<std::int64_t>(b->requested);
          break;
        case BlockState::parked: {
          ++parked_blocks;
          RESERVOIR_CHECK(b == parked_, where() + " is parked but is not the pool's parked block");
          RESERVOIR_CHECK(!b->extras && b->requested == 0,
                          where() + " is parked but used elsewhere or still requested");
          RESERVOIR_CHECK(allocated_.find(b->address) == nullptr,
                          where() + " is parked but still in the allocated map");
          RESERVOIR_CHECK(!(b->prev && b->prev->state == BlockState::free),
                          where() + " is parked after a free block");
          RESERVOIR_CHECK(parked_split_current(),
                          where() + " is parked with a stale record of its merge");
          // Counted as the free block its merge makes: with its next when that is free.
          const bool merges = b->next && b->next->state == BlockState::free;
          if (merges) merged_into_parked = b->next;
          if (!seg->expandable && (b->prev || (merges ? b->next->next : b->next))) {
            expected[kInactiveSplit][pool] += 1;
            expected[kInactiveSplitBytes][pool] +=
                size + (merges ? static_cast<std::int64_t>(b->next->size) : 0);
          }
          break;
        }
        case BlockState::unmapped:
          RESERVOIR_CHECK(seg->expandable, where() + " is unmapped in a non-expandable segment");
          RESERVOIR_CHECK(unmapped_[pool].count(b) == 1 && *b->unmapped_at == b,
                          where() + " is unmapped but not in its pool's unmapped set");
          ++unmapped_blocks[pool];
          break;
      }
    }
    if (seg->expandable) {
      std::size_t mapped = 0;
      for (Block* b = seg->head; b; b = b->next)
        if (b->mapped()) mapped += b->size;
      // Pages put to sleep keep their blocks (free or allocated) for wake.
      RESERVOIR_CHECK(mapped == seg->mapped_bytes + seg->vm->asleep_bytes() &&
                          seg->mapped_bytes == seg->vm->mapped_bytes(),
                      "mapped bytes of expandable segment " + at(seg->base) + " disagree");
      RESERVOIR_CHECK(asleep_ || seg->vm->asleep_bytes() == 0,
                      "expandable segment " + at(seg->base) + " has pages asleep in a pool awake");
    } else {
      RESERVOIR_CHECK(seg->mapped_bytes == seg->size,
                      "segment " + at(seg->base) + " is not wholly mapped");
    }
    RESERVOIR_CHECK(tiled == seg->size, "blocks of segment " + at(seg->base) + " cover " +
                                            std::to_string(tiled) + " of " +
                                            std::to_string(seg->size) + " bytes");
    // Memory an expandable segment failed to give back stays reserved.
    const std::size_t held = seg->expandable ? seg->vm->held_bytes() : 0;
    expected[kReservedBytes][pool] += static_cast<std::int64_t>(seg->mapped_bytes + held);
    expected[kSegment][pool] += 1;
    if (seg->oversize) expected[kOversizeSegments][pool] += 1;
    totals->reserved += seg->mapped_bytes + held;
    totals->segments += 1;
  }
  RESERVOIR_CHECK(allocated_blocks == allocated_.size(),
                  "allocated map holds " + std::to_string(allocated_.size()) + " blocks, " +
                      std::to_string(allocated_blocks) + " are allocated");
  RESERVOIR_CHECK(pending_with_events == pending_blocks_, "pending block count is off");
  for (const UseQueue& q : pending_queues_)
    RESERVOIR_CHECK(services_.waiting.lists(q.stream, this),
                    "a pool waits on stream " + std::to_string(q.stream) +
                        " but is not among the device's pools waiting on it");
  totals->use_queues += pending_queues_.size();
  RESERVOIR_CHECK(parked_blocks == (parked_ ? 1u : 0u),
                  "the parked block is not one of the pool's blocks in state parked");
  if (fit_block_) {
    RESERVOIR_CHECK(fit_block_seen && !fit_block_->in_expandable,
                    "the fit memo names a block that is gone or expandable");
    RESERVOIR_CHECK(fit_memo_current(),
                    "the fit memo would hand out the parked block where best fit would not");
  }
  std::size_t marked = 0;
  for (const Block* b : capture_deferred_) {
    RESERVOIR_CHECK(b->state == BlockState::pending && b->event_count == 0 && b->extras,
                    "block " + at(b->address) + " deferred past a capture is not pending");
    if (b->extras->capture_points.empty()) continue;
    ++marked;
    for (StreamHandle s : b->extras->uses)
      RESERVOIR_CHECK(b->extras->capture_uses.contains(s),
                      "block " + at(b->address) +
                          " waits for its capture points but was used outside the capture");
  }
  RESERVOIR_CHECK(marked == capture_marked_, "the count of blocks with capture points is " +
                                                 std::to_string(capture_marked_) + ", not " +
                                                 std::to_string(marked));
  RESERVOIR_CHECK(pool_id_.is_default() || !no_split_ ||
                      expected[kInactiveSplit][0] + expected[kInactiveSplit][1] == 0,
                  "a no_split pool holds split blocks");
  for (int pool = 0; pool < kPoolCount; ++pool) {
    const std::string index_problem = free_[pool].problem();
    RESERVOIR_CHECK(index_problem.empty(), "pool " + std::to_string(pool) + ": " + index_problem);
    RESERVOIR_CHECK(unmapped_blocks[pool] == unmapped_[pool].size(),
                    "unmapped set holds blocks that are not unmapped");
    RESERVOIR_CHECK(free_blocks[pool] == free_[pool].size(),
                    "free set of pool " + std::to_string(pool) + " holds " +
                        std::to_string(free_[pool].size()) + " blocks, " +
                        std::to_string(free_blocks[pool]) + " are free");
    // The device compares the sums with its statistics (the shards are per thread).
    for (int kind = 0; kind < kStatKinds; ++kind)
      totals->counted[kind][pool] += expected[kind][pool];
  }
}

}  // namespace reservoir::detail
