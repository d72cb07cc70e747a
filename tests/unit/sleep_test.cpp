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

TEST(SleepBadInput, EachIsRefusedWithAClearError) {
  SimAllocator s("", host_backed());
  auto refused = [](auto&& call, const std::string& words) {
    try {
      call();
      ADD_FAILURE() << "not refused: " << words;
    } catch (const InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused([&] { s.a.push_tag(""); }, "needs a name");
  refused([&] { s.a.push_tag("a b"); }, "letters, digits");
  refused([&] { s.a.push_tag(std::string(64, 'x')); }, "at most 63");
  refused([&] { s.a.pop_tag(); }, "without a tag scope");
  refused([&] { s.a.sleep("never-made-tag", SleepMode::offload, 0); }, "no memory was ever tagged");
  refused([&] { s.a.wake("never-made-tag", 0); }, "no memory was ever tagged");
  refused([&] { s.a.sleep("a b", SleepMode::offload, 0); }, "letters, digits");
  refused([&] { s.a.sleep("bad.mode", static_cast<SleepMode>(7), 0); }, "neither offload");
  const std::string tag = "bad-input.twice";
  void* p;
  {
    TagScope scope(s.a, tag);
    p = s.a.allocate(MiB, 0);
  }
  refused([&] { s.a.wake(tag, 0); }, "not asleep");
  s.a.sleep(tag, SleepMode::offload, 0);
  refused([&] { s.a.sleep(tag, SleepMode::discard, 0); }, "asleep already");
  {
    TagScope scope(s.a, tag);
    refused([&] { s.a.allocate(MiB, 0); }, "asleep (wake it first)");
  }
  s.a.wake(tag, 0);
  s.a.deallocate(p);
  // Where the engine keeps no pools: refused up front.
  SimAllocator async("backend:cudaMallocAsync", host_backed());
  EXPECT_THROW(async.a.push_tag("async.tag"), InvalidArgumentError);
  // A device without virtual memory cannot sleep.
  SimOptions no_vmm = host_backed();
  no_vmm.virtual_memory = false;
  SimAllocator plain("", no_vmm);
  { TagScope scope(plain.a, "novmm.tag"); }
  refused([&] { plain.a.sleep("novmm.tag", SleepMode::offload, 0); }, "virtual memory");
}

TEST(SleepBadInput, ABlockWhoseTagSleepsIsNotShared) {
  SimOptions o = host_backed();
  o.shared_memory = true;
  SimAllocator s("", o);
  void* p;
  {
    TagScope scope(s.a, "share.asleep");
    p = s.a.allocate(MiB, 0);
  }
  s.a.sleep("share.asleep", SleepMode::discard, 0);
  try {
    s.a.share(p);
    ADD_FAILURE() << "shared a sleeping block";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("its tag is asleep"), std::string::npos) << e.what();
  }
  s.a.wake("share.asleep", 0);
  s.a.deallocate(p);
  s.a.validate();
}

TEST(SleepTags, TheSummaryAndTheMetricsListEachTag) {
  SimAllocator s("", host_backed());
  void* p;
  {
    TagScope scope(s.a, "observed.tag");
    p = s.a.allocate(3 * MiB, 0);
  }
  s.a.sleep("observed.tag", SleepMode::offload, 0);
  const std::vector<TagState> tags = s.a.tag_states(0);
  ASSERT_EQ(tags.size(), 1u);
  EXPECT_EQ(tags[0].name, "observed.tag");
  EXPECT_TRUE(tags[0].asleep);
  const std::string summary = s.a.summary(0);
  EXPECT_NE(summary.find("Tag 'observed.tag': 3.00 MiB allocated, 0 bytes reserved"),
            std::string::npos)
      << summary;
  EXPECT_NE(summary.find("asleep (offload): 20.00 MiB given back, 20.00 MiB kept in host memory"),
            std::string::npos)
      << summary;
  const std::string prom = s.a.metrics_prometheus();
  EXPECT_NE(prom.find("reservoir_tag_asleep{device=\"0\",tag=\"observed.tag\"} 1"),
            std::string::npos)
      << prom;
  EXPECT_NE(prom.find("reservoir_tag_bytes{device=\"0\",tag=\"observed.tag\",kind=\"asleep\"} " +
                      std::to_string(tags[0].asleep_bytes)),
            std::string::npos);
  const std::string json = s.a.metrics_json();
  EXPECT_NE(json.find("\"tags\":[{\"name\":\"observed.tag\",\"asleep\":true"), std::string::npos)
      << json;
  s.a.wake("observed.tag", 0);
  s.a.deallocate(p);
  EXPECT_NE(
      s.a.metrics_prometheus().find("reservoir_tag_asleep{device=\"0\",tag=\"observed.tag\"} 0"),
      std::string::npos);
}

TEST(SleepTags, SegmentsNameTheirTagAndWhetherItSleeps) {
  SimAllocator s("", host_backed());
  void* plain = s.a.allocate(MiB, 0);
  void* p;
  {
    TagScope scope(s.a, "snapshot.tag");
    p = s.a.allocate(3 * MiB, 0);
  }
  auto tagged = [&](bool asleep) {
    std::size_t bytes = 0;
    for (const SegmentInfo& seg : s.a.snapshot().segments) {
      if (seg.address == reinterpret_cast<std::uintptr_t>(plain)) {
        EXPECT_EQ(seg.tag, "");
        EXPECT_FALSE(seg.asleep);
      }
      if (seg.tag != "snapshot.tag") continue;
      EXPECT_EQ(seg.asleep, asleep);
      EXPECT_TRUE(seg.is_expandable);
      bytes += seg.total_size;
    }
    return bytes;
  };
  EXPECT_EQ(tagged(false), s.a.tag_state("snapshot.tag", 0).reserved_bytes);
  s.a.sleep("snapshot.tag", SleepMode::discard, 0);
  EXPECT_EQ(tagged(true), s.a.tag_state("snapshot.tag", 0).asleep_bytes);  // the bytes asleep
  s.a.wake("snapshot.tag", 0);
  EXPECT_EQ(tagged(false), s.a.tag_state("snapshot.tag", 0).reserved_bytes);
  s.a.deallocate(p);
  s.a.deallocate(plain);
}

TEST(SleepBadInput, ACaptureOnAnotherDeviceRefusesSleepToo) {
  SimOptions o = host_backed();
  o.device_count = 2;
  SimAllocator s("", o);
  void* p;
  {
    TagScope scope(s.a, "capture.elsewhere");
    p = s.a.allocate(MiB, 0, 0);
  }
  const PoolId graph = s.a.create_pool({}, 1);
  s.a.begin_capture_to_pool(graph, 3, 1);
  s.sim->set_current_device(1);
  s.sim->begin_capture(3);
  EXPECT_THROW(s.a.sleep("capture.elsewhere", SleepMode::offload, 0), InvalidArgumentError);
  s.sim->end_capture(3);
  s.sim->set_current_device(0);
  s.a.end_allocate_to_pool(graph, 1);
  s.a.release_pool(graph, 1);
  s.a.sleep("capture.elsewhere", SleepMode::offload, 0);
  s.a.wake("capture.elsewhere", 0);
  s.a.deallocate(p);
  s.a.validate();
}

TEST(SleepTags, TrackersHearOfThePagesThatGoAndCome) {
  SimAllocator s("", host_backed());
  std::vector<TraceEntry> seen;
  s.a.attach_trace_tracker([&](const TraceEntry& e) {
    if (e.action == TraceAction::segment_map || e.action == TraceAction::segment_unmap)
      seen.push_back(e);
  });
  void* p;
  {
    TagScope scope(s.a, "tracked.tag");
    p = s.a.allocate(5 * MiB, 0);
  }
  seen.clear();
  s.a.sleep("tracked.tag", SleepMode::discard, 0);
  std::size_t unmapped = 0;
  for (const TraceEntry& e : seen) {
    EXPECT_EQ(e.action, TraceAction::segment_unmap);
    unmapped += e.size;
  }
  EXPECT_EQ(unmapped, s.a.tag_state("tracked.tag", 0).asleep_bytes);
  seen.clear();
  s.a.wake("tracked.tag", 0);
  std::size_t mapped = 0;
  for (const TraceEntry& e : seen) {
    EXPECT_EQ(e.action, TraceAction::segment_map);
    mapped += e.size;
  }
  EXPECT_EQ(mapped, unmapped);
  s.a.deallocate(p);
}

TEST(SleepTags, ScopesNestAndBelongToTheirAllocator) {
  SimAllocator s("", host_backed());
  SimAllocator other("", host_backed());
  {
    TagScope outer(s.a, "nest.outer");
    {
      TagScope inner(s.a, "nest.inner");
      EXPECT_EQ(s.a.current_tag(), "nest.inner");
      EXPECT_EQ(other.a.current_tag(), "");
      void* p = other.a.allocate(MiB, 0);  // another allocator's request: untagged
      other.a.deallocate(p);
    }
    EXPECT_EQ(s.a.current_tag(), "nest.outer");
    void* p = s.a.allocate(MiB, 0);
    EXPECT_GE(s.a.tag_state("nest.outer", 0).allocated_bytes, MiB);
    s.a.deallocate(p);
  }
  EXPECT_EQ(s.a.current_tag(), "");
  EXPECT_EQ(s.a.tag_state("nest.inner", 0).allocated_bytes, 0u);
}

}  // namespace
}  // namespace reservoir
