// ExtentMap: the compact pool's physical memory — extents of device memory mapped
// under the pages of its arenas where blocks live, moved (stitched) to where a request
// needs them, kept mapped as ghosts where they were, and kept spare between uses.
// CompactPool (compact_pool.hpp) owns the arenas and their blocks; it tells this map
// which bytes are live (add_live, remove_live) and asks for memory under a block
// (back_pages); the map never looks at blocks.
//
// Invariants (validate_arena(), validate_end()), for every arena a and page index i:
//   a.mapped_end == 1 + max{i : pages[i].extent} (0 when none);
//   page.extent == x <=> x mapped in a && x.first <= i < x.first + x.pages;
//   page.live > 0 => page.extent && page.extent->accessible;
//   page.ghost == y <=> y.ghost_arena == a && y.ghost_first <= i < y.ghost_first + y.pages;
//   page.ghost => !page.extent && page.live == 0;
//   x.live_pages == #{pages of x with live > 0};
//   x.listed <=> x mapped && x.live_pages == 0 <=> x is on the reclaimable list (oldest
//   first); spare extents are unmapped and on spare_;
//   a.segment->mapped_bytes == #{i : pages[i].extent} * page;
//   reserved bytes counted == sum of every extent's pages * page == physical bytes held
//   == held_pages_ * page.
// Locking: none of its own; every member runs under the compact pool's lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "engine/books/block.hpp"
#include "engine/pool/pool_services.hpp"
#include "engine/stats/stat_ledger.hpp"
#include "engine/streams/stream_events.hpp"
#include "util/compiler.hpp"

namespace reservoir::detail {

class ExtentMap {
 public:
  struct Arena;
  // Physical memory: one device handle of `pages` pages, mapped whole (the driver maps
  // a handle whole, never a part) at pages [first, first + pages) of arena, or spare
  // (arena == nullptr). Extents are made as large as the run of pages a request
  // lacks, up to extent_limit(), so a move costs one unmap, one map and one access
  // grant per extent, not per page.
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
  // Invariants (validate_arena): mapped_pages == |{i : pages[i].extent}|,
  //   unready_pages == |{i : pages[i].extent && !pages[i].extent->accessible}|; so
  //   mapped_pages == mapped_end && unready_pages == 0 => every page below mapped_end
  //   has memory it may use (ready(): a request's pages checked in O(1)).
  struct Arena {
    Segment* segment = nullptr;
    std::vector<Page> pages;
    std::size_t mapped_end = 0;     // 1 + the last page with memory (0: none)
    std::size_t mapped_pages = 0;   // pages naming an extent
    std::size_t unready_pages = 0;  // of those, pages whose extent has no access yet
    // No page below mapped_end lacks memory or access.
    bool ready() const noexcept { return mapped_pages == mapped_end && unready_pages == 0; }
  };
  // What validate_arena() counts across arenas, for validate_end().
  struct Audit {
    std::size_t held_pages = 0;    // pages of the mapped extents
    std::size_t mapped_pages = 0;  // pages naming an extent
    std::size_t listed = 0;        // mapped extents holding no block
    // Pages of ghosts counted at their first page, less the pages naming them: 0 when
    // every ghost's pages name it.
    std::ptrdiff_t ghost_pages = 0;
  };

  // page: the device's mapping granularity. counters: the pool's (reserved bytes);
  // fences: the pool's stream markers.
  ExtentMap(PoolServices& services, StreamEvents& fences, std::size_t page)
      : services_(services),
        fences_(fences),
        page_(page),
        page_shift_((page & (page - 1)) == 0 ? __builtin_ctzll(page) : -1) {}
  ~ExtentMap();  // every spare extent's memory goes back to the device
  ExtentMap(const ExtentMap&) = delete;
  ExtentMap& operator=(const ExtentMap&) = delete;

  std::size_t page() const noexcept { return page_; }
  // The arena's whole range in pages (pages.size() grows up to it).
  std::size_t pages_total(const Arena& a) const { return a.segment->size / page_; }
  // Pages [first, end) of a under [address, address + size).
  std::pair<std::size_t, std::size_t> page_span(const Arena& a, std::uintptr_t address,
                                                std::size_t size) const {
    const std::size_t from = address - a.segment->base;
    return {page_of(from), page_of(from + size + page_ - 1)};
  }
  // Pages [first, end) of a wholly inside [address, address + size) (first >= end:
  // none).
  std::pair<std::size_t, std::size_t> inner_span(const Arena& a, std::uintptr_t address,
                                                 std::size_t size) const {
    const std::size_t from = address - a.segment->base;
    return {page_of(from + page_ - 1), page_of(from + size)};
  }
  // Books for pages [0, end) of a (and their entries in the segment map).
  RESERVOIR_INLINE void grow_pages(Arena& a, std::size_t end) {
    if (RESERVOIR_UNLIKELY(end > a.pages.size())) grow_pages_to(a, end);
  }
  // Pages of [address, address + size) of a that have no memory.
  std::size_t unbacked_pages(const Arena& a, std::uintptr_t address, std::size_t size) const;
  // Physical memory for the unmapped pages under [address, address + size) of a, and
  // access to all of them: all or nothing. false: no memory to be had.
  bool back_pages(Arena& a, std::uintptr_t address, std::size_t size);
  // A block of [address, address + size) was handed out / b was freed (its users'
  // marks go on its pages).
  void add_live(Arena& a, std::uintptr_t address, std::size_t size);
  void remove_live(Arena& a, const Block& b);
  std::size_t spare_bytes() const;
  // The most pages a new extent has, for a request lacking need pages: one under a
  // memory fraction (memory moves page by page, so the fraction's every byte can be
  // used); else a 128th of the pages held with the request's, from 1 to 16 (large
  // extents make moves cheap per byte; the bound keeps the free pages of partly used
  // extents a small share of the pool, at every scale).
  std::size_t extent_limit(std::size_t need) const;

  // ---- the out-of-memory ladder's release (all under synchronized fences) ----
  void unmap_ghosts(Arena& a);      // every ghost in a; throws with the rest kept
  void unmap_unused(Arena& a);      // every extent of a without live pages, to spare
  std::size_t release_spares();     // every spare's memory to the device; bytes
  void abandon(Arena& a) noexcept;  // the pool is going: a's memory unmapped, to spare

  // ---- the validator ----
  // live[i]: the bytes of allocated blocks on page i of a, as the pool's blocks say.
  void validate_arena(const Arena& a, const std::vector<std::uint64_t>& live, Audit* audit) const;
  // The lists, once every arena is validated; returns the physical bytes held.
  std::size_t validate_end(const Audit& audit) const;

 private:
  // Memory for the unmapped pages from s on (need of them): a spare or reclaimed extent
  // (already unmapped from where it was), else a new one; nullptr when none can be had.
  void grow_pages_to(Arena& a, std::size_t end);  // grow_pages past the books' end
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
  template <typename F>
  void for_pages(const Arena& a, std::uintptr_t address, std::size_t size, F&& f) const;

  // The page holding byte offset of an arena. Every CUDA granularity is a power of
  // two: a shift, not a division per block end.
  std::size_t page_of(std::size_t offset) const noexcept {
    return RESERVOIR_LIKELY(page_shift_ >= 0) ? offset >> page_shift_ : offset / page_;
  }

  PoolServices& services_;
  StreamEvents& fences_;
  Extent *reclaim_head_ = nullptr, *reclaim_tail_ = nullptr;  // mapped, no live page; oldest first
  std::vector<Extent*> spare_;  // unmapped extents, kept for the next request
  // Scratch of back_pages (kept to spare an allocation per request).
  std::vector<Extent*> unlisted_, placed_;
  const std::size_t page_;      // mapping granularity
  const int page_shift_;        // log2(page_), or -1 when page_ is no power of two
  std::size_t held_pages_ = 0;  // pages of every extent, mapped or spare
};

}  // namespace reservoir::detail
