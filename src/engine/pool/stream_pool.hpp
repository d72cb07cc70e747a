// StreamPool: the cache of one stream on one device — the shard that lets threads
// on different streams allocate without contending.
//
// It owns, under one Lock:
//   - the segments allocated for its stream, and their blocks (block.hpp);
//   - free blocks per pool in best-fit order (FreeIndex) and, for expandable
//     segments, unmapped blocks by address (AddressSet);
//   - the allocated blocks by address (AddressMap);
//   - pending frees: blocks freed by the program but used on other streams, in one
//     FIFO queue per using stream, so a slow stream never delays frees on another;
//   - nothing of the statistics: the calling thread's shard of the device's StatLedger
//     counts (every operation holds a StatScope in its lock guard).
// Invariants (checked by validate()):
//   counters.allocation[p] == number of allocated blocks in pool p segments,
//   counters.allocated_bytes[p] == sum of their sizes,
//   counters.pending[p], pending_bytes[p] == the same for pending blocks,
//   counters.requested_bytes[p] == sum of requested sizes of allocated and pending blocks,
//   counters.reserved_bytes[p] == sum of mapped bytes of its segments in pool p
//     + held bytes of its expandable segments (memory a failed give-back kept),
//   |free_[p]| == number of free blocks in pool p segments; |allocated_| == allocated blocks,
//   pending_blocks_ == number of pending blocks with event_count > 0;
//   services_.waiting lists (s, this) iff pending_queues_ has a queue for s;
//   every block in capture_deferred_ is pending with event_count == 0 (freed while a
//     capture was under way: its events are recorded once no capture is, spec's
//     needs_events_deferred_until_no_capture);
//   capture_marked_ == number of blocks in capture_deferred_ with capture points, and
//     such a block's uses are all capture uses (its other uses need events).
// Parked free: the program's free of a block is often followed by a request of the
// same size, which best fit would serve by splitting the very block the free merged
// (so the merge and the split cancel out). free() therefore parks the block instead
// of merging it, counting the statistics as if merged, and the next request takes it
// back when best fit, run on the merged block, would hand out exactly that block;
// anything else settles the block first (the merge, as the free would have done it).
// Only a block of the size last requested is parked: the pattern that pays.
//   parked_ == nullptr, or parked_ is the one block in state parked: no extras, not
//     in allocated_ nor in any index, its prev not free; statistics count it (with
//     its next, when that is free) as the free block the merge makes; gc_stamp ==
//     the clock when it was freed;
//   every member but allocate_cached() and free() settles it first (Guard),
//     so no other code ever meets a parked block;
//   parked_split_ == parked_merge(parked_) while parked_ != nullptr.
// The fit memo spares the steady pair (free, then the same request) the best-fit check:
//   fit_block_ != nullptr (never a block of an expandable segment) => with
//     p == fit_block_->pool(): while free_[p].version() == fit_version_,
//     parked_fit(p, fit_block_->size) == fit_block_ whenever fit_block_ is parked (its
//     size cannot change meanwhile: that takes a merge or a split, which the index sees);
//   the engine calls forget_fit() when the size policy changes, and delete_block()
//     forgets a deleted block.
// A pool of a private pool (pool_id_ != {0, 0}) is the same cache, kept apart: the
// engine routes only that pool's requests to it (private_pools.hpp).
// It depends only on PoolServices (calls go one way: the engine and the
// out-of-memory ladder call the pool; the pool calls nothing above it).
// Locking: public members take the lock; a member never takes another pool's lock.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "engine/books/block.hpp"
#include "engine/books/block_list.hpp"
#include "engine/books/block_owner.hpp"
#include "engine/books/free_index.hpp"
#include "engine/books/validation_totals.hpp"
#include "engine/pool/pool_services.hpp"
#include "engine/stats/stat_ledger.hpp"
#include "reservoir/history.hpp"
#include "reservoir/pools.hpp"
#include "reservoir/segment_source.hpp"
#include "util/address_map.hpp"
#include "util/compiler.hpp"
#include "util/lock.hpp"
#include "util/node_pool.hpp"

namespace reservoir::detail {

struct WakeCopies;  // engine/pool/expandable_segment.hpp

// "(first, second)": a private pool as error messages name it.
std::string pool_name(PoolId id);

// Per-pool inputs and outputs of one garbage-collection round.
struct GcTally {
  std::uint64_t total_age = 0;
  std::int64_t count = 0;
  std::size_t reclaimed = 0;
  bool freed_any = false;
};

// Cache-line aligned so that pools of different streams never share a line.
class alignas(64) StreamPool final : public BlockOwner {
 public:
  StreamPool(PoolServices& services, StreamHandle stream);
  ~StreamPool();  // returns every segment to the device
  StreamPool(const StreamPool&) = delete;
  StreamPool& operator=(const StreamPool&) = delete;

  // The stream served: changes only while the pool is empty, under its lock and the
  // engine's creation mutex (a recycled pool serves a new stream), so a reader holding
  // the lock sees the stream of every block it finds.
  StreamHandle stream() const noexcept { return stream_.load(std::memory_order_relaxed); }
  // Recycling (the engine, under its creation mutex): when the pool holds no block (no
  // allocated, pending or parked one), it forgets its stream, takes `next` (kNoStream:
  // none yet) and answers true; else changes nothing and answers false. Its cached
  // segments stay, for the next stream, when the release fence (release_stream) says
  // that the work of the old stream is done; they go back to the device when there is
  // no fence, or give_back is set (a fence still pending then no longer holds the pool
  // back). While the fence is pending and give_back is not set: false. Never during a
  // capture (nothing may go back).
  bool recycle(StreamHandle next, bool give_back);
  // A recycled pool takes a stream. pre: the pool holds no block.
  void assign(StreamHandle stream);
  // Keeps the pool from being recycled while it lives (an allocation's out-of-memory
  // ladder, which locks the pool step by step). serves(): whether the pool serves
  // stream, read under its lock after the pin is counted, so a recycling either came
  // before (the answer is false) or sees the pin and waits for the next sweep.
  class Pin {
   public:
    explicit Pin(StreamPool& pool) noexcept : pool_(pool) {
      pool_.pins_.fetch_add(1, std::memory_order_relaxed);
    }
    ~Pin() { pool_.pins_.fetch_sub(1, std::memory_order_relaxed); }
    Pin(const Pin&) = delete;
    Pin& operator=(const Pin&) = delete;
    bool serves(StreamHandle stream) {
      std::lock_guard<Lock> guard(pool_.lock_);
      return pool_.stream() == stream;
    }

   private:
    StreamPool& pool_;
  };
  // Whether the pool holds a block the program has not given back for good (allocated,
  // pending, stranded or deferred past a capture), or a release fence: what a
  // recycled pool never holds (the validator).
  bool holds_blocks();
  static constexpr StreamHandle kNoStream = ~StreamHandle{0} - 0x600d;
  // The private pool this cache serves ({0, 0}: the default pools), its no_split
  // option and its segment source (null: the device). Set while the pool holds no
  // segment (a new or recycled cache). vmm: its segments are expandable whatever the
  // settings say (a tagged pool's, which may sleep).
  void set_private(PoolId pool, bool no_split, std::shared_ptr<SegmentSource> source,
                   bool vmm = false);
  PoolId pool_id() const noexcept { return pool_id_; }
  Lock& lock() noexcept { return lock_; }
  // The size policy changed (the caller holds the lock): the fit memo no longer holds.
  void forget_fit() noexcept { fit_block_ = nullptr; }

  // ---- Allocation: the cache hit, then the rungs of the out-of-memory ladder ----
  // Each returns the address of a block of at least requested bytes (requested > 0),
  // or 0 when that step cannot serve it. Device errors throw DeviceError.
  // From cached blocks only (completing finished pending frees first). traced: history
  // is on (read once per operation by the caller; the engine's fast path knows it off).
  // stream: the stream the caller looked the pool up for without a lock; 0 when the
  // pool serves another by the time its lock is taken (recycled meanwhile).
  std::uintptr_t allocate_cached(std::size_t requested, StreamHandle stream, const Context& context,
                                 bool traced);
  std::uintptr_t allocate_cached(std::size_t requested, const Context& context) {
    return allocate_cached(requested, stream(), context, tracing());
  }
  // From a new device allocation (or newly mapped pages); retry counts a retry.
  std::uintptr_t allocate_new_segment(std::size_t requested, bool retry, const Context& context);
  // After a device-wide release: cached blocks freed meanwhile, else a new segment.
  std::uintptr_t allocate_after_release(std::size_t requested, const Context& context);
  // Releases cached oversize blocks that could make room for requested bytes (the
  // spec's release_available_cached_blocks); true when enough was released.
  bool release_oversize(std::size_t requested);

  // ---- BlockOwner (program requests on existing blocks) ----
  bool free(std::uintptr_t address) override;
  bool record_use(std::uintptr_t address, StreamHandle other) override;
  bool block_sizes(std::uintptr_t address, std::size_t* size, std::size_t* requested) override;
  bool segment_of(std::uintptr_t address, BaseAllocation* out) override;
  std::string explain_not_allocated(std::uintptr_t address) override;
  bool share(std::uintptr_t address, SharedBlock* out) override;

  // ---- Cache control (called by DeviceEngine; each takes the lock) ----
  void process_events_now();     // completes pending frees whose events have completed
  void synchronize_pending();    // waits for every pending free's events and completes it
  std::size_t release_cached();  // every free, unsplit segment and free page; bytes released
  std::size_t largest_free_block(PoolIndex pool);
  std::size_t cached_bytes();
  std::size_t reserved_bytes();  // device memory its segments hold (mapped, or kept)
  void gc_scan(std::uint64_t now, GcTally* tally);
  void gc_release(std::uint64_t now, double age_threshold, GcTally* tally);
  void add_peer(int device);  // grants device access to every mapped expandable page
  // The program is about to destroy this pool's stream (Allocator::release_stream):
  // from now on, unmapping expandable pages waits for the whole device instead of
  // naming the stream (a destroyed stream cannot be synchronized; its handle may even
  // come back as another stream's). Never undone: a device-wide wait is always safe.
  // fence: when the pool holds cached segments and no block, an event is recorded on
  // the stream now (the release fence; a second release records it again), so that
  // recycling hands the cache to the next stream once the old stream's work is done,
  // instead of giving it back to the device (cudaFree waits for the whole device) for
  // the next stream to allocate again. No event to be had or recorded: no fence (the
  // cache goes back at recycling, as without one).
  void release_stream(bool fence);
  // Records the events of frees deferred while a capture was under way (call once
  // none is). Throws DeviceError after trying every block.
  void flush_capture_deferred();
  bool holds_segments();

  // ---- Sleep and wake (stream_pool_sleep.cpp; a tag's pools, docs/sleep.md) ----
  // Waits for the work on every stream that used the pool's blocks and for its pending
  // frees, gives its free pages back, then puts every mapped page to sleep (offload:
  // contents kept in pinned host memory). Returns the bytes put to sleep. Throws
  // DeviceError (or InvalidArgumentError: segments not its own to unmap), with what
  // went to sleep asleep and the pool asleep (the caller wakes it).
  // keep_free: the free pages sleep too instead of going back to the device (a CUDA
  // graph's or MemPool's pool: its replays use the memory of blocks freed in capture).
  std::size_t sleep(bool offload, bool keep_free = false);
  // Maps fresh memory at every page put to sleep, contents copied back: all or
  // nothing. false: out of memory or over the memory fraction (still asleep). With
  // restoring, the copies go on its stream unwaited (ExpandableSegment::wake); the host
  // copies of a wake that succeeds join restoring->host.
  bool wake(WakeCopies* restoring = nullptr);
  bool asleep() {
    Guard guard(*this);
    return asleep_;
  }
  // A tag's figures (TagState) over this pool.
  struct SleepCounts {
    std::size_t allocated = 0, reserved = 0, asleep = 0, offloaded = 0;
  };
  SleepCounts sleep_counts();

  // ---- Checkpoints of a private pool (stream_pool_checkpoint.cpp) ----
  // Appends every segment with its blocks (an expandable one's mapped blocks).
  // Throws InvalidArgumentError for pending frees (synchronize first).
  void checkpoint(std::vector<CheckpointSegment>* out);
  // Throws InvalidArgumentError (changing nothing) unless every segment of the
  // checkpoint is a segment of this pool, of its size, tiled by its blocks (an
  // expandable one: its allocated blocks in memory mapped now).
  void check_restorable(const std::vector<const CheckpointSegment*>& segments);
  // Frees every allocated block (appending its address) and waits for the frees
  // that wait for other streams.
  void free_all_allocated(std::vector<void*>* freed);
  // pre: free_all_allocated, check_restorable. Splits each segment as recorded and
  // allocates the blocks recorded as allocated (appending their addresses).
  void restore(const std::vector<const CheckpointSegment*>& segments,
               std::vector<void*>* allocated);
  // Appends the address of every allocated block.
  void allocated_addresses(std::vector<std::uintptr_t>* out);
  // Appends this pool's segments and blocks; returns the active bytes.
  std::size_t snapshot(std::vector<SegmentInfo>* out);
  // The validator's walk (the caller holds lock(): the engine holds every pool's, so
  // that the device-wide sums are of one moment). Throws InvariantError.
  void validate_locked(ValidationTotals* totals);

 private:
  // An operation's hold on the pool: the lock, with a parked free settled (how every
  // member but the hot two begins), and the statistics scope, declared after the lock
  // so that the calling thread's shard is settled, however the operation ends, before
  // the lock goes.
  // The shard is found when first counted (a query makes none); after relocking, the
  // holder forgets it again (shard_ = &unowned_shard).
  struct Guard : std::unique_lock<Lock> {
    explicit Guard(StreamPool& pool)
        : std::unique_lock<Lock>(pool.lock_), stats(pool.services_.ledger) {
      pool.shard_ = &unowned_shard;
      if (pool.parked_) pool.settle();
    }
    StatScope stats;
  };
  // The two hot paths, which never unlock early and always count: the shard is found
  // once, with the lock (the one the pool's last operation counted on, when it is
  // this thread's). Inlined: out of line, its set-up cost a tenth of a cache-hit pair.
  struct ScopedGuard {
    RESERVOIR_INLINE explicit ScopedGuard(StreamPool& pool)
        : lock(pool.lock_), stats(pool.services_.ledger.mine(*pool.shard_)) {
      pool.shard_ = &*stats;
    }
    std::lock_guard<Lock> lock;
    ShardScope stats;
  };
  // The calling thread's shard, inside an operation (its guard's scope settles it).
  RESERVOIR_INLINE ShardCounters& stats() {
    if (RESERVOIR_UNLIKELY(shard_ == &unowned_shard)) shard_ = &services_.ledger.mine();
    return *shard_;
  }
  struct Pending {
    EventHandle event;
    Block* block;
  };
  struct UseQueue {
    StreamHandle stream;
    std::deque<Pending> entries;
  };

  const SizePolicy& policy() const noexcept { return policy_; }
  bool tracing() const noexcept { return history_.active(); }
  void trace(TraceAction action, std::uintptr_t address, std::size_t size,
             const Context& context) const {
    services_.trace(action, address, size, stream(), context, pool_id_);
  }
  // ---- blocks and their indexes ----
  // (the small ones are defined inline at the end of this header: they are the hot path)
  Block* new_block(std::uintptr_t address, std::size_t size, Segment* segment, BlockState state);
  void delete_block(Block* b);
  void index_free(Block* b);  // b becomes free: into its pool's free set
  void unindex_free(Block* b) { free_[b->pool()].erase(b); }
  void reposition_free(Block* b);  // b's size or address changed while in the free set
  void index_unmapped(Block* b);
  void unindex_unmapped(Block* b) { unmapped_[b->pool()].erase(b->unmapped_at); }
  // b (in no index) enters state (free or unmapped): merges with neighbours in that
  // state and leaves one indexed block. Returns it; *absorbed gets the number and
  // bytes of the neighbours merged in.
  Block* coalesce(Block* b, BlockState state, std::int64_t* absorbed, std::int64_t* absorbed_bytes);
  void link_segment(Segment* seg);
  void unlink_segment(Segment* seg);

  // ---- allocation ----
  Block* find_free(PoolIndex pool, std::size_t size);
  static std::size_t room_after(const Block* b);
  // traced: history is on (the flag is loaded once per operation).
  // shard: the operation's (the hot paths pass their guard's, found once).
  std::uintptr_t hand_out(Block* b, std::size_t size, std::size_t requested, const Context& context,
                          bool traced, ShardCounters& shard);
  // out (allocated) goes to the program: the allocated map and the statistics.
  void issue(Block* out, std::size_t requested, SplitChange split, ShardCounters& shard);
  Block* new_segment_block(Guard& guard, std::size_t size, PoolIndex pool, bool retry,
                           const Context& context);
  // ---- expandable segments (stream_pool_expandable.cpp) ----
  Block* allocate_expandable(std::size_t size, PoolIndex pool, const Context& context);
  Block* find_expandable(std::size_t size, PoolIndex pool);
  Segment* new_expandable_segment(PoolIndex pool, std::size_t at_least);
  std::size_t expandable_reserve();
  Block* map_block(Block* block, std::size_t bytes, const Context& context);
  bool unmap_block(Block* block);
  bool release_expandable_segment(Segment* segment, std::string* error);
  std::size_t release_idle_expandable();
  void count_held(Segment* segment, std::size_t held_before, std::size_t unused);
  // ---- parked free (see the class comment) ----
  bool parks(const Block* b) const noexcept;
  void park(Block* b, ShardCounters& shard);
  static SplitChange parked_merge(const Block* b);
  // The parked block when best fit for size bytes of pool would hand it out as it is
  // (its merge and that split cancel out), else nullptr.
  Block* parked_fit(PoolIndex pool, std::size_t size);
  std::uintptr_t take_parked(Block* b, std::size_t requested, ShardCounters& shard);
  RESERVOIR_COLD void settle();  // merges the parked block as its free would have
  // For the validator: parked_split_ is the parked block's merge; the fit memo, while
  // it stands, gives what parked_fit() gives.
  bool parked_split_current();
  bool fit_memo_current();
  // ---- free ----
  RESERVOIR_COLD bool free_traced(std::uintptr_t address);
  void release_block(Block* block, bool traced, ShardCounters& shard);
  void release_block_outlined(Block* block);  // for the pool's other files
  [[nodiscard]] SplitChange free_block(Block* block, bool traced);
  void defer_free(Block* block);
  // A pending block's last wait is over (its events passed, or the capture ordered
  // the stream after its uses): its counts leave pending and it becomes free.
  void complete_pending(Block* block);
  RESERVOIR_COLD void defer_past_capture(Block* block);
  // graph_capture_record_stream_reuse: the capture points of a block freed during a
  // capture whose every use is in the graph (none when a point cannot be had).
  RESERVOIR_COLD void mark_captured(Block* block);
  // Frees the deferred blocks whose capture points this stream's captured work follows.
  RESERVOIR_COLD void reclaim_captured();
  Segment* segment_at(std::uintptr_t base);
  void restore_segment(Segment* segment, const CheckpointSegment& record,
                       std::vector<void*>* allocated);
  void check_restorable_expandable(Segment* seg, const CheckpointSegment& record,
                                   const std::string& where);
  void restore_expandable_segment(Segment* seg, const CheckpointSegment& record,
                                  std::vector<void*>* allocated);
  void restore_allocated(Block* b, std::size_t requested, std::vector<void*>* allocated);
  void process_events(bool wait);
  void drop_empty_queues();  // and their entries in services_.waiting
  // Under the lock: a block the program has not given back for good (allocated,
  // pending, stranded or deferred past a capture); such a pool is neither fenced at
  // its release nor recycled.
  bool owes_blocks() const noexcept {
    return allocated_.size() != 0 || pending_blocks_ != 0 || !stranded_.empty() ||
           !capture_deferred_.empty();
  }
  std::size_t release_cached_locked();
  void serve(StreamHandle stream);  // pre: the pool holds nothing (recycle, assign)
  void release_segment(Segment* segment);
  std::string give_back_segment(Segment* segment);  // "" or why it failed

  void finish_operation();

  PoolServices& services_;
  // Of services_, what every request reads: one load fewer each (both are replaced in
  // place by a configuration change, never moved).
  const SizePolicy& policy_;
  const History& history_;
  std::atomic<StreamHandle> stream_;  // see stream()
  Lock lock_;
  std::size_t pending_blocks_ = 0;
  Block* parked_ = nullptr;  // a freed block, merge postponed (the class comment)
  // The rounded size of the last request: only a block of that size is parked (a
  // settled block costs a little more than an immediate merge, so frees that are
  // unlikely to meet their size's request next merge at once).
  std::size_t last_size_ = 0;
  SplitChange parked_split_;    // what the parked block's merge did to the split blocks
  Block* fit_block_ = nullptr;  // the fit memo (the class comment)
  std::uint64_t fit_version_ = 0;
  bool no_split_ = false;         // read by every hand_out: kept on the lock's line
  bool vmm_ = false;              // expandable segments whatever the settings (set_private)
  bool stream_released_ = false;  // release_stream() was called (unmaps wait for the device)
  // The release fence (release_stream): fenced_ only while the pool serves a released
  // stream and holds segments or blocks; the event is the pool's until recycling.
  bool fenced_ = false;
  EventHandle release_fence_ = 0;
  std::atomic<int> pins_{0};  // Pin: recycle() refuses while nonzero
  // The statistics shard of the operation holding the lock (its thread's), or unowned_shard
  // until it first counts; set by the guards, never read without the lock.
  // Between operations, a hint for the next (StatLedger::mine(hint) checks that it is
  // the calling thread's; shards live as long as the ledger).
  ShardCounters* shard_ = &unowned_shard;
  // On the line after the fit memo's, with the free indexes' version counter: a steady
  // pair touches the pool's first three lines only (one thread taking turns between
  // hundreds of streams finds few of them in its L1).
  alignas(64) AddressMap<Block> allocated_;
  std::uint64_t index_version_ = 0;  // free_[0] and free_[1] count their changes here
  NodePool set_nodes_;
  NodePool block_nodes_;
  FreeIndex free_[kPoolCount];
  AddressSet unmapped_[kPoolCount];  // unmapped blocks of expandable segments, by address
  Segment* segments_ = nullptr;      // list through prev_in_pool/next_in_pool
  std::vector<UseQueue> pending_queues_;
  std::vector<Block*> stranded_;  // pending forever after a device error
  std::vector<Block*> capture_deferred_;
  std::size_t capture_marked_ = 0;  // of capture_deferred_, those with capture points
  PoolId pool_id_{};
  std::shared_ptr<SegmentSource> source_;  // a private pool's own segments, or null
  bool asleep_ = false;                    // sleep() .. wake(): nothing is handed out or given back
  bool sleep_offload_ = false;             // while asleep_: the contents were kept
  // One segment of a sleep() or wake() (the statistics, budget and counters follow).
  std::size_t sleep_segment(Segment* segment);
  bool wake_segment(Segment* segment, WakeCopies* restoring);
  // Whether new segments are expandable.
  bool expandable() const noexcept { return vmm_ || policy().expandable(); }
};

// ---------------------------------------------------------------- hot inline helpers

RESERVOIR_INLINE Block* StreamPool::new_block(std::uintptr_t address, std::size_t size,
                                              Segment* segment, BlockState state) {
  return block_list::create(block_nodes_, address, size, segment, state);
}

RESERVOIR_INLINE void StreamPool::delete_block(Block* b) {
  if (b == fit_block_) fit_block_ = nullptr;
  block_list::destroy(block_nodes_, b);
}

RESERVOIR_INLINE void StreamPool::index_free(Block* b) {
  b->state = BlockState::free;
  b->gc_stamp = services_.gc.now();
  free_[b->pool()].insert(b);
}

// Keeps b's node when the order still holds (the common case of splitting or merging
// the same block), else re-inserts it.
RESERVOIR_INLINE void StreamPool::reposition_free(Block* b) {
  b->gc_stamp = services_.gc.now();
  free_[b->pool()].reposition(b);
}

RESERVOIR_INLINE void StreamPool::index_unmapped(Block* b) {
  b->state = BlockState::unmapped;
  b->unmapped_at = unmapped_[b->pool()].insert(b).first;
}

// The one merge routine (free blocks, newly mapped pages, newly unmapped pages):
// block_list::coalesce with this pool's indexes (free: the FreeIndex, repositioned
// when a neighbour grows; unmapped: the address-ordered set, whose order a merge
// cannot change).
RESERVOIR_INLINE Block* StreamPool::coalesce(Block* b, BlockState state, std::int64_t* absorbed,
                                             std::int64_t* absorbed_bytes) {
  // Forced inline, every one: the merge is on the free path (an outlined hook costs
  // a call per merge).
  struct Hooks {
    StreamPool& pool;
    bool to_free;
    std::int64_t* count;
    std::int64_t* bytes;
    RESERVOIR_INLINE void drop(Block* x) { pool.delete_block(x); }
    RESERVOIR_INLINE void unindex(Block* x) {
      if (to_free)
        pool.unindex_free(x);
      else
        pool.unindex_unmapped(x);
    }
    RESERVOIR_INLINE void index(Block* x) {
      if (to_free)
        pool.index_free(x);
      else
        pool.index_unmapped(x);
    }
    RESERVOIR_INLINE void reposition(Block* x) {
      if (to_free) pool.reposition_free(x);
    }
    RESERVOIR_INLINE void absorbed(const Block& x) {
      *count += 1;
      *bytes += static_cast<std::int64_t>(x.size);
    }
  };
  Hooks hooks{*this, state == BlockState::free, absorbed, absorbed_bytes};
  return block_list::coalesce(b, state, hooks);
}

}  // namespace reservoir::detail
