// Statistics without a device-wide lock, at a cost that does not depend on streams.
//
// Each thread that changes a device's statistics writes its own ShardCounters in that
// device's StatLedger (made on the thread's first change, found through a thread-local
// hint), so threads never share a counter's cache line, and one thread taking turns
// between any number of streams writes one shard: no coordination at all. (Shards were
// per stream before: two streams taking turns passed each other's limits on every
// request, 6x the cost of one stream, and every stream ever seen stayed in the ledger.)
// A few shards are fixed instead, owned by a lock (the cudaMallocAsync and uncached
// engines, which serialize on their own mutex anyway): attach().
// Totals (current, allocated, freed) are sums over shards, plus `retired_`: the counters
// of threads that have exited, folded in at their exit (a block allocated by one thread
// and freed by another leaves one shard positive and the other negative; only the sum
// means anything). Peaks of the sums are kept exact by a budget per shard:
//
//   Invariant (per reported quantity q and pool scope p in {all, small, large}):
//     value(retired_) + sum over live shards s of limit[s][q][p] <= peak[q][p]
//   so while every shard stays at or below its limits, the device-wide sum cannot
//   exceed the recorded peak. A shard whose quantity passes its limit sets the
//   quantity's bit in `over`, and when its operation ends (StatScope) calls
//   StatLedger::rebalance(), which, for those quantities only, sums the shards, raises
//   the peak if the sum exceeds it, and hands out the headroom (peak - sum) again,
//   first to the shards that have needed it (their own high-water marks).
// A rebalance costs O(threads that used the device), never O(streams).
// In single-threaded use every peak is exact. When several threads allocate at the
// same instant, a peak may lag by the allocations in flight at that instant (the sums
// are read without stopping the other threads).
//
// Stored kinds are what operations change; active and active_bytes are derived:
//   active == allocation + pending,  active_bytes == allocated_bytes + pending_bytes
// A deferred free moves a block from allocation to pending (active unchanged), so a
// cache hit and its free each update three counters (count, bytes, requested).
//
// Guards: the seven quantities a cache hit and its split raise (allocation, active,
// allocated_bytes, active_bytes, requested_bytes, inactive_split and its bytes) are not
// compared with their fourteen limits on every operation. Each shard keeps, for the
// five stored kinds behind them (blocks, bytes, requested bytes, split blocks, split
// bytes), a ceiling per pool and one over both pools: the value up to which none of
// the kind's quantities can pass a limit (the derived ones' pending parts folded in).
// An allocation compares its new values with them, and only one that passes a ceiling
// does the exact check (which sets `over` as before) and recomputes them. Ceilings do
// not depend on the values, so a free or a merge, which only lowers values, touches no
// guard. The limits themselves, and so the peaks, are exactly those of the exact
// check: the guards only skip compares that cannot fire.
//
// The rule for code that counts: every operation that changes counters holds a
// StatScope (the pools' lock guards hold one), which settles the shard when the
// operation ends, however it ends; helpers inside it reach the same shard through
// StatLedger::mine().
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/books/validation_totals.hpp"
#include "reservoir/stats.hpp"
#include "util/compiler.hpp"

namespace reservoir::detail {

// What operations count, per pool (0 small, 1 large).
enum StatKind : int {
  kAllocation,
  kSegment,
  kPending,  // blocks freed by the program, waiting for other streams
  kInactiveSplit,
  kAllocatedBytes,
  kReservedBytes,
  kPendingBytes,
  kInactiveSplitBytes,
  kRequestedBytes,
  kOversizeAllocations,  // pool-less: kept under the pool of the block
  kOversizeSegments,
  kStatKinds
};
static_assert(kStatKinds == ValidationTotals::kKinds);
// StatKind's names, in its order (the validator's messages).
inline constexpr const char* kStatKindNames[kStatKinds] = {
    "allocation",       "segment",
    "pending",          "inactive_split",
    "allocated_bytes",  "reserved_bytes",
    "pending_bytes",    "inactive_split_bytes",
    "requested_bytes",  "oversize_allocations",
    "oversize_segments"};

// The units of ShardCounters' guards.
enum GuardUnit : int {
  kGuardBlocks,
  kGuardBytes,
  kGuardRequested,
  kGuardSplitBlocks,
  kGuardSplitBytes,
  kGuardUnits
};

// What is reported (DeviceStats' order: the nine StatArrays, then the oversize pair),
// with a peak each.
enum Reported : int {
  rAllocation,
  rSegment,
  rActive,  // derived
  rInactiveSplit,
  rAllocatedBytes,
  rReservedBytes,
  rActiveBytes,  // derived
  rInactiveSplitBytes,
  rRequestedBytes,
  rOversizeAllocations,
  rOversizeSegments,
  kReportedKinds
};

// What a split or a merge does to a pool's inactive split blocks (either sign).
struct SplitChange {
  std::int64_t blocks = 0;
  std::int64_t bytes = 0;
};

class StatLedger;

struct alignas(64) ShardCounters {
  // Written by the owner only (its thread, or the lock of a fixed shard).
  // added == current - base + removed - removed_base (the bases: current and removed at
  // the last reset_accumulated, written by the ledger), so an increase costs one store.
  std::atomic<std::int64_t> current[kStatKinds][2];
  std::atomic<std::int64_t> removed[kStatKinds][2];
  // Written by the ledger, read by the shard: [quantity][0 = all, 1 = small, 2 = large].
  std::atomic<std::int64_t> limit[kReportedKinds][3];
  // Bit q set when reported quantity q passed a limit (of some scope) during the
  // current operation; nonzero: the operation ends with StatLedger::rebalance().
  std::uint32_t over = 0;
  // Owner-only, per unit and scope s (as limit's: 0 all, 1 small, 2 large). With
  // L(q, s) = limit[q][s] and P(s), PB(s) the pending blocks and bytes in scope s, and
  // while guard_epoch == limits_epoch (no limit lowered, no pending rise since):
  //   ceiling[kGuardBlocks][s] <= min(L(rAllocation, s), L(rActive, s) - P(s)),
  //   ceiling[kGuardBytes][s] <= min(L(rAllocatedBytes, s), L(rActiveBytes, s) - PB(s)),
  //   ceiling[kGuardRequested][s] <= L(rRequestedBytes, s),
  //   ceiling[kGuardSplitBlocks][s] <= L(rInactiveSplit, s),
  //   ceiling[kGuardSplitBytes][s] <= L(rInactiveSplitBytes, s),
  // so a stored kind at or below its ceilings in its pool and over both pools passes
  // no limit. Checked by guards_hold() (the validator).
  std::int64_t ceiling[kGuardUnits][3] = {};
  std::uint64_t guard_epoch = ~std::uint64_t{0};  // none computed yet
  // Written by the ledger only, under its mutex: +1 before and +1 after it lowers one
  // of this shard's limits (odd while it writes: a sequence lock), +2 when the shard
  // triggers a rebalance (its ceilings were passed: they are recomputed from the new limits).
  // A raised limit leaves it: guards that fit the old headroom fit the new one.
  std::atomic<std::uint64_t> limits_epoch{0};
  // The thread pointer of the thread this shard counts for, 0 when none (a spare, a
  // fixed shard, or a shard made while its thread exits). Written by the ledger under
  // its mutex when the shard is given and taken back; a thread finds its shard by it.
  std::atomic<std::uintptr_t> owner{0};
  // The ledger whose budget the shard is in (set when it joins: made or attached).
  StatLedger* ledger = nullptr;
  // Cold, ledger-owned (under its mutex): accumulation bases, own high-water marks as
  // last observed by the ledger (the budget a shard claims), and the ledger epoch of
  // its last rebalance (a shard idle for a while gives up its claims).
  std::atomic<std::int64_t> base[kStatKinds][2];
  std::atomic<std::int64_t> removed_base[kStatKinds][2];
  std::int64_t high[kReportedKinds][3];
  std::uint64_t last_trigger = 0;

  ShardCounters();

  std::int64_t get(int kind, int pool) const noexcept {
    return current[kind][pool].load(std::memory_order_relaxed);
  }
  // The reported quantity q of one pool (0/1) as the shard sees it.
  std::int64_t reported(int q, int pool) const noexcept {
    switch (q) {
      case rActive:
        return get(kAllocation, pool) + get(kPending, pool);
      case rActiveBytes:
        return get(kAllocatedBytes, pool) + get(kPendingBytes, pool);
      default:
        return get(stored_of(q), pool);
    }
  }

  // A change of one counter; checks the limits of every reported quantity it feeds.
  // Kind is a template argument so that each call site folds to a few instructions.
  template <int kind>
  void add(int pool, std::int64_t delta) noexcept {
    if (delta > 0)
      raise<kind>(pool, delta);
    else if (delta < 0)
      lower<kind>(pool, -delta);
  }
  // A block handed out / given back by the program, with what its split or merge did
  // to the pool's inactive split blocks (either sign): one delta per operation. The
  // hot pair of the engine: a store per changed counter and, within the guards, two
  // compares per stored kind (its pool, both pools) and one branch.
  RESERVOIR_INLINE void on_allocate(int pool, std::int64_t bytes, std::int64_t requested,
                                    SplitChange split = {}) noexcept {
    const std::int64_t n = rise<kAllocation>(pool, 1);
    const std::int64_t b = rise<kAllocatedBytes>(pool, bytes);
    const std::int64_t r = rise<kRequestedBytes>(pool, requested);
    const std::int64_t sn = bump<kInactiveSplit>(pool, split.blocks);
    const std::int64_t sb = bump<kInactiveSplitBytes>(pool, split.bytes);
    const int s = 1 + pool, o = pool ^ 1;
    const int past =
        static_cast<int>(n > ceiling[kGuardBlocks][s]) |
        static_cast<int>(n + get(kAllocation, o) > ceiling[kGuardBlocks][0]) |
        static_cast<int>(b > ceiling[kGuardBytes][s]) |
        static_cast<int>(b + get(kAllocatedBytes, o) > ceiling[kGuardBytes][0]) |
        static_cast<int>(r > ceiling[kGuardRequested][s]) |
        static_cast<int>(r + get(kRequestedBytes, o) > ceiling[kGuardRequested][0]) |
        static_cast<int>(sn > ceiling[kGuardSplitBlocks][s]) |
        static_cast<int>(sn + get(kInactiveSplit, o) > ceiling[kGuardSplitBlocks][0]) |
        static_cast<int>(sb > ceiling[kGuardSplitBytes][s]) |
        static_cast<int>(sb + get(kInactiveSplitBytes, o) > ceiling[kGuardSplitBytes][0]);
    if (RESERVOIR_UNLIKELY(
            past | static_cast<int>(guard_epoch != limits_epoch.load(std::memory_order_relaxed))))
      unguarded(pool);
  }
  RESERVOIR_INLINE void on_free(int pool, std::int64_t bytes, std::int64_t requested,
                                SplitChange split = {}) noexcept {
    lower<kAllocation>(pool, 1);
    lower<kAllocatedBytes>(pool, bytes);
    lower<kRequestedBytes>(pool, requested);
    // Falls pass no ceiling; only a merge that left more inactive split memory rose.
    split_guards(pool, split, bump<kInactiveSplit>(pool, split.blocks),
                 bump<kInactiveSplitBytes>(pool, split.bytes));
  }
  // Inactive split blocks change alone (a pending free completing).
  RESERVOIR_INLINE void on_split_change(int pool, SplitChange split) noexcept {
    split_guards(pool, split, bump<kInactiveSplit>(pool, split.blocks),
                 bump<kInactiveSplitBytes>(pool, split.bytes));
  }
  // Whether the guards' invariant holds (true while they are stale).
  bool guards_hold() const noexcept;
  // A freed block waits for other streams (allocation -> pending; its requested bytes
  // stay counted until the free completes), and completes.
  void on_defer(int pool, std::int64_t bytes) noexcept {
    lower<kAllocation>(pool, 1);
    lower<kAllocatedBytes>(pool, bytes);
    raise<kPending>(pool, 1);
    raise<kPendingBytes>(pool, bytes);
  }
  void on_pending_done(int pool, std::int64_t bytes, std::int64_t requested) noexcept {
    lower<kPending>(pool, 1);
    lower<kPendingBytes>(pool, bytes);
    lower<kRequestedBytes>(pool, requested);
  }

 private:
  // The stored kind a reported quantity other than the two derived ones is.
  static constexpr int stored_of(int q) noexcept {
    constexpr int kinds[kReportedKinds] = {kAllocation,      kSegment,
                                           kAllocation,      kInactiveSplit,
                                           kAllocatedBytes,  kReservedBytes,
                                           kAllocatedBytes,  kInactiveSplitBytes,
                                           kRequestedBytes,  kOversizeAllocations,
                                           kOversizeSegments};
    return kinds[q];
  }
  static constexpr int reported_of(int kind) noexcept {
    switch (kind) {
      case kAllocation:
        return rAllocation;
      case kSegment:
        return rSegment;
      case kInactiveSplit:
        return rInactiveSplit;
      case kAllocatedBytes:
        return rAllocatedBytes;
      case kReservedBytes:
        return rReservedBytes;
      case kInactiveSplitBytes:
        return rInactiveSplitBytes;
      case kRequestedBytes:
        return rRequestedBytes;
      case kOversizeAllocations:
        return rOversizeAllocations;
      case kOversizeSegments:
        return rOversizeSegments;
      default:
        return -1;  // pending kinds are reported only inside the derived two
    }
  }
  std::int64_t lim(int q, int scope) const noexcept {
    return limit[q][scope].load(std::memory_order_relaxed);
  }
  // mine: the quantity's new value in pool; all: its new value over both pools.
  // Returns whether either passed its limit (both compares, no branch between them).
  int passed(int q, int pool, std::int64_t mine, std::int64_t all) const noexcept {
    return static_cast<int>(mine > lim(q, 1 + pool)) | static_cast<int>(all > lim(q, 0));
  }
  // Inactive split blocks changed (a split or a merge; either sign) to blocks and
  // bytes in pool: a rise past a ceiling takes the exact check.
  RESERVOIR_INLINE void split_guards(int pool, SplitChange split, std::int64_t blocks,
                                     std::int64_t bytes) noexcept {
    if (RESERVOIR_LIKELY(split.blocks <= 0 && split.bytes <= 0)) return;
    const int s = 1 + pool, o = pool ^ 1;
    if (RESERVOIR_UNLIKELY(blocks > ceiling[kGuardSplitBlocks][s] ||
                           blocks + get(kInactiveSplit, o) > ceiling[kGuardSplitBlocks][0] ||
                           bytes > ceiling[kGuardSplitBytes][s] ||
                           bytes + get(kInactiveSplitBytes, o) > ceiling[kGuardSplitBytes][0] ||
                           guard_epoch != limits_epoch.load(std::memory_order_relaxed)))
      unguarded(pool);
  }
  // A counter's change (of either sign for bump), no limit checked (the guards cover
  // it): a fall counts in removed too. Both return the new value.
  template <int kind>
  RESERVOIR_INLINE std::int64_t rise(int pool, std::int64_t delta) noexcept {  // delta >= 0
    const std::int64_t v = get(kind, pool) + delta;
    current[kind][pool].store(v, std::memory_order_relaxed);
    return v;
  }
  template <int kind>
  RESERVOIR_INLINE std::int64_t bump(int pool, std::int64_t delta) noexcept {
    const std::int64_t v = rise<kind>(pool, delta);
    if (delta < 0)
      removed[kind][pool].store(removed[kind][pool].load(std::memory_order_relaxed) - delta,
                                std::memory_order_relaxed);
    return v;
  }
  template <int kind>
  void raise(int pool, std::int64_t delta) noexcept {
    over |= raised<kind>(pool, delta);
  }
  // The exact check of a change the guards did not cover (its counters already
  // stored), then the guards of pool recomputed.
  RESERVOIR_COLD void unguarded(int pool) noexcept;
  // The increase of one counter; returns the bits (as `over`'s) of the reported
  // quantities it feeds that passed a limit.
  template <int kind>
  std::uint32_t raised(int pool, std::int64_t delta) noexcept {
    const int other = pool ^ 1;
    const std::int64_t v = get(kind, pool) + delta;
    current[kind][pool].store(v, std::memory_order_relaxed);
    const std::int64_t v_all = v + get(kind, other);
    // A guarded quantity raised outside on_allocate: the guards no longer hold.
    if constexpr (kind == kAllocation || kind == kAllocatedBytes || kind == kRequestedBytes ||
                  kind == kPending || kind == kPendingBytes || kind == kInactiveSplit ||
                  kind == kInactiveSplitBytes)
      guard_epoch = ~std::uint64_t{0};
    std::uint32_t hit = 0;
    if constexpr (reported_of(kind) >= 0)
      hit = static_cast<std::uint32_t>(passed(reported_of(kind), pool, v, v_all))
            << reported_of(kind);
    // The derived quantities rise with either of their two kinds.
    if constexpr (kind == kAllocation || kind == kPending) {
      constexpr int partner = kind == kAllocation ? kPending : kAllocation;
      const std::int64_t p = get(partner, pool);
      hit |=
          static_cast<std::uint32_t>(passed(rActive, pool, v + p, v_all + p + get(partner, other)))
          << rActive;
    } else if constexpr (kind == kAllocatedBytes || kind == kPendingBytes) {
      constexpr int partner = kind == kAllocatedBytes ? kPendingBytes : kAllocatedBytes;
      const std::int64_t p = get(partner, pool);
      hit |= static_cast<std::uint32_t>(
                 passed(rActiveBytes, pool, v + p, v_all + p + get(partner, other)))
             << rActiveBytes;
    }
    return hit;
  }
  template <int kind>
  void lower(int pool, std::int64_t delta) noexcept {
    current[kind][pool].store(get(kind, pool) - delta, std::memory_order_relaxed);
    removed[kind][pool].store(removed[kind][pool].load(std::memory_order_relaxed) + delta,
                              std::memory_order_relaxed);
  }
};

// Which shard this thread writes, for the ledger it last used (ledger ids are never
// reused, so a stale hint never matches). Constant-initialized: no initialization
// check. (Not initial-exec: that puts all of the library's TLS, its 2 KiB error
// buffers included, in the static block, and a library loaded by Python then fails to
// load: "cannot allocate memory in static TLS block".)
struct StatHint {
  std::uint64_t ledger = 0;
  ShardCounters* shard = nullptr;
};
extern constinit thread_local StatHint tls_stat_hint;

// A shard that no thread owns (owner 0, never a thread pointer) and no ledger counts:
// the "none yet" value of a shard hint, so that mine(hint) needs no null test.
extern ShardCounters unowned_shard;

class StatLedger {
 public:
  StatLedger();
  ~StatLedger();
  StatLedger(const StatLedger&) = delete;
  StatLedger& operator=(const StatLedger&) = delete;

  // The calling thread's shard, made (and brought into the budget) on its first use.
  // May throw std::bad_alloc on that first use only.
  RESERVOIR_INLINE ShardCounters& mine() {
    if (ShardCounters* s = by_thread_pointer()) return *s;
    return mine_slow();
  }
  // The calling thread's shard when hint is it (one compare: for a caller that keeps,
  // under its own lock, the shard its last operation used, or unowned_shard), else
  // mine().
  RESERVOIR_INLINE ShardCounters& mine(const ShardCounters& hint) {
    if (RESERVOIR_LIKELY(kThreadPointer &&
                         hint.owner.load(std::memory_order_relaxed) == thread_pointer()))
      return const_cast<ShardCounters&>(hint);
    return mine();
  }
  // Whether the calling thread's shard is found the fast way (the thread-pointer table,
  // no thread_local): for tests.
  bool mine_found_fast() const noexcept { return by_thread_pointer() != nullptr; }
  // The end of an operation: the rebalance the calling thread's shard owes, if any.
  // Makes no shard (a thread that counted nothing owes nothing).
  RESERVOIR_INLINE void settle_mine() noexcept {
    ShardCounters* s = by_thread_pointer();
    if (!s) s = find_mine();
    if (s && RESERVOIR_UNLIKELY(s->over)) rebalance(s);
  }
  // A fixed shard, owned by a lock: it must outlive the ledger's use of it.
  void attach(ShardCounters* shard);
  // Called at the end of an operation whose shard passed a limit. Allocates nothing
  // (room for every shard is reserved when one joins), so destructors may call it.
  void rebalance(ShardCounters* trigger);
  void reset_peaks();
  // Fills the StatArray-shaped counters of out (current/peak/allocated/freed).
  void read(DeviceStats* out);
  // Zeroes the accumulations (allocated, freed) of every shard.
  void reset_accumulated();
  // The sum of stored kind k in pool p over the thread shards and the retired counters
  // (what the pools' blocks add up to when no operation is under way; fixed shards
  // are their engines' own).
  std::int64_t pooled_total(int kind, int pool);
  // The first broken invariant of the ledger, or "" (validators): per quantity and
  // scope, the retired counters plus the live shards' limits are at most the peak;
  // spare shards hold nothing; and the calling thread's shard's guards hold.
  std::string problem();
  // Shards in the budget (thread shards of live threads and fixed shards), shards made
  // for threads so far, and rebalances so far (tests, reports).
  std::size_t live_shards();
  std::size_t thread_shards_made();
  std::uint64_t rebalances();

  // Where a thread that exits finds the ledger (shared with the threads' exit hooks,
  // which may outlive it): its mutex is the ledger's.
  struct Home {
    std::mutex mutex;
    StatLedger* ledger = nullptr;  // null once the ledger is gone
  };

 private:
  // The calling thread's shard through a small table indexed by the thread pointer
  // (one register read, no call: a thread_local in a shared library costs a
  // __tls_get_addr call, 5% of a pair), or nullptr (the four slots of its group taken
  // by other threads: the thread_local way then). A thread's shard sits in one of the
  // kProbe slots of its home group (one 32-byte part of a line), so that threads whose
  // pointers hash alike (8 threads share a home slot about a third of the time) each
  // keep the fast way. A slot's shard is this thread's only if its owner is this
  // thread's pointer: the ledger clears the owner when a thread exits, before its
  // pointer can be another thread's.
  // Whether thread_pointer() tells threads apart (it is never 0 where it does).
#if defined(__x86_64__)
  static constexpr bool kThreadPointer = true;
#else
  static constexpr bool kThreadPointer = false;
#endif
  static std::uintptr_t thread_pointer() noexcept {
#if defined(__x86_64__)
    std::uintptr_t tp;
    asm("mov %%fs:0, %0" : "=r"(tp));
    return tp;
#else
    return 0;  // elsewhere: the thread_local hint alone
#endif
  }
  static constexpr std::size_t kByThread = 128;  // slot_of() keeps 7 bits
  // Thread pointers of threads with default stacks lie 8 MiB apart: hashed, not masked.
  static std::size_t slot_of(std::uintptr_t tp) noexcept {
    return static_cast<std::size_t>((static_cast<std::uint64_t>(tp) * 0x9E3779B97F4A7C15ull) >>
                                    57);  // top 7 bits: 0..127
  }
  static constexpr std::size_t kProbe = 4;  // slots of a group: home ^ 0 .. home ^ 3
  RESERVOIR_INLINE ShardCounters* by_thread_pointer() const noexcept {
    const std::uintptr_t tp = thread_pointer();
    // Acquire: the shard was made by another thread (free on x86: a plain load).
    ShardCounters* s = by_thread_[slot_of(tp)].load(std::memory_order_acquire);
    return s && tp != 0 && s->owner.load(std::memory_order_relaxed) == tp ? s : by_thread_group(tp);
  }
  // The other slots of tp's group (slot_of(tp) ^ 1 .. ^ 3), or nullptr.
  RESERVOIR_COLD ShardCounters* by_thread_group(std::uintptr_t tp) const noexcept;
  RESERVOIR_COLD ShardCounters& mine_slow();
  RESERVOIR_COLD ShardCounters* find_mine() noexcept;  // the thread's, or nullptr
  // Under the mutex: a shard for a new thread (a spare, or a new one) in the budget.
  ShardCounters* take_shard_locked();
  // Under the mutex: a thread exited; its counters go to retired_, its shard to spares.
  void retire_locked(ShardCounters* shard);
  friend struct ThreadShards;
  void make_room_locked(std::size_t n);
  void rebalance_locked();  // every quantity
  // Quantity q over pool scope p (0 all, 1 small, 2 large); trigger: the shard that
  // passed its limit (served first when the headroom is short), or nullptr.
  void rebalance_one(int q, int p, const ShardCounters* trigger);
  const std::uint64_t id_;
  std::shared_ptr<Home> home_;
  std::mutex& mutex_;                                 // home_->mutex
  std::vector<std::unique_ptr<ShardCounters>> made_;  // every thread shard, live or spare
  std::vector<ShardCounters*> spare_;                 // of made_, owner gone, zeroed
  std::vector<ShardCounters*> live_;                  // in the budget: thread and fixed shards
  std::vector<ShardCounters*> fixed_;
  ShardCounters retired_;                 // counters of exited threads (never live)
  std::vector<std::int64_t> cur_, want_;  // scratch of rebalance_one, one per live shard
  std::atomic<ShardCounters*> by_thread_[kByThread] = {};  // by_thread_pointer()
  std::int64_t peak_[kReportedKinds][3] = {};
  std::uint64_t epoch_ = 0;  // rebalances so far
  // Rebalances after which a shard that triggered none gives up its claims.
  static constexpr std::uint64_t kClaimLifetime = 64;
};

// The statistics of one operation: settles the calling thread's shard when the scope
// ends, however it ends (a request that fails part way has raised counters too). Code
// that counts holds one (the pools' lock guards do) and reaches the shard through it
// or, in helpers, through StatLedger::mine(); a scope that counted nothing makes no shard.
class StatScope {
 public:
  explicit StatScope(StatLedger& ledger) noexcept : ledger_(ledger) {}
  ~StatScope() { ledger_.settle_mine(); }
  StatScope(const StatScope&) = delete;
  StatScope& operator=(const StatScope&) = delete;
  ShardCounters* operator->() const { return &ledger_.mine(); }
  ShardCounters& operator*() const { return ledger_.mine(); }

 private:
  StatLedger& ledger_;
};

// The same for a shard known when the scope begins (a fixed shard, or the thread's
// found by the caller): settling it is one compare, so the hot paths hold this one.
class ShardScope {
 public:
  RESERVOIR_INLINE explicit ShardScope(ShardCounters& shard) noexcept : shard_(shard) {}
  RESERVOIR_INLINE ~ShardScope() {
    if (RESERVOIR_UNLIKELY(shard_.over)) shard_.ledger->rebalance(&shard_);
  }
  ShardScope(const ShardScope&) = delete;
  ShardScope& operator=(const ShardScope&) = delete;
  ShardCounters* operator->() const { return &shard_; }
  ShardCounters& operator*() const { return shard_; }

 private:
  ShardCounters& shard_;
};

}  // namespace reservoir::detail
