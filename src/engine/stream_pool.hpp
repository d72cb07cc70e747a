// StreamPool: the cache of one stream on one device — the shard that lets threads
// on different streams allocate without contending.
//
// It owns, under one Lock:
//   - the segments allocated for its stream, and their blocks (block.hpp);
//   - free blocks by pool kind in best-fit order (FreeSet) and, for expandable
//     segments, unmapped blocks by address (AddressSet);
//   - the allocated blocks by address (AddressMap);
//   - pending frees: blocks freed by the program but used on other streams, in one
//     FIFO queue per using stream, so a slow stream never delays frees on another;
//   - its statistics counters (ShardCounters, summed by the engine's StatLedger).
// Invariants (checked by validate()):
//   counters.allocated_bytes[pool] == sum of sizes of allocated blocks in pool
//   counters.active_bytes[pool] == allocated_bytes + sum of sizes of pending blocks
//   counters.reserved_bytes[pool] == sum of mapped bytes of its segments in pool
//     + held bytes of its expandable segments (memory a failed give-back kept)
//   |free_[pool]| == number of free blocks in pool segments; |allocated_| == allocated blocks
//   pending_blocks_ == number of pending blocks with event_count > 0
// Locking: public members take the lock; a member never takes another pool's lock
// while holding its own (cross-pool work goes through DeviceEngine after unlocking).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine/block.hpp"
#include "engine/stat_ledger.hpp"
#include "reservoir/allocator.hpp"
#include "reservoir/history.hpp"
#include "util/address_map.hpp"
#include "util/lock.hpp"
#include "util/node_pool.hpp"

namespace reservoir::detail {

class DeviceEngine;
class SizePolicy;

// Totals a validation pass accumulates across pools.
struct ValidationTotals {
  std::size_t reserved = 0;
  std::size_t segments = 0;
};

// Per-pool inputs and outputs of one garbage-collection round.
struct GcTally {
  std::uint64_t total_age = 0;
  std::int64_t count = 0;
  std::size_t reclaimed = 0;
  bool freed_any = false;
};

// Cache-line aligned so that pools of different streams never share a line.
class alignas(64) StreamPool {
 public:
  StreamPool(DeviceEngine& engine, StreamHandle stream);
  ~StreamPool();  // returns every segment to the device
  StreamPool(const StreamPool&) = delete;
  StreamPool& operator=(const StreamPool&) = delete;

  StreamHandle stream() const noexcept { return stream_; }
  ShardCounters& counters() noexcept { return counters_; }
  Lock& lock() noexcept { return lock_; }

  // ---- Program requests ----
  // Returns the address of a block of at least requested bytes (requested > 0).
  // Throws OutOfMemoryError or DeviceError.
  std::uintptr_t allocate(std::size_t requested);
  // false: address is not an allocated block of this pool (nothing changed).
  bool free(std::uintptr_t address);
  // false: address is not an allocated block of this pool.
  bool record_use(std::uintptr_t address, StreamHandle other);
  // Size and requested size of the allocated block at address; false if none.
  bool block_sizes(std::uintptr_t address, std::size_t* size, std::size_t* requested);
  // Why address is not an allocated block here, for error messages.
  std::string explain_not_allocated(std::uintptr_t address);
  // The segment holding address (any block state); false if none.
  // The segment holding address (any block state); false if none. Throws
  // InvalidArgumentError for expandable segments (they have no single base).
  bool segment_of(std::uintptr_t address, BaseAllocation* out);
  // Grants device access to the mapped pages of every expandable segment.
  void add_peer(int device);
  // Appends this pool's segments and blocks; returns the active bytes.
  std::size_t snapshot(std::vector<SegmentInfo>* out);

  // ---- Cache control (called by DeviceEngine; each takes the lock) ----
  // Completes pending frees whose events have completed.
  void process_events_now();
  // Waits for every pending free's events and completes it.
  void synchronize_pending();
  // Returns every free, unsplit segment to the device; bytes released.
  std::size_t release_cached();
  std::size_t largest_free_block(bool small);
  std::size_t cached_bytes();
  void gc_scan(std::uint64_t now, GcTally* tally);
  void gc_release(std::uint64_t now, double age_threshold, GcTally* tally);
  void validate(ValidationTotals* totals);
  void reset_accumulated();

 private:
  using Guard = std::unique_lock<Lock>;
  struct Pending {
    EventHandle event;
    Block* block;
  };
  struct UseQueue {
    StreamHandle stream;
    std::deque<Pending> entries;
  };

  Block* find_free(bool small, std::size_t size);
  Block* allocate_slow(Guard& guard, std::size_t requested, std::size_t size, bool small,
                       const Context& context);
  Block* allocate_segment(Guard& guard, std::size_t size, bool small, bool retry,
                          const Context& context);
  // ---- expandable segments (expandable_pool.cpp) ----
  Block* allocate_expandable(std::size_t size, bool small, const Context& context);
  Block* find_expandable(std::size_t size, bool small);
  Segment* new_expandable_segment(bool small, std::size_t at_least);
  Block* map_block(Block* block, std::size_t bytes, const Context& context);
  bool unmap_block(Block* block);
  bool release_expandable_segment(Segment* segment, std::string* error);
  std::size_t release_idle_expandable();
  void count_held(Segment* segment, std::size_t held_before, std::size_t unused);
  AddressSet& unmapped_set(const Block* b) { return unmapped_[b->segment->small ? 0 : 1]; }
  bool release_oversize(std::size_t size, bool small);
  Block* take(Block* block, std::size_t size, std::size_t requested, bool small,
              const Context& context);
  void free_block(Block* block);
  void defer_free(Block* block);
  void process_events(bool wait);
  void release_segment(Segment* segment);
  Block* merge_into(Block* keep, Block* gone);

  void index_insert(Block* b);
  void index_erase(Block* b);
  void index_reposition(Block* b);
  FreeSet& free_set(const Block* b) { return free_[b->segment->small ? 0 : 1]; }
  Block* new_block();
  void delete_block(Block* b);
  void finish_operation();
  void validate_locked(ValidationTotals* totals);
  bool mutated_stats_over() const { return counters_.over; }

  DeviceEngine& engine_;
  const StreamHandle stream_;
  Lock lock_;
  ShardCounters counters_;
  NodePool set_nodes_;
  NodePool block_nodes_;
  FreeSet free_[2];         // [0] small pool, [1] large pool
  AddressSet unmapped_[2];  // unmapped blocks of expandable segments, by address
  AddressMap<Block> allocated_;
  Segment* segments_ = nullptr;  // list through prev_in_pool/next_in_pool
  std::vector<UseQueue> pending_queues_;
  std::size_t pending_blocks_ = 0;
  std::vector<Block*> stranded_;  // pending forever after a device error
};

}  // namespace reservoir::detail
