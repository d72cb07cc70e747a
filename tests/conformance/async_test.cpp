// backend:cudaMallocAsync (the suite's async mode): the driver's stream-ordered pool
// behind the Allocator API, with Reservoir's statistics on top. The suite's
// engine-independent tests (fraction, OOM report, peaks, threads) run in this mode
// too; the caching engine's own are skipped (NATIVE_ENGINE_ONLY).
#include "conformance/fixture.hpp"

namespace reservoir::testing {
namespace {

TEST_P(Conformance, AsyncCountsWhatWasAskedAndThePoolReserves) {
  ASYNC_ONLY();
  void* p = alloc(5000);
  EXPECT_EQ(a().engine_name(), "cudaMallocAsync");
  EXPECT_EQ(a().block_size(p), 5000u);  // no rounding of Reservoir's: the pool's own
  EXPECT_EQ(a().requested_size(p), 5000u);
  DeviceStats s = stats();
  EXPECT_EQ(s.allocated_bytes.all().current, 5000);
  EXPECT_EQ(s.requested_bytes.all().current, 5000);
  EXPECT_EQ(s.allocation.all().current, 1);
  EXPECT_GE(s.reserved_bytes.all().current, 5000);  // the pool's figure
  EXPECT_EQ(s.reserved_bytes.all().peak, s.reserved_bytes.all().current);
  if (sim()) {
    EXPECT_EQ(s.reserved_bytes.all().current, static_cast<std::int64_t>(32 * MiB));
  }
  free(p);
  EXPECT_EQ(stats().allocated_bytes.all().current, 0);
}

TEST_P(Conformance, AsyncReusesFreedMemoryOnItsStreamAtOnce) {
  ASYNC_ONLY();
  void* p = alloc(8 * MiB);
  const std::int64_t reserved_before = reserved();
  free(p);
  void* q = alloc(8 * MiB);  // stream-ordered: the free precedes it on the same stream
  EXPECT_EQ(reserved(), reserved_before);
  if (sim()) {
    EXPECT_EQ(q, p);
  }
  free(q);
}

TEST_P(Conformance, AsyncFreeWaitsForTheStreamsThatUsedTheBlock) {
  ASYNC_ONLY();
  StreamHandle user = harness_->new_stream();
  StreamHandle third = harness_->new_stream();
  void* p = alloc(8 * MiB);
  a().record_stream(p, user);
  a().record_stream(p, stream_);  // the allocating stream: ignored
  harness_->hold_stream(user);
  free(p);  // ordered after `user`'s unfinished work
  EXPECT_EQ(stats().num_stream_waits, 1);
  void* q = alloc_on(8 * MiB, third);
  // The simulated pool reuses another stream's free only once it is complete (a real
  // driver may also reuse it by making `third` wait: cudaMemPoolReuseAllowInternal-
  // Dependencies, which is as safe).
  if (sim()) {
    EXPECT_NE(q, p) << "a third stream reused a block whose last user had not finished";
  }
  harness_->release_stream(user);
  free(q);
  if (sim()) {
    // `user` has finished: the free is complete, and any stream may reuse the block.
    void* r = alloc_on(8 * MiB, third);
    EXPECT_TRUE(r == p || r == q);
    free(r);
  }
}

TEST_P(Conformance, AsyncEmptyCacheGivesThePoolsMemoryBack) {
  ASYNC_ONLY();
  void* p = alloc(40 * MiB);
  free(p);
  EXPECT_GT(reserved(), 0);
  a().empty_cache();
  EXPECT_EQ(reserved(), 0);
  EXPECT_GE(stats().reserved_bytes.all().peak, static_cast<std::int64_t>(40 * MiB));
  a().reset_peak_stats(0);
  EXPECT_EQ(stats().reserved_bytes.all().peak, 0);
}

TEST_P(Conformance, AsyncSnapshotHasOneSegmentPerAllocation) {
  ASYNC_ONLY();
  a().record_history(true);
  void* p = alloc(3 * MiB);
  void* q = alloc(1000);
  Snapshot snap = a().snapshot();
  ASSERT_EQ(snap.segments.size(), 2u);
  for (const SegmentInfo& seg : snap.segments) {
    ASSERT_EQ(seg.blocks.size(), 1u);
    EXPECT_EQ(seg.blocks[0].state, BlockStateInfo::active_allocated);
    EXPECT_EQ(seg.total_size, seg.blocks[0].size);
  }
  free(q);
  std::vector<TraceEntry> h = a().history(0);
  ASSERT_GE(h.size(), 3u);
  EXPECT_EQ(h[0].action, TraceAction::alloc);
  EXPECT_EQ(h[0].size, 3 * MiB);
  EXPECT_EQ(h.back().action, TraceAction::free_completed);
  free(p);
}

TEST_P(Conformance, AsyncRefusesWhatItCannotDo) {
  ASYNC_ONLY();
  void* p = alloc(MiB);
  EXPECT_THROW(a().share(p), InvalidArgumentError);  // PyTorch's cannot share either
  EXPECT_THROW(a().update_config("backend:native"), ConfigError);
  EXPECT_THROW(a().deallocate(static_cast<char*>(p) + 512), InvalidPointerError);
  EXPECT_EQ(a().largest_cached_block(0), 0u);
  EXPECT_EQ(a().base_allocation(static_cast<char*>(p) + 512).base, p);
  free(p);
  EXPECT_THROW(free(p), InvalidPointerError);
}

}  // namespace
}  // namespace reservoir::testing
