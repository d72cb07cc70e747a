// Expandable segments (expandable_segments:True): one growing address range per
// stream and pool, mapped in pages (2 MiB small pool, 20 MiB large pool).
#include "conformance/fixture.hpp"

namespace reservoir::testing {
namespace {

// These tests choose their configuration themselves; run them once per backend.
#define ONCE_PER_BACKEND()                                 \
  if (expandable() || async() || compact())                \
  GTEST_SKIP() << "runs once per backend, in the default " \
                  "mode"

TEST_P(Conformance, ExpandableGrowsByPagesAndReservedFollowsMaps) {
  ONCE_PER_BACKEND();
  make("expandable_segments:True");
  void* p = alloc(3 * MiB);
  DeviceStats s = stats();
  EXPECT_EQ(s.reserved_bytes.large().current, static_cast<std::int64_t>(20 * MiB));
  EXPECT_EQ(s.segment.large().current, 1);
  void* q = alloc(30 * MiB);  // the segment grows: 3 + 30 MiB need 2 pages
  EXPECT_EQ(q, static_cast<char*>(p) + 3 * MiB);
  EXPECT_EQ(reserved(), static_cast<std::int64_t>(40 * MiB));
  void* small = alloc(4096);  // the small pool maps 2 MiB pages
  EXPECT_EQ(stats().reserved_bytes.small().current, static_cast<std::int64_t>(2 * MiB));
  EXPECT_EQ(stats().num_device_alloc, 3);  // three maps
  EXPECT_EQ(a().block_size(p), 3 * MiB);   // split to the byte (remainder >= 512)
  free(p), free(q), free(small);
  a().empty_cache();
  s = stats();
  EXPECT_EQ(s.reserved_bytes.all().current, 0);
  EXPECT_EQ(s.segment.all().current, 0);  // address ranges released too
  EXPECT_EQ(s.num_device_free, 2);        // one unmap per segment's free run
}

TEST_P(Conformance, ExpandableFillsGapsAtTheLowestAddressFirst) {
  ONCE_PER_BACKEND();
  make("expandable_segments:True");
  void* a1 = alloc(20 * MiB);
  void* b1 = alloc(20 * MiB);
  void* c1 = alloc(20 * MiB);
  free(b1);
  a().empty_cache();  // unmaps b1's page: a gap between a1 and c1
  EXPECT_EQ(reserved(), static_cast<std::int64_t>(40 * MiB));
  void* d1 = alloc(20 * MiB);  // mapped into the gap, not at the end
  EXPECT_EQ(d1, b1);
  EXPECT_EQ(reserved(), static_cast<std::int64_t>(60 * MiB));
  free(a1), free(c1), free(d1);
}

TEST_P(Conformance, ExpandableBestFitCountsUnmappedRoom) {
  ONCE_PER_BACKEND();
  make("expandable_segments:True");
  void* a1 = alloc(4 * MiB);
  void* a2 = alloc(6 * MiB);
  void* a3 = alloc(6 * MiB);  // 16 of 20 MiB used; a 4 MiB tail before unmapped room
  free(a2);                   // a 6 MiB hole in the middle
  void* p = alloc(4 * MiB);   // the tail fits best by size, but could grow: take the hole
  EXPECT_EQ(p, a2);
  free(a1), free(a3), free(p);
}

TEST_P(Conformance, ExpandableUnmapsFreePagesUnderMemoryPressure) {
  ONCE_PER_BACKEND();
  make("expandable_segments:True");
  cap(61 * MiB);
  StreamHandle other = harness_->new_stream();
  void* x = alloc_on(40 * MiB, other);
  free(x);                    // 40 MiB mapped, free, on the other stream
  void* y = alloc(40 * MiB);  // 80 > 61: the other stream's pages are unmapped, retry
  DeviceStats s = stats();
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(s.num_ooms, 0);
  EXPECT_EQ(s.reserved_bytes.all().current, static_cast<std::int64_t>(40 * MiB));
  free(y);
}

TEST_P(Conformance, ExpandableCanBeSwitchedOffAndOnAtRunTime) {
  ONCE_PER_BACKEND();
  make("expandable_segments:True");
  void* p = alloc(3 * MiB);
  free(p);  // cached in the expandable segment
  a().update_config("expandable_segments:False");
  void* q = alloc(3 * MiB);  // expandable blocks are not handed out now
  EXPECT_NE(q, p);
  EXPECT_EQ(a().base_allocation(q).size, 20 * MiB);  // a regular segment
  EXPECT_THROW(a().base_allocation(p), InvalidArgumentError);
  a().update_config("expandable_segments:True");
  void* r = alloc(30 * MiB);  // expandable again: grows the expandable segment
  EXPECT_EQ(r, p);
  free(q), free(r);
  a().empty_cache();
  EXPECT_EQ(reserved(), 0);
}

TEST_P(Conformance, ExpandableOutOfMemoryIsCleanAndRecovers) {
  ONCE_PER_BACKEND();
  make("expandable_segments:True");
  cap(41 * MiB);
  void* p = alloc(30 * MiB);
  EXPECT_THROW(alloc(30 * MiB), OutOfMemoryError);
  a().validate();
  free(p);
  void* q = alloc(30 * MiB);
  free(q);
}

}  // namespace
}  // namespace reservoir::testing
