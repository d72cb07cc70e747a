// Block and Segment: the books of one device's memory.
//
// A Segment is one device allocation (or, for expandable segments, one reserved
// address range). Its Blocks tile it exactly, in address order:
//   head->prev == nullptr, b->next->prev == b, b->next->address == b->address + b->size,
//   sum(b->size over the list) == segment->size.
// No two neighbouring blocks are both free, nor both unmapped: they are merged when
// the second one enters that state (block_list::coalesce, block_list.hpp), or, for a parked
// block, when it is settled.
// Every block is in exactly one of these places, by state:
//   free      -> its owner's FreeIndex for the segment's pool (free_leaf valid)
//   allocated -> its owner's AddressMap of allocated blocks
//   pending   -> freed by the program, waiting for events on other streams
//                (event_count > 0, stranded after a device error, or deferred until
//                no capture is under way)
//   unmapped  -> (expandable segments) its owner's unmapped AddressSet (unmapped_at valid)
//   parked    -> freed by the program, its merge postponed: its owner's parked_ (at
//                most one per owner; stream_pool.hpp)
// A block belongs to the owner of its segment (one StreamPool: one stream); blocks
// never move between owners.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <vector>

#include "engine/books/size_policy.hpp"
#include "reservoir/backend.hpp"
#include "reservoir/history.hpp"
#include "reservoir/types.hpp"
#include "util/insertion_set.hpp"
#include "util/node_pool.hpp"

namespace reservoir::detail {

struct Block;
struct Segment;
class BlockOwner;
class ExpandableSegment;

// A free block's key in its owner's FreeIndex (free_index.hpp): best fit takes the
// smallest size first, ties by lowest address.
struct FreeKey {
  std::size_t size;
  std::uintptr_t address;
};
struct FreeLeaf;  // a leaf of a FreeIndex
struct ByAddress {
  bool operator()(const Block* a, const Block* b) const noexcept;
};
using AddressSet = std::set<Block*, ByAddress, PoolAllocator<Block*>>;

enum class BlockState : std::uint8_t { free, allocated, pending, unmapped, parked };

// What only some blocks need: the other streams that used it (record_stream) and
// where it was allocated (history on). Kept out of Block so that Block stays
// trivially constructible and the hot path never builds or destroys a vector.
struct BlockExtras {
  // In the order first named; a use is a constant-time lookup however many there are.
  InsertionSet<StreamHandle> uses;
  // Of uses, those recorded while a capture was under way: their work is in the
  // graph, so once no capture is, a deferred free needs no event on them (spec's
  // block_to_cudagraph_stream_uses).
  InsertionSet<StreamHandle> capture_uses;
  // Freed during a capture with graph_capture_record_stream_reuse: where the capture
  // stood on the block's stream and on each stream that used it (all in the graph);
  // empty otherwise. The block is free again once its stream's work follows them all.
  std::vector<CapturePoint> capture_points;
  Context context;
};

// Hot fields first: a cache-hit allocation and its free touch only the first line.
struct Block {
  std::uintptr_t address;
  std::size_t size;
  Block* prev;  // neighbours in the segment, by address
  Block* next;
  Segment* segment;
  std::size_t requested;  // bytes the program asked for (allocated or pending)
  BlockState state;
  bool oversize;  // counted in oversize_allocations when handed out
  // Copies of segment->pool and segment->expandable (fixed for a segment's life), so
  // the hot path does not load the segment: pool_index == segment->pool,
  // in_expandable == segment->expandable.
  PoolIndex pool_index;
  bool in_expandable;
  std::uint32_t event_count;            // outstanding events while pending
  FreeLeaf* free_leaf;                  // its leaf in the FreeIndex, valid while state == free
  AddressSet::iterator unmapped_at;     // valid while state == unmapped
  std::uint64_t gc_stamp;               // garbage-collection clock when it became free
  StreamHandle stream;                  // allocated on (policy:compact; a StreamPool knows its own)
  std::unique_ptr<BlockExtras> extras;  // null unless used on other streams or history is on

  bool is_split() const noexcept { return prev != nullptr || next != nullptr; }
  bool mapped() const noexcept { return state != BlockState::unmapped; }
  inline PoolIndex pool() const noexcept;
  BlockExtras& extra() {
    if (!extras) extras = std::make_unique<BlockExtras>();
    return *extras;
  }
  Context context() const { return extras ? extras->context : Context{}; }
};

inline bool ByAddress::operator()(const Block* a, const Block* b) const noexcept {
  return a->address < b->address;
}

// Cache-line aligned: segments of different streams are written by different threads
// (head changes on every split and merge), so they must not share a line.
struct alignas(64) Segment {
  // base, size and owner are also read without a lock by SegmentMap::find and the
  // free path, possibly while the object is being reused for another segment:
  // written only through set_range() and set_owner().
  std::uintptr_t base = 0;
  std::size_t size = 0;  // bytes of address space the blocks tile
  BlockOwner* owner = nullptr;
  Block* head = nullptr;
  std::size_t mapped_bytes = 0;  // == size unless expandable
  PoolIndex pool = kLargePool;   // kSmallPool: blocks of requests <= 1 MiB
  bool expandable = false;
  bool oversize = false;            // counted in oversize_segments (max_split_size may change)
  ExpandableSegment* vm = nullptr;  // physical pages of an expandable segment
  Segment* prev_in_pool = nullptr;  // the owner's list of segments
  Segment* next_in_pool = nullptr;
  std::uint64_t serial = 0;  // creation order, for snapshots
  Context context;           // where the device allocation was made (history on)

  bool is_small() const noexcept { return pool == kSmallPool; }
  void set_owner(BlockOwner* o) noexcept {
    std::atomic_ref<BlockOwner*>(owner).store(o, std::memory_order_release);
  }
  BlockOwner* owner_now() const noexcept {
    return std::atomic_ref<BlockOwner*>(const_cast<BlockOwner*&>(owner))
        .load(std::memory_order_acquire);
  }
  // Release, paired with base_now() and size_now(): a reader that sees a recycled
  // object's new range also sees what preceded the recycling (the SegmentMap erase
  // that moved its generation; SegmentMap::remember relies on it).
  void set_range(std::uintptr_t new_base, std::size_t new_size) noexcept {
    std::atomic_ref<std::uintptr_t>(base).store(new_base, std::memory_order_release);
    std::atomic_ref<std::size_t>(size).store(new_size, std::memory_order_release);
  }
  // base and size as a reader without the owner's lock sees them (plain loads on x86).
  std::uintptr_t base_now() const noexcept {
    return std::atomic_ref<std::uintptr_t>(const_cast<std::uintptr_t&>(base))
        .load(std::memory_order_acquire);
  }
  std::size_t size_now() const noexcept {
    return std::atomic_ref<std::size_t>(const_cast<std::size_t&>(size))
        .load(std::memory_order_acquire);
  }
  // Whether address lies in [base, base + size), read as SegmentMap's readers do.
  bool holds(std::uintptr_t address) const noexcept {
    const std::uintptr_t b = base_now();
    return address >= b && address - b < size_now();
  }
};

inline PoolIndex Block::pool() const noexcept {
  return pool_index;
}

}  // namespace reservoir::detail
