// The pinned host memory of offloads (docs/sleep.md, "Host memory"): a wake keeps the
// host buffers its copies read for the tag's next offload, so a second sleep pins
// nothing new; empty_host_cache frees them; what is kept never exceeds what offloads
// needed at once, whatever the sizes; when the host has no memory the kept buffers go
// back first. On the simulated device with real host memory behind its addresses.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/pool/host_stash.hpp"
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
constexpr std::size_t MiB = std::size_t{1} << 20;

std::string host_tag(const std::string& test, const std::string& config) {
  return test::tag_for("host." + test, config);
}

std::int64_t kept(SimAllocator& s) {
  return s.a.stats(0).host_kept_bytes;
}

class SleepHost : public ::testing::TestWithParam<std::string> {};

TEST_P(SleepHost, ASecondOffloadReusesTheHostMemoryOfTheFirst) {
  SimAllocator s(GetParam(), host_backed());
  const std::string tag = host_tag("reuse", GetParam());
  void *p, *q;
  {
    TagScope scope(s.a, tag);
    p = s.a.allocate(7 * MiB, 0);
    q = s.a.allocate(200 * 1024, 0);
  }
  const std::size_t hosts_before = s.sim->live_host_allocations();
  fill(p, 7 * MiB, 1);
  fill(q, 200 * 1024, 2);
  s.a.sleep(tag, SleepMode::offload, 0);
  const std::size_t offloaded = s.a.tag_state(tag, 0).offloaded_bytes;
  ASSERT_GT(offloaded, 0u);
  EXPECT_EQ(kept(s), 0) << "in use by the sleeping tag, not kept";
  const std::uint64_t pinned = s.sim->counters().host_allocs;
  s.a.wake(tag, 0);
  EXPECT_TRUE(holds(p, 7 * MiB, 1));
  EXPECT_EQ(kept(s), static_cast<std::int64_t>(offloaded));
  EXPECT_GT(s.sim->live_host_allocations(), hosts_before);
  s.a.validate();

  fill(p, 7 * MiB, 3);
  fill(q, 200 * 1024, 4);
  s.a.sleep(tag, SleepMode::offload, 0);
  EXPECT_EQ(s.sim->counters().host_allocs, pinned) << "the second offload pinned anew";
  EXPECT_EQ(kept(s), 0);
  s.a.validate();
  s.a.wake(tag, 0);
  EXPECT_TRUE(holds(p, 7 * MiB, 3));
  EXPECT_TRUE(holds(q, 200 * 1024, 4));

  // Observable, then given back.
  EXPECT_NE(s.a.summary(0).find("Pinned host memory kept for the next offload"), std::string::npos);
  EXPECT_NE(s.a.metrics_prometheus().find("reservoir_host_kept_bytes{device=\"0\"} " +
                                          std::to_string(offloaded)),
            std::string::npos);
  EXPECT_NE(s.a.metrics_json().find("\"host_kept_bytes\":" + std::to_string(offloaded)),
            std::string::npos);
  s.a.empty_host_cache();
  EXPECT_EQ(kept(s), 0);
  EXPECT_EQ(s.sim->live_host_allocations(), hosts_before);
  EXPECT_EQ(s.a.summary(0).find("Pinned host memory kept"), std::string::npos);
  s.a.validate();

  // A discard keeps no contents: it needs no host memory.
  s.a.sleep(tag, SleepMode::discard, 0);
  s.a.wake(tag, 0);
  EXPECT_EQ(kept(s), 0);
  s.a.deallocate(p);
  s.a.deallocate(q);
  s.a.validate();
}

TEST_P(SleepHost, AWakeOnAStreamKeepsTheHostMemoryOnceItsCopiesAreDone) {
  SimAllocator s(GetParam(), host_backed());
  const std::string tag = host_tag("async", GetParam());
  constexpr StreamHandle kCopies = 5;
  void* p;
  {
    TagScope scope(s.a, tag);
    p = s.a.allocate(6 * MiB, 0);
  }
  fill(p, 6 * MiB, 5);
  s.a.sleep(tag, SleepMode::offload, 0);
  const std::size_t offloaded = s.a.tag_state(tag, 0).offloaded_bytes;
  s.a.wake_async(tag, kCopies, 0);
  EXPECT_EQ(kept(s), 0) << "the copies may still read them";
  s.a.empty_host_cache();  // leaves the buffers the copies read
  EXPECT_EQ(s.a.tag_state(tag, 0).offloaded_bytes, offloaded);
  s.sim->advance(kCopies);
  EXPECT_EQ(s.a.tag_state(tag, 0).offloaded_bytes, 0u);  // the poll gives them to the stash
  EXPECT_EQ(kept(s), static_cast<std::int64_t>(offloaded));
  EXPECT_TRUE(holds(p, 6 * MiB, 5));
  const std::uint64_t pinned = s.sim->counters().host_allocs;
  s.a.sleep(tag, SleepMode::offload, 0);
  EXPECT_EQ(s.sim->counters().host_allocs, pinned);
  s.a.wake(tag, 0);
  s.a.deallocate(p);
  s.a.validate();
}

TEST_P(SleepHost, ChangingSizesDoNotGrowTheHostMemoryKept) {
  SimAllocator s(GetParam(), host_backed());
  const std::string tag = host_tag("sizes", GetParam());
  std::mt19937 rng(7);
  std::size_t most = 0;
  const std::size_t hosts_before = s.sim->live_host_allocations();
  for (int cycle = 0; cycle < 30; ++cycle) {
    // Small blocks (2 MiB pages) and large ones (20 MiB pages) in turn: neither's host
    // buffers can serve the other's runs.
    std::vector<void*> blocks;
    {
      TagScope scope(s.a, tag);
      const int n = 1 + static_cast<int>(rng() % 3);
      for (int i = 0; i < n; ++i)
        blocks.push_back(
            s.a.allocate(cycle % 2 ? (100 + rng() % 800) * 1024 : (41 + rng() % 40) * MiB, 0));
    }
    s.a.sleep(tag, SleepMode::offload, 0);
    const std::size_t offloaded = s.a.tag_state(tag, 0).offloaded_bytes;
    most = std::max(most, offloaded);
    s.a.wake(tag, 0);
    EXPECT_LE(static_cast<std::size_t>(kept(s)), most) << "cycle " << cycle;
    s.a.validate();
    for (void* b : blocks) s.a.deallocate(b);
    s.a.empty_cache();  // the next cycle's layout differs
  }
  s.a.empty_host_cache();
  EXPECT_EQ(s.sim->live_host_allocations(), hosts_before);
}

TEST_P(SleepHost, WhenTheHostHasNoMemoryTheKeptBuffersGoFirst) {
  SimAllocator s(GetParam(), host_backed());
  const std::string small = host_tag("full-small", GetParam());
  const std::string large = host_tag("full-large", GetParam());
  void *p, *q;
  {
    TagScope scope(s.a, small);
    p = s.a.allocate(3 * MiB, 0);
  }
  {
    TagScope scope(s.a, large);
    q = s.a.allocate(60 * MiB, 0);
  }
  s.a.sleep(small, SleepMode::offload, 0);
  s.a.wake(small, 0);
  ASSERT_GT(kept(s), 0);
  fill(q, 60 * MiB, 9);
  // The host refuses the large tag's first buffer once: the kept ones are freed and it
  // is asked again.
  s.sim->fail_operation_number(SimOp::allocate_host, 1, DeviceStatus::out_of_memory);
  s.a.sleep(large, SleepMode::offload, 0);
  s.sim->clear_faults();
  EXPECT_TRUE(s.a.tag_state(large, 0).asleep);
  EXPECT_EQ(kept(s), 0);
  s.a.validate();
  s.a.wake(large, 0);
  EXPECT_TRUE(holds(q, 60 * MiB, 9));
  // Refused twice: the sleep fails and changes nothing.
  s.sim->fail_operation(SimOp::allocate_host, DeviceStatus::out_of_memory);
  s.a.empty_host_cache();
  EXPECT_THROW(s.a.sleep(large, SleepMode::offload, 0), DeviceError);
  s.sim->clear_faults();
  EXPECT_FALSE(s.a.tag_state(large, 0).asleep);
  EXPECT_TRUE(holds(q, 60 * MiB, 9));
  s.a.deallocate(p);
  s.a.deallocate(q);
  s.a.validate();
}

INSTANTIATE_TEST_SUITE_P(Policies, SleepHost, test::kSleepPolicies, test::sleep_policy_name);

// The stash itself: reuse within a factor of two, the bound, release.
TEST(HostStash, ReusesWithinTwiceTheSizeAndKeepsNoMoreThanTheMostInUse) {
  SimBackend sim(host_backed());
  detail::HostStash stash(sim, 0);
  void *a = nullptr, *b = nullptr, *c = nullptr;
  ASSERT_EQ(stash.take(8 * MiB, &a), DeviceStatus::ok);
  ASSERT_EQ(stash.take(2 * MiB, &b), DeviceStatus::ok);
  EXPECT_EQ(stash.in_use_bytes(), 10 * MiB);
  stash.give(a);
  stash.give(b);
  EXPECT_EQ(stash.kept_bytes(), 10 * MiB);
  EXPECT_EQ(stash.problem(), "");
  const std::uint64_t pinned = sim.counters().host_allocs;
  ASSERT_EQ(stash.take(5 * MiB, &c), DeviceStatus::ok);  // the 8 MiB one: within twice
  EXPECT_EQ(c, a);
  EXPECT_EQ(sim.counters().host_allocs, pinned);
  stash.give(c);
  // 20 MiB fits none: pinned anew, and the kept ones beyond the most ever in use at
  // once (20 MiB now, all of it in use) go back.
  void* d = nullptr;
  ASSERT_EQ(stash.take(20 * MiB, &d), DeviceStatus::ok);
  EXPECT_EQ(stash.kept_bytes(), 0u);
  EXPECT_EQ(stash.problem(), "");
  stash.give(d);
  EXPECT_EQ(stash.release(), 20 * MiB);
  EXPECT_EQ(sim.live_host_allocations(), 0u);
  EXPECT_EQ(stash.problem(), "");
}

TEST(HostStash, ABufferNotItsOwnIsFreedNotKept) {
  SimBackend sim(host_backed());
  detail::HostStash stash(sim, 0);
  void* foreign = nullptr;
  ASSERT_EQ(sim.allocate_host(0, MiB, &foreign), DeviceStatus::ok);
  stash.give(foreign);
  EXPECT_EQ(stash.kept_bytes(), 0u);
  EXPECT_EQ(sim.live_host_allocations(), 0u);
  stash.give(nullptr);
  EXPECT_EQ(stash.problem(), "");
}

}  // namespace
}  // namespace reservoir
