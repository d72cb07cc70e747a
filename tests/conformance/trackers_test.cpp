// Trace trackers and segments(): what a communication library registers. NCCL's
// allocator hook (ProcessGroupNCCL with TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK)
// registers the segments a snapshot lists when a communicator is made, then every
// range a SEGMENT_ALLOC / SEGMENT_MAP entry names, and deregisters by address what a
// SEGMENT_FREE / SEGMENT_UNMAP entry names. So: an entry that gives memory back names
// a range an earlier entry (or the listing) gave, exactly; and the memory registered
// so covers every segment listed, after any sequence of operations.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "conformance/fixture.hpp"
#include "reservoir/history.hpp"

namespace reservoir::testing {
namespace {

// The ranges a registering tracker holds, by address.
struct Registry {
  std::mutex mutex;
  std::map<std::uintptr_t, std::size_t> ranges;
  std::vector<std::string> problems;  // deregistrations of ranges never registered

  void take(const TraceEntry& e) {
    std::lock_guard<std::mutex> guard(mutex);
    switch (e.action) {
      case TraceAction::segment_alloc:
      case TraceAction::segment_map:
        ranges[e.address] = e.size;
        break;
      case TraceAction::segment_free:
      case TraceAction::segment_unmap: {
        auto it = ranges.find(e.address);
        if (it == ranges.end() || it->second != e.size)
          problems.push_back(std::string(to_string(e.action)) + " of " + std::to_string(e.size) +
                             " bytes at " + std::to_string(e.address) + " never registered");
        else
          ranges.erase(it);
        break;
      }
      default:
        break;
    }
  }
  // Whether [lo, lo + n) lies in the registered ranges.
  bool covers(std::uintptr_t lo, std::size_t n) {
    std::lock_guard<std::mutex> guard(mutex);
    std::uintptr_t at = lo;
    const std::uintptr_t hi = lo + n;
    while (at < hi) {
      auto it = ranges.upper_bound(at);
      if (it == ranges.begin()) return false;
      --it;
      if (it->first + it->second <= at) return false;
      at = it->first + it->second;
    }
    return true;
  }
};

TEST_P(Conformance, ARegisteringTrackerHoldsEverySegmentListed) {
  // As PyTorch, whose ProcessGroupNCCL turns its allocator hook off under expandable
  // segments: their growth and shrinking are runs of pages that need not pair.
  if (expandable())
    GTEST_SKIP() << "expandable segments map and unmap runs of pages that need not pair";
  NATIVE_ENGINE_ONLY();
  Allocator& al = a();
  std::vector<void*> live;
  // Some memory before the tracker: what the listing registers (a communicator made
  // late in a program).
  for (std::size_t size : {3 * MiB, 512 * KiB, 40 * MiB}) live.push_back(alloc(size));
  Registry registry;
  for (const SegmentInfo& s : al.segments(0)) registry.ranges[s.address] = s.total_size;
  al.attach_trace_tracker([&](const TraceEntry& e) { registry.take(e); });
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int> op(0, 9);
  std::uniform_real_distribution<double> lg(9.0, 26.0);
  const StreamHandle other = harness_->new_stream();
  for (int step = 0; step < 600; ++step) {
    const int o = op(rng);
    if (o < 5 || live.empty()) {
      const auto size = static_cast<std::size_t>(std::exp2(lg(rng)));
      live.push_back(alloc_on(size, o == 0 ? other : stream_));
    } else if (o < 9) {
      const std::size_t k = rng() % live.size();
      free(live[k]);
      live[k] = live.back();
      live.pop_back();
    } else {
      al.empty_cache();
    }
    if (step % 50 == 0 || o == 9) {
      for (const SegmentInfo& s : al.segments(0))
        ASSERT_TRUE(registry.covers(s.address, s.total_size))
            << "step " << step << ": a segment of " << s.total_size << " bytes at " << s.address
            << " was never registered";
    }
  }
  for (void* p : live) free(p);
  al.empty_cache();
  EXPECT_TRUE(al.segments(0).empty());
  std::lock_guard<std::mutex> guard(registry.mutex);
  EXPECT_TRUE(registry.problems.empty()) << registry.problems.front();
  // Everything registered was deregistered once the memory went back.
  EXPECT_TRUE(registry.ranges.empty()) << registry.ranges.size() << " ranges still registered";
}

// segments() is snapshot()'s segments of that device, without the history.
TEST_P(Conformance, SegmentsAreTheSnapshotsSegments) {
  Allocator& al = a();
  void* p = alloc(5 * MiB);
  void* q = alloc(700 * KiB);
  const std::vector<SegmentInfo> listed = al.segments(0);
  const std::vector<SegmentInfo> snap = al.snapshot().segments;
  ASSERT_EQ(listed.size(), snap.size());
  for (std::size_t i = 0; i < listed.size(); ++i) {
    EXPECT_EQ(listed[i].address, snap[i].address);
    EXPECT_EQ(listed[i].total_size, snap[i].total_size);
    EXPECT_EQ(listed[i].allocated_size, snap[i].allocated_size);
  }
  EXPECT_EQ(al.segments(-1).size(), listed.size());  // the current device
  EXPECT_THROW(al.segments(7), InvalidArgumentError);
  free(p);
  free(q);
}

}  // namespace
}  // namespace reservoir::testing
