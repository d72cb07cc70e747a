// Engine behaviours that need the simulated device's controls: injected device
// failures, blocking device calls, uncached mode, device counters.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <string>
#include <thread>

#include "reservoir/allocator.hpp"
#include "reservoir/errors.hpp"
#include "reservoir/sim_backend.hpp"
#include "support/sim_allocator.hpp"

namespace reservoir {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

using test::SimAllocator;

TEST(EngineOnSim, DeviceOutOfMemoryWalksTheLadderThenThrows) {
  SimOptions o;
  o.capacity = 64 * MiB;
  SimAllocator s("", o);
  void* p = s.a.allocate(40 * MiB, 1, 0);
  EXPECT_THROW(s.a.allocate(40 * MiB, 1, 0), OutOfMemoryError);
  DeviceStats st = s.a.stats(0);
  EXPECT_EQ(st.num_ooms, 1);
  EXPECT_EQ(st.num_alloc_retries, 1);
  EXPECT_EQ(st.num_sync_all_streams, 1);
  EXPECT_EQ(s.sim->counters().failed_allocs, 2u);  // first try, then the retry
  s.a.validate();
  s.a.deallocate(p);
  EXPECT_NO_THROW(s.a.deallocate(s.a.allocate(40 * MiB, 1, 0)));
}

TEST(EngineOnSim, InjectedAllocationFailureIsRetriedAfterReleasingCache) {
  SimAllocator s;
  void* cached = s.a.allocate(30 * MiB, 2, 0);
  s.a.deallocate(cached);
  s.sim->fail_allocation_number(1);  // the next device allocation fails once
  void* p = s.a.allocate(12 * MiB, 1, 0);
  EXPECT_NE(p, nullptr);
  DeviceStats st = s.a.stats(0);
  EXPECT_EQ(st.num_alloc_retries, 1);
  EXPECT_EQ(st.num_device_free, 1);  // the other stream's cache was released
  s.a.deallocate(p);
  s.a.validate();
}

TEST(EngineOnSim, NonMemoryDeviceErrorsSurfaceNamingTheCall) {
  SimAllocator s;
  s.sim->fail_operation(SimOp::allocate, DeviceStatus::error);
  try {
    s.a.allocate(MiB, 1, 0);
    FAIL();
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("allocating a segment"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("injected"), std::string::npos) << e.what();
  }
  s.sim->clear_faults();
  s.a.validate();
  EXPECT_EQ(s.a.stats(0).reserved_bytes.all().current, 0);

  void* p = s.a.allocate(MiB, 1, 0);
  s.a.record_stream(p, 7);
  s.a.deallocate(p);  // pending on stream 7
  s.sim->fail_operation(SimOp::query_event, DeviceStatus::error);
  EXPECT_THROW(s.a.allocate(MiB, 1, 0), DeviceError);  // processing events queries
  s.sim->clear_faults();
  s.a.validate();
  s.sim->advance(7);
  s.a.deallocate(s.a.allocate(MiB, 1, 0));
  EXPECT_EQ(s.a.stats(0).active.all().current, 0);
}

// Pending frees that complete raise counters (a freed block joins the inactive split
// memory); when a later event query fails, what they raised is settled before the
// error leaves, so the peak they reached is kept.
TEST(EngineOnSim, AFailedEventQuerySettlesWhatTheFreesBeforeItRaised) {
  constexpr std::size_t kQuarter = 512 * 1024;
  SimAllocator s;
  void* a = s.a.allocate(kQuarter, 1, 0);  // a small segment of 2 MiB in four blocks
  void* b = s.a.allocate(kQuarter, 1, 0);
  void* c = s.a.allocate(kQuarter, 1, 0);
  void* d = s.a.allocate(kQuarter, 1, 0);
  s.a.record_stream(a, 2);
  s.a.record_stream(b, 2);
  s.a.deallocate(a);  // pending on stream 2, a's event first
  s.a.deallocate(b);
  s.a.deallocate(c);  // free at once: 1 MiB of inactive split memory
  s.a.deallocate(d);
  s.a.reset_peak_stats(0);
  EXPECT_EQ(s.a.stats(0).inactive_split_bytes.all().peak, static_cast<std::int64_t>(2 * kQuarter));
  s.sim->advance(2);
  s.sim->fail_operation_number(SimOp::query_event, 2, DeviceStatus::error);  // b's query
  EXPECT_THROW(s.a.allocate(kQuarter, 1, 0), DeviceError);
  s.sim->clear_faults();
  EXPECT_EQ(s.a.stats(0).inactive_split_bytes.all().current,
            static_cast<std::int64_t>(3 * kQuarter));  // a completed, b did not
  s.a.validate();
  // b completes, the segment merges whole and goes back: the peak is the one a's
  // completion reached, not what was current when the pool next settled.
  s.a.empty_cache(0);
  const DeviceStats st = s.a.stats(0);
  EXPECT_EQ(st.inactive_split_bytes.all().current, 0);
  EXPECT_EQ(st.inactive_split_bytes.all().peak, static_cast<std::int64_t>(3 * kQuarter));
  EXPECT_EQ(st.active.all().current, 0);
  s.a.validate();
}

TEST(EngineOnSim, EventsArePooledNotCreatedPerFree) {
  SimAllocator s;
  for (int i = 0; i < 50; ++i) {
    void* p = s.a.allocate(MiB, 1, 0);
    s.a.record_stream(p, 2);
    s.a.deallocate(p);
    s.sim->advance(2);
  }
  s.a.deallocate(s.a.allocate(MiB, 1, 0));
  EXPECT_LE(s.sim->counters().events_created, 2u);
  EXPECT_EQ(s.sim->counters().events_recorded, 50u);
}

TEST(EngineOnSim, ReleaseLockOnCudaMallocLetsTheStreamGoOn) {
  for (bool release : {true, false}) {
    SimAllocator s(release ? "release_lock_on_cudamalloc:True" : "");
    void* warm = s.a.allocate(4096, 1, 0);  // a cached small segment on stream 1
    std::promise<void> entered;
    std::promise<void> go;
    std::shared_future<void> go_f = go.get_future().share();
    std::atomic<bool> first{true};
    s.sim->set_allocate_hook([&] {
      if (first.exchange(false)) {
        entered.set_value();
        go_f.wait();
      }
    });
    std::thread slow([&] { s.a.deallocate(s.a.allocate(64 * MiB, 1, 0)); });
    entered.get_future().wait();  // the device allocation is in progress
    // Same stream, from cache: with the setting it is served while the device call
    // blocks; without it, it waits for the call (the pool's lock is held).
    auto quick = std::async(std::launch::async, [&] { s.a.deallocate(s.a.allocate(8192, 1, 0)); });
    const bool served = quick.wait_for(std::chrono::milliseconds(release ? 5000 : 200)) ==
                        std::future_status::ready;
    EXPECT_EQ(served, release) << (release ? "the cache hit waited for the device call"
                                           : "the cache hit ran during the device call");
    go.set_value();
    quick.wait();
    slow.join();
    s.a.deallocate(warm);
    s.a.validate();
  }
}

TEST(EngineOnSim, UncachedModeCallsTheDeviceEveryTime) {
  setenv("RESERVOIR_NO_CACHING", "1", 1);
  SimAllocator s;
  unsetenv("RESERVOIR_NO_CACHING");
  EXPECT_FALSE(s.a.caching());
  for (int i = 0; i < 10; ++i) s.a.deallocate(s.a.allocate(1000, 1, 0));
  EXPECT_EQ(s.sim->counters().allocs, 10u);
  EXPECT_EQ(s.sim->counters().frees, 10u);
  EXPECT_EQ(s.a.stats(0).allocated_bytes.all().peak, 1000);
  int x;
  EXPECT_THROW(s.a.deallocate(&x), InvalidPointerError);
}

// What each engine tells the user about itself and what it refuses, word for word (the
// front asks the engine in force; it does not know which one it has).
TEST(EngineOnSim, EachEngineNamesItselfAndItsRefusals) {
  auto refusal = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const InvalidArgumentError& e) {
      return e.what();
    }
    return "(no refusal)";
  };
  auto ends_with = [](const std::string& text, const std::string& end) {
    return text.size() >= end.size() &&
           text.compare(text.size() - end.size(), end.size(), end) == 0;
  };
  {
    SimAllocator native;
    EXPECT_EQ(native.a.engine_name(), "native");
    EXPECT_TRUE(native.a.caching());
    EXPECT_NO_THROW(native.a.create_pool({}, 0));
  }
  {
    SimAllocator async("backend:cudaMallocAsync");
    EXPECT_EQ(async.a.engine_name(), "cudaMallocAsync");
    EXPECT_TRUE(async.a.caching());
    void* p = async.a.allocate(4096, 0, 0);
    const std::string share = refusal([&] { async.a.share(p); });
    EXPECT_EQ(share.rfind("reservoir: cannot share ", 0), 0u) << share;
    EXPECT_TRUE(ends_with(share,
                          ": backend:cudaMallocAsync memory cannot be shared (PyTorch's cannot "
                          "either); use backend:native"))
        << share;
    EXPECT_EQ(refusal([&] { async.a.create_pool({}, 0); }),
              "reservoir: private pools need Reservoir's caching engine, and "
              "backend:cudaMallocAsync is set (its memory comes from the driver's pool); use "
              "backend:native for CUDA graphs and memory pools");
    async.a.deallocate(p);
  }
  {
    setenv("RESERVOIR_NO_CACHING", "1", 1);
    SimAllocator uncached;
    unsetenv("RESERVOIR_NO_CACHING");
    EXPECT_EQ(uncached.a.engine_name(), "uncached");
    EXPECT_FALSE(uncached.a.caching());
    void* p = uncached.a.allocate(4096, 0, 0);
    const std::string share = refusal([&] { uncached.a.share(p); });
    EXPECT_EQ(share.rfind("reservoir: cannot share ", 0), 0u) << share;
    EXPECT_TRUE(ends_with(
        share,
        ": uncached mode (RESERVOIR_NO_CACHING=1) does not share memory; use backend:native"))
        << share;
    EXPECT_EQ(refusal([&] {
                uncached.a.begin_allocate_to_pool({0, 7}, nullptr, 0);
              }),
              "reservoir: private pools need the caching allocator (RESERVOIR_NO_CACHING=1 is "
              "set): CUDA graphs and memory pools cannot run uncached");
    uncached.a.deallocate(p);
  }
}

// With several owners a free asks this thread's last segment first: right after a
// release of it, after its pool's engine is gone, and for a pointer it never handed
// out, the free still lands where it must (or is refused, naming the pointer).
TEST(EngineOnSim, AFreeAsksThisThreadsLastSegmentOnlyWhileItHolds) {
  for (int round = 0; round < 2; ++round) {  // a fresh engine: the last one's hint is stale
    SimAllocator s;
    void* first = s.a.allocate(512, 1, 0);
    void* p = s.a.allocate(512, 2, 0);  // a second owner: frees take the general path
    s.a.deallocate(p);                  // this thread's hint: stream 2's segment
    void* again = s.a.allocate(512, 2, 0);
    EXPECT_THROW(s.a.deallocate(static_cast<char*>(again) + 512), InvalidPointerError);
    s.a.deallocate(again);
    s.a.empty_cache();                  // stream 2's segment goes back
    void* q = s.a.allocate(512, 3, 0);  // a third owner, maybe in the same range
    s.a.deallocate(q);
    s.a.deallocate(first);
    s.a.validate();
    DeviceStats st = s.a.stats(0);
    EXPECT_EQ(st.allocation.all().current, 0);
    EXPECT_EQ(st.allocation.all().freed, 4);
  }
}

TEST(EngineOnSim, SeveralDevicesHaveSeparateEngines) {
  SimOptions o;
  o.device_count = 2;
  o.capacity = 100 * MiB;
  SimAllocator s("", o);
  void* p0 = s.a.allocate(60 * MiB, 1, 0);
  void* p1 = s.a.allocate(60 * MiB, 1, 1);  // device 1 has its own capacity
  EXPECT_EQ(s.a.stats(0).reserved_bytes.all().current, static_cast<std::int64_t>(60 * MiB));
  EXPECT_EQ(s.a.stats(1).reserved_bytes.all().current, static_cast<std::int64_t>(60 * MiB));
  s.a.deallocate(p1);  // found through the segment map, whatever the device
  s.a.deallocate(p0);
  s.sim->set_current_device(1);
  void* q = s.a.allocate(MiB, 1);  // device -1: the current device
  EXPECT_EQ(s.a.stats(1).allocation.all().current, 1);
  s.a.deallocate(q);
}

}  // namespace
}  // namespace reservoir
