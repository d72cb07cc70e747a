// policy:compact's stream caches (engine/compact/stream_caches.hpp): a stream's frees
// wait for its next request of the same size, served without the device-wide pool (one
// large block too, where the pool would place it); a request no cache serves first
// returns every cached block but those of its size, and those too before the pool
// takes physical memory, so the pool decides over all freed memory; cached blocks are
// freed for the program, its statistics and snapshots; a released stream's cache drains.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/allocators/caching_allocator.hpp"
#include "engine/compact/compact_pool.hpp"
#include "engine/device/device_engine.hpp"
#include "reservoir/allocator.hpp"
#include "reservoir/errors.hpp"
#include "reservoir/sim_backend.hpp"
#include "support/sim_allocator.hpp"

namespace reservoir::detail {
namespace {

using test::SimAllocator;
constexpr std::size_t MiB = std::size_t{1} << 20;

SimOptions sim() {
  SimOptions o;
  o.capacity = 1024 * MiB;
  return o;
}

struct Engine {
  Engine() : sim(detail::sim()), a(sim, Config::parse("policy:compact"), 1) {}
  SimBackend sim;
  CachingAllocator a;
  std::size_t cached() { return a.engine(0).compact_if_made()->stream_cached_blocks(); }
};

// A stream reusing the blocks it freed: the same block each time, no event recorded,
// no device call at all, and the statistics as for any free.
TEST(CompactStreamCache, AStreamReusesItsOwnFreedBlockWithNoDeviceCall) {
  Engine e;
  void* first = e.a.allocate(MiB, 1, 0);
  e.a.deallocate(first);
  EXPECT_EQ(e.cached(), 1u);
  const SimCounters before = e.sim.counters();
  for (int i = 0; i < 100; ++i) {
    void* p = e.a.allocate(MiB, 1, 0);
    EXPECT_EQ(p, first);
    e.sim.submit_work(1);
    e.a.deallocate(p);
  }
  const SimCounters after = e.sim.counters();
  EXPECT_EQ(after.events_recorded, before.events_recorded);
  EXPECT_EQ(after.event_queries, before.event_queries);
  EXPECT_EQ(after.stream_waits, before.stream_waits);
  EXPECT_EQ(after.maps, before.maps);
  const DeviceStats st = e.a.engine(0).stats();
  EXPECT_EQ(st.allocation.all().current, 0);
  EXPECT_EQ(st.allocated_bytes.all().current, 0);
  EXPECT_EQ(st.allocation.all().allocated, 101);
  EXPECT_EQ(st.allocation.all().freed, 101);
  e.a.engine(0).validate();
}

// Another stream's request of the size stream 1 keeps takes other memory that is mapped
// already (the rest of the page), and stream 1 keeps its block: two streams taking turns
// with one size each reuse their own block, with no device-side wait at any turn (they
// handed one block back and forth, a wait and an event each turn, while every miss
// drained every cache).
TEST(CompactStreamCache, StreamsTakingTurnsWithOneSizeKeepTheirOwnBlocks) {
  SimAllocator s("policy:compact", sim());
  void* p = s.a.allocate(MiB, 1, 0);
  s.a.deallocate(p);
  const std::int64_t reserved = s.a.stats(0).reserved_bytes.all().current;
  void* q = s.a.allocate(MiB, 2, 0);
  EXPECT_NE(q, p);
  s.a.deallocate(q);
  const SimCounters before = s.sim->counters();
  for (int i = 0; i < 100; ++i) {
    const StreamHandle stream = 1 + static_cast<StreamHandle>(i % 2);
    void* r = s.a.allocate(MiB, stream, 0);
    EXPECT_EQ(r, stream == 1 ? p : q);
    s.sim->submit_work(stream);
    s.a.deallocate(r);
  }
  const SimCounters after = s.sim->counters();
  EXPECT_EQ(after.stream_waits, before.stream_waits);
  EXPECT_EQ(after.events_recorded, before.events_recorded);
  EXPECT_EQ(s.a.stats(0).reserved_bytes.all().current, reserved);
  s.a.validate();
}

// Before the pool takes physical memory it drains every cache, the blocks of the
// request's size too: with no other mapped memory for it, stream 2 gets stream 1's
// freed block (no new memory), ordered after stream 1's work on the device.
TEST(CompactStreamCache, AnotherStreamsRequestGetsTheCachedBlockBeforeNewMemory) {
  SimAllocator s("policy:compact", sim());
  void* p = s.a.allocate(MiB, 1, 0);
  void* fill = s.a.allocate(MiB, 1, 0);  // the rest of the page
  s.sim->submit_work(1);
  const std::uint64_t used_until = s.sim->submitted(1);
  s.a.deallocate(p);
  const std::int64_t reserved = s.a.stats(0).reserved_bytes.all().current;
  void* q = s.a.allocate(MiB, 2, 0);
  EXPECT_EQ(q, p);
  EXPECT_EQ(s.a.stats(0).reserved_bytes.all().current, reserved);
  EXPECT_TRUE(s.sim->ordered_after(2, 1, used_until));
  s.a.deallocate(q);
  s.a.deallocate(fill);
  s.a.validate();
}

// Only sizes the stream asked for lately are kept: a block of another size goes back
// to the pool at once.
TEST(CompactStreamCache, KeepsOnlySizesTheStreamAskedForLately) {
  Engine e;
  std::vector<void*> old;
  for (std::size_t k = 1; k <= 6; ++k) old.push_back(e.a.allocate(k * 64 * 1024, 1, 0));
  // The last four sizes asked for are 3..6 x 64 KiB.
  e.a.deallocate(old[0]);
  e.a.deallocate(old[1]);
  EXPECT_EQ(e.cached(), 0u);
  e.a.deallocate(old[5]);
  EXPECT_EQ(e.cached(), 1u);
  e.a.engine(0).validate();
  for (std::size_t k = 2; k <= 4; ++k) e.a.deallocate(old[k]);
  EXPECT_EQ(e.cached(), 4u);
  e.a.engine(0).validate();
}

// A large block freed and asked for again on its stream (a loop over one large buffer)
// waits in the stream's cache, as one block: the same block each time, no device call,
// no page bookkeeping, the statistics as for any free; another size drains it.
TEST(CompactStreamCache, ALargeBlockAskedForAgainIsReusedWithNoDeviceCall) {
  Engine e;
  void* first = e.a.allocate(64 * MiB, 1, 0);
  e.a.deallocate(first);
  EXPECT_EQ(e.cached(), 1u);
  const SimCounters before = e.sim.counters();
  for (int i = 0; i < 100; ++i) {
    void* p = e.a.allocate(64 * MiB, 1, 0);
    EXPECT_EQ(p, first);
    e.sim.submit_work(1);
    e.a.deallocate(p);
    EXPECT_EQ(e.cached(), 1u);
  }
  const SimCounters after = e.sim.counters();
  EXPECT_EQ(after.events_recorded, before.events_recorded);
  EXPECT_EQ(after.event_queries, before.event_queries);
  EXPECT_EQ(after.maps, before.maps);
  EXPECT_EQ(after.unmaps, before.unmaps);
  DeviceStats st = e.a.engine(0).stats();
  EXPECT_EQ(st.allocated_bytes.all().current, 0);
  EXPECT_EQ(st.allocated_bytes.all().peak, static_cast<std::int64_t>(64 * MiB));
  EXPECT_EQ(st.allocation.large().allocated, 101);
  EXPECT_EQ(st.allocation.large().freed, 101);
  e.a.engine(0).validate();
  // One large block at most: a second one of the size goes to the pool.
  void* p = e.a.allocate(64 * MiB, 1, 0);
  void* q = e.a.allocate(64 * MiB, 1, 0);
  e.a.deallocate(p);
  e.a.deallocate(q);
  EXPECT_EQ(e.cached(), 1u);
  e.a.engine(0).validate();
  // A request of another size is the pool's: every cache drains first.
  void* r = e.a.allocate(3 * MiB, 1, 0);
  EXPECT_EQ(e.cached(), 0u);
  e.a.deallocate(r);
  e.a.engine(0).validate();
  st = e.a.engine(0).stats();
  EXPECT_EQ(st.allocation.all().current, 0);
}

// Once the pool has kept a large block, the loop over it runs without the pool's lock:
// while no pool operation ran since, the pool's decision stands. Here another thread
// holds the pool's lock throughout; the loop's pairs still complete.
TEST(CompactStreamCache, ALargeLoopNeedsNotThePoolsLockOnceKept) {
  Engine e;
  void* first = e.a.allocate(64 * MiB, 1, 0);
  e.a.deallocate(first);  // kept: the pool's decision, under its lock
  ASSERT_EQ(e.cached(), 1u);
  CompactPool& pool = *e.a.engine(0).compact_if_made();
  std::unique_lock<Lock> held(pool.lock());
  std::atomic<bool> done{false};
  std::thread loop([&] {
    for (int i = 0; i < 100; ++i) {
      void* p = e.a.allocate(64 * MiB, 1, 0);
      EXPECT_EQ(p, first);
      e.a.deallocate(p);
    }
    done = true;
  });
  for (int waited = 0; waited < 200 && !done; ++waited)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(done) << "the pairs waited for the pool's lock";
  held.unlock();
  loop.join();
  e.a.engine(0).validate();
}

// A large block waits in the cache only where the pool would place the next request of
// its size anyway: not when a free block precedes it (the merged hole starts there) or
// another free block fits more tightly (the pool's best fit is elsewhere); a free block
// after it merges into its hole, which starts at it.
TEST(CompactStreamCache, ALargeBlockIsKeptOnlyWhereThePoolWouldPlaceItsSize) {
  {  // a tighter hole elsewhere: same size, lower address
    Engine e;
    void* a = e.a.allocate(8 * MiB, 1, 0);
    void* g1 = e.a.allocate(MiB, 1, 0);
    void* b = e.a.allocate(8 * MiB, 1, 0);
    void* g2 = e.a.allocate(MiB, 1, 0);
    e.a.deallocate(a);
    EXPECT_EQ(e.cached(), 1u);
    e.a.empty_cache(0);  // a drains into the pool: an 8 MiB hole below b
    EXPECT_EQ(e.cached(), 0u);
    e.a.deallocate(b);
    EXPECT_EQ(e.cached(), 0u);
    e.a.engine(0).validate();
    e.a.deallocate(g1);
    e.a.deallocate(g2);
    e.a.engine(0).validate();
  }
  {  // a free block before it
    Engine e;
    void* a = e.a.allocate(8 * MiB, 1, 0);
    void* b = e.a.allocate(8 * MiB, 1, 0);
    void* g = e.a.allocate(MiB, 1, 0);
    e.a.deallocate(a);
    e.a.empty_cache(0);
    e.a.deallocate(b);
    EXPECT_EQ(e.cached(), 0u);
    e.a.deallocate(g);
    e.a.engine(0).validate();
  }
  {  // a free block after it: the merged hole starts at it
    Engine e;
    void* a = e.a.allocate(8 * MiB, 1, 0);
    void* b = e.a.allocate(8 * MiB, 1, 0);
    void* g = e.a.allocate(MiB, 1, 0);
    e.a.deallocate(a);  // kept
    e.a.deallocate(b);  // the one large place is taken: b goes to the pool, a free hole
    EXPECT_EQ(e.cached(), 1u);
    void* again = e.a.allocate(8 * MiB, 1, 0);
    EXPECT_EQ(again, a);
    EXPECT_EQ(e.cached(), 0u);
    e.a.deallocate(again);  // b's hole after it
    EXPECT_EQ(e.cached(), 1u);
    EXPECT_EQ(e.a.allocate(8 * MiB, 1, 0), a);
    e.a.deallocate(a);
    e.a.deallocate(g);
    e.a.engine(0).validate();
  }
}

// A cached block is freed for the program: freeing it again is refused, its sizes are
// not answered, a snapshot shows it inactive, and empty_cache gives its memory back.
TEST(CompactStreamCache, ACachedBlockIsFreedForTheProgram) {
  SimAllocator s("policy:compact", sim());
  void* p = s.a.allocate(MiB, 1, 0);
  s.a.deallocate(p);
  EXPECT_THROW(s.a.deallocate(p), InvalidPointerError);
  EXPECT_THROW((void)s.a.block_size(p), InvalidPointerError);
  bool seen = false;
  for (const SegmentInfo& seg : s.a.snapshot().segments)
    for (const BlockInfo& b : seg.blocks)
      if (b.address == reinterpret_cast<std::uintptr_t>(p)) {
        seen = true;
        EXPECT_EQ(b.state, BlockStateInfo::inactive);
      }
  EXPECT_TRUE(seen);
  EXPECT_EQ(s.a.stats(0).active_bytes.all().current, 0);
  s.a.empty_cache();
  EXPECT_EQ(s.a.stats(0).reserved_bytes.all().current, 0);
  s.a.validate();
}

// A block another stream used (record_stream) needs a fence: it is never cached.
TEST(CompactStreamCache, ABlockUsedOnAnotherStreamIsNotCached) {
  Engine e;
  void* p = e.a.allocate(MiB, 1, 0);
  e.a.record_stream(p, 2);
  e.a.deallocate(p);
  EXPECT_EQ(e.cached(), 0u);
  e.a.engine(0).validate();
}

// Releasing a stream drains its cache before its markers are recorded: its block goes
// back to the pool, and the cache serves the next new stream.
TEST(CompactStreamCache, ReleasingAStreamDrainsItsCache) {
  Engine e;
  void* p = e.a.allocate(MiB, 1, 0);
  e.a.deallocate(p);
  EXPECT_EQ(e.cached(), 1u);
  e.a.release_stream(1, 0);
  EXPECT_EQ(e.cached(), 0u);
  e.a.engine(0).validate();
  e.a.empty_cache(0);
  EXPECT_EQ(e.a.engine(0).stats().reserved_bytes.all().current, 0);
}

// Threads on their own streams, each reusing its blocks (small ones, and large ones the
// pool kept), while the main thread validates and reads the statistics: every walk
// sees one consistent state.
TEST(CompactStreamCache, ThreadsOnTheirOwnStreamsBesideTheValidator) {
  Engine e;
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      const StreamHandle stream = 10 + static_cast<StreamHandle>(t);
      int i = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        // Two threads loop over small sizes, two over a large one that changes every 50
        // pairs (kept by the pool's decision, then at once, then drained).
        const std::size_t size =
            t < 2 ? (1 + (i % 3)) * 256 * 1024 : ((i / 50) % 2 ? 4 : 6) * MiB + t * 4096;
        ++i;
        void* p = e.a.allocate(size, stream, 0);
        e.a.deallocate(p);
      }
    });
  for (int i = 0; i < 300; ++i) {
    e.a.engine(0).validate();
    (void)e.a.engine(0).stats();
  }
  stop = true;
  for (auto& t : threads) t.join();
  e.a.engine(0).validate();
  EXPECT_EQ(e.a.engine(0).stats().allocation.all().current, 0);
}

}  // namespace
}  // namespace reservoir::detail
