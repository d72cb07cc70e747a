// CUDA graph captures under policy:compact: the capture's requests go to its private
// pool (as under the default policy); while a capture is under way the compact pool
// records no event, queries none, unmaps nothing and gives nothing back (the simulated
// device refuses each of those during a capture and counts it), its stream caches still
// serve, and what they do not serve comes from the stream's default pool; the policy
// may be switched with a capture under way.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "reservoir/allocator.hpp"
#include "reservoir/errors.hpp"
#include "reservoir/sim_backend.hpp"
#include "support/sim_allocator.hpp"

namespace reservoir::detail {
namespace {

using test::SimAllocator;
constexpr std::size_t MiB = std::size_t{1} << 20;

SimOptions sim_options() {
  SimOptions o;
  o.capacity = 4096 * MiB;
  return o;
}

// A capture on `capturing` routed to a new private pool, begun as PyTorch begins one
// (the allocator first, then the device); the routing's use of the pool is the graph's
// (release_pool gives it up).
struct Capture {
  Capture(SimAllocator& s, StreamHandle capturing) : s(s), stream(capturing) {
    pool = s.a.create_pool({}, 0);
    s.a.begin_capture_to_pool(pool, stream, 0);
    s.a.release_pool(pool, 0);
    s.sim->begin_capture(stream);
  }
  void end() {
    if (ended) return;
    ended = true;
    s.sim->end_capture(stream);
    s.a.end_allocate_to_pool(pool, 0);
  }
  ~Capture() { end(); }
  SimAllocator& s;
  StreamHandle stream;
  PoolId pool;
  bool ended = false;
};

std::vector<SegmentInfo> segments_of(Allocator& a, bool compact_arenas) {
  std::vector<SegmentInfo> out;
  for (const SegmentInfo& seg : a.snapshot().segments)
    if (seg.pool == PoolId{} && seg.is_expandable == compact_arenas) out.push_back(seg);
  return out;
}

// Eager work beside a capture touches every path of the compact pool that a capture
// forbids (fences, host waits, a released stream, empty_cache, page moves): none of
// them makes a forbidden call, the capture's blocks are its pool's, and afterwards
// the compact pool serves again, the validator content.
TEST(CompactCapture, EagerWorkBesideACaptureMakesNoForbiddenCall) {
  SimAllocator s("policy:compact", sim_options());
  const StreamHandle capturing = 1, eager = 2, side = 3;
  // Memory used on several streams and freed: pages fenced by markers still owed.
  std::vector<void*> before;
  for (std::size_t size : {MiB, 6 * MiB, 40 * MiB}) {
    void* p = s.a.allocate(size, eager, 0);
    s.a.record_stream(p, side);
    s.sim->submit_work(side);
    before.push_back(p);
  }
  void* warm = s.a.allocate(8 * MiB, capturing, 0);  // a warm-up on the capture stream
  s.a.deallocate(warm);
  for (void* p : before) s.a.deallocate(p);
  const SimCounters at_begin = s.sim->counters();
  {
    Capture c(s, capturing);
    void* graph = s.a.allocate(8 * MiB, capturing, 0);
    const std::vector<SegmentInfo> snap = s.a.snapshot().segments;
    bool in_pool = false;
    for (const SegmentInfo& seg : snap)
      if (seg.pool == c.pool && graph >= reinterpret_cast<void*>(seg.address) &&
          graph < reinterpret_cast<void*>(seg.address + seg.total_size))
        in_pool = true;
    EXPECT_TRUE(in_pool) << "the capture's request was not served by its private pool";
    // Eager requests of every size on other streams, frees, a host wait, a released
    // stream, empty_cache and a record_stream, all while the capture is under way.
    std::vector<void*> during;
    for (std::size_t size : {std::size_t{512}, MiB, 6 * MiB, 40 * MiB, 100 * MiB})
      during.push_back(s.a.allocate(size, eager, 0));
    s.a.record_stream(during[1], side);
    s.a.deallocate(during[1]);
    s.a.deallocate(during[3]);
    s.a.notify_host_wait(side, 0);
    s.a.release_stream(side, 0);
    s.a.empty_cache();
    during.push_back(s.a.allocate(40 * MiB, eager, 0));
    s.a.validate();
    const SimCounters now = s.sim->counters();
    EXPECT_EQ(now.event_queries, at_begin.event_queries);
    EXPECT_EQ(now.unmaps, at_begin.unmaps);
    EXPECT_EQ(now.physical_releases, at_begin.physical_releases);
    EXPECT_EQ(now.frees, at_begin.frees);
    EXPECT_EQ(s.sim->capture_violations(), 0u);
    c.end();
    s.a.deallocate(graph);
    for (std::size_t i : {0, 2, 4, 5}) s.a.deallocate(during[i]);
  }
  EXPECT_EQ(s.sim->capture_violations(), 0u);
  s.a.validate();
  // The compact pool's shared path again: a request reuses the pages freed before.
  const std::int64_t reserved = s.a.stats(0).reserved_bytes.all().current;
  void* again = s.a.allocate(40 * MiB, eager, 0);
  EXPECT_EQ(s.a.stats(0).reserved_bytes.all().current, reserved);
  s.a.deallocate(again);
  s.a.empty_cache();
  EXPECT_EQ(s.a.stats(0).reserved_bytes.all().current, s.a.stats(0).private_pool_reserved_bytes);
  s.a.validate();
}

// The compact pool's stream caches serve during a capture (no device call there);
// a request they do not serve gets a segment of the stream's default pool, which
// goes back to the device at the next empty_cache after the capture.
TEST(CompactCapture, StreamCachesServeAndTheRestComesFromTheDefaultPool) {
  SimAllocator s("policy:compact", sim_options());
  const StreamHandle capturing = 1, eager = 2;
  void* cached = s.a.allocate(MiB, eager, 0);
  s.a.deallocate(cached);  // waits in the stream's cache
  Capture c(s, capturing);
  const SimCounters at_begin = s.sim->counters();
  void* p = s.a.allocate(MiB, eager, 0);
  EXPECT_EQ(p, cached) << "the stream cache did not serve during the capture";
  const SimCounters after_cached = s.sim->counters();
  EXPECT_EQ(after_cached.allocs, at_begin.allocs);
  EXPECT_EQ(after_cached.maps, at_begin.maps);
  EXPECT_EQ(after_cached.events_recorded, at_begin.events_recorded);
  void* big = s.a.allocate(30 * MiB, eager, 0);
  ASSERT_EQ(segments_of(s.a, false).size(), 1u) << "not served by the default pool";
  EXPECT_EQ(segments_of(s.a, false)[0].stream, eager);
  EXPECT_EQ(s.sim->counters().allocs, at_begin.allocs + 1);
  s.a.deallocate(big);
  s.a.empty_cache();  // nothing goes back during a capture
  EXPECT_EQ(segments_of(s.a, false).size(), 1u);
  c.end();
  s.a.deallocate(p);
  s.a.empty_cache();
  EXPECT_TRUE(segments_of(s.a, false).empty());
  EXPECT_EQ(s.sim->capture_violations(), 0u);
  s.a.validate();
}

// Under policy:compact the default pools serve only during captures, when their
// pending frees may not be checked: they are checked when a capture ends.
TEST(CompactCapture, TheDefaultPoolsPendingFreesCompleteWhenACaptureEnds) {
  SimOptions o = sim_options();
  o.completion = SimCompletion::eager;
  SimAllocator s("policy:compact", o);
  const StreamHandle capturing = 1, eager = 2, side = 3;
  void* p;
  {
    Capture c(s, capturing);
    p = s.a.allocate(30 * MiB, eager, 0);  // the default pool's
    s.a.record_stream(p, side);
  }
  s.a.deallocate(p);  // pending: an event on `side`
  EXPECT_EQ(s.a.stats(0).active_bytes.all().current, static_cast<std::int64_t>(30 * MiB));
  { Capture c(s, capturing); }
  EXPECT_EQ(s.a.stats(0).active_bytes.all().current, 0) << "the pending free was not checked";
  EXPECT_EQ(s.sim->capture_violations(), 0u);
  s.a.validate();
}

// Out of memory during a capture: nothing is given back and nothing waited for
// (OutOfMemoryError); after the capture the ladder makes room again, the released
// graph pool's memory included.
TEST(CompactCapture, TheLadderWaitsForTheCaptureToEnd) {
  SimAllocator s("policy:compact", sim_options());
  const StreamHandle capturing = 1, eager = 2;
  s.a.deallocate(s.a.allocate(64 * MiB, eager, 0));  // free pages of the compact pool
  s.a.set_memory_fraction(128.0 / 4096.0, 0);        // 128 MiB
  PoolId pool;
  {
    Capture c(s, capturing);
    pool = c.pool;
    void* graph = s.a.allocate(60 * MiB, capturing, 0);
    try {
      s.a.allocate(60 * MiB, eager, 0);
      ADD_FAILURE() << "served beyond the memory fraction";
    } catch (const OutOfMemoryError& e) {
      EXPECT_NE(std::string(e.what()).find("capture is under way"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(s.sim->capture_violations(), 0u);
    c.end();
    s.a.deallocate(graph);  // cached in the graph's pool, which its replays keep
  }
  void* p = s.a.allocate(60 * MiB, eager, 0);  // the compact pool's free pages
  EXPECT_THROW(s.a.allocate(60 * MiB, eager, 0), OutOfMemoryError)
      << "the live graph pool's memory was taken";
  s.a.release_pool(pool, 0);
  void* q = s.a.allocate(60 * MiB, eager, 0);  // the released pool's memory, via the ladder
  EXPECT_EQ(s.a.stats(0).private_pool_reserved_bytes, 0);
  s.a.deallocate(p);
  s.a.deallocate(q);
  EXPECT_EQ(s.sim->capture_violations(), 0u);
  s.a.validate();
}

// The policy switched while a capture is under way, either way: requests go where the
// policy in force says (compact's shared path waiting for the capture's end), blocks
// are freed by whoever holds them, and no forbidden call is made.
TEST(CompactCapture, ThePolicyMaySwitchDuringACapture) {
  for (const char* from : {"", "policy:compact"}) {
    SCOPED_TRACE(std::string("from '") + from + "'");
    SimAllocator s(from, sim_options());
    const StreamHandle capturing = 1, eager = 2;
    void* old = s.a.allocate(10 * MiB, eager, 0);
    Capture c(s, capturing);
    s.a.update_config(std::string(from).empty() ? "policy:compact" : "policy:pytorch");
    void* graph = s.a.allocate(4 * MiB, capturing, 0);
    void* p = s.a.allocate(12 * MiB, eager, 0);
    s.a.deallocate(old);
    s.a.validate();
    c.end();
    void* after = s.a.allocate(12 * MiB, eager, 0);
    s.a.deallocate(p);
    s.a.deallocate(after);
    s.a.deallocate(graph);
    s.a.release_pool(c.pool, 0);
    s.a.empty_cache();
    EXPECT_EQ(s.a.stats(0).reserved_bytes.all().current, 0);
    EXPECT_EQ(s.sim->capture_violations(), 0u);
    s.a.validate();
  }
}

// A thread working on its own stream under policy:compact while another begins and
// ends captures: an operation under way when a capture begins finishes first, and
// later ones see it (no forbidden call lands inside a capture).
TEST(CompactCapture, AThreadsWorkNeverLandsInsideACapture) {
  SimOptions o = sim_options();
  o.completion = SimCompletion::eager;  // a device that keeps up: the worker never waits
  SimAllocator s("policy:compact", o);
  const StreamHandle capturing = 1, eager = 2, side = 3;
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> ops{0};  // the worker's requests so far
  std::thread worker([&] {
    try {
      std::uint64_t i = 0;
      std::vector<void*> live;
      while (!stop.load(std::memory_order_relaxed)) {
        // 512 B to 4 MiB: a capture the scheduler stretches keeps every free of a block
        // used on `side` pending until it ends (as PyTorch's allocator does).
        const std::size_t size = (std::size_t{1} << (9 + i % 14)) + (i % 3) * 4096;
        void* p = s.a.allocate(size, eager, 0);
        if (i % 5 == 0) s.a.record_stream(p, side);
        live.push_back(p);
        if (live.size() > 6) {
          s.a.deallocate(live.front());
          live.erase(live.begin());
        }
        if (i % 64 == 0) s.a.notify_host_wait(side, 0);
        ops.store(++i, std::memory_order_relaxed);
      }
      for (void* p : live) s.a.deallocate(p);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "worker: " << e.what();
    }
  });
  // One pool for every graph (as torch.compile's graphs share one).
  const PoolId pool = s.a.create_pool({}, 0);
  try {
    // Rounds until the worker has worked beside them for a while too.
    for (int round = 0; round < 2000 || ops.load(std::memory_order_relaxed) < 20000; ++round) {
      s.a.begin_capture_to_pool(pool, capturing, 0);
      s.sim->begin_capture(capturing);
      void* graph = s.a.allocate(MiB * (1 + round % 4), capturing, 0);
      s.a.deallocate(graph);
      s.sim->end_capture(capturing);
      s.a.end_allocate_to_pool(pool, 0);
      s.a.release_pool(pool, 0);  // the routing's use
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
  s.a.release_pool(pool, 0);
  stop = true;
  worker.join();
  EXPECT_EQ(s.sim->capture_violations(), 0u);
  s.a.validate();
}

}  // namespace
}  // namespace reservoir::detail
