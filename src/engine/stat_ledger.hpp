// Statistics without a device-wide lock.
//
// Each StreamPool keeps its own ShardCounters, written only under its lock, so
// threads on different streams never share a counter's cache line. Totals
// (current, allocated, freed) are sums over shards. Peaks of the sums are kept
// exact by the StatLedger with a budget per shard:
//
//   Invariant (per counter k and pool q in {all, small, large}):
//     sum over shards s of limit[s][k][q] <= peak[k][q]
//   so while every shard stays at or below its limit, the device-wide sum cannot
//   exceed the recorded peak. A shard whose counter passes its limit calls
//   StatLedger::rebalance(), which sums the shards, raises the peak if the sum
//   exceeds it, and hands out the headroom (peak - sum) again, first to the shards
//   that have needed it (their own high-water marks).
// In single-threaded use every peak is exact. When several threads allocate on
// different streams at the same instant, a peak may lag by the allocations in
// flight at that instant (the sums are read without stopping the other shards).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "reservoir/stats.hpp"

namespace reservoir::detail {

enum StatKind : int {
  kAllocation,
  kSegment,
  kActive,
  kInactiveSplit,
  kAllocatedBytes,
  kReservedBytes,
  kActiveBytes,
  kInactiveSplitBytes,
  kRequestedBytes,
  kOversizeAllocations,  // pool-less: kept under the pool of the block
  kOversizeSegments,
  kStatKinds
};

struct alignas(64) ShardCounters {
  // [kind][0 = small, 1 = large]; written by the owning shard under its lock.
  // The total added since the last reset_accumulated is derived, not counted:
  //   added == current - base + removed   (base: current at that reset)
  // so an increase costs one counter update and a decrease two.
  std::atomic<std::int64_t> current[kStatKinds][2];
  std::atomic<std::int64_t> removed[kStatKinds][2];
  std::atomic<std::int64_t> base[kStatKinds][2];
  // [kind][0 = all, 1 = small, 2 = large]; written by the ledger, read by the shard.
  std::atomic<std::int64_t> limit[kStatKinds][3];
  // Own high-water marks, as last observed by the ledger: the budget a shard claims.
  std::int64_t high[kStatKinds][3];
  // Ledger epoch of this shard's last rebalance. A shard idle for a while gives up
  // its claims, so old streams do not hold budget that active ones need.
  std::uint64_t last_trigger = 0;
  // Set when a counter passed its limit during the current operation.
  bool over = false;

  ShardCounters();

  // pool: 0 small, 1 large.
  void add(int kind, int pool, std::int64_t delta) noexcept {
    auto& c = current[kind][pool];
    std::int64_t v = c.load(std::memory_order_relaxed) + delta;
    c.store(v, std::memory_order_relaxed);
    if (delta > 0) {
      std::int64_t all = v + current[kind][pool ^ 1].load(std::memory_order_relaxed);
      if (v > limit[kind][1 + pool].load(std::memory_order_relaxed) ||
          all > limit[kind][0].load(std::memory_order_relaxed))
        over = true;
    } else if (delta < 0) {
      removed[kind][pool].store(removed[kind][pool].load(std::memory_order_relaxed) - delta,
                                std::memory_order_relaxed);
    }
  }
  std::int64_t get(int kind, int pool) const noexcept {
    return current[kind][pool].load(std::memory_order_relaxed);
  }
};

class StatLedger {
 public:
  // The shard must outlive the ledger's use of it (shards live as long as the engine).
  void attach(ShardCounters* shard);
  // Called by a shard (under its own lock) whose counter passed its limit.
  void rebalance(ShardCounters* trigger);
  void reset_peaks();
  // Fills the StatArray-shaped counters of out (current/peak/allocated/freed).
  void read(DeviceStats* out);
  // Zeroes added/removed of one shard: call under that shard's lock.
  static void reset_accumulated(ShardCounters* shard);

 private:
  void rebalance_locked();
  std::mutex mutex_;
  std::vector<ShardCounters*> shards_;
  std::int64_t peak_[kStatKinds][3] = {};
  std::uint64_t epoch_ = 0;  // rebalances so far
  // Rebalances after which a shard that triggered none gives up its claims.
  static constexpr std::uint64_t kClaimLifetime = 64;
};

}  // namespace reservoir::detail
