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
//     out-of-memory ladder);
//   - a stream's frees wait, a few, in its own cache (stream_caches.hpp) for its next
//     request of the same size, served without this pool's lock; every cache drains
//     back here before physical memory is taken.
// Physical memory (extents, pages, ghosts, stitching) is ExtentMap's (extent_map.hpp);
// this class keeps the arenas' blocks and serves requests.
// Invariants (validate()):
//   blocks tile every arena (block_list.hpp); no two neighbouring blocks are both free;
//   free blocks == free_ (by size, address); allocated blocks == allocated_ (stripes)
//   + the blocks of the stream caches, each in one of the two;
//   page.live == bytes of allocated blocks, cached ones included, overlapping the page (the live
//   bytes ExtentMap books, through add_live and remove_live); the pages and extents keep
//   ExtentMap's invariants (ExtentMap::validate_arena, validate_end);
//   reserved_bytes == the physical bytes ExtentMap holds.
// Locking: lock_ (the device) -> the caches' writers -> a cache -> an allocated stripe;
// the cached requests take a cache and a stripe, never lock_; never held while taking
// another pool's.
#pragma once

#include <atomic>
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
#include "engine/compact/allocated_stripes.hpp"
#include "engine/compact/extent_map.hpp"
#include "engine/compact/stream_caches.hpp"
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

  Lock& lock() noexcept { return lock_; }

  // A block of at least requested bytes for stream, or 0 when the device or the memory
  // fraction has no physical memory left for it (the ladder then runs), or
  // kClosedForCapture: a capture is under way and no stream cache serves it (the
  // caller serves it elsewhere). Throws DeviceError.
  std::uintptr_t allocate(std::size_t requested, StreamHandle stream, const Context& context);
  // Never a block's address.
  static constexpr std::uintptr_t kClosedForCapture = 1;
  // Returns once no operation under the pool's lock is under way: a capture counted
  // before this call is seen by every later one (which then records no event, queries
  // none and moves no page: the shared path is closed, host waits are not checked,
  // nothing goes back to the device). The stream caches' paths make no device call.
  void wait_for_operations() { std::lock_guard<Lock> guard(lock_); }
  // The ladder's rung: waits for every fence, then gives every free page's memory back
  // to the device; returns the bytes released. With give_back false, the memory is
  // kept as spare pages for the retry (nothing is released).
  std::size_t release_free_pages(bool give_back);
  void host_waited(StreamHandle stream);
  // The program is about to destroy stream: its cache drains, its markers are recorded
  // (StreamEvents::release).
  void release_stream(StreamHandle stream);
  // Streams whose markers are still tracked (tests: released ones are forgotten).
  std::size_t streams() {
    std::lock_guard<Lock> guard(lock_);
    return fences_.streams();
  }

  // Blocks waiting in the stream caches (tests, reports).
  std::size_t stream_cached_blocks() {
    std::lock_guard<Lock> guard(lock_);
    StreamCaches::AllLocked caches(caches_);
    return caches.blocks().size();
  }

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
  // Every stream cache and allocated stripe locked: with lock(), no request of this
  // pool is under way (the cached ones take these, not lock()). Taken after lock().
  class RequestsHeld {
   public:
    explicit RequestsHeld(CompactPool& p) : caches(p.caches_), stripes(p.allocated_) {}
    StreamCaches::AllLocked caches;
    AllocatedStripes::AllLocked stripes;
  };
  // The validator's walk (the caller holds lock() and a RequestsHeld). Throws
  // InvariantError.
  void validate_locked(ValidationTotals* totals, const RequestsHeld& requests);

 private:
  // An operation's hold on the pool: the lock, and the statistics scope (declared
  // after the lock: the calling thread's shard is settled, however the operation ends,
  // before the lock goes).
  struct Guard : std::unique_lock<Lock> {
    explicit Guard(CompactPool& pool)
        : std::unique_lock<Lock>(pool.lock_), stats(pool.services_.ledger) {
      pool.operations_.store(pool.operations_.load(std::memory_order_relaxed) + 1,
                             std::memory_order_release);
    }
    StatScope stats;
  };
  // The calling thread's shard (inside an operation: its Guard's scope settles it).
  ShardCounters& stats() { return services_.ledger.mine(); }
  using Arena = ExtentMap::Arena;

  // Few arenas (one until a request outgrows it): a look at each, inline.
  RESERVOIR_INLINE Arena* arena_of(const Block* b) const {
    for (const auto& a : arenas_)
      if (a->segment == b->segment) return a.get();
    return nullptr;  // unreachable: every block is in an arena
  }
  void index_free(Block* b);
  void reposition_free(Block* b);
  Block* coalesce_free(Block* b);
  Arena* new_arena(std::size_t at_least);
  // Pages of the first size bytes of b that have no memory.
  std::size_t unbacked_pages(const Block* b, std::size_t size) const {
    return extents_.unbacked_pages(*arena_of(b), b->address, size);
  }
  Block* choose(FreeIndex::iterator best, std::size_t size) const;
  // The free block a request of size takes (nullptr: a new arena is needed).
  Block* pick(std::size_t size);
  // The bytes of b a request of size takes (all of it when the rest would be too small).
  static std::size_t taken_of(const Block* b, std::size_t size) {
    return b->size - size >= SizePolicy::kMinBlockSize ? size : b->size;
  }
  // The stream caches' side (no lock_): a request served from stream's cache (0: none
  // there), and a free kept in its stream's cache.
  std::uintptr_t allocate_cached(std::size_t requested, StreamHandle stream,
                                 const Context& context);
  enum class CachedFree { kept, not_allocated, declined, retry };
  // Whether a freed block may wait in its stream's cache: used on its own stream only
  // (memory other streams used needs the fences the pool's free gives).
  static bool cacheable(const Block& b) { return !b.extras || b.extras->uses.empty(); }
  // The free of a small block may keep it without the pool's lock; a large one is kept
  // where the pool would place the next request of its size at it anyway
  // (best_fit_stays, under the lock: large blocks are where placement matters), or
  // without the lock when that was decided for it and no pool operation ran since.
  static bool small_cacheable(const Block& b) {
    return b.size <= StreamCaches::kMaxBlock && cacheable(b);
  }
  bool best_fit_stays(const Block* b) const;
  // pre: c locked, b of c's stream, wants(c, b.size).
  bool kept_at_once(const StreamCaches::Cache& c, const Block& b) const {
    return b.size <= StreamCaches::kMaxBlock ||
           (c.large_kept == &b && c.large_epoch == operations_.load(std::memory_order_acquire));
  }
  CachedFree free_cached(std::uintptr_t address, bool traced, const Context& context);
  // free() with history on (its context gathered first), and the free itself.
  RESERVOIR_COLD bool free_traced(std::uintptr_t address);
  bool free_as(std::uintptr_t address, bool traced, const Context& context);
  CachedFree free_cached_at_once(std::uintptr_t address, bool traced, const Context& context);
  // b (out of the stripes) freed into c. pre: c locked, wants(c, b->size).
  void keep_cached(StreamCaches::Cache& c, Block* b, bool traced, const Context& context);
  // A cached block given back to the free blocks (its pages' live bytes and fences as
  // a free's); every cache's blocks given back. Under lock_.
  void return_cached(Block* b);
  void drain_caches();
  void trace_alloc(Block* b, std::size_t requested, StreamHandle stream, const Context& context) {
    if (services_.history.active()) trace_alloc_on(b, requested, stream, context);
  }
  void trace_alloc_on(Block* b, std::size_t requested, StreamHandle stream, const Context& context);
  void trace_free(const Block* b, const Context& context);
  void finish_operation();

  PoolServices& services_;
  Lock lock_;
  NodePool block_nodes_;
  FreeIndex free_;
  AllocatedStripes allocated_;
  StreamCaches caches_;
  StreamEvents fences_;
  ExtentMap extents_;                         // after fences_, which it uses
  std::atomic<std::uint64_t> operations_{0};  // operations under lock_ so far (Guard)
  std::vector<std::unique_ptr<Arena>> arenas_;
};

}  // namespace reservoir::detail
