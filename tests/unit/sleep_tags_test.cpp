// Tags around sleep and wake (docs/sleep.md): every refusal with its message, the
// summary, metrics, snapshots and trackers naming each tag, and scopes that nest and
// belong to their allocator. On the simulated device with real host memory behind its
// addresses.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "reservoir/allocator.hpp"
#include "reservoir/errors.hpp"
#include "reservoir/sim_backend.hpp"
#include "support/sim_allocator.hpp"
#include "unit/sleep_test_util.hpp"

namespace reservoir {
namespace {

using test::host_backed;
using test::SimAllocator;
constexpr std::size_t MiB = std::size_t{1} << 20;

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
  void* tagged;
  {
    TagScope scope(plain.a, "novmm.tag");  // tagged memory is served all the same
    tagged = plain.a.allocate(MiB, 0);
  }
  refused([&] { plain.a.sleep("novmm.tag", SleepMode::offload, 0); }, "virtual memory");
  plain.a.deallocate(tagged);
  plain.a.validate();
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
