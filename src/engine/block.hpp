// Block and Segment: the books of one device's memory.
//
// A Segment is one device allocation (or, for expandable segments, one reserved
// address range). Its Blocks tile it exactly, in address order:
//   head->prev == nullptr, b->next->prev == b, b->next->address == b->address + b->size,
//   sum(b->size over the list) == segment->size.
// No two neighbouring blocks are both free (and both mapped, or both unmapped):
// they are merged when the second becomes free.
// Every block is in exactly one of these places, by state:
//   free      -> its stream pool's FreeSet for the segment's pool kind (free_at valid)
//   allocated -> its stream pool's AddressMap of allocated blocks
//   pending   -> freed by the program, waiting for events on other streams
//                (event_count > 0, or stranded after a device error)
//   unmapped  -> (expandable segments) its stream pool's unmapped AddressSet
// A block belongs to the stream of its segment, and all segments of a StreamPool
// share its stream: blocks never move between streams.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <set>
#include <vector>

#include "reservoir/backend.hpp"
#include "reservoir/history.hpp"
#include "util/node_pool.hpp"

namespace reservoir::detail {

struct Block;
struct Segment;
class StreamPool;
class ExpandableSegment;

// Best fit: smallest size first, ties by lowest address.
struct BySizeThenAddress {
  bool operator()(const Block* a, const Block* b) const noexcept;
};
struct ByAddress {
  bool operator()(const Block* a, const Block* b) const noexcept;
};
using FreeSet = std::set<Block*, BySizeThenAddress, PoolAllocator<Block*>>;
using AddressSet = std::set<Block*, ByAddress, PoolAllocator<Block*>>;

enum class BlockState : std::uint8_t { free, allocated, pending, unmapped };

struct Block {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  std::size_t requested = 0;  // bytes the program asked for (allocated or pending)
  Block* prev = nullptr;      // neighbours in the segment, by address
  Block* next = nullptr;
  Segment* segment = nullptr;
  FreeSet::iterator free_at{};         // valid while state == free
  AddressSet::iterator unmapped_at{};  // valid while state == unmapped
  BlockState state = BlockState::free;
  bool oversize = false;           // counted in oversize_allocations when handed out
  std::uint32_t event_count = 0;   // outstanding events while pending
  std::vector<StreamHandle> uses;  // other streams that used it (record_stream)
  std::uint64_t gc_stamp = 0;      // garbage-collection clock when it became free
  Context context;                 // where it was allocated (history on)

  bool is_split() const noexcept { return prev != nullptr || next != nullptr; }
  bool mapped() const noexcept { return state != BlockState::unmapped; }
};

inline bool BySizeThenAddress::operator()(const Block* a, const Block* b) const noexcept {
  if (a->size != b->size) return a->size < b->size;
  return a->address < b->address;
}
inline bool ByAddress::operator()(const Block* a, const Block* b) const noexcept {
  return a->address < b->address;
}

// Cache-line aligned: segments of different streams are written by different threads
// (head changes on every split and merge), so they must not share a line.
struct alignas(64) Segment {
  // base and size are also read without a lock by SegmentMap::find, possibly while the
  // object is being reused for another segment: written only through set_range().
  std::uintptr_t base = 0;
  std::size_t size = 0;          // bytes of address space the blocks tile
  std::size_t mapped_bytes = 0;  // == size unless expandable
  StreamPool* owner = nullptr;
  Block* head = nullptr;
  bool small = false;  // small pool (blocks of requests <= 1 MiB)
  bool expandable = false;
  bool oversize = false;            // counted in oversize_segments (max_split_size may change)
  ExpandableSegment* vm = nullptr;  // physical pages of an expandable segment
  Segment* prev_in_pool = nullptr;  // the owner's list of segments
  Segment* next_in_pool = nullptr;
  std::uint64_t serial = 0;  // creation order, for snapshots
  Context context;           // where the device allocation was made (history on)

  // owner, like base and size, is read by lock-free lookups (Allocator::deallocate).
  void set_owner(StreamPool* pool) noexcept {
    std::atomic_ref<StreamPool*>(owner).store(pool, std::memory_order_release);
  }
  StreamPool* owner_now() const noexcept {
    return std::atomic_ref<StreamPool*>(const_cast<StreamPool*&>(owner))
        .load(std::memory_order_acquire);
  }
  void set_range(std::uintptr_t new_base, std::size_t new_size) noexcept {
    std::atomic_ref<std::uintptr_t>(base).store(new_base, std::memory_order_relaxed);
    std::atomic_ref<std::size_t>(size).store(new_size, std::memory_order_relaxed);
  }
  // Whether address lies in [base, base + size), read as SegmentMap's readers do.
  bool holds(std::uintptr_t address) const noexcept {
    auto b = std::atomic_ref<std::uintptr_t>(const_cast<std::uintptr_t&>(base))
                 .load(std::memory_order_relaxed);
    auto n = std::atomic_ref<std::size_t>(const_cast<std::size_t&>(size))
                 .load(std::memory_order_relaxed);
    return address >= b && address - b < n;
  }
};

}  // namespace reservoir::detail
