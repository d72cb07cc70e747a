// The validator: walks every segment and block of a stream pool and checks the
// books against each other (the invariants written on Block, Segment, StreamPool).
// Tests call it; the checks build (RESERVOIR_CHECKS) runs it after every operation.
#include <string>

#include "engine/device_engine.hpp"
#include "engine/expandable_segment.hpp"
#include "engine/segment_map.hpp"
#include "engine/stream_pool.hpp"
#include "util/checks.hpp"
#include "util/format.hpp"

namespace reservoir::detail {

namespace {
std::string at(std::uintptr_t a) {
  return format_pointer(reinterpret_cast<void*>(a));
}
}  // namespace

void StreamPool::validate(ValidationTotals* totals) {
  Guard guard(lock_);
  validate_locked(totals);
}

void StreamPool::validate_locked(ValidationTotals* totals) {
  std::int64_t allocation[2] = {}, allocated_bytes[2] = {}, active[2] = {}, active_bytes[2] = {},
               requested[2] = {}, reserved[2] = {}, segments[2] = {}, split_free[2] = {},
               split_free_bytes[2] = {};
  std::size_t free_blocks[2] = {}, unmapped_blocks[2] = {}, allocated_blocks = 0,
              pending_with_events = 0;
  for (Segment* seg = segments_; seg; seg = seg->next_in_pool) {
    const int pool = seg->small ? 0 : 1;
    RESERVOIR_CHECK(seg->owner == this, "segment " + at(seg->base) + " has another owner");
    RESERVOIR_CHECK(engine_.segments().find(seg->base) == seg,
                    "segment " + at(seg->base) + " missing from the segment map");
    RESERVOIR_CHECK(seg->head && seg->head->prev == nullptr,
                    "segment " + at(seg->base) + " has no head block");
    RESERVOIR_CHECK(seg->head->address == seg->base, "head block does not start the segment");
    std::size_t tiled = 0;
    for (Block* b = seg->head; b; b = b->next) {
      std::string where = "block " + at(b->address) + " of segment " + at(seg->base);
      RESERVOIR_CHECK(b->segment == seg, where + " points to another segment");
      RESERVOIR_CHECK(b->size > 0 && b->size % 512 == 0, where + " has a bad size");
      RESERVOIR_CHECK(b->address == seg->base + tiled, where + " leaves a gap or overlaps");
      if (b->next) {
        RESERVOIR_CHECK(b->next->prev == b, where + ": next->prev != block");
        RESERVOIR_CHECK(!(b->state == BlockState::free && b->next->state == BlockState::free),
                        where + " and its successor are both free but not merged");
      }
      tiled += b->size;
      switch (b->state) {
        case BlockState::free: {
          ++free_blocks[pool];
          RESERVOIR_CHECK(free_[pool].count(b) == 1 && *b->free_at == b,
                          where + " is free but not in its pool's free set");
          if (b->is_split() && !seg->expandable) {
            ++split_free[pool];
            split_free_bytes[pool] += static_cast<std::int64_t>(b->size);
          }
          break;
        }
        case BlockState::allocated:
          ++allocated_blocks;
          RESERVOIR_CHECK(allocated_.find(b->address) == b,
                          where + " is allocated but not in the allocated map");
          ++allocation[pool];
          allocated_bytes[pool] += static_cast<std::int64_t>(b->size);
          ++active[pool];
          active_bytes[pool] += static_cast<std::int64_t>(b->size);
          requested[pool] += static_cast<std::int64_t>(b->requested);
          break;
        case BlockState::pending:
          RESERVOIR_CHECK(allocated_.find(b->address) == nullptr,
                          where + " is pending but still in the allocated map");
          if (b->event_count > 0) ++pending_with_events;
          ++active[pool];
          active_bytes[pool] += static_cast<std::int64_t>(b->size);
          requested[pool] += static_cast<std::int64_t>(b->requested);
          break;
        case BlockState::unmapped:
          RESERVOIR_CHECK(seg->expandable, where + " is unmapped in a non-expandable segment");
          RESERVOIR_CHECK(unmapped_[pool].count(b) == 1 && *b->unmapped_at == b,
                          where + " is unmapped but not in its pool's unmapped set");
          RESERVOIR_CHECK(!(b->next && b->next->state == BlockState::unmapped),
                          where + " and its successor are both unmapped but not merged");
          ++unmapped_blocks[pool];
          break;
      }
    }
    if (seg->expandable) {
      std::size_t mapped = 0;
      for (Block* b = seg->head; b; b = b->next)
        if (b->mapped()) mapped += b->size;
      RESERVOIR_CHECK(mapped == seg->mapped_bytes && mapped == seg->vm->mapped_bytes(),
                      "mapped bytes of expandable segment " + at(seg->base) + " disagree");
    }
    RESERVOIR_CHECK(tiled == seg->size, "blocks of segment " + at(seg->base) + " cover " +
                                            std::to_string(tiled) + " of " +
                                            std::to_string(seg->size) + " bytes");
    // Memory an expandable segment failed to give back stays reserved.
    const std::size_t held = seg->expandable ? seg->vm->held_bytes() : 0;
    reserved[pool] += static_cast<std::int64_t>(seg->mapped_bytes + held);
    ++segments[pool];
    totals->reserved += seg->mapped_bytes + held;
    totals->segments += 1;
  }
  RESERVOIR_CHECK(allocated_blocks == allocated_.size(),
                  "allocated map holds " + std::to_string(allocated_.size()) + " blocks, " +
                      std::to_string(allocated_blocks) + " are allocated");
  RESERVOIR_CHECK(pending_with_events == pending_blocks_, "pending block count is off");
  for (int pool = 0; pool < 2; ++pool) {
    RESERVOIR_CHECK(unmapped_blocks[pool] == unmapped_[pool].size(),
                    "unmapped set holds blocks that are not unmapped");
    RESERVOIR_CHECK(free_blocks[pool] == free_[pool].size(),
                    "free set of pool " + std::to_string(pool) + " holds " +
                        std::to_string(free_[pool].size()) + " blocks, " +
                        std::to_string(free_blocks[pool]) + " are free");
    struct {
      int kind;
      std::int64_t expected;
      const char* name;
    } rows[] = {{kAllocation, allocation[pool], "allocation"},
                {kAllocatedBytes, allocated_bytes[pool], "allocated_bytes"},
                {kActive, active[pool], "active"},
                {kActiveBytes, active_bytes[pool], "active_bytes"},
                {kRequestedBytes, requested[pool], "requested_bytes"},
                {kReservedBytes, reserved[pool], "reserved_bytes"},
                {kSegment, segments[pool], "segment"},
                {kInactiveSplit, split_free[pool], "inactive_split"},
                {kInactiveSplitBytes, split_free_bytes[pool], "inactive_split_bytes"}};
    for (const auto& row : rows) {
      std::int64_t counted = counters_.get(row.kind, pool);
      RESERVOIR_CHECK(counted == row.expected, std::string("statistic ") + row.name +
                                                   (pool ? ".large_pool" : ".small_pool") + " is " +
                                                   std::to_string(counted) +
                                                   " but the blocks add up to " +
                                                   std::to_string(row.expected));
    }
  }
}

void DeviceEngine::validate(bool quiescent) {
  ValidationTotals totals;
  for (StreamPool* pool : pools_snapshot()) pool->validate(&totals);
  if (quiescent) {
    RESERVOIR_CHECK(totals.reserved == reserved(),
                    "pools reserve " + std::to_string(totals.reserved) +
                        " bytes but the device budget counts " + std::to_string(reserved()));
  }
}

}  // namespace reservoir::detail
