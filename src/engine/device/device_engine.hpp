// DeviceEngine: the allocator of one device. It routes each request to the
// StreamPool of its stream (created on first use, found without a lock) and owns
// what the pools share (PoolServices: the settings and size policy, the
// memory-fraction budget, pooled events, the statistics ledger, the segment
// registry, history) and the device-wide operations: garbage collection, releasing
// every cache, statistics, snapshots, configuration changes.
//
// Invariants:
//   while every pool is locked: budget_.reserved() == sum over pools of their mapped
//     segment bytes + budget_.unlocked() (device_state.hpp);
//   with a memory fraction set, budget_.reserved() <= budget_.limit() at all times, but
//     for the pages an expandable request mapped past PyTorch's gate (device_state.hpp);
//   every pool in pools_ is either in table_ under its stream (p->stream() == key)
//     or in recycled_ (holds no block and no release fence, serves kNoStream, in no
//     table slot; its cached segments, if any, are the next stream's), never both;
//   draining_ lists, each once, pools of released streams that still held blocks or
//     wait for their release fence (each in table_, none in recycled_);
//   first_pool_ == nullptr or first_pool_ == table_.find(first_stream_) and serves
//     first_stream_ (it goes null for good when that pool is recycled);
//   every StreamPool of private_pools_ serves one registered private pool, or is
//     spare (no segment) and listed in spare_;
// Lock order: config_mutex_ -> create_mutex_ -> private-pool registry
// mutex -> pool locks (in creation order: the default pools, the private pools' caches,
// the compact pool, then its stream caches and allocated stripes) -> ledger / segment
// map / event pool / segment registry mutexes.
// Only lock_every_pool() holds two pool locks; every other path holds at most one.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include "engine/books/segment_registry.hpp"
#include "engine/compact/compact_pool.hpp"
#include "engine/device/private_pools.hpp"
#include "engine/pool/device_state.hpp"
#include "engine/pool/expandable_segment.hpp"
#include "engine/pool/pool_services.hpp"
#include "engine/pool/stream_pool.hpp"
#include "engine/stats/history.hpp"
#include "engine/stats/stat_ledger.hpp"
#include "engine/streams/event_pool.hpp"
#include "engine/streams/stream_table.hpp"
#include "engine/tags/tags.hpp"
#include "reservoir/hooks.hpp"
#include "reservoir/pools.hpp"
#include "reservoir/sleep.hpp"
#include "reservoir/stats.hpp"
#include "util/compiler.hpp"
#include "util/lock.hpp"

namespace reservoir::detail {

// Callbacks shared by every engine of an allocator (the first rung of the ladder and
// the observers told before OutOfMemoryError is thrown).
struct EngineHooks {
  std::mutex mutex;
  std::vector<FreeMemoryCallback> free_memory_callbacks;
  std::vector<OomObserver> oom_observers;
  std::atomic<bool> has_callbacks{false};

  // Runs every callback (outside the mutex: they may free through the allocator);
  // true if any freed memory.
  bool run_free_memory_callbacks();
  std::vector<OomObserver> observers();
};

class DeviceEngine {
 public:
  DeviceEngine(Backend& backend, int device, const Config& config, SegmentMap& segments,
               EngineHooks& hooks);
  ~DeviceEngine();
  DeviceEngine(const DeviceEngine&) = delete;
  DeviceEngine& operator=(const DeviceEngine&) = delete;

  int device() const noexcept { return device_; }
  Backend& backend() noexcept { return backend_; }

  // ---- Requests ----
  // A block of at least requested bytes (> 0) on stream: from the cache, else by the
  // out-of-memory ladder (oom_ladder.cpp). Throws OutOfMemoryError or DeviceError.
  RESERVOIR_INLINE std::uintptr_t allocate(std::size_t requested, StreamHandle stream) {
    // With history on, the user's context recorder runs first (it may be slow or take
    // its own locks), out of the hot path.
    if (RESERVOIR_UNLIKELY(history_.active() || detours_.load(std::memory_order_relaxed))) {
      // policy:compact alone (no routing, no history): no context to gather.
      if (detours_.load(std::memory_order_relaxed) == kDetourCompact && !history_.active())
        return allocate_compact(requested, stream, kNoContext);
      return allocate_with_context(requested, stream);
    }
    StreamPool& p = pool(stream);
    if (std::uintptr_t address = p.allocate_cached(requested, stream, kNoContext, false))
      return address;
    return allocate_missed(p, requested, stream, kNoContext);
  }
  // The pool of stream, created on first use. Lock-free once created, and then a hint:
  // a pool recycled meanwhile serves another stream, which the caller checks under
  // the pool's lock (allocate_cached's stream argument).
  StreamPool& pool(StreamHandle stream) {
    // The first stream's pool without the table (a one-stream program's every request).
    if (StreamPool* first = first_pool_.load(std::memory_order_acquire);
        first && first_stream_ == stream)
      return *first;
    StreamPool* p = table_.find(stream);
    return p ? *p : create_pool(stream);
  }

  // ---- Device-wide operations ----
  void empty_cache();
  // The host waited for stream: pending frees and fences on it are complete.
  void host_waited(StreamHandle stream);
  // The program is about to destroy stream: what is owed on it is recorded now, and
  // its pool is recycled once it holds nothing (at once when no block is allocated or
  // pending: its cached segments go back; else once its last block is free and its
  // frees complete, noticed by the next new stream, release_stream or empty_cache).
  void release_stream(StreamHandle stream);
  // For tests: StreamPool objects of the default pools (live and recycled), the
  // table's entries and capacity.
  std::size_t stream_pool_count();
  std::size_t stream_table_size();
  std::size_t stream_table_capacity();
  void set_memory_fraction(double fraction);
  double memory_fraction() const;
  std::size_t largest_cached_block();
  DeviceStats stats();
  void reset_peak_stats() { ledger_.reset_peaks(); }
  void reset_accumulated_stats();
  // The device's statistics, for the engines that count in it with a fixed shard of
  // their own (uncached mode, cudaMallocAsync).
  StatLedger& ledger() noexcept { return ledger_; }
  // Installs a new configuration with every pool locked; apply_fraction: the update
  // set per_process_memory_fraction (else a fraction set at run time stays).
  void update_config(const Config& config, bool apply_fraction);
  // Segments of every pool with their blocks (adds a snapshot history entry).
  void snapshot(std::vector<SegmentInfo>* out);
  History& history() noexcept { return history_; }
  // Walks every pool and reconciles the device-wide totals; throws InvariantError.
  // Safe beside requests on other threads: it holds every lock that guards what it
  // compares (no capture begins, no pool is made, every pool is locked) for the walk,
  // so they wait for it.
  void validate();
  // Grants device access to this device's expandable segments, now and later.
  void add_peer(int device);

  // ---- Private pools (device_pools.cpp; the vocabulary is reservoir/pools.hpp) ----
  // Creates the pool (use count 1) or adds a use.
  void retain_pool(PoolId id, const PoolOptions& options,
                   std::shared_ptr<SegmentSource> source = nullptr);
  // Drops a use; at 0 the pool's memory goes back once its blocks are freed (at the
  // next release of the device's caches).
  // empty_cache: at the last use, the pool's cached memory goes back now (else at the
  // next empty_cache or out-of-memory release).
  void release_pool(PoolId id, bool empty_cache = false);
  int pool_use_count(PoolId id);
  // The bytes the pool's segments hold and those of its allocated blocks (a released
  // pool's too, until it is forgotten); throws InvalidArgumentError for an unknown one.
  PrivatePoolUsage pool_usage(PoolId id);
  // The private pool that a request on stream from this thread would go to now, or
  // {0, 0} (the trace recorder's question; runs the routes' filters).
  PoolId routed_pool(StreamHandle stream);
  std::optional<PoolFacts> pool_facts(PoolId id) const { return private_registry_.facts(id); }
  // Routes requests that filter accepts to the pool (retaining it) until
  // end_allocate_to_pool. capture: a graph capture may be under way meanwhile.
  void begin_allocate_to_pool(PoolId id, StreamFilter filter, bool capture);
  void end_allocate_to_pool(PoolId id);
  PoolCheckpoint checkpoint_pool(PoolId id);
  PoolRestore restore_pool(const PoolCheckpoint& checkpoint);
  // Whether the pool's allocated blocks are exactly expected.
  bool pool_live_allocations_are(PoolId id, const std::vector<void*>& expected);
  bool capture_underway() const noexcept { return capture_.underway(); }

  // ---- Tags: sleep and wake (tag_pools.cpp; docs/sleep.md) ----
  // A tag scope of this allocator is open (on): requests read their thread's tag
  // (thread_tag_for(&hooks())) and a tagged one goes to its tag's pool. Off, the
  // request path never looks (CachingAllocator counts the scopes).
  void set_tagging(bool on);
  // Puts the memory of tag on this device to sleep: the tag's own pool and every
  // private pool carrying it (their free pages given back, the rest unmapped, their
  // contents kept on the host for offload), addresses kept. Throws
  // InvalidArgumentError (asleep already, a capture under way, memory that cannot be
  // unmapped) or DeviceError; either way nothing is asleep then.
  void sleep(TagId tag, SleepMode mode);
  // Maps the tag's memory again at the same addresses (offloaded contents copied
  // back). Throws InvalidArgumentError (not asleep, a capture under way),
  // OutOfMemoryError or DeviceError; either way the tag stays asleep then. With a
  // stream, the copies back are enqueued on it and not waited for (the program orders
  // its use of the memory after that stream); their host copies go back to the host
  // stash once an event recorded after them has completed.
  void wake(TagId tag, const StreamHandle* stream = nullptr);
  // Frees the pinned host buffers kept for the next offload (HostStash); returns their
  // bytes. Those a tag asleep or a wake's copies still use stay.
  std::size_t empty_host_cache() noexcept { return host_stash_.release(); }
  TagState tag_state(TagId tag);
  // Every tag that has a pool on this device, in the order of their first use.
  std::vector<TagState> tag_states();

  // The compact pool if policy:compact was ever used (else null).
  CompactPool* compact_if_made() const noexcept {
    return compact_ptr_.load(std::memory_order_acquire);
  }

  // ---- The ladder's device-wide rungs (oom_ladder.cpp drives them) ----
  EngineHooks& hooks() noexcept { return hooks_; }
  DeviceBudget& budget() noexcept { return budget_; }
  DeviceCounters& counters() noexcept { return counters_; }
  bool gc_enabled() const noexcept { return gc_.enabled(); }
  // Age-based release of cached large blocks (garbage_collection_threshold).
  void garbage_collect();
  // Waits for every pending free, then releases every free, unsplit segment (and
  // free expandable page) of every pool.
  // compact_pages_back: policy:compact's free pages go back to the device too (else
  // they stay as spare pages, for the compact pool's own retry).
  void release_cached_everywhere(bool compact_pages_back = true);
  // Free bytes cached on streams other than except's.
  std::size_t cached_elsewhere(const StreamPool* except);
  const char* backend_name() const noexcept { return backend_.name(); }

 private:
  // private_request: pool belongs to a private pool (no use_on_oom fallback).
  std::uintptr_t allocate_slow(StreamPool& pool, std::size_t requested, const Context& context,
                               bool private_request = false);
  std::uintptr_t allocate_private(PrivatePool& pool, std::size_t requested, StreamHandle stream,
                                  const Context& context);
  // The use_on_oom pools' free blocks on stream (0 when none serves it).
  std::uintptr_t allocate_from_use_on_oom(std::size_t requested, StreamHandle stream,
                                          const Context& context);
  StreamPool& private_stream_pool(PrivatePool& pool, StreamHandle stream);
  // A tag's state on this device: its own pool (made on first use) and whether it
  // sleeps. Requests under the tag hold use shared; sleep and wake hold it alone, so
  // no request is under way in the tag's pools while their pages go or come.
  // Invariant: restore_event != 0 iff restoring.host is non-empty (the copies of a wake
  // on a stream may still read them); both under restore_mutex.
  struct TagEntry {
    TagId tag = kNoTag;
    std::shared_ptr<PrivatePool> pool;
    std::shared_mutex use;
    bool asleep = false;  // under use
    SleepMode mode = SleepMode::offload;
    std::mutex restore_mutex;
    WakeCopies restoring;
    EventHandle restore_event = 0;
  };
  // Frees the host copies of a wake on a stream once its copies are done: waiting for
  // them (wait), or only if they are. Returns the bytes still held.
  std::size_t finish_restoring(TagEntry& entry, bool wait) noexcept;
  // Waits for the copies' stream, then frees their host copies.
  void drop_wake_copies(WakeCopies& copies) noexcept;
  void sleep_pool(StreamPool& pool, bool offload);  // a pool of a tag, free pages as they go
  TagEntry& tag_entry(TagId tag);
  // A tag's own pool is named (kTagPoolMark, tag) in snapshots and messages: no id
  // PyTorch or MemPool hands out (theirs count up from 1 in one half).
  static constexpr std::uint64_t kTagPoolMark = 0x7461670000000000ull;  // "tag"
  // A request under tag (its own pool, or routed to a private pool carrying it).
  std::uintptr_t allocate_tagged(TagId tag, PrivatePool* routed, std::size_t requested,
                                 StreamHandle stream, const Context& context);
  // The caches of every pool carrying tag (its own pool's and private pools').
  std::vector<StreamPool*> tag_stream_pools(const TagEntry& entry);
  TagState tag_state_locked(TagEntry& entry);  // the caller holds entry.use
  std::vector<StreamPool*> tag_own_pools();    // the caches of every tag's own pool
  TagId tag_of(const StreamPool& pool);        // the tag its memory carries (or kNoTag)
  // The registered, unreleased pool (throws InvalidArgumentError).
  PoolRegistry::Pool live_pool(PoolId id, const char* action);
  // Waits for the pools' pending frees, then gives their free segments back. pre: the
  // caller holds ladder_mutex_.
  void release_caches_locked(const std::vector<StreamPool*>& pools);
  // Forgets released pools with nothing left, keeping their caches for reuse.
  void collect_dead_pools();
  // Every StreamPool: the default ones, then the private ones.
  std::vector<StreamPool*> all_pools_snapshot();
  // policy:compact: the device-wide pool, and its ladder (oom_ladder.cpp).
  std::uintptr_t allocate_compact(std::size_t requested, StreamHandle stream,
                                  const Context& context);
  std::uintptr_t allocate_default(std::size_t requested, StreamHandle stream,
                                  const Context& context);
  // Made on first use; the pointer's load alone after that (every compact request).
  CompactPool& compact() {
    if (CompactPool* c = compact_ptr_.load(std::memory_order_acquire)) return *c;
    return make_compact();
  }
  RESERVOIR_COLD CompactPool& make_compact();
  [[noreturn]] void raise_out_of_memory(StreamHandle stream, std::size_t requested,
                                        std::size_t alloc_size, std::size_t largest_small,
                                        std::size_t largest_large, std::size_t cached_elsewhere);
  RESERVOIR_COLD std::uintptr_t allocate_with_context(std::size_t requested, StreamHandle stream);
  static inline const Context kNoContext{};
  StreamPool& create_pool(StreamHandle stream);
  // After allocate_cached answered 0: the pool's ladder, once the pool is stream's (a
  // pool found without a lock may have been recycled meanwhile).
  RESERVOIR_COLD std::uintptr_t allocate_missed(StreamPool& pool, std::size_t requested,
                                                StreamHandle stream, const Context& context);
  // The pool of stream if it has one (no pool is made).
  StreamPool* existing_pool(StreamHandle stream);
  // Under create_mutex_: a pool for stream, from empty (recycled or spare) if any, else
  // a new one added to owned.
  StreamPool* take_pool_locked(std::vector<StreamPool*>& empty,
                               std::vector<std::unique_ptr<StreamPool>>& owned,
                               StreamHandle stream);
  // Under create_mutex_: recycles p (a released stream's pool) if it holds no block,
  // with its cache once its release fence passed (give_back: without it).
  bool retire_locked(StreamPool* p, bool give_back);
  // Under create_mutex_: tries up to `most` draining pools, oldest first.
  void sweep_draining_locked(std::size_t most);
  std::vector<StreamPool*> pools_snapshot();
  // Locks every pool in the lock order (the caller holds create_mutex_), and the
  // compact pool's request locks (its stream caches and stripes, which its cached
  // requests take instead of its lock); they go with held.
  struct EveryPoolLocked {
    std::vector<std::unique_lock<Lock>> locks;
    std::optional<CompactPool::RequestsHeld> compact;
  };
  void lock_every_pool(EveryPoolLocked* held);

  Backend& backend_;
  const int device_;
  EngineHooks& hooks_;
  Config config_;          // under config_mutex_
  PoolSettings settings_;  // changes with every pool locked
  EventPool events_;
  StatLedger ledger_;
  SegmentRegistry registry_;
  DeviceBudget budget_;
  DeviceCounters counters_;
  GcClock gc_;
  PeerSet peers_;
  History history_;
  CaptureState capture_;
  WaitingPools waiting_;
  HostStash host_stash_;  // outlives the pools: their segments give buffers back to it
  PoolServices services_;

  mutable std::mutex config_mutex_;  // lock-all operations
  std::mutex create_mutex_;          // pool creation
  std::mutex ladder_mutex_;          // one device-wide release at a time
  StreamTable<StreamPool> table_;
  std::vector<std::unique_ptr<StreamPool>> pools_;  // the default pools, one per stream
  std::vector<StreamPool*> recycled_;               // under create_mutex_: empty, for new streams
  std::deque<StreamPool*> draining_;                // under create_mutex_: released, not yet empty
  static constexpr std::size_t kDrainingKept = 8;   // sweep_draining_locked()
  // The first pool ever made and its stream, set once (stream first, then the pool,
  // released); the pool goes null for good when recycled.
  StreamHandle first_stream_ = 0;
  std::atomic<StreamPool*> first_pool_{nullptr};
  bool first_made_ = false;  // under create_mutex_
  PoolRegistry private_registry_{detours_, kDetourRouting};
  std::vector<std::unique_ptr<StreamPool>> private_pools_;  // under create_mutex_
  std::vector<StreamPool*> spare_;                          // under create_mutex_
  std::atomic<bool> compact_on_{false};                     // policy:compact in force
  // Why a request cannot take the plain path, as bits: one load on the hot path.
  static constexpr std::uint8_t kDetourCompact = 1, kDetourRouting = 2, kDetourTags = 4;
  std::atomic<std::uint8_t> detours_{0};
  std::unique_ptr<CompactPool> compact_;  // made on first use, under create_mutex_
  // Tags (tag_pools.cpp): entries never go while the engine lives; tags_mutex_ guards
  // the list, sleep_mutex_ lets one sleep or wake run at a time.
  std::mutex tags_mutex_;
  std::vector<std::unique_ptr<TagEntry>> tags_;
  std::mutex sleep_mutex_;
  std::atomic<CompactPool*> compact_ptr_{nullptr};
};

}  // namespace reservoir::detail
