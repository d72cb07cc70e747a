// CompactPool: policy:compact — the least reserved memory, online.
//
// One cache for the whole device, shared by every stream and by small and large
// requests, over growing virtual address ranges (arenas) whose pages (the device's
// mapping granularity, 2 MiB on CUDA) are backed by physical memory only where blocks
// live:
//   - best fit by (size, address) over every free block of the device, coalescing
//     neighbours; blocks of an arena tile it;
//   - a page is mapped while any block of it is allocated; physical memory comes in
//     extents (one device handle each, one or more pages, mapped whole); an extent whose
//     pages hold no block stays mapped (it serves the next request there at no cost)
//     until a request elsewhere needs physical memory: then it is unmapped and mapped
//     where it is needed (stitching), before any new memory is taken from the device;
//   - memory freed on stream A serves stream B at once: B is made to wait on the
//     device for A's work (StreamEvents: markers recorded lazily, no host waits); a
//     page's memory moves to another address only once the host knows the work that
//     used it has completed (events queried, never waited for, short of the
//     out-of-memory ladder).
// Invariants (validate()):
//   blocks tile every arena; no two neighbouring blocks are both free;
//   free blocks == free_ (by size, address); allocated blocks == allocated_;
//   page.live == bytes of allocated blocks overlapping the page;
//   arena.mapped_end == 1 + max{i : pages[i].extent} (0 when none);
//   page.extent == x <=> x mapped in the page's arena && x.first <= index < x.first + x.pages;
//   page.live > 0 => page.extent && page.extent->accessible;
//   page.ghost == y <=> y.ghost_arena == this arena && y.ghost_first <= index <
//   y.ghost_first + y.pages; page.ghost => !page.extent && page.live == 0;
//   x.live_pages == #{pages of x with live > 0};
//   x.listed <=> x mapped && x.live_pages == 0 <=> x is on the reclaimable list (oldest
//   first); spare extents are unmapped and on spare_;
//   reserved_bytes == sum of every extent's pages * page size == physical bytes held.
// Locking: one Lock for the pool (the device); never held while taking another pool's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/books/block.hpp"
#include "engine/books/block_list.hpp"
#include "engine/books/block_owner.hpp"
#include "engine/books/free_index.hpp"
#include "engine/books/validation_totals.hpp"
#include "engine/pool/pool_services.hpp"
#include "engine/stats/stat_ledger.hpp"
#include "engine/streams/stream_events.hpp"
#include "util/address_map.hpp"
#include "util/lock.hpp"
#include "util/node_pool.hpp"

namespace reservoir::detail {

class alignas(64) CompactPool final : public BlockOwner {
 public:
  explicit CompactPool(PoolServices& services);
  ~CompactPool();  // returns every page and arena to the device
  CompactPool(const CompactPool&) = delete;
  CompactPool& operator=(const CompactPool&) = delete;

  ShardCounters& counters() noexcept { return counters_; }

  // A block of at least requested bytes for stream, or 0 when the device or the memory
  // fraction has no physical memory left for it (the ladder then runs). Throws
  // DeviceError.
  std::uintptr_t allocate(std::size_t requested, StreamHandle stream, const Context& context);
  // The ladder's rung: waits for every fence, then gives every free page's memory back
  // to the device; returns the bytes released. With give_back false, the memory is
  // kept as spare pages for the retry (nothing is released).
  std::size_t release_free_pages(bool give_back);
  void host_waited(StreamHandle stream);
  // The program is about to destroy stream (StreamEvents::release).
  void release_stream(StreamHandle stream);

  // ---- BlockOwner ----
  bool free(std::uintptr_t address) override;
  bool record_use(std::uintptr_t address, StreamHandle other) override;
  bool block_sizes(std::uintptr_t address, std::size_t* size, std::size_t* requested) override;
  bool segment_of(std::uintptr_t address, BaseAllocation* out) override;
  std::string explain_not_allocated(std::uintptr_t address) override;

  // ---- Queries ----
  std::size_t largest_free_block();
  std::size_t cached_bytes();  // physical bytes held but not under an allocated block
  std::size_t snapshot(std::vector<SegmentInfo>* out);
  void validate(ValidationTotals* totals);
  void reset_accumulated();

 private:
  using Guard = std::unique_lock<Lock>;
  struct Arena;
  // Physical memory: one device handle of `pages` pages, mapped whole (the driver maps
  // a handle whole, never a part) at pages [first, first + pages) of arena, or spare
  // (arena == nullptr). Extents are made as large as the run of pages a request
  // lacks (up to kMaxExtentPages; one page under a memory fraction), so a move costs
  // one unmap, one map and one access grant per extent, not per page.
  struct Extent {
    PhysicalHandle handle = 0;
    std::size_t pages = 0;
    Arena* arena = nullptr;  // where it is mapped; nullptr: spare
    std::size_t first = 0;   // its first page there
    // accessible => mapped. An extent a failed request could not unmap stays mapped
    // without access: the next request that covers it grants access first.
    bool accessible = false;
    bool listed = false;                      // on the reclaimable list
    std::size_t live_pages = 0;               // its pages with live > 0
    Extent *prev = nullptr, *next = nullptr;  // the reclaimable list
    // Where it was mapped before it moved, still mapped there (and accessible): memory
    // that moves back costs no device call (a program's layout often alternates).
    Arena* ghost_arena = nullptr;
    std::size_t ghost_first = 0;
  };
  struct Page {
    Extent* extent = nullptr;  // the memory under the page; nullptr: none of its own
    Extent* ghost = nullptr;   // an extent mapped here too, whose memory serves elsewhere
    std::uint64_t live = 0;    // bytes of allocated blocks on this page
    Fence fence;               // marks of the frees and uses of memory on this page
  };
  // pages covers [base, base + pages.size() * page) — the part of the range that may
  // hold blocks in use, registered in the segment map; beyond it the arena is one free
  // block of address space.
  struct Arena {
    Segment* segment = nullptr;
    std::vector<Page> pages;
    std::size_t mapped_end = 0;  // 1 + the last page with memory (0: none)
  };

  Arena* arena_of(const Block* b) const;
  // The arena's whole range in pages (pages.size() grows up to it).
  std::size_t pages_total(const Arena& a) const { return a.segment->size / page_; }
  std::pair<std::size_t, std::size_t> page_span(const Arena& a, std::uintptr_t address,
                                                std::size_t size) const;
  void index_free(Block* b);
  void reposition_free(Block* b);
  Block* coalesce_free(Block* b);
  Arena* new_arena(std::size_t at_least);
  std::size_t unbacked_pages(const Block* b, std::size_t size) const;
  Block* choose(FreeIndex::iterator best, std::size_t size) const;
  void grow_pages(Arena& a, std::size_t end);
  // Physical memory for the unmapped pages under [address, address + size) of a, and
  // access to all of them: all or nothing.
  bool back_pages(Arena& a, std::uintptr_t address, std::size_t size);
  // Memory for the unmapped pages from s on (need of them): a spare or reclaimed extent
  // (already unmapped from where it was), else a new one; nullptr when none can be had.
  Extent* take_extent(Arena& a, std::size_t s, std::size_t need);
  Extent* create_extent(std::size_t pages);
  void map_extent(Arena& a, std::size_t at, Extent* x);  // throws with nothing changed
  void unmap_range(std::uintptr_t address, std::size_t bytes);
  void take_place(Arena& a, std::size_t at, Extent* x, bool accessible);
  void leave_place(Extent* x, Extent* ghost);
  void unmap_extent(Extent* x);  // its fences have completed; throws with nothing changed
  // x (mapped, free, its fences complete) leaves its place without a device call: it
  // stays mapped there as x's ghost (an older ghost of x is unmapped first).
  void retire(Extent* x);
  void unmap_ghost(Extent* x);  // throws with nothing changed
  // x's ghost becomes its place again, no device call (x is spare, or mapped and free
  // with its fences complete; that place becomes the ghost).
  void return_to_ghost(Extent* x);
  bool movable(Extent& x);  // free, and its users done: it may move
  void release_extent(Extent* x);
  bool fences_complete(const Extent& x);
  void list_push(Extent* x);
  void list_remove(Extent* x);
  std::size_t overlap(const Arena& a, std::size_t i, std::uintptr_t address,
                      std::size_t size) const;
  void add_live(Arena& a, std::uintptr_t address, std::size_t size);
  void remove_live(Arena& a, const Block& b);
  void finish_operation();
  void validate_locked(ValidationTotals* totals);

  PoolServices& services_;
  Lock lock_;
  ShardCounters counters_;
  NodePool block_nodes_;
  FreeIndex free_;
  AddressMap<Block> allocated_;
  StreamEvents fences_;
  std::vector<std::unique_ptr<Arena>> arenas_;
  Extent *reclaim_head_ = nullptr, *reclaim_tail_ = nullptr;  // mapped, no live page; oldest first
  std::vector<Extent*> spare_;  // unmapped extents, kept for the next request
  // Scratch of back_pages (kept to spare an allocation per request).
  std::vector<Extent*> unlisted_, placed_;
  std::size_t page_ = 0;  // mapping granularity
};

}  // namespace reservoir::detail
