// Rounding, segment sizes, split and merge rules, best fit, oversize blocks.
#include "conformance/fixture.hpp"

namespace reservoir::testing {
namespace {

TEST_P(Conformance, SizesRoundTo512Bytes) {
  NATIVE_ENGINE_ONLY();
  struct {
    std::size_t request, block;
  } rows[] = {{1, 512},     {511, 512}, {512, 512},           {513, 1024},
              {1000, 1024}, {MiB, MiB}, {MiB + 1, MiB + 512}, {3 * MiB + 7, 3 * MiB + 512}};
  for (auto r : rows) {
    void* p = alloc(r.request);
    EXPECT_EQ(a().block_size(p), r.block) << "request " << r.request;
    EXPECT_EQ(a().requested_size(p), r.request);
    free(p);
  }
}

TEST_P(Conformance, RoundupPower2DivisionsSingleValue) {
  NATIVE_ENGINE_ONLY();
  make("roundup_power2_divisions:4");
  void* p = alloc(5000);  // between 4096 and 8192, steps of 1024
  EXPECT_EQ(a().block_size(p), 5120u);
  void* q = alloc(1200);  // below 512 * 4: plain 512-byte rounding
  EXPECT_EQ(a().block_size(q), 1536u);
  void* r = alloc(4096);  // powers of two stay
  EXPECT_EQ(a().block_size(r), 4096u);
  free(p), free(q), free(r);
}

TEST_P(Conformance, RoundupPower2DivisionsPerInterval) {
  NATIVE_ENGINE_ONLY();
  make("roundup_power2_divisions:[256:1,512:2,>:8]");
  // As PyTorch parses the list: each entry names the interval that starts at its size.
  void* small = alloc(100 * MiB + 1);  // below 256 MiB: 1 division = 512-byte rounding
  EXPECT_EQ(a().block_size(small), 100 * MiB + 512);
  free(small);
  void* mid = alloc(300 * MiB + 1);  // [256, 512) MiB: the "256:1" entry, 512-byte rounding
  EXPECT_EQ(a().block_size(mid), 300 * MiB + 512);
  free(mid);
  void* big = alloc(600 * MiB);  // [512, 1024) MiB: 2 divisions of 512 MiB -> 768 MiB
  EXPECT_EQ(a().block_size(big), 768 * MiB);
  free(big);
  void* huge = alloc(1100 * MiB);  // >= 1 GiB: 8 divisions of 1 GiB -> 1152 MiB
  EXPECT_EQ(a().block_size(huge), 1152 * MiB);
  free(huge);
}

TEST_P(Conformance, SegmentSizeTable) {
  REGULAR_SEGMENTS_ONLY();
  struct {
    std::size_t request, segment;
    bool small;
  } rows[] = {{512, 2 * MiB, true},
              {MiB, 2 * MiB, true},
              {MiB + 1, 20 * MiB, false},
              {10 * MiB - 512, 20 * MiB, false},
              {10 * MiB, 10 * MiB, false},
              {11 * MiB + 1, 12 * MiB, false},
              {100 * MiB + 1, 102 * MiB, false}};
  for (auto r : rows) {
    void* p = alloc(r.request);
    DeviceStats s = stats();
    EXPECT_EQ(s.reserved_bytes.all().current, static_cast<std::int64_t>(r.segment))
        << "request " << r.request;
    EXPECT_EQ(s.segment.small().current, r.small ? 1 : 0);
    EXPECT_EQ(s.segment.large().current, r.small ? 0 : 1);
    free(p);
    a().empty_cache();
    EXPECT_EQ(reserved(), 0);
  }
}

TEST_P(Conformance, SmallBlocksShareA2MiBSegment) {
  REGULAR_SEGMENTS_ONLY();
  void* p = alloc(1000);
  void* q = alloc(200 * KiB);
  void* r = alloc(MiB);
  EXPECT_EQ(stats().segment.small().current, 1);
  EXPECT_EQ(a().base_allocation(q).base, a().base_allocation(p).base);
  EXPECT_EQ(reinterpret_cast<char*>(q), reinterpret_cast<char*>(p) + 1024);
  free(p), free(q), free(r);
}

TEST_P(Conformance, LargeBlockSplitsOnlyWhenRemainderExceeds1MiB) {
  REGULAR_SEGMENTS_ONLY();
  // 19 MiB in a 20 MiB segment: the 1 MiB remainder is not kept apart.
  void* p = alloc(19 * MiB);
  EXPECT_EQ(a().block_size(p), 20 * MiB);
  EXPECT_EQ(allocated(), static_cast<std::int64_t>(20 * MiB));
  free(p);
  a().empty_cache();
  // 2 MiB in a 20 MiB segment: split, 18 MiB stays cached as an inactive split block.
  void* q = alloc(2 * MiB);
  EXPECT_EQ(a().block_size(q), 2 * MiB);
  DeviceStats s = stats();
  EXPECT_EQ(s.inactive_split.large().current, 1);
  EXPECT_EQ(s.inactive_split_bytes.large().current, static_cast<std::int64_t>(18 * MiB));
  void* r = alloc(3 * MiB);  // served from the remainder, same segment
  EXPECT_EQ(reinterpret_cast<char*>(r), reinterpret_cast<char*>(q) + 2 * MiB);
  EXPECT_EQ(stats().segment.all().current, 1);
  free(q), free(r);
  EXPECT_EQ(stats().inactive_split.all().current, 0);  // merged back into one block
}

TEST_P(Conformance, FreedNeighboursMerge) {
  REGULAR_SEGMENTS_ONLY();
  void* p = alloc(4096);
  void* q = alloc(4096);
  void* r = alloc(4096);
  free(q);
  EXPECT_EQ(stats().inactive_split.small().current, 2);  // q's hole and the tail
  free(p);
  EXPECT_EQ(stats().inactive_split.small().current, 2);  // p+q merged
  free(r);
  DeviceStats s = stats();
  EXPECT_EQ(s.inactive_split.small().current, 0);
  EXPECT_EQ(s.inactive_split_bytes.small().current, 0);
  void* whole = alloc(MiB);  // the whole segment is one free block again: lowest address
  EXPECT_EQ(whole, p);
  free(whole);
}

TEST_P(Conformance, BestFitTakesSmallestBlockThenLowestAddress) {
  REGULAR_SEGMENTS_ONLY();
  // Four unsplit cached segments: 12, 14, 12, 16 MiB.
  void* a12 = alloc(12 * MiB);
  void* b14 = alloc(14 * MiB);
  void* c12 = alloc(12 * MiB);
  void* d16 = alloc(16 * MiB);
  free(a12), free(b14), free(c12), free(d16);
  void* lower12 = std::min(a12, c12);
  void* first = alloc(11 * MiB);  // fits all; smallest are the two 12s: lowest address
  EXPECT_EQ(first, lower12);
  void* second = alloc(11 * MiB);  // the other 12
  EXPECT_EQ(second, std::max(a12, c12));
  void* third = alloc(13 * MiB);  // 14 fits before 16
  EXPECT_EQ(third, b14);
  EXPECT_EQ(stats().num_device_alloc, 4);
  free(first), free(second), free(third);
}

TEST_P(Conformance, OversizeBlocksAreNotSplitAndServeOnlyNearSizes) {
  REGULAR_SEGMENTS_ONLY();
  make("max_split_size_mb:100");
  void* big = alloc(200 * MiB);
  EXPECT_EQ(stats().oversize_allocations.current, 1);
  EXPECT_EQ(stats().oversize_segments.current, 1);
  free(big);
  EXPECT_EQ(stats().oversize_allocations.current, 0);
  // A small request never takes the cached oversize block.
  void* small = alloc(50 * MiB);
  EXPECT_NE(small, big);
  EXPECT_EQ(stats().num_device_alloc, 2);
  // An oversize request within max_non_split_rounding (20 MiB) of it does, unsplit.
  void* near = alloc(190 * MiB);
  EXPECT_EQ(near, big);
  EXPECT_EQ(a().block_size(near), 200 * MiB);
  free(near);
  // One 20 MiB or more smaller does not.
  void* far = alloc(150 * MiB);
  EXPECT_NE(far, big);
  free(far), free(small);
}

TEST_P(Conformance, MaxNonSplitRoundingIsConfigurable) {
  REGULAR_SEGMENTS_ONLY();
  make("max_split_size_mb:100,max_non_split_rounding_mb:60");
  void* big = alloc(200 * MiB);
  free(big);
  void* p = alloc(150 * MiB);  // 200 < 150 + 60: served by the cached block
  EXPECT_EQ(p, big);
  free(p);
}

TEST_P(Conformance, BlocksStayOnTheirStream) {
  PYTORCH_POLICY_ONLY();
  StreamHandle other = harness_->new_stream();
  void* p = alloc(4 * MiB);
  free(p);
  void* q = alloc_on(4 * MiB, other);  // the cached block belongs to stream_
  EXPECT_NE(q, p);
  EXPECT_EQ(stats().num_device_alloc, 2);
  free(q);
  void* r = alloc(4 * MiB);  // back on stream_: reused
  EXPECT_EQ(r, p);
  free(r);
}

}  // namespace
}  // namespace reservoir::testing
