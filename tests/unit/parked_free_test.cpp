// The parked free (stream_pool.hpp): a free is merged lazily, and a request that best
// fit would serve from the merged block's start takes the block back. Invisible by
// design: each test pins what the eager merge gives (addresses, blocks, statistics),
// on a path where a wrong shortcut would show.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "reservoir/allocator.hpp"
#include "support/sim_allocator.hpp"

namespace reservoir {
namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::int64_t kSmallSegment = 2 * MiB;

using test::SimAllocator;

std::uintptr_t at(void* p) {
  return reinterpret_cast<std::uintptr_t>(p);
}

// The segment holding address, from a snapshot (which settles a parked block).
SegmentInfo segment_of(Allocator& a, void* p) {
  for (SegmentInfo& s : a.snapshot().segments)
    if (at(p) >= s.address && at(p) < s.address + s.total_size) return s;
  ADD_FAILURE() << "no segment holds the pointer";
  return {};
}

TEST(ParkedFree, TheSameSizeRequestTakesTheBlockBackWithTheMergedStatistics) {
  SimAllocator s;
  void* p = s.a.allocate(512, 1, 0);
  EXPECT_EQ(s.a.stats(0).inactive_split.small().current, 1);  // the rest of the segment
  s.a.deallocate(p);
  s.a.validate();
  // As merged: the segment is one free block again, so nothing is split.
  DeviceStats st = s.a.stats(0);
  EXPECT_EQ(st.allocation.small().current, 0);
  EXPECT_EQ(st.allocated_bytes.small().current, 0);
  EXPECT_EQ(st.requested_bytes.small().current, 0);
  EXPECT_EQ(st.inactive_split.small().current, 0);
  EXPECT_EQ(st.inactive_split_bytes.small().current, 0);
  void* q = s.a.allocate(500, 1, 0);
  EXPECT_EQ(q, p);
  s.a.validate();
  st = s.a.stats(0);
  EXPECT_EQ(st.allocation.small().current, 1);
  EXPECT_EQ(st.allocation.small().allocated, 2);
  EXPECT_EQ(st.allocation.small().freed, 1);
  EXPECT_EQ(st.requested_bytes.small().current, 500);
  EXPECT_EQ(st.inactive_split.small().current, 1);
  EXPECT_EQ(st.inactive_split_bytes.small().current, kSmallSegment - 512);
  EXPECT_EQ(st.inactive_split_bytes.small().peak, kSmallSegment - 512);
  s.a.deallocate(q);
  const SegmentInfo seg = segment_of(s.a, p);
  ASSERT_EQ(seg.blocks.size(), 1u);
  EXPECT_EQ(seg.blocks[0].state, BlockStateInfo::inactive);
  EXPECT_EQ(seg.blocks[0].size, static_cast<std::size_t>(kSmallSegment));
}

// A free block of the same size at a lower address is the best fit, not the block
// just freed (without a merge: both neighbours allocated).
TEST(ParkedFree, AnEqualFreeBlockAtALowerAddressWinsOverTheParkedOne) {
  SimAllocator s;
  void* a = s.a.allocate(512, 1, 0);
  void* x = s.a.allocate(512, 1, 0);
  void* y = s.a.allocate(512, 1, 0);
  void* b = s.a.allocate(512, 1, 0);
  void* c = s.a.allocate(512, 1, 0);
  s.a.deallocate(x);
  s.a.deallocate(b);  // x is merged now (a free 512 B), b waits
  EXPECT_EQ(s.a.stats(0).inactive_split.small().current, 3);  // x, b, the rest
  void* again = s.a.allocate(512, 1, 0);
  EXPECT_EQ(again, x);
  s.a.validate();
  EXPECT_EQ(s.a.stats(0).inactive_split.small().current, 2);
  for (void* p : {a, y, c, again}) s.a.deallocate(p);
  s.a.validate();
  EXPECT_EQ(s.a.stats(0).inactive_split.small().current, 0);
}

// A smaller free block beats the block the free would merge with the segment's rest.
TEST(ParkedFree, ASmallerFreeBlockWinsOverTheMergedOne) {
  SimAllocator s;
  void* a = s.a.allocate(512, 1, 0);
  void* x = s.a.allocate(1 * KiB, 1, 0);
  void* y = s.a.allocate(512, 1, 0);
  void* b = s.a.allocate(1 * KiB, 1, 0);  // before the segment's free rest
  s.a.deallocate(x);
  s.a.deallocate(b);  // x is merged now (a free 1 KiB), b waits to merge with the rest
  void* again = s.a.allocate(1 * KiB, 1, 0);
  EXPECT_EQ(again, x);
  s.a.validate();
  for (void* p : {a, y, again}) s.a.deallocate(p);
  s.a.validate();
  EXPECT_EQ(s.a.stats(0).inactive_split.small().current, 0);
}

// Freeing the parked block's neighbour first merges the parked one, as the free did.
TEST(ParkedFree, FreeingANeighbourMergesTheParkedBlockFirst) {
  SimAllocator s;
  void* a = s.a.allocate(512, 1, 0);
  void* b = s.a.allocate(512, 1, 0);
  s.a.deallocate(b);  // parked: merges with the rest
  SegmentInfo seg = segment_of(s.a, a);
  ASSERT_EQ(seg.blocks.size(), 2u);
  EXPECT_EQ(seg.blocks[1].address, at(b));
  EXPECT_EQ(seg.blocks[1].size, static_cast<std::size_t>(kSmallSegment) - 512);
  void* b2 = s.a.allocate(512, 1, 0);
  EXPECT_EQ(b2, b);
  s.a.deallocate(b2);
  s.a.deallocate(a);  // the whole segment is free: no split block
  s.a.validate();
  EXPECT_EQ(s.a.stats(0).inactive_split.small().current, 0);
  void* whole = s.a.allocate(1 * KiB, 1, 0);
  EXPECT_EQ(whole, a);
  s.a.deallocate(whole);
  EXPECT_EQ(s.a.stats(0).segment.all().current, 1);
  s.a.empty_cache();  // the segment goes back only if it is one free block
  EXPECT_EQ(s.a.stats(0).segment.all().current, 0);
  s.a.validate();
}

// The fit memo (the steady pair skips the best-fit check) stands only while the free
// index is unchanged: a block freed since, smaller than the merged one, wins.
TEST(ParkedFree, TheFitMemoLapsesWhenTheFreeBlocksChange) {
  SimAllocator s;
  void* x = s.a.allocate(1 * KiB, 1, 0);
  void* y = s.a.allocate(512, 1, 0);
  void* b = s.a.allocate(512, 1, 0);  // before the segment's free rest
  for (int i = 0; i < 3; ++i) {       // the steady pair: b back each time
    s.a.deallocate(b);
    ASSERT_EQ(s.a.allocate(512, 1, 0), b);
  }
  s.a.deallocate(x);  // another size: merged at once, a free 1 KiB before y
  s.a.deallocate(b);  // parked (with the rest: far larger than x)
  void* again = s.a.allocate(512, 1, 0);
  EXPECT_EQ(again, x);  // best fit: x, split
  s.a.validate();
  for (void* p : {y, again}) s.a.deallocate(p);
  s.a.validate();
  EXPECT_EQ(s.a.stats(0).inactive_split.small().current, 0);
}

// ... and while the size policy is unchanged: with max_split_size_mb:40 the 60 MiB
// block the parked one merges into no longer serves a 2 MiB request.
TEST(ParkedFree, TheFitMemoLapsesWhenThePolicyChanges) {
  SimAllocator s;
  s.a.deallocate(s.a.allocate(60 * MiB, 1, 0));  // a free 60 MiB segment
  void* b = s.a.allocate(2 * MiB, 1, 0);
  for (int i = 0; i < 3; ++i) {
    s.a.deallocate(b);
    ASSERT_EQ(s.a.allocate(2 * MiB, 1, 0), b);
  }
  s.a.deallocate(b);  // parked
  s.a.update_config("max_split_size_mb:40");
  void* again = s.a.allocate(2 * MiB, 1, 0);
  EXPECT_NE(again, b);  // from a new 20 MiB segment
  EXPECT_EQ(s.a.stats(0).segment.large().current, 2);
  s.a.validate();
  s.a.deallocate(again);
  s.a.validate();
}

// Large pool: the remainder of a 20 MiB segment; a request of another size merges.
TEST(ParkedFree, LargeBlocksAndOtherSizes) {
  SimAllocator s;
  void* p = s.a.allocate(2 * MiB, 1, 0);
  s.a.deallocate(p);
  EXPECT_EQ(s.a.stats(0).inactive_split.large().current, 0);
  void* q = s.a.allocate(2 * MiB, 1, 0);
  EXPECT_EQ(q, p);
  EXPECT_EQ(s.a.stats(0).inactive_split_bytes.large().current, static_cast<std::int64_t>(18 * MiB));
  s.a.deallocate(q);
  void* r = s.a.allocate(4 * MiB, 1, 0);  // the merged block, split anew
  EXPECT_EQ(r, p);
  EXPECT_EQ(s.a.stats(0).inactive_split_bytes.large().current, static_cast<std::int64_t>(16 * MiB));
  s.a.validate();
  s.a.deallocate(r);
  s.a.validate();
}

// Expandable segments park too (no split blocks counted there); switched off, their
// blocks are no longer handed out, parked or not.
TEST(ParkedFree, ExpandableSegmentsAndTheirSwitchingOff) {
  SimAllocator s("expandable_segments:True");
  void* p = s.a.allocate(512, 1, 0);
  s.a.deallocate(p);
  void* q = s.a.allocate(512, 1, 0);
  EXPECT_EQ(q, p);
  s.a.validate();
  EXPECT_EQ(s.a.stats(0).inactive_split.small().current, 0);
  s.a.deallocate(q);
  s.a.update_config("expandable_segments:False");
  void* r = s.a.allocate(512, 1, 0);
  EXPECT_NE(r, p);  // from a new, ordinary segment
  s.a.validate();
  EXPECT_EQ(s.a.stats(0).segment.small().current, 2);
  s.a.deallocate(r);
  s.a.validate();
}

// Blocks of other streams, pending frees and history take the plain path; statistics
// read meanwhile already count the parked block as freed.
TEST(ParkedFree, StatisticsAndSnapshotsSeeTheFreeAtOnce) {
  SimAllocator s;
  void* p = s.a.allocate(3 * KiB, 1, 0);
  void* keep = s.a.allocate(512, 1, 0);
  s.a.deallocate(p);  // no merge: its next is allocated
  DeviceStats st = s.a.stats(0);
  EXPECT_EQ(st.allocated_bytes.small().current, 512);
  EXPECT_EQ(st.inactive_split.small().current, 2);  // p, and the rest
  EXPECT_EQ(st.inactive_split_bytes.small().current, kSmallSegment - 512);
  const SegmentInfo seg = segment_of(s.a, p);
  ASSERT_EQ(seg.blocks.size(), 3u);
  EXPECT_EQ(seg.blocks[0].state, BlockStateInfo::inactive);
  EXPECT_EQ(s.a.block_size(keep), 512u);
  s.a.record_history(true);
  void* again = s.a.allocate(3 * KiB, 1, 0);
  EXPECT_EQ(again, p);
  s.a.deallocate(again);
  s.a.deallocate(keep);
  s.a.validate();
  EXPECT_EQ(s.a.stats(0).inactive_split.small().current, 0);
}

}  // namespace
}  // namespace reservoir
