// CompactPool: policy:compact — the least reserved memory, online.
//
// One cache for the whole device, shared by every stream and by small and large
// requests, over growing virtual address ranges (arenas) whose pages (the device's
// mapping granularity, 2 MiB on CUDA) are backed by physical memory only where blocks
// live:
//   - best fit by (size, address) over every free block of the device, coalescing
//     neighbours; blocks of an arena tile it;
//   - a page is mapped while any block of it is allocated; a page whose blocks are all
//     free stays mapped (it serves the next request there at no cost) until a request
//     elsewhere needs physical memory: then it is unmapped and its memory mapped where
//     it is needed (stitching), before any new memory is taken from the device;
//   - memory freed on stream A serves stream B at once: B is made to wait on the
//     device for A's work (StreamEvents: markers recorded lazily, no host waits); a
//     page's memory moves to another address only once the host knows the work that
//     used it has completed (events queried, never waited for, short of the
//     out-of-memory ladder).
// Invariants (validate()):
//   blocks tile every arena; no two neighbouring blocks are both free;
//   free blocks == free_ (by size, address); allocated blocks == allocated_;
//   page.live == bytes of allocated blocks overlapping the page;
//   page.live > 0 => page.mapped;
//   reserved_bytes == (mapped pages + spare handles) * page size == physical bytes held;
//   page.listed <=> page.mapped && page.live == 0 <=> the page is on the reclaimable list
//   (oldest first).
// Locking: one Lock for the pool (the device); never held while taking another pool's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/block.hpp"
#include "engine/block_owner.hpp"
#include "engine/pool_services.hpp"
#include "engine/stat_ledger.hpp"
#include "engine/stream_events.hpp"
#include "engine/stream_pool.hpp"
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
  struct PageRef {
    Arena* arena = nullptr;
    std::size_t index = 0;
    explicit operator bool() const noexcept { return arena != nullptr; }
    bool operator==(const PageRef&) const = default;
  };
  struct Page {
    PhysicalHandle handle = 0;
    bool mapped = false;
    // accessible => mapped. A page a failed request could not unmap stays mapped
    // without access: the next request that covers it grants access first.
    bool accessible = false;
    bool listed = false;     // on the reclaimable list
    std::uint64_t live = 0;  // bytes of allocated blocks on this page
    Fence fence;             // marks of the frees and uses of memory on this page
    PageRef prev, next;      // the reclaimable list
  };
  // pages covers [base, base + pages.size() * page) — the part of the range that may
  // hold blocks in use, registered in the segment map; beyond it the arena is one free
  // block of address space.
  struct Arena {
    Segment* segment = nullptr;
    std::vector<Page> pages;
  };
  struct Span {  // pages [first, end) of arena
    const Arena* arena;
    std::size_t first, end;
  };

  Arena* arena_of(const Block* b) const;
  std::pair<std::size_t, std::size_t> page_span(const Arena& a, std::uintptr_t address,
                                                std::size_t size) const;
  Block* new_block(std::uintptr_t address, std::size_t size, Segment* segment, BlockState state);
  void delete_block(Block* b);
  void index_free(Block* b);
  void reposition_free(Block* b);
  Block* coalesce_free(Block* b);
  Arena* new_arena(std::size_t at_least);
  std::size_t unbacked_pages(const Block* b, std::size_t size) const;
  Block* choose(FreeSet::iterator best, std::size_t size) const;
  void grow_pages(Arena& a, std::size_t end);
  // Physical memory for the unmapped pages of [first, end) of a: all or nothing.
  bool back_pages(Arena& a, std::size_t first, std::size_t end);
  // A spare, a reclaimed or a new page (never one of keep).
  bool take_physical(PhysicalHandle* handle, const Span& keep);
  bool reclaim_one(PhysicalHandle* handle, const Span& keep);
  bool create_page(PhysicalHandle* handle);
  Page& page(const PageRef& r) { return r.arena->pages[r.index]; }
  void list_push(PageRef r);
  void list_remove(PageRef r);
  void unmap_page(Arena& a, std::size_t index);  // its fence has completed
  void release_handle(PhysicalHandle handle);
  std::size_t overlap(const Arena& a, std::size_t i, std::uintptr_t address,
                      std::size_t size) const;
  void add_live(Arena& a, std::uintptr_t address, std::size_t size);
  void remove_live(Arena& a, const Block& b);
  void finish_operation();
  void validate_locked(ValidationTotals* totals);

  PoolServices& services_;
  Lock lock_;
  ShardCounters counters_;
  NodePool set_nodes_;
  NodePool block_nodes_;
  FreeSet free_;
  AddressMap<Block> allocated_;
  StreamEvents fences_;
  std::vector<std::unique_ptr<Arena>> arenas_;
  PageRef reclaim_head_, reclaim_tail_;  // mapped pages that hold no block, oldest first
  // Scratch of back_pages (kept to spare an allocation per request).
  std::vector<std::size_t> missing_;
  std::vector<PhysicalHandle> got_;
  std::vector<std::size_t> unlisted_;
  std::vector<std::size_t> grant_;  // back_pages: the pages it grants access to
  std::vector<PhysicalHandle> spare_;
  std::size_t page_ = 0;  // mapping granularity
};

}  // namespace reservoir::detail
