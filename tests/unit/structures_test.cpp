// The engine's data structures on their own: AddressMap, SegmentMap, StatLedger, Lock,
// NodePool.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <latch>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/books/block.hpp"
#include "engine/books/block_owner.hpp"
#include "engine/books/segment_map.hpp"
#include "engine/stats/stat_ledger.hpp"
#include "util/address_map.hpp"
#include "util/insertion_set.hpp"
#include "util/lock.hpp"
#include "util/node_pool.hpp"

namespace reservoir::detail {
namespace {

// An element that counts the comparisons made of it: the operation count of a set.
struct Counted {
  std::uint64_t value;
  static inline std::uint64_t compares = 0;
  friend bool operator==(const Counted& a, const Counted& b) {
    ++compares;
    return a.value == b.value;
  }
};
struct CountedHash {
  std::size_t operator()(const Counted& c) const { return std::hash<std::uint64_t>{}(c.value); }
};

// A block's streams (record_stream): a use on the n-th new stream costs a bounded
// number of comparisons, not n (a million uses of one block on new streams took
// 9 us each, growing), and the members keep the order they were first named in.
TEST(InsertionSet, MembershipCostsAConstantNumberOfComparisons) {
  constexpr std::uint64_t kStreams = 20000;
  InsertionSet<Counted, CountedHash> set;
  Counted::compares = 0;
  for (std::uint64_t s = 1; s <= kStreams; ++s) {
    ASSERT_TRUE(set.insert(Counted{s}));
    ASSERT_FALSE(set.insert(Counted{s}));
  }
  // A scan would make about kStreams^2 / 2; the hash index a few per lookup.
  EXPECT_LT(Counted::compares, 8 * kStreams);
  ASSERT_EQ(set.size(), kStreams);
  std::uint64_t expected = 1;
  for (const Counted& c : set) EXPECT_EQ(c.value, expected++);

  // Removing a set of members (the uses recorded during a capture) keeps the rest,
  // in order, still indexed.
  InsertionSet<Counted, CountedHash> odd;
  for (std::uint64_t s = 1; s <= kStreams; s += 2) odd.insert(Counted{s});
  set.erase_all(odd);
  ASSERT_EQ(set.size(), kStreams / 2);
  EXPECT_EQ(set.begin()->value, 2u);
  EXPECT_TRUE(set.contains(Counted{kStreams}));
  EXPECT_FALSE(set.contains(Counted{1}));
  Counted::compares = 0;
  EXPECT_FALSE(set.insert(Counted{4}));
  EXPECT_LT(Counted::compares, 8u);
  set.clear();
  EXPECT_TRUE(set.empty());
  EXPECT_TRUE(set.insert(Counted{4}));
}

TEST(AddressMap, MatchesAReferenceMapUnderRandomOperations) {
  AddressMap<int> map;
  std::unordered_map<std::uintptr_t, int*> ref;
  std::vector<int> values(4096);
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200000; ++i) {
    std::uintptr_t key = (1 + rng() % 5000) * 512;
    if (rng() % 2) {
      if (!ref.count(key)) {
        int* v = &values[key / 512 % values.size()];
        map.insert(key, v);
        ref[key] = v;
      }
    } else {
      int* got = map.erase(key);
      auto it = ref.find(key);
      ASSERT_EQ(got, it == ref.end() ? nullptr : it->second);
      if (it != ref.end()) ref.erase(it);
    }
    ASSERT_EQ(map.size(), ref.size());
    // The table at most a quarter full (short probe runs for the hot erase); one key
    // more may wait in the front slot.
    ASSERT_LE(map.size() * 4, map.capacity() + 4);
  }
  for (auto& [k, v] : ref) ASSERT_EQ(map.find(k), v);
}

TEST(AddressMap, TheLastInsertWaitsInFrontOfTheTable) {
  AddressMap<int> map;
  int a = 1, b = 2, c = 3;
  map.insert(512, &a);
  map.insert(1024, &b);  // 512 enters the table, 1024 waits in front
  EXPECT_EQ(map.size(), 2u);
  EXPECT_EQ(map.find(512), &a);
  EXPECT_EQ(map.find(1024), &b);
  EXPECT_EQ(map.find(2048), nullptr);
  int seen = 0;
  map.for_each([&](std::uintptr_t, int* v) { seen += *v; });
  EXPECT_EQ(seen, 3);
  EXPECT_EQ(map.erase(1024), &b);
  EXPECT_EQ(map.erase(1024), nullptr);  // gone from the front, and in no table slot
  EXPECT_EQ(map.find(1024), nullptr);
  EXPECT_EQ(map.erase(512), &a);
  EXPECT_EQ(map.size(), 0u);
  // Allocate-free pairs of one block never touch the table: it never grows.
  const std::size_t capacity = map.capacity();
  for (std::uintptr_t k = 512; k < 512 * 1000; k += 512) {
    map.insert(k, &c);
    ASSERT_EQ(map.erase(k), &c);
  }
  EXPECT_EQ(map.capacity(), capacity);
  EXPECT_EQ(map.size(), 0u);
}

// An owner that owns nothing: the map only compares owners.
class NoBlocks final : public BlockOwner {
 public:
  bool free(std::uintptr_t) override { return false; }
  bool record_use(std::uintptr_t, StreamHandle) override { return false; }
  bool block_sizes(std::uintptr_t, std::size_t*, std::size_t*) override { return false; }
  bool segment_of(std::uintptr_t, BaseAllocation*) override { return false; }
  std::string explain_not_allocated(std::uintptr_t) override { return ""; }
};

TEST(SegmentMap, NamesTheSoleOwnerUntilASecondOwnerOrItsEnd) {
  NoBlocks first, second;
  Segment a, b, c;
  a.base = 0x7f0000000000;
  b.base = a.base + (4 << 20);
  c.base = b.base + (4 << 20);
  a.size = b.size = c.size = 2 << 20;
  a.set_owner(&first);
  b.set_owner(&first);
  c.set_owner(&second);
  {
    SegmentMap map;
    EXPECT_EQ(map.sole_owner(), nullptr);  // no segment yet
    map.insert(&a);
    EXPECT_EQ(map.sole_owner(), &first);
    map.insert(&b);
    map.erase(&a);
    EXPECT_EQ(map.sole_owner(), &first);  // every segment so far is first's
    map.insert(&c);
    EXPECT_EQ(map.sole_owner(), nullptr);  // second's pointers must be looked up
    map.erase(&c);
    EXPECT_EQ(map.sole_owner(), nullptr);  // and stay so: its frees may still come
  }
  {
    SegmentMap map;
    map.insert(&a);
    map.owner_gone(&second);  // not the sole owner: nothing changes
    EXPECT_EQ(map.sole_owner(), &first);
    map.owner_gone(&first);
    EXPECT_EQ(map.sole_owner(), nullptr);
    map.insert(&b);  // never again a sole owner
    EXPECT_EQ(map.sole_owner(), nullptr);
  }
}

// A thread's owner hint holds only while the generation it was taken under stays:
// every erase and every owner's end move it, to a value no map of the process had.
TEST(SegmentMap, OwnerHintsHoldUntilAnEraseOrAnOwnersEndAndNeverAcrossMaps) {
  NoBlocks first, second;
  Segment a, b;
  a.base = 0x7f0000000000;
  b.base = a.base + (4 << 20);
  a.size = b.size = 2 << 20;
  a.set_owner(&first);
  b.set_owner(&second);
  std::uint64_t earlier = 0;
  {
    SegmentMap map;
    map.insert(&a);
    map.insert(&b);
    const std::uint64_t g = map.generation();
    EXPECT_EQ(map.generation(), g);  // inserts keep it
    SegmentMap::remember(g, a.base, &a, &first);
    EXPECT_EQ(SegmentMap::hinted_owner(map.generation(), a.base + 100), &first);
    EXPECT_EQ(SegmentMap::hinted_owner(map.generation(), b.base), nullptr);  // not in a
    map.erase(&b);  // another segment's release: hints of every segment go stale
    EXPECT_NE(map.generation(), g);
    EXPECT_EQ(SegmentMap::hinted_owner(map.generation(), a.base + 100), nullptr);
    SegmentMap::remember(map.generation(), a.base, &a, &first);
    const std::uint64_t before_end = map.generation();
    map.owner_gone(&second);
    EXPECT_NE(map.generation(), before_end);
    EXPECT_EQ(SegmentMap::hinted_owner(map.generation(), a.base), nullptr);
    SegmentMap::remember(map.generation(), a.base, &a, &first);
    earlier = map.generation();
  }
  SegmentMap later;  // (likely at the same address as the map above)
  later.insert(&a);
  EXPECT_NE(later.generation(), earlier);
  EXPECT_EQ(SegmentMap::hinted_owner(later.generation(), a.base), nullptr);
}

// A thread taking turns between streams frees into their segments in turn: each
// segment keeps its hint in its page's slot, so every free finds its owner without a
// lookup; a segment whose page shares the slot replaces the hint there.
TEST(SegmentMap, OwnerHintsOfSegmentsOnDifferentPageSlotsHoldTogether) {
  NoBlocks first, second, third;
  Segment a, b, c;
  a.base = 0x7f0000000000;
  b.base = a.base + (2 << 20);                  // the next page slot
  c.base = a.base + (kOwnerHints * (2 << 20));  // a's page slot again
  a.size = b.size = c.size = 2 << 20;
  a.set_owner(&first);
  b.set_owner(&second);
  c.set_owner(&third);
  SegmentMap map;
  map.insert(&a);
  map.insert(&b);
  map.insert(&c);
  const std::uint64_t g = map.generation();
  SegmentMap::remember(g, a.base + 512, &a, &first);
  SegmentMap::remember(g, b.base + 512, &b, &second);
  EXPECT_EQ(SegmentMap::hinted_owner(g, a.base + 1024), &first);
  EXPECT_EQ(SegmentMap::hinted_owner(g, b.base + 1024), &second);
  SegmentMap::remember(g, c.base, &c, &third);
  EXPECT_EQ(SegmentMap::hinted_owner(g, c.base + 1024), &third);
  EXPECT_EQ(SegmentMap::hinted_owner(g, a.base + 1024), nullptr);  // c took the slot
  EXPECT_EQ(SegmentMap::hinted_owner(g, b.base + 1024), &second);
}

TEST(SegmentMap, FindsSegmentsIncludingUnalignedNeighbours) {
  SegmentMap map;
  Segment a, b, c;
  a.base = 0x7f0000000000;
  a.size = 20 << 20;
  b.base = a.base + a.size + 4096;  // shares a 2 MiB page with a's end
  b.size = 3 << 20;
  c.base = std::uintptr_t{1} << 50;
  c.size = 2 << 20;
  map.insert(&a);
  map.insert(&b);
  map.insert(&c);
  EXPECT_EQ(map.find(a.base), &a);
  EXPECT_EQ(map.find(a.base + a.size - 1), &a);
  EXPECT_EQ(map.find(a.base + a.size), nullptr);  // the 4 KiB gap
  EXPECT_EQ(map.find(b.base), &b);
  EXPECT_EQ(map.find(b.base + b.size - 1), &b);
  EXPECT_EQ(map.find(c.base + 100), &c);
  EXPECT_EQ(map.find(0x1000), nullptr);
  map.erase(&a);
  EXPECT_EQ(map.find(a.base), nullptr);
  EXPECT_EQ(map.find(b.base), &b);
}

TEST(StatLedger, PeaksOfSumsAreExactWhenSerialized) {
  StatLedger ledger;
  ShardCounters s1, s2;
  ledger.attach(&s1);
  ledger.attach(&s2);
  auto op = [&](ShardCounters& s, std::int64_t delta) {
    s.add<kAllocatedBytes>(1, delta);
    ShardScope{s};
  };
  std::mt19937_64 rng(3);
  std::int64_t a = 0, b = 0, peak = 0;
  for (int i = 0; i < 20000; ++i) {
    std::int64_t d = static_cast<std::int64_t>(rng() % 1000);
    if (rng() % 2) {
      if (rng() % 2 && a >= d) d = -d;
      a += d;
      op(s1, d);
    } else {
      if (rng() % 2 && b >= d) d = -d;
      b += d;
      op(s2, d);
    }
    peak = std::max(peak, a + b);
  }
  DeviceStats out;
  ledger.read(&out);
  EXPECT_EQ(out.allocated_bytes.all().current, a + b);
  EXPECT_EQ(out.allocated_bytes.all().peak, peak);
}

// Each thread counts in its own shard, made on its first change; a thread that exits
// leaves its counters to the ledger (a block one thread allocated and another freed
// leaves one shard up and one down: only the sum means anything) and its shard to the
// next new thread. The peaks stay those of the sums, the budget stays within them.
TEST(StatLedger, ThreadShardsFoldIntoTheLedgerWhenTheirThreadsExit) {
  StatLedger ledger;
  std::int64_t value = 0, peak = 0;
  auto op = [&](std::int64_t delta) {
    {
      StatScope scope(ledger);
      scope->add<kAllocatedBytes>(0, delta);
    }
    value += delta;
    peak = std::max(peak, value);
  };
  op(1000);  // this thread's shard
  EXPECT_EQ(ledger.thread_shards_made(), 1u);
  // Threads one after another: each raises by its number and frees what the last freed
  // not; a shard is made once and reused by every later thread.
  for (int t = 0; t < 50; ++t) {
    std::thread([&] {
      op(4096 + t);
      op(-(t % 2 ? 2048 : 0));
      ASSERT_EQ(ledger.problem(), "");
    }).join();
    op(-1000 + 1000);  // the main thread keeps counting between them
  }
  EXPECT_EQ(ledger.thread_shards_made(), 2u);
  EXPECT_EQ(ledger.live_shards(), 1u);  // the main thread's
  op(-value + 10);                      // the main thread frees what the exited threads allocated
  EXPECT_EQ(ledger.problem(), "");
  DeviceStats out;
  ledger.read(&out);
  EXPECT_EQ(out.allocated_bytes.pool[1].current, 10);
  EXPECT_EQ(out.allocated_bytes.pool[1].peak, peak);
  EXPECT_EQ(ledger.pooled_total(kAllocatedBytes, 0), 10);
  // Accumulated totals survive the folds: allocated - freed == current.
  EXPECT_EQ(out.allocated_bytes.pool[1].allocated - out.allocated_bytes.pool[1].freed, 10);
}

// Eight threads at once, generation after generation (threads come and go, their shards
// reused): every thread finds its shard through the thread-pointer table, none falls to
// the thread_local way (threads whose pointers hash to one slot share its group; a
// thread's slots are cleared when it exits, so no reused shard holds an old slot).
TEST(StatLedger, EveryThreadOfEightFindsItsShardTheFastWay) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "the thread-pointer table is x86-64 only";
#endif
  StatLedger ledger;
  constexpr int kThreads = 8;
  for (int generation = 0; generation < 40; ++generation) {
    std::atomic<int> fast{0};
    std::latch started(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&] {
        {
          StatScope scope(ledger);
          scope->add<kAllocatedBytes>(0, 4096);
        }
        started.arrive_and_wait();  // all eight live at once
        {
          StatScope scope(ledger);
          scope->add<kAllocatedBytes>(0, -4096);
        }
        if (ledger.mine_found_fast()) ++fast;
      });
    for (auto& th : threads) th.join();
    ASSERT_EQ(fast.load(), kThreads) << "generation " << generation;
  }
  EXPECT_EQ(ledger.problem(), "");
}

// One thread's operations, whatever pool or stream they come from, write one shard:
// no rebalance once its limits cover the level it returns to.
TEST(StatLedger, OneThreadNeedsNoRebalanceAtALevelItHasReached) {
  StatLedger ledger;
  auto op = [&](std::int64_t delta) {
    StatScope scope(ledger);
    scope->add<kAllocatedBytes>(1, delta);
  };
  op(1 << 20);
  op(-(1 << 20));
  const std::uint64_t before = ledger.rebalances();
  for (int i = 0; i < 10000; ++i) {
    op(1 << 20);
    op(-(1 << 20));
  }
  EXPECT_EQ(ledger.rebalances(), before);
}

// Below the peak but short of headroom (the others' claims from their own highs take
// it), the shard that passed its limit is served first: a stream climbing back under
// the peak rebalances a few times, not at every request.
TEST(StatLedger, TheRisingShardIsServedFirstWhenHeadroomIsShort) {
  StatLedger ledger;
  ShardCounters shards[4];
  for (ShardCounters& s : shards) ledger.attach(&s);
  auto op = [&](ShardCounters& s, std::int64_t delta) {
    s.add<kAllocation>(0, delta);
    ShardScope{s};
  };
  // Each shard in turn climbs to 1,000 blocks and back: the peak is 1,000 and every
  // shard claims its high-water mark.
  for (int round = 0; round < 2; ++round)
    for (ShardCounters& s : shards) {
      for (int i = 0; i < 1000; ++i) op(s, 1);
      for (int i = 0; i < 1000; ++i) op(s, -1);
    }
  // The first climbs again, one block at a time, to 900 (never a new peak).
  const std::uint64_t before = ledger.rebalances();
  for (int i = 0; i < 900; ++i) op(shards[0], 1);
  EXPECT_LE(ledger.rebalances() - before, 12u);
  DeviceStats out;
  ledger.read(&out);
  EXPECT_EQ(out.allocation.all().peak, 1000);
  EXPECT_EQ(out.allocation.all().current, 900);
}

// The guards of on_allocate and on_split_change skip compares that cannot fire: every
// peak of the seven quantities they raise stays exact, whatever the mix of pools,
// shards, deferred frees, splits and merges.
TEST(StatLedger, GuardedAllocationsKeepEveryPeakExact) {
  StatLedger ledger;
  ShardCounters shards[2];
  for (ShardCounters& s : shards) ledger.attach(&s);
  struct Live {
    int shard, pool;
    std::int64_t bytes, requested;
    bool pending;
  };
  std::vector<Live> live;
  // Reference values per quantity (allocation, active, allocated, active bytes,
  // requested, inactive split, its bytes) and scope (0 all, 1 small, 2 large), and
  // their peaks.
  std::int64_t value[7][3] = {}, peak[7][3] = {};
  auto change = [&](int pool, const std::int64_t(&d)[7]) {
    for (int q = 0; q < 7; ++q)
      for (int scope : {0, 1 + pool}) {
        value[q][scope] += d[q];
        peak[q][scope] = std::max(peak[q][scope], value[q][scope]);
      }
  };
  auto apply = [&](const Live& l, std::int64_t alloc, std::int64_t act, std::int64_t req) {
    change(l.pool, {alloc, act, alloc * l.bytes, act * l.bytes, req * l.requested, 0, 0});
  };
  // Split blocks per shard and pool (each of 512 bytes), as splits and merges leave them.
  std::int64_t splits[2][2] = {};
  std::mt19937_64 rng(11);
  // A split change of shard in pool: +1, -1 (if any) or none, as an operation's split
  // or merge leaves it; applied to the expected values.
  auto split_change = [&](int shard, int pool) {
    const int r = static_cast<int>(rng() % 3);
    const std::int64_t d = r == 0 ? 1 : r == 1 && splits[shard][pool] > 0 ? -1 : 0;
    splits[shard][pool] += d;
    change(pool, {0, 0, 0, 0, 0, d, 512 * d});
    return SplitChange{d, 512 * d};
  };
  for (int i = 0; i < 40000; ++i) {
    const int r = static_cast<int>(rng() % 12);
    if (r >= 10) {  // a split (+1 block) or a merge (-1 block, if any)
      const int shard = static_cast<int>(rng() % 2), pool = static_cast<int>(rng() % 2);
      const std::int64_t d = r == 10 || splits[shard][pool] == 0 ? 1 : -1;
      splits[shard][pool] += d;
      shards[shard].on_split_change(pool, {d, 512 * d});
      change(pool, {0, 0, 0, 0, 0, d, 512 * d});
    } else if (r < 5 || live.empty()) {
      Live l{static_cast<int>(rng() % 2), static_cast<int>(rng() % 2),
             512 * static_cast<std::int64_t>(1 + rng() % 64), 0, false};
      l.requested = 1 + static_cast<std::int64_t>(rng() % l.bytes);
      // The split of the block handed out lands in the same delta (apply first: within
      // one operation each quantity changes once, so the order is free).
      apply(l, 1, 1, 1);
      shards[l.shard].on_allocate(l.pool, l.bytes, l.requested, split_change(l.shard, l.pool));
      live.push_back(l);
    } else {
      const std::size_t k = rng() % live.size();
      Live& l = live[k];
      ShardCounters& s = shards[l.shard];
      if (!l.pending && r == 9) {  // the free waits for another stream
        s.on_defer(l.pool, l.bytes);
        apply(l, -1, 0, 0);
        l.pending = true;
      } else {
        if (l.pending) {  // the deferred free completes
          s.on_pending_done(l.pool, l.bytes, l.requested);
          apply(l, 0, -1, -1);
        } else {
          apply(l, -1, -1, -1);
          s.on_free(l.pool, l.bytes, l.requested, split_change(l.shard, l.pool));
        }
        live[k] = live.back();
        live.pop_back();
      }
    }
    for (ShardCounters& s : shards) {
      ShardScope{s};
      ASSERT_TRUE(s.guards_hold()) << "operation " << i;
    }
  }
  DeviceStats out;
  ledger.read(&out);
  const StatArray* arrays[7] = {
      &out.allocation,      &out.active,         &out.allocated_bytes,     &out.active_bytes,
      &out.requested_bytes, &out.inactive_split, &out.inactive_split_bytes};
  for (int q = 0; q < 7; ++q)
    for (int scope = 0; scope < 3; ++scope) {
      EXPECT_EQ(arrays[q]->pool[scope].current, value[q][scope]) << q << " " << scope;
      EXPECT_EQ(arrays[q]->pool[scope].peak, peak[q][scope]) << q << " " << scope;
    }
}

// Chunks asked for on cache lines are aligned to them and never share one (policy:compact
// hands blocks of one pool to threads working on their own streams); the default packs
// chunks at the platform's alignment.
TEST(NodePool, ChunksOnCacheLinesShareNone) {
  constexpr std::size_t kChunk = 104;  // a Block's size on x86-64: not a line's multiple
  NodePool lines(kChunk, 8, 64);
  NodePool packed(kChunk, 8);
  std::vector<std::uintptr_t> got, dense;
  for (int i = 0; i < 20; ++i) {  // over two slabs
    got.push_back(reinterpret_cast<std::uintptr_t>(lines.get()));
    dense.push_back(reinterpret_cast<std::uintptr_t>(packed.get()));
  }
  std::sort(got.begin(), got.end());
  std::sort(dense.begin(), dense.end());
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i] % 64, 0u);
    if (i > 0) {
      EXPECT_GE(got[i] / 64, (got[i - 1] + kChunk - 1) / 64 + 1) << "chunks share a line";
    }
  }
  bool shared = false;  // packed chunks of 104 bytes at 112-byte strides do share lines
  for (std::size_t i = 1; i < dense.size(); ++i)
    shared = shared || (dense[i - 1] + kChunk - 1) / 64 == dense[i] / 64;
  EXPECT_TRUE(shared);
  for (std::uintptr_t c : got) lines.put(reinterpret_cast<void*>(c));
  for (std::uintptr_t c : dense) packed.put(reinterpret_cast<void*>(c));
}

TEST(Lock, ExcludesConcurrentThreads) {
  Lock lock;
  long counter = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 100000; ++i) {
        lock.lock();
        ++counter;
        lock.unlock();
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(counter, 400000);
}

// Holders that sleep inside the lock (as a device call does) push waiters past the
// spin into the futex sleep; every waiter still gets in, and exclusion holds.
TEST(Lock, SleepingWaitersAllGetIn) {
  Lock lock;
  std::atomic<int> inside{0};
  int entries = 0;
  bool overlapped = false;
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        lock.lock();
        overlapped |= inside.fetch_add(1) != 0;
        ++entries;
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        inside.fetch_sub(1);
        lock.unlock();
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_FALSE(overlapped);
  EXPECT_EQ(entries, 400);
}

}  // namespace
}  // namespace reservoir::detail
