// Sleep and wake of tagged memory (docs/sleep.md) on the simulated device with real
// host memory behind its addresses: a tag's memory goes back to the device at sleep
// and comes back at the same addresses at wake, with its contents (offload); requests
// under a sleeping tag are refused; private pools made under a tag sleep with it; a
// failed sleep or wake leaves the tag as it was; the books hold at every step.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "reservoir/allocator.hpp"
#include "reservoir/errors.hpp"
#include "reservoir/sim_backend.hpp"
#include "support/sim_allocator.hpp"
#include "unit/sleep_test_util.hpp"

namespace reservoir {
namespace {

using test::fill;
using test::holds;
using test::host_backed;
using test::SimAllocator;
using test::tag_for;
constexpr std::size_t MiB = std::size_t{1} << 20;

std::size_t device_free(SimAllocator& s) {
  MemoryInfo info;
  EXPECT_EQ(s.sim->memory_info(0, &info), DeviceStatus::ok);
  return info.free;
}

class Sleep : public ::testing::TestWithParam<std::string> {};

TEST_P(Sleep, OffloadGivesMemoryBackAndWakeRestoresItAtTheSameAddresses) {
  SimAllocator s(GetParam(), host_backed());
  const std::string tag = tag_for("offload", GetParam());
  void* plain = s.a.allocate(3 * MiB, 0);
  void *p = nullptr, *q = nullptr;
  {
    TagScope scope(s.a, tag);
    EXPECT_EQ(s.a.current_tag(), tag);
    p = s.a.allocate(5 * MiB, 0);
    q = s.a.allocate(300 * 1024, 0);
  }
  EXPECT_EQ(s.a.current_tag(), "");
  fill(p, 5 * MiB, 1);
  fill(q, 300 * 1024, 2);
  const TagState awake = s.a.tag_state(tag, 0);
  EXPECT_FALSE(awake.asleep);
  EXPECT_GE(awake.allocated_bytes, 5 * MiB + 300 * 1024);
  EXPECT_GE(awake.reserved_bytes, awake.allocated_bytes);
  const std::size_t free_before = device_free(s);
  const std::int64_t reserved_before = s.a.stats(0).reserved_bytes.all().current;

  s.a.sleep(tag, SleepMode::offload, 0);
  const TagState asleep = s.a.tag_state(tag, 0);
  EXPECT_TRUE(asleep.asleep);
  EXPECT_EQ(asleep.mode, SleepMode::offload);
  EXPECT_EQ(asleep.reserved_bytes, 0u);
  EXPECT_GT(asleep.asleep_bytes, 0u);
  EXPECT_EQ(asleep.offloaded_bytes, asleep.asleep_bytes);
  EXPECT_EQ(asleep.allocated_bytes, awake.allocated_bytes);  // the program still holds them
  EXPECT_EQ(device_free(s), free_before + awake.reserved_bytes);
  EXPECT_EQ(s.a.stats(0).reserved_bytes.all().current,
            reserved_before - static_cast<std::int64_t>(awake.reserved_bytes));
  s.a.validate();
  {
    TagScope scope(s.a, tag);
    EXPECT_THROW(s.a.allocate(MiB, 0), InvalidArgumentError);
  }
  void* other = s.a.allocate(MiB, 0);  // untagged requests go on
  s.a.deallocate(other);

  s.a.wake(tag, 0);
  const TagState woken = s.a.tag_state(tag, 0);
  EXPECT_FALSE(woken.asleep);
  EXPECT_EQ(woken.reserved_bytes, asleep.asleep_bytes);
  EXPECT_EQ(woken.asleep_bytes, 0u);
  EXPECT_EQ(woken.offloaded_bytes, 0u);
  EXPECT_TRUE(holds(p, 5 * MiB, 1));
  EXPECT_TRUE(holds(q, 300 * 1024, 2));
  s.a.validate();
  {
    TagScope scope(s.a, tag);
    void* more = s.a.allocate(MiB, 0);
    s.a.deallocate(more);
  }
  s.a.deallocate(p);
  s.a.deallocate(q);
  s.a.deallocate(plain);
  s.a.validate();
}

TEST_P(Sleep, DiscardFreesTheDeviceForOthersAndWakeNeedsItBack) {
  SimAllocator s(GetParam(), host_backed(96 * MiB));
  const std::string tag = tag_for("discard", GetParam());
  void* p;
  {
    TagScope scope(s.a, tag);
    p = s.a.allocate(60 * MiB, 0);
  }
  EXPECT_THROW(s.a.allocate(60 * MiB, 0), OutOfMemoryError);
  s.a.sleep(tag, SleepMode::discard, 0);
  EXPECT_EQ(s.a.tag_state(tag, 0).offloaded_bytes, 0u);
  void* other = s.a.allocate(60 * MiB, 0);  // the tag's memory serves another request
  // No room to wake: out of memory, still asleep, nothing changed.
  EXPECT_THROW(s.a.wake(tag, 0), OutOfMemoryError);
  EXPECT_TRUE(s.a.tag_state(tag, 0).asleep);
  s.a.validate();
  s.a.deallocate(other);
  s.a.empty_cache();
  s.a.wake(tag, 0);
  EXPECT_FALSE(s.a.tag_state(tag, 0).asleep);
  std::memset(p, 7, 60 * MiB);  // mapped again
  s.a.deallocate(p);
  s.a.validate();
}

// Reservoir's own cache never stands in a wake's way (a cached block blocking the
// wake is a known failure of allocators below sleep-mode shims): without room, the
// wake gives the cache back and tries again. Under a memory fraction too.
TEST_P(Sleep, AWakeTakesTheRoomReservoirCaches) {
  for (const bool fraction : {false, true}) {
    SimAllocator s(GetParam(), host_backed(fraction ? 256 * MiB : 96 * MiB));
    if (fraction) s.a.set_memory_fraction(0.375, 0);  // 96 MiB of 256
    const std::string tag = tag_for(fraction ? "room-fraction" : "room", GetParam());
    void* p;
    {
      TagScope scope(s.a, tag);
      p = s.a.allocate(60 * MiB, 0);
    }
    fill(p, 60 * MiB, 3);
    s.a.sleep(tag, SleepMode::offload, 0);
    s.a.deallocate(s.a.allocate(60 * MiB, 0));  // the room, now cached
    EXPECT_GE(s.a.stats(0).reserved_bytes.all().current, static_cast<std::int64_t>(60 * MiB));
    s.a.wake(tag, 0);
    EXPECT_FALSE(s.a.tag_state(tag, 0).asleep);
    EXPECT_TRUE(holds(p, 60 * MiB, 3));
    EXPECT_EQ(s.a.stats(0).num_sync_all_streams, 1) << "the cache went back once";
    s.a.validate();
    s.a.deallocate(p);
  }
}

TEST_P(Sleep, FreesWhileAsleepAreKeptAndTheMemoryServesAfterWake) {
  SimAllocator s(GetParam(), host_backed());
  const std::string tag = tag_for("free-asleep", GetParam());
  void *p, *q;
  {
    TagScope scope(s.a, tag);
    p = s.a.allocate(4 * MiB, 0);
    q = s.a.allocate(4 * MiB, 0);
  }
  fill(q, 4 * MiB, 9);
  s.a.record_stream(q, 5);
  s.a.sleep(tag, SleepMode::offload, 0);
  s.a.deallocate(p);  // books only: nothing of it is mapped now
  s.a.validate();
  EXPECT_LT(s.a.tag_state(tag, 0).allocated_bytes, 8 * MiB);
  s.a.wake(tag, 0);
  EXPECT_TRUE(holds(q, 4 * MiB, 9));
  {
    TagScope scope(s.a, tag);
    void* again = s.a.allocate(4 * MiB, 0);
    s.a.deallocate(again);
  }
  s.a.deallocate(q);
  s.a.validate();
}

TEST_P(Sleep, APrivatePoolMadeUnderATagSleepsWithIt) {
  SimAllocator s(GetParam(), host_backed());
  const std::string tag = tag_for("pool", GetParam());
  PoolId pool;
  void* in_pool;
  {
    TagScope scope(s.a, tag);
    pool = s.a.create_pool({}, 0);
    s.a.begin_allocate_current_thread_to_pool(pool, 0);
    in_pool = s.a.allocate(6 * MiB, 0);
    // Freed in the pool (as in a capture): a graph's replays use that memory, so it
    // sleeps and wakes with the pool rather than going back to the device.
    s.a.deallocate(s.a.allocate(40 * MiB, 0));
    s.a.end_allocate_to_pool(pool, 0);
  }
  fill(in_pool, 6 * MiB, 4);
  const TagState awake = s.a.tag_state(tag, 0);
  EXPECT_EQ(awake.pools, 2u);  // its own and the private pool
  EXPECT_GE(awake.allocated_bytes, 6 * MiB);
  s.a.sleep(tag, SleepMode::offload, 0);
  EXPECT_GE(s.a.tag_state(tag, 0).asleep_bytes, 6 * MiB);
  // Routing to the sleeping pool is refused as the tag's own requests are.
  s.a.begin_allocate_current_thread_to_pool(pool, 0);
  EXPECT_THROW(s.a.allocate(MiB, 0), InvalidArgumentError);
  s.a.end_allocate_to_pool(pool, 0);
  s.a.validate();
  s.a.wake(tag, 0);
  EXPECT_TRUE(holds(in_pool, 6 * MiB, 4));
  EXPECT_EQ(s.a.tag_state(tag, 0).reserved_bytes, awake.reserved_bytes);
  s.a.deallocate(in_pool);
  s.a.release_pool(pool, 0);
  s.a.validate();
}

TEST_P(Sleep, ACaptureRefusesSleepAndWake) {
  SimAllocator s(GetParam(), host_backed());
  const std::string tag = tag_for("capture", GetParam());
  void* p;
  {
    TagScope scope(s.a, tag);
    p = s.a.allocate(MiB, 0);
  }
  const PoolId graph = s.a.create_pool({}, 0);
  s.a.begin_capture_to_pool(graph, 3, 0);
  s.sim->begin_capture(3);
  EXPECT_THROW(s.a.sleep(tag, SleepMode::offload, 0), InvalidArgumentError);
  s.sim->end_capture(3);
  s.a.end_allocate_to_pool(graph, 0);
  s.a.sleep(tag, SleepMode::discard, 0);
  s.a.begin_capture_to_pool(graph, 3, 0);
  s.sim->begin_capture(3);
  EXPECT_THROW(s.a.wake(tag, 0), InvalidArgumentError);
  s.sim->end_capture(3);
  s.a.end_allocate_to_pool(graph, 0);
  s.a.release_pool(graph, 0);
  s.a.wake(tag, 0);
  s.a.deallocate(p);
  s.a.validate();
}

TEST_P(Sleep, AFailedCopyOrMapLeavesTheTagAsItWas) {
  SimAllocator s(GetParam(), host_backed());
  const std::string tag = tag_for("faults", GetParam());
  void *p, *q;
  {
    TagScope scope(s.a, tag);
    p = s.a.allocate(5 * MiB, 0);
    q = s.a.allocate(30 * MiB, 0);
  }
  fill(p, 5 * MiB, 5);
  fill(q, 30 * MiB, 6);
  // Each failure: the call throws, the tag is awake with its memory and contents.
  // Two segments (small and large pools): a failure at the second undoes the first.
  void* small;
  {
    TagScope scope(s.a, tag);
    small = s.a.allocate(100 * 1024, 0);
  }
  const std::size_t reserved_all = s.a.tag_state(tag, 0).reserved_bytes;
  for (SimOp op : {SimOp::allocate_host, SimOp::copy_to_host, SimOp::unmap})
    for (std::uint64_t n : {1, 2}) {
      SCOPED_TRACE(std::string(to_string(op)) + " #" + std::to_string(n));
      s.sim->fail_operation_number(op, n, DeviceStatus::error);
      EXPECT_THROW(s.a.sleep(tag, SleepMode::offload, 0), DeviceError);
      s.sim->clear_faults();
      EXPECT_FALSE(s.a.tag_state(tag, 0).asleep);
      EXPECT_EQ(s.a.tag_state(tag, 0).reserved_bytes, reserved_all);
      EXPECT_TRUE(holds(p, 5 * MiB, 5));
      EXPECT_TRUE(holds(q, 30 * MiB, 6));
      s.a.validate();
    }
  s.a.sleep(tag, SleepMode::offload, 0);
  for (SimOp op : {SimOp::create_physical, SimOp::map, SimOp::set_access, SimOp::copy_to_device})
    for (std::uint64_t n : {1, 2}) {
      SCOPED_TRACE(std::string(to_string(op)) + " #" + std::to_string(n));
      s.sim->fail_operation_number(op, n, DeviceStatus::error);
      EXPECT_THROW(s.a.wake(tag, 0), DeviceError);
      s.sim->clear_faults();
      EXPECT_TRUE(s.a.tag_state(tag, 0).asleep);
      s.a.validate();
    }
  s.a.wake(tag, 0);
  EXPECT_TRUE(holds(p, 5 * MiB, 5));
  EXPECT_TRUE(holds(q, 30 * MiB, 6));
  s.a.deallocate(p);
  s.a.deallocate(q);
  s.a.deallocate(small);
  s.a.validate();
}

// A wake on a stream maps at once and enqueues the copies back on the stream: the
// contents are there for work on it; the host copies stay (counted as offloaded) until
// an event after the copies completes, and a sleep before then waits for them first.
// A failed asynchronous copy leaves the tag asleep as a failed wake does.
TEST_P(Sleep, WakeOnAStreamEnqueuesTheCopiesAndFreesTheHostCopiesOnceDone) {
  SimAllocator s(GetParam(), host_backed());
  const std::string tag = tag_for("wake-async", GetParam());
  constexpr StreamHandle kCopies = 9;
  void *p, *q;
  {
    TagScope scope(s.a, tag);
    p = s.a.allocate(5 * MiB, 0);
    q = s.a.allocate(100 * 1024, 0);
  }
  fill(p, 5 * MiB, 11);
  fill(q, 100 * 1024, 12);
  const std::size_t hosts_before = s.sim->live_host_allocations();
  s.a.sleep(tag, SleepMode::offload, 0);
  const std::size_t kept = s.a.tag_state(tag, 0).offloaded_bytes;
  ASSERT_GT(kept, 0u);

  s.sim->fail_operation_number(SimOp::copy_to_device_async, 2, DeviceStatus::error);
  EXPECT_THROW(s.a.wake_async(tag, kCopies, 0), DeviceError);
  s.sim->clear_faults();
  EXPECT_TRUE(s.a.tag_state(tag, 0).asleep);
  EXPECT_EQ(s.a.tag_state(tag, 0).offloaded_bytes, kept);
  s.a.validate();

  const std::uint64_t async_before = s.sim->counters().async_copies_to_device;
  s.a.wake_async(tag, kCopies, 0);
  EXPECT_GT(s.sim->counters().async_copies_to_device, async_before);
  TagState woken = s.a.tag_state(tag, 0);
  EXPECT_FALSE(woken.asleep);
  EXPECT_EQ(woken.asleep_bytes, 0u);
  EXPECT_EQ(woken.offloaded_bytes, kept) << "the copies may still read them";
  EXPECT_GT(s.sim->live_host_allocations(), hosts_before);
  EXPECT_TRUE(holds(p, 5 * MiB, 11));
  EXPECT_TRUE(holds(q, 100 * 1024, 12));
  s.a.validate();
  s.sim->advance(kCopies);  // the copies are done
  EXPECT_EQ(s.a.tag_state(tag, 0).offloaded_bytes, 0u);
  // Kept for the next offload (sleep_host_test.cpp).
  EXPECT_EQ(s.a.stats(0).host_kept_bytes, static_cast<std::int64_t>(kept));

  // Asleep again before the copies of a wake on a stream are done: sleep waits.
  fill(p, 5 * MiB, 13);
  s.a.sleep(tag, SleepMode::offload, 0);
  s.a.wake_async(tag, kCopies, 0);
  s.a.sleep(tag, SleepMode::offload, 0);
  EXPECT_EQ(s.a.tag_state(tag, 0).offloaded_bytes, kept);
  s.a.wake(tag, 0);
  EXPECT_TRUE(holds(p, 5 * MiB, 13));
  EXPECT_EQ(s.a.tag_state(tag, 0).offloaded_bytes, 0u);
  // Discarded memory has nothing to copy: nothing waits.
  s.a.sleep(tag, SleepMode::discard, 0);
  s.a.wake_async(tag, kCopies, 0);
  EXPECT_EQ(s.a.tag_state(tag, 0).offloaded_bytes, 0u);
  s.a.deallocate(p);
  s.a.deallocate(q);
  s.a.validate();
  s.a.empty_host_cache();
  EXPECT_EQ(s.sim->live_host_allocations(), hosts_before);
}

INSTANTIATE_TEST_SUITE_P(Policies, Sleep, test::kSleepPolicies, test::sleep_policy_name);

}  // namespace
}  // namespace reservoir
