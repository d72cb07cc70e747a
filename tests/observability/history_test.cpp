// History on the simulated device: which actions scripted workloads record and in
// what order, the ring buffer, context levels, trackers and annotations.
#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "observability/sim_allocator.hpp"

namespace reservoir {
namespace {

using test::actions;
using test::kMiB;
using test::SimAllocator;

TEST(History, ScriptedPairRecordsEveryActionInOrder) {
  SimAllocator s;
  s.a.record_history(true, 1000);
  void* p = s.a.allocate(1000, 1, 0);
  s.a.deallocate(p);
  s.a.empty_cache();
  s.a.snapshot();
  const std::vector<TraceEntry> h = s.a.history(0);
  ASSERT_EQ(actions(h), (std::vector<std::string>{"segment_alloc", "alloc", "free_requested",
                                                  "free_completed", "segment_free", "snapshot"}));
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  EXPECT_EQ(h[0].size, 2 * kMiB);  // a small-pool segment
  EXPECT_EQ(h[0].address, h[4].address);
  EXPECT_EQ(h[4].size, 2 * kMiB);
  for (int i : {1, 2, 3}) {
    EXPECT_EQ(h[i].address, addr) << i;
    EXPECT_EQ(h[i].size, 1000u) << i;  // what was asked for, as PyTorch records
  }
  for (const TraceEntry& e : h) {
    EXPECT_EQ(e.device, 0);
    EXPECT_EQ(e.context, nullptr);  // no recorder
  }
  for (std::size_t i = 0; i + 1 < h.size(); ++i) {
    EXPECT_LE(h[i].time_us, h[i + 1].time_us) << i;
    if (h[i].action != TraceAction::snapshot) {
      EXPECT_EQ(h[i].stream, 1u) << i;
    }
  }
}

TEST(History, OutOfMemoryIsRecordedWithTheDeviceFreeBytes) {
  SimOptions o;
  o.capacity = 64 * kMiB;
  SimAllocator s("", o);
  s.a.record_history(true, 1000);
  void* p = s.a.allocate(40 * kMiB, 1, 0);
  EXPECT_THROW(s.a.allocate(40 * kMiB, 1, 0), OutOfMemoryError);
  const std::vector<TraceEntry> h = s.a.history(0);
  ASSERT_FALSE(h.empty());
  const TraceEntry& oom = h.back();
  EXPECT_EQ(oom.action, TraceAction::oom);
  EXPECT_EQ(oom.size, 40 * kMiB);                 // the segment size asked of the device
  EXPECT_EQ(oom.address, 64 * kMiB - 40 * kMiB);  // device free bytes
  EXPECT_EQ(oom.stream, 1u);
  s.a.deallocate(p);
}

TEST(History, PendingFreeCompletesOnlyAfterTheOtherStreamAdvances) {
  SimAllocator s;
  s.a.record_history(true, 1000);
  void* p = s.a.allocate(4096, 1, 0);
  s.a.record_stream(p, 7);
  s.a.deallocate(p);
  EXPECT_EQ(actions(s.a.history(0)).back(), "free_requested");

  void* q = s.a.allocate(4096, 1, 0);  // stream 7 has not advanced: p stays pending
  EXPECT_NE(q, p);
  std::vector<std::string> a = actions(s.a.history(0));
  EXPECT_EQ(std::count(a.begin(), a.end(), "free_completed"), 0);

  s.sim->advance(7);
  void* r = s.a.allocate(4096, 1, 0);  // processes the completed event first
  const std::vector<TraceEntry> h = s.a.history(0);
  a = actions(h);
  ASSERT_EQ(a, (std::vector<std::string>{"segment_alloc", "alloc", "free_requested", "alloc",
                                         "free_completed", "alloc"}));
  EXPECT_EQ(h[4].address, reinterpret_cast<std::uintptr_t>(p));
  EXPECT_EQ(h[5].address, reinterpret_cast<std::uintptr_t>(r));
  s.a.deallocate(q);
  s.a.deallocate(r);
}

TEST(History, RingKeepsTheNewestEntriesInOrder) {
  SimAllocator s;
  std::vector<TraceEntry> all;
  s.a.attach_trace_tracker([&](const TraceEntry& e) { all.push_back(e); });
  s.a.record_history(true, 5);
  for (int i = 1; i <= 10; ++i)
    s.a.deallocate(s.a.allocate(static_cast<std::size_t>(i) * 512, 1, 0));
  ASSERT_GE(all.size(), 20u);
  auto same_tail = [&](const std::vector<TraceEntry>& h, std::size_t n) {
    ASSERT_EQ(h.size(), n);
    for (std::size_t i = 0; i < n; ++i) {
      const TraceEntry& want = all[all.size() - n + i];
      EXPECT_EQ(h[i].action, want.action) << i;
      EXPECT_EQ(h[i].address, want.address) << i;
      EXPECT_EQ(h[i].size, want.size) << i;
      EXPECT_EQ(h[i].time_us, want.time_us) << i;
    }
  };
  same_tail(s.a.history(0), 5);
  EXPECT_EQ(s.a.history(0).back().size, 10u * 512);
  s.a.record_history(true, 3);  // shrinking keeps the newest
  same_tail(s.a.history(0), 3);
  s.a.record_history(true, 100);  // growing keeps what is there
  same_tail(s.a.history(0), 3);
  s.a.deallocate(s.a.allocate(512, 1, 0));  // cached: alloc, free_requested, free_completed
  same_tail(s.a.history(0), 6);
}

// A recorder whose every call returns a new frame, so tests can tell which call
// produced the context an entry holds.
struct CountingRecorder {
  int calls = 0;
  ContextRecorder fn() {
    return [this] { return "train.py:" + std::to_string(++calls) + " step"; };
  }
};

TEST(History, ContextLevelNoneKeepsNoContext) {
  SimAllocator s;
  CountingRecorder rec;
  s.a.record_history(true, 100, ContextLevel::none, rec.fn());
  void* p = s.a.allocate(4096, 1, 0);
  s.a.deallocate(p);
  EXPECT_EQ(rec.calls, 0);
  for (const TraceEntry& e : s.a.history(0)) EXPECT_EQ(e.context, nullptr);
}

TEST(History, ContextLevelStateKeepsContextOnLiveBlocksOnly) {
  SimAllocator s;
  CountingRecorder rec;
  s.a.record_history(true, 100, ContextLevel::state, rec.fn());
  void* p = s.a.allocate(4096, 1, 0);
  Snapshot snap = s.a.snapshot();
  ASSERT_EQ(snap.segments.size(), 1u);
  const BlockInfo& live = snap.segments[0].blocks[0];
  ASSERT_EQ(live.address, reinterpret_cast<std::uintptr_t>(p));
  ASSERT_NE(live.context, nullptr);
  EXPECT_EQ(*live.context, "train.py:1 step");
  ASSERT_NE(snap.segments[0].context, nullptr);            // the allocation that made the segment
  EXPECT_EQ(snap.segments[0].blocks[1].context, nullptr);  // the free remainder
  s.a.deallocate(p);
  const std::vector<TraceEntry> h = s.a.history(0);
  ASSERT_EQ(actions(h), (std::vector<std::string>{"segment_alloc", "alloc", "snapshot",
                                                  "free_requested", "free_completed"}));
  EXPECT_EQ(h[1].context, nullptr);  // alloc entries need level alloc
  // Frees carry the block's allocation context, as PyTorch's do.
  ASSERT_NE(h[3].context, nullptr);
  EXPECT_EQ(*h[3].context, "train.py:1 step");
  EXPECT_EQ(rec.calls, 1);
}

TEST(History, ContextLevelAllocPutsContextOnAllocEntries) {
  SimAllocator s;
  CountingRecorder rec;
  s.a.record_history(true, 100, ContextLevel::alloc, rec.fn());
  s.a.deallocate(s.a.allocate(4096, 1, 0));
  const std::vector<TraceEntry> h = s.a.history(0);
  ASSERT_EQ(actions(h)[1], "alloc");
  ASSERT_NE(h[1].context, nullptr);
  EXPECT_EQ(*h[1].context, "train.py:1 step");
  ASSERT_NE(h[2].context, nullptr);
  EXPECT_EQ(*h[2].context, "train.py:1 step");  // free_requested: no new context
  EXPECT_EQ(rec.calls, 1);
}

TEST(History, ContextLevelAllGathersContextAtFreeToo) {
  SimAllocator s;
  CountingRecorder rec;
  s.a.record_history(true, 100, ContextLevel::all, rec.fn());
  s.a.deallocate(s.a.allocate(4096, 1, 0));
  const std::vector<TraceEntry> h = s.a.history(0);
  ASSERT_EQ(actions(h)[2], "free_requested");
  ASSERT_NE(h[1].context, nullptr);
  ASSERT_NE(h[2].context, nullptr);
  EXPECT_EQ(*h[1].context, "train.py:1 step");
  EXPECT_EQ(*h[2].context, "train.py:2 step");  // where the free happened
  EXPECT_EQ(rec.calls, 2);
}

TEST(History, TrackersSeeEveryEntryWithHistoryOff) {
  SimAllocator s;
  std::vector<std::string> seen;
  // Attached before the engine exists: later engines get it too.
  s.a.attach_trace_tracker([&](const TraceEntry& e) { seen.push_back(to_string(e.action)); });
  s.a.deallocate(s.a.allocate(4096, 1, 0));
  s.a.empty_cache();
  EXPECT_EQ(seen, (std::vector<std::string>{"segment_alloc", "alloc", "free_requested",
                                            "free_completed", "segment_free"}));
  EXPECT_TRUE(s.a.history(0).empty());
}

// Trackers run with no allocator lock held: one may call the allocator (a snapshot,
// the statistics, even a request of its own, as a registration with a communication
// library might), under every policy, on every path that records (a request and its
// ladder, a free, a release of caches, a pending free completing at a host wait).
// It would deadlock on the pool's lock if called under it.
TEST(History, TrackersRunWithNoAllocatorLockHeld) {
  for (const char* config : {"", "expandable_segments:True", "policy:compact"}) {
    SCOPED_TRACE(config);
    SimAllocator s(config);
    std::vector<std::string> seen;
    int nested = 0;
    s.a.attach_trace_tracker([&](const TraceEntry& e) {
      seen.push_back(to_string(e.action));
      if (e.action == TraceAction::snapshot) return;  // (a snapshot records one)
      (void)s.a.snapshot();                           // every pool's lock
      (void)s.a.stats(0);
      if ((e.action == TraceAction::segment_alloc || e.action == TraceAction::segment_map) &&
          nested++ < 2) {
        void* mine = s.a.allocate(512, 9, 0);  // a request of its own, recorded too
        s.a.deallocate(mine);
      }
    });
    void* p = s.a.allocate(3 * kMiB, 1, 0);
    s.a.record_stream(p, 2);
    s.a.deallocate(p);                    // pending: used on stream 2
    s.a.notify_host_wait(2, 0);           // completes there
    s.a.deallocate(s.a.allocate(kMiB, 1, 0));
    s.a.empty_cache();
    EXPECT_GE(seen.size(), 6u);
    EXPECT_NE(std::find(seen.begin(), seen.end(), "alloc"), seen.end());
    EXPECT_NE(std::find(seen.begin(), seen.end(), "free_requested"), seen.end());
    EXPECT_GT(nested, 0) << "no segment was recorded";
    s.a.validate();
  }
}

// A tracker that throws: the operation is already done (its books consistent); the
// exception is printed and dropped, the other trackers still run.
TEST(History, ATrackerThatThrowsIsReportedAndIgnored) {
  SimAllocator s;
  int after = 0;
  s.a.attach_trace_tracker([](const TraceEntry&) { throw std::runtime_error("tracker broke"); });
  s.a.attach_trace_tracker([&](const TraceEntry&) { ++after; });
  ::testing::internal::CaptureStderr();
  void* p = s.a.allocate(kMiB, 1, 0);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("a trace tracker threw (ignored): tracker broke"), std::string::npos) << err;
  EXPECT_GE(after, 2);  // segment_alloc, alloc
  s.a.deallocate(p);
  s.a.validate();
}

TEST(History, DisablingClearsEntriesAndAnnotations) {
  SimAllocator s;
  s.a.record_annotation("ignored", "START");  // history off: not kept
  s.a.record_history(true, 100);
  s.a.record_annotation("forward", "START", 0);
  s.a.deallocate(s.a.allocate(4096, 1, 0));
  Snapshot snap = s.a.snapshot();
  ASSERT_EQ(snap.annotations.size(), 1u);
  EXPECT_EQ(snap.annotations[0].name, "forward");
  EXPECT_EQ(snap.annotations[0].value, "START");
  EXPECT_FALSE(s.a.history(0).empty());

  s.a.record_history(false);
  EXPECT_TRUE(s.a.history(0).empty());
  EXPECT_TRUE(s.a.snapshot().annotations.empty());
  s.a.deallocate(s.a.allocate(4096, 1, 0));
  EXPECT_TRUE(s.a.history(0).empty());
}

TEST(History, EachDeviceHasItsOwnTrace) {
  SimOptions o;
  o.device_count = 2;
  SimAllocator s("", o);
  s.a.record_history(true, 100);
  void* p0 = s.a.allocate(4096, 1, 0);
  void* p1 = s.a.allocate(3 * kMiB, 1, 1);
  Snapshot snap = s.a.snapshot();
  ASSERT_EQ(snap.device_traces.size(), 2u);
  EXPECT_EQ(actions(snap.device_traces[0]),
            (std::vector<std::string>{"segment_alloc", "alloc", "snapshot"}));
  EXPECT_EQ(actions(snap.device_traces[1]),
            (std::vector<std::string>{"segment_alloc", "alloc", "snapshot"}));
  EXPECT_EQ(snap.device_traces[1][1].device, 1);
  EXPECT_EQ(snap.device_traces[1][1].size, 3 * kMiB);
  s.a.deallocate(p0);
  s.a.deallocate(p1);
}

}  // namespace
}  // namespace reservoir
