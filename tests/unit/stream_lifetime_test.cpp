// Streams come and go: a released stream's pool is recycled once it holds nothing, so
// a program that makes a million short-lived streams runs at constant cost and memory.
#include <gtest/gtest.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include "engine/allocators/caching_allocator.hpp"
#include "engine/device/device_engine.hpp"
#include "reservoir/sim_backend.hpp"

namespace reservoir::detail {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
// Under a sanitizer the process's resident memory says nothing about the allocator's:
// AddressSanitizer keeps freed host memory in quarantine (256 MiB), ThreadSanitizer
// keeps shadow and history.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define RESERVOIR_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define RESERVOIR_TEST_SANITIZED 1
#endif
#endif

#ifdef RESERVOIR_TEST_SLOW_BUILD
constexpr int kStreams = 20'000;  // the validator after every operation, or a sanitizer
#else
constexpr int kStreams = 1'000'000;
#endif

long resident_kib() {
  std::ifstream statm("/proc/self/statm");
  long size = 0, resident = 0;
  statm >> size >> resident;
  return resident * 4;
}

// Each stream allocates (a large and a small block), lends the small one to a
// long-lived stream (record_stream: its free waits there), frees both and is released.
// The long-lived stream's work completes every 16 streams, so some pools are still
// draining when released and are recycled later. Returns what the last 100,000
// streams cost against the first 100,000 (the thread's CPU time).
double run_streams_one_after_another() {
  SimBackend sim;
  CachingAllocator a(sim, Config::parse(""), 1);
  DeviceEngine& engine = a.engine(0);
  constexpr StreamHandle kWorker = 7;
  a.deallocate(a.allocate(MiB, kWorker, 0));

  constexpr int kChunk = kStreams / 50;
  std::vector<double> chunk_seconds;
  std::size_t pools_early = 0, capacity_early = 0;
  [[maybe_unused]] long resident_early = 0;  // unread under a sanitizer
  // The thread's own CPU time: the other tests that ctest runs beside this one take the
  // machine's cores, which wall time would count.
  auto thread_seconds = [] {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
  };
  double chunk_start = thread_seconds();
  for (int i = 1; i <= kStreams; ++i) {
    const auto s = static_cast<StreamHandle>(1000 + i);
    void* big = a.allocate(4 * MiB, s, 0);
    void* small = a.allocate(4096, s, 0);
    a.record_stream(small, kWorker);
    a.deallocate(small);
    a.deallocate(big);
    a.release_stream(s, 0);
    if (i % 16 == 0) sim.advance(kWorker);
    if (i == 1000) {
      pools_early = engine.stream_pool_count();
      capacity_early = engine.stream_table_capacity();
      resident_early = resident_kib();
    }
    if (i % kChunk == 0) {
      const double now = thread_seconds();
      chunk_seconds.push_back(now - chunk_start);
      chunk_start = now;
    }
  }
  EXPECT_LE(engine.stream_pool_count(), pools_early);
  EXPECT_EQ(engine.stream_table_capacity(), capacity_early);
  EXPECT_LE(engine.stream_table_size(), 32u);  // the worker and a few draining streams
#ifndef RESERVOIR_TEST_SANITIZED
  EXPECT_LE(resident_kib() - resident_early, 4 * 1024) << "KiB of resident memory grew";
#endif
  a.empty_cache(0);
  a.engine(0).validate();
  // The fastest of 5 chunks each (a chunk slowed by another process's use of the
  // caches is not the allocator's).
  auto fastest = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.front();
  };
  const double first = fastest({chunk_seconds.begin(), chunk_seconds.begin() + 5});
  const double last = fastest({chunk_seconds.end() - 5, chunk_seconds.end()});
  return last / first;
}

TEST(StreamLifetime, AMillionReleasedStreamsKeepConstantStructuresMemoryAndCost) {
  [[maybe_unused]] double ratio = run_streams_one_after_another();  // unread in slow builds
#ifndef RESERVOIR_TEST_SLOW_BUILD
  // Run alone the ratio is 0.96-1.05; beside other tests on a 2-core machine (one
  // core's sibling busy, caches shared) one run measured up to 1.66. A cost that grows
  // with the streams seen exceeds the bound in every run; noise rarely in three.
  for (int attempt = 1; attempt < 3 && ratio > 1.2; ++attempt)
    ratio = std::min(ratio, run_streams_one_after_another());
  RecordProperty("last_over_first", std::to_string(ratio));
  EXPECT_LE(ratio, 1.2) << "the last 100,000 streams cost more per stream than the first";
#endif
}

// A host wait on one stream visits only the pools whose frees wait on it: 1,000
// streams each with a free pending on a busy stream cost no event query when the
// program waits on another stream, and the frees waiting on the stream waited for
// complete (its pool checks one event).
TEST(StreamLifetime, AHostWaitVisitsOnlyThePoolsWaitingOnItsStream) {
  SimBackend sim;
  CachingAllocator a(sim, Config::parse(""), 1);
  DeviceEngine& engine = a.engine(0);
  constexpr StreamHandle kBusy = 5000, kWaited = 5001;
  for (StreamHandle s = 1; s <= 1000; ++s) {
    void* p = a.allocate(4096, s, 0);
    a.record_stream(p, kBusy);
    a.deallocate(p);
  }
  void* lent = a.allocate(4096, 2000, 0);
  a.record_stream(lent, kWaited);
  a.deallocate(lent);
  engine.validate();
  EXPECT_EQ(engine.stats().active.all().current, 1001);
  const std::uint64_t queries = sim.counters().event_queries;
  // What reservoir::Allocator::notify_host_wait does: the device learns of the wait
  // (the simulated one completes the stream's work), then the engine.
  sim.host_waited(0, kWaited);
  a.notify_host_wait(kWaited, 0);
  EXPECT_EQ(sim.counters().event_queries - queries, 1u);
  EXPECT_EQ(engine.stats().active.all().current, 1000);
  engine.validate();
  sim.host_waited(0, kBusy);
  a.notify_host_wait(kBusy, 0);
  EXPECT_EQ(engine.stats().active.all().current, 0);
  engine.validate();
}

// A released stream whose pool still holds a block keeps it (and its table entry)
// until the block is freed; then the next new stream recycles the pool.
TEST(StreamLifetime, APoolWithABlockIsRecycledOnceTheBlockIsFreed) {
  SimBackend sim;
  CachingAllocator a(sim, Config::parse(""), 1);
  DeviceEngine& engine = a.engine(0);
  void* kept = a.allocate(MiB, 1, 0);
  a.release_stream(1, 0);
  EXPECT_EQ(engine.stream_table_size(), 1u);
  EXPECT_GT(sim.used(0), 0u);
  a.deallocate(kept);
  // A new stream: the draining pool is recycled first, and the new stream takes it.
  a.deallocate(a.allocate(MiB, 2, 0));
  EXPECT_EQ(engine.stream_table_size(), 1u);
  EXPECT_EQ(engine.stream_pool_count(), 1u);
  // Empty at release: a fence on stream 2 holds the pool (and its cache) until the
  // stream's work is done; the next new stream then takes the pool with its cache.
  a.release_stream(2, 0);
  EXPECT_EQ(engine.stream_table_size(), 1u);
  EXPECT_GT(sim.used(0), 0u);
  engine.validate();
  sim.advance(2);
  a.empty_cache(0);  // gives the cache back and recycles the pool
  EXPECT_EQ(engine.stream_table_size(), 0u);
  EXPECT_EQ(sim.used(0), 0u);
  engine.validate();
  // A stream under an old handle starts afresh on a recycled pool.
  void* again = a.allocate(MiB, 1, 0);
  EXPECT_EQ(engine.stream_pool_count(), 1u);
  a.deallocate(again);
  engine.validate();
}

// A stream released twice, the second time once its block is freed: the pool is
// recycled at the second release and leaves the draining list then, so the sweep never
// recycles it again (twice in the recycled list, or taken from a stream that reuses it).
TEST(StreamLifetime, AStreamReleasedAgainAfterDrainingIsRecycledOnce) {
  SimBackend sim;
  CachingAllocator a(sim, Config::parse(""), 1);
  DeviceEngine& engine = a.engine(0);
  void* kept = a.allocate(MiB, 1, 0);
  a.release_stream(1, 0);  // holds a block: draining
  a.deallocate(kept);
  sim.set_eager(true);     // work completes as submitted: the fence too
  a.release_stream(1, 0);  // empty now, its fence passed at once: recycled
  engine.validate();
  EXPECT_EQ(engine.stream_table_size(), 0u);
  void* on_two = a.allocate(MiB, 2, 0);  // a new stream takes the recycled pool
  a.empty_cache(0);                      // sweeps whatever still drains
  void* on_three = a.allocate(MiB, 3, 0);
  engine.validate();
  EXPECT_EQ(engine.stream_table_size(), 2u);
  EXPECT_EQ(engine.stream_pool_count(), 2u);
  EXPECT_NE(a.base_allocation(on_two).base, a.base_allocation(on_three).base);
  a.deallocate(on_two);
  a.deallocate(on_three);
  engine.validate();
}

// The first stream's pool is reached without the table; once recycled, that shortcut
// is gone and its handle, reused, is a new stream like any other.
TEST(StreamLifetime, ReleasingTheFirstStreamLeavesNoStaleShortcut) {
  SimBackend sim;
  CachingAllocator a(sim, Config::parse(""), 1);
  a.deallocate(a.allocate(MiB, 5, 0));
  a.release_stream(5, 0);
  void* other = a.allocate(MiB, 6, 0);  // takes the recycled first pool
  void* first_again = a.allocate(MiB, 5, 0);
  BaseAllocation base_other = a.base_allocation(other);
  BaseAllocation base_first = a.base_allocation(first_again);
  EXPECT_NE(base_other.base, base_first.base);  // separate pools, separate segments
  a.engine(0).validate();
  a.deallocate(other);
  a.deallocate(first_again);
  a.engine(0).validate();
}

// The out-of-memory ladder pins the pool it works for (it locks the pool step by step):
// a sweep meanwhile (another thread's new stream) must not recycle it, or a block the
// ladder then hands out would land in a pool that serves another stream. Pinned, the
// released pool waits; unpinned, the next sweep recycles it.
TEST(StreamLifetime, APinnedPoolIsNotRecycledUntilUnpinned) {
  SimBackend sim;
  CachingAllocator a(sim, Config::parse(""), 1);
  DeviceEngine& engine = a.engine(0);
  sim.set_eager(true);  // fences pass as recorded: only the pin holds the pool back
  a.deallocate(a.allocate(MiB, 1, 0));
  StreamPool& pool = engine.pool(1);
  {
    StreamPool::Pin pin(pool);
    a.release_stream(1, 0);
    EXPECT_EQ(engine.stream_table_size(), 1u);  // still draining: pinned
    void* other = a.allocate(MiB, 2, 0);        // its sweep passes the pinned pool by
    EXPECT_EQ(engine.stream_pool_count(), 2u);
    EXPECT_TRUE(pin.serves(1));
    EXPECT_FALSE(pin.serves(2));
    engine.validate();
    a.deallocate(other);
  }
  void* third = a.allocate(MiB, 3, 0);  // the sweep recycles it now, and stream 3 takes it
  EXPECT_EQ(engine.stream_pool_count(), 2u);
  EXPECT_EQ(&engine.pool(3), &pool);
  {
    StreamPool::Pin pin(pool);
    EXPECT_FALSE(pin.serves(1));  // what the ladder checks after pinning: gone, it asks again
    EXPECT_TRUE(pin.serves(3));
  }
  engine.validate();
  a.deallocate(third);
  engine.validate();
}

// A released stream's cache serves the next new stream once the stream's work on it is
// done (its release fence passed): no memory given back to the device and taken again
// (cudaFree waits for the whole device), the same segment reused.
TEST(StreamLifetime, AReleasedStreamsCacheServesTheNextStreamOnceItsWorkIsDone) {
  SimBackend sim;
  CachingAllocator a(sim, Config::parse(""), 1);
  DeviceEngine& engine = a.engine(0);
  void* first = a.allocate(MiB, 1, 0);
  a.deallocate(first);
  a.release_stream(1, 0);
  EXPECT_EQ(engine.stream_table_size(), 1u);  // the fence has not passed yet
  sim.advance(1);                             // the stream's work completes
  const SimCounters before = sim.counters();
  void* second = a.allocate(MiB, 2, 0);  // sweeps the released pool, takes it
  EXPECT_EQ(second, first);
  EXPECT_EQ(sim.counters().allocs, before.allocs);
  EXPECT_EQ(sim.counters().frees, before.frees);
  EXPECT_EQ(engine.stream_pool_count(), 1u);
  EXPECT_EQ(engine.stream_table_size(), 1u);
  engine.validate();
  a.deallocate(second);
  // Its segment now names the new stream.
  std::vector<SegmentInfo> segments;
  engine.snapshot(&segments);
  ASSERT_EQ(segments.size(), 1u);
  EXPECT_EQ(segments[0].stream, 2u);
  engine.validate();
}

// While their fences have not passed (a device far behind), released caches wait, at
// most kDrainingKept of them: beyond, the oldest goes back to the device, so streams
// released faster than their work completes hold a bounded cache.
TEST(StreamLifetime, CachesWaitingForTheirStreamsAreBounded) {
  SimBackend sim;
  CachingAllocator a(sim, Config::parse(""), 1);
  DeviceEngine& engine = a.engine(0);
  for (StreamHandle s = 1; s <= 100; ++s) {
    a.deallocate(a.allocate(MiB, s, 0));
    a.release_stream(s, 0);
  }
  EXPECT_LE(engine.stream_table_size(), 10u);
  EXPECT_LE(sim.used(0), 10 * 2 * MiB);
  EXPECT_LE(engine.stream_pool_count(), 11u);
  engine.validate();
  sim.advance_all();
  a.empty_cache(0);
  EXPECT_EQ(sim.used(0), 0u);
  EXPECT_EQ(engine.stream_table_size(), 0u);
  engine.validate();
}

// A stream used again after its release did work its fence does not cover: its cache
// goes back to the device rather than to the next stream.
TEST(StreamLifetime, AStreamUsedAfterItsReleaseGivesItsCacheBack) {
  SimBackend sim;
  CachingAllocator a(sim, Config::parse(""), 1);
  DeviceEngine& engine = a.engine(0);
  a.deallocate(a.allocate(MiB, 1, 0));
  a.release_stream(1, 0);
  sim.advance(1);                       // the fence passes...
  a.deallocate(a.allocate(MiB, 1, 0));  // ...but the stream works on
  const SimCounters before = sim.counters();
  a.deallocate(a.allocate(MiB, 2, 0));  // sweeps the released pool
  EXPECT_EQ(sim.counters().frees, before.frees + 1);
  EXPECT_EQ(sim.counters().allocs, before.allocs + 1);
  engine.validate();
}

// No event for the fence (none to be had, or its record refused): the cache goes back
// to the device at the release, as it would without fences.
TEST(StreamLifetime, AReleaseWhoseFenceCannotBeRecordedGivesTheCacheBack) {
  SimBackend sim;
  CachingAllocator a(sim, Config::parse(""), 1);
  DeviceEngine& engine = a.engine(0);
  a.deallocate(a.allocate(MiB, 1, 0));
  sim.fail_operation_number(SimOp::record_event, 1, DeviceStatus::error);
  a.release_stream(1, 0);
  EXPECT_EQ(engine.stream_table_size(), 0u);
  EXPECT_EQ(sim.used(0), 0u);
  engine.validate();
  a.deallocate(a.allocate(MiB, 2, 0));
  engine.validate();
}

// policy:compact forgets a released stream's markers once they complete.
TEST(StreamLifetime, CompactForgetsReleasedStreams) {
  SimBackend sim;
  CachingAllocator a(sim, Config::parse("policy:compact"), 1);
  for (StreamHandle s = 1; s <= 20000; ++s) {
    void* p = a.allocate(MiB, s, 0);
    a.deallocate(p);
    a.release_stream(s, 0);
    sim.advance(s);
  }
  a.empty_cache(0);
  a.engine(0).validate();
  ASSERT_NE(a.engine(0).compact_if_made(), nullptr);
  EXPECT_LE(a.engine(0).compact_if_made()->streams(), 2u);
}

}  // namespace
}  // namespace reservoir::detail
