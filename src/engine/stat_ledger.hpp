// Statistics without a device-wide lock.
//
// Each cache shard (StreamPool) keeps its own ShardCounters, written only under its
// lock, so threads on different streams never share a counter's cache line. Totals
// (current, allocated, freed) are sums over shards. Peaks of the sums are kept exact
// by the StatLedger with a budget per shard:
//
//   Invariant (per reported quantity q and pool p in {all, small, large}):
//     sum over shards s of limit[s][q][p] <= peak[q][p]
//   so while every shard stays at or below its limits, the device-wide sum cannot
//   exceed the recorded peak. A shard whose quantity passes its limit sets `over`, and
//   at the end of the operation calls StatLedger::rebalance(), which sums the shards,
//   raises the peak if the sum exceeds it, and hands out the headroom (peak - sum)
//   again, first to the shards that have needed it (their own high-water marks).
// In single-threaded use every peak is exact. When several threads allocate on
// different streams at the same instant, a peak may lag by the allocations in flight
// at that instant (the sums are read without stopping the other shards).
//
// Stored kinds are what operations change; active and active_bytes are derived:
//   active == allocation + pending,  active_bytes == allocated_bytes + pending_bytes
// A deferred free moves a block from allocation to pending (active unchanged), so a
// cache hit and its free each update three counters (count, bytes, requested).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "reservoir/stats.hpp"

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

struct alignas(64) ShardCounters {
  // Written by the owning shard under its lock. added == current - base + removed
  // (base: current at the last reset_accumulated), so an increase costs one store.
  std::atomic<std::int64_t> current[kStatKinds][2];
  std::atomic<std::int64_t> removed[kStatKinds][2];
  // Written by the ledger, read by the shard: [quantity][0 = all, 1 = small, 2 = large].
  std::atomic<std::int64_t> limit[kReportedKinds][3];
  // Set when a quantity passed its limit during the current operation.
  bool over = false;
  // Cold: accumulation bases, own high-water marks as last observed by the ledger
  // (the budget a shard claims), and the ledger epoch of its last rebalance (a shard
  // idle for a while gives up its claims).
  std::atomic<std::int64_t> base[kStatKinds][2];
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
  // A block handed out / given back by the program: one delta per operation.
  void on_allocate(int pool, std::int64_t bytes, std::int64_t requested) noexcept {
    raise<kAllocation>(pool, 1);
    raise<kAllocatedBytes>(pool, bytes);
    raise<kRequestedBytes>(pool, requested);
  }
  void on_free(int pool, std::int64_t bytes, std::int64_t requested) noexcept {
    lower<kAllocation>(pool, 1);
    lower<kAllocatedBytes>(pool, bytes);
    lower<kRequestedBytes>(pool, requested);
  }
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
  // mine: the quantity's new value in pool; all: its new value over both pools.
  void check(int q, int pool, std::int64_t mine, std::int64_t all) noexcept {
    // Both compares, no branch between them (an int or, not a logical one).
    over |= static_cast<bool>(
        static_cast<int>(mine > limit[q][1 + pool].load(std::memory_order_relaxed)) |
        static_cast<int>(all > limit[q][0].load(std::memory_order_relaxed)));
  }
  template <int kind>
  void raise(int pool, std::int64_t delta) noexcept {
    const int other = pool ^ 1;
    const std::int64_t v = get(kind, pool) + delta;
    current[kind][pool].store(v, std::memory_order_relaxed);
    const std::int64_t v_all = v + get(kind, other);
    if constexpr (reported_of(kind) >= 0) check(reported_of(kind), pool, v, v_all);
    // The derived quantities rise with either of their two kinds.
    if constexpr (kind == kAllocation || kind == kPending) {
      constexpr int partner = kind == kAllocation ? kPending : kAllocation;
      const std::int64_t p = get(partner, pool);
      check(rActive, pool, v + p, v_all + p + get(partner, other));
    } else if constexpr (kind == kAllocatedBytes || kind == kPendingBytes) {
      constexpr int partner = kind == kAllocatedBytes ? kPendingBytes : kAllocatedBytes;
      const std::int64_t p = get(partner, pool);
      check(rActiveBytes, pool, v + p, v_all + p + get(partner, other));
    }
  }
  template <int kind>
  void lower(int pool, std::int64_t delta) noexcept {
    current[kind][pool].store(get(kind, pool) - delta, std::memory_order_relaxed);
    removed[kind][pool].store(removed[kind][pool].load(std::memory_order_relaxed) + delta,
                              std::memory_order_relaxed);
  }
};

class StatLedger {
 public:
  // The shard must outlive the ledger's use of it (shards live as long as the engine).
  void attach(ShardCounters* shard);
  // Called by a shard (under its own lock) whose quantity passed its limit.
  void rebalance(ShardCounters* trigger);
  void reset_peaks();
  // Fills the StatArray-shaped counters of out (current/peak/allocated/freed).
  void read(DeviceStats* out);
  // Zeroes the accumulations of one shard: call under that shard's lock.
  static void reset_accumulated(ShardCounters* shard);

 private:
  void rebalance_locked();           // every quantity
  void rebalance_one(int q, int p);  // quantity q over pool scope p (0 all, 1 small, 2 large)
  std::mutex mutex_;
  std::vector<ShardCounters*> shards_;
  std::vector<std::int64_t> cur_, want_;  // scratch of rebalance_one, one per shard
  std::int64_t peak_[kReportedKinds][3] = {};
  std::uint64_t epoch_ = 0;  // rebalances so far
  // Rebalances after which a shard that triggered none gives up its claims.
  static constexpr std::uint64_t kClaimLifetime = 64;
};

}  // namespace reservoir::detail
