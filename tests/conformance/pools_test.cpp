// Private pools (CTest label "pools"): isolation from the default pools, routing by
// stream filter and by thread, use counts and release, capture awareness (deferred
// frees, no device free or event query during a capture), checkpoints, use_on_oom,
// no_split, and the statistics and snapshots of each.
#include <algorithm>
#include <thread>
#include <vector>

#include "conformance/fixture.hpp"

namespace reservoir::testing {
// This executable runs the Pools suite only.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Conformance);
namespace {

class Pools : public Conformance {
 protected:
  void SetUp() override {
    Conformance::SetUp();
    if (async()) GTEST_SKIP() << "private pools need the caching engine (backend:native)";
  }
  // A pool with this thread's requests routed to it while the object lives.
  struct ThreadRoute {
    ThreadRoute(Allocator& a, PoolId id) : a(a), id(id) {
      a.begin_allocate_current_thread_to_pool(id, 0);
    }
    ~ThreadRoute() {
      a.end_allocate_to_pool(id, 0);
      a.release_pool(id, 0);
    }
    Allocator& a;
    PoolId id;
  };
  std::vector<SegmentInfo> segments_of(PoolId id) {
    std::vector<SegmentInfo> out;
    for (SegmentInfo& s : a().snapshot().segments)
      if (s.pool == id) out.push_back(s);
    return out;
  }
  bool capture(StreamHandle s) { return harness_->begin_capture(s); }
};

TEST_P(Pools, APoolsFreeBlocksNeverServeDefaultRequests) {
  PoolId pool = a().create_pool({}, 0);
  void* in_pool;
  {
    ThreadRoute route(a(), pool);
    in_pool = alloc(4 * MiB);
  }
  free(in_pool);  // cached in the pool
  const std::int64_t reserved_before = reserved();
  void* outside = alloc(4 * MiB);
  EXPECT_NE(outside, in_pool) << "a default request was served from a private pool's block";
  EXPECT_GT(reserved(), reserved_before);
  free(outside);
  a().release_pool(pool, 0);
}

// c10's cacheInfo counts graph pools' free blocks too; cuDNN sizes workspaces by it.
TEST_P(Pools, LargestCachedBlockCountsPrivatePools) {
  a().empty_cache();
  PoolId pool = a().create_pool({}, 0);
  void* in_pool;
  {
    ThreadRoute route(a(), pool);
    in_pool = alloc(24 * MiB);
  }
  // Expandable segments may keep a mapped free tail beside the block.
  EXPECT_LT(a().largest_cached_block(0), 24 * MiB);
  free(in_pool);  // cached in the pool only
  EXPECT_GE(a().largest_cached_block(0), 24 * MiB);
  a().release_pool(pool, 0);
  a().empty_cache();
  EXPECT_EQ(a().largest_cached_block(0), 0u);
}

TEST_P(Pools, DefaultFreeBlocksNeverServePoolRequests) {
  void* outside = alloc(4 * MiB);
  free(outside);  // cached in the default pool
  const std::int64_t allocs_before = stats().num_device_alloc;
  PoolId pool = a().create_pool({}, 0);
  {
    ThreadRoute route(a(), pool);
    void* in_pool = alloc(4 * MiB);
    EXPECT_NE(in_pool, outside) << "a pool request was served from the default cache";
    EXPECT_EQ(stats().num_device_alloc, allocs_before + 1);
    free(in_pool);
  }
  a().release_pool(pool, 0);
}

TEST_P(Pools, StreamFilterRoutesOnlyTheCapturingStream) {
  StreamHandle capturing = harness_->new_stream();
  StreamHandle other = harness_->new_stream();
  PoolId pool = a().create_pool({}, 0);
  a().begin_capture_to_pool(pool, capturing, 0);
  void* routed = alloc_on(MiB, capturing);
  void* not_routed = alloc_on(MiB, other);
  a().end_allocate_to_pool(pool, 0);
  auto pool_segments = segments_of(pool);
  ASSERT_EQ(pool_segments.size(), 1u);
  EXPECT_EQ(pool_segments[0].address, reinterpret_cast<std::uintptr_t>(routed));
  EXPECT_EQ(pool_segments[0].stream, capturing);
  for (const SegmentInfo& s : a().snapshot().segments) {
    if (s.address == reinterpret_cast<std::uintptr_t>(not_routed)) {
      EXPECT_TRUE(s.pool.is_default());
    }
  }
  free(routed);
  free(not_routed);
  // The route held a use: begin retained, end did not release.
  EXPECT_EQ(a().pool_use_count(pool, 0), 2);
  a().release_pool(pool, 0);
  a().release_pool(pool, 0);
}

TEST_P(Pools, ThreadRoutingLeavesOtherThreadsInTheDefaultPools) {
  PoolId pool = a().create_pool({}, 0);
  void* mine = nullptr;
  void* theirs = nullptr;
  {
    ThreadRoute route(a(), pool);
    mine = alloc(MiB);
    std::thread other([&] { theirs = a().allocate(MiB, stream_, 0); });
    other.join();
  }
  void* after = alloc(MiB);  // routing ended
  auto pool_segments = segments_of(pool);
  ASSERT_EQ(pool_segments.size(), 1u);
  EXPECT_EQ(pool_segments[0].address, reinterpret_cast<std::uintptr_t>(mine));
  EXPECT_EQ(pool_segments[0].blocks.size(), 2u) << "only this thread's block is in the pool";
  EXPECT_NE(reinterpret_cast<std::uintptr_t>(theirs) - pool_segments[0].address, 512u);
  EXPECT_FALSE(a().pool_live_allocations_are(pool, {theirs, mine}, 0));
  EXPECT_TRUE(a().pool_live_allocations_are(pool, {mine}, 0));
  free(mine);
  free(theirs);
  free(after);
  a().release_pool(pool, 0);
}

// Nested use_mem_pool blocks: the route begun last takes the requests until it ends,
// then the enclosing one takes them again (PyTorch's test_nested_mempool).
TEST_P(Pools, NestedRoutingServesTheInnermostPool) {
  PoolId outer = a().create_pool({}, 0);
  PoolId middle = a().create_pool({}, 0);
  PoolId inner = a().create_pool({}, 0);
  std::vector<void*> live;
  const std::size_t size = 20 * MiB;  // a segment of its own each
  {
    ThreadRoute r1(a(), outer);
    live.push_back(alloc(size));
    {
      ThreadRoute r2(a(), middle);
      live.push_back(alloc(size));
      {
        ThreadRoute r3(a(), inner);
        live.push_back(alloc(size));
      }
      live.push_back(alloc(size));
    }
    live.push_back(alloc(size));
  }
  if (!expandable()) {  // (an expandable segment grows: one per pool)
    EXPECT_EQ(segments_of(outer).size(), 2u);
    EXPECT_EQ(segments_of(middle).size(), 2u);
    EXPECT_EQ(segments_of(inner).size(), 1u);
  }
  EXPECT_TRUE(a().pool_live_allocations_are(inner, {live[2]}, 0));
  EXPECT_TRUE(a().pool_live_allocations_are(middle, {live[1], live[3]}, 0));
  EXPECT_TRUE(a().pool_live_allocations_are(outer, {live[0], live[4]}, 0));
  for (void* p : live) free(p);
}

TEST_P(Pools, UseCountsFollowRetainBeginAndRelease) {
  PoolId pool{0, 77};
  a().retain_pool(pool, {}, 0);
  EXPECT_EQ(a().pool_use_count(pool, 0), 1);
  a().retain_pool(pool, {}, 0);
  EXPECT_EQ(a().pool_use_count(pool, 0), 2);
  a().begin_capture_to_pool(pool, stream_, 0);
  EXPECT_EQ(a().pool_use_count(pool, 0), 3);
  EXPECT_THROW(a().begin_capture_to_pool(pool, stream_, 0), InvalidArgumentError);
  a().end_allocate_to_pool(pool, 0);
  EXPECT_THROW(a().end_allocate_to_pool(pool, 0), InvalidArgumentError);
  EXPECT_EQ(a().pool_use_count(pool, 0), 3);
  for (int i = 0; i < 3; ++i) a().release_pool(pool, 0);
  // Released with no memory: forgotten at once.
  EXPECT_THROW(a().pool_use_count(pool, 0), InvalidArgumentError);
  EXPECT_THROW(a().release_pool(pool, 0), InvalidArgumentError);
  EXPECT_THROW(a().retain_pool(PoolId{}, {}, 0), InvalidArgumentError);
}

TEST_P(Pools, AReleasedPoolGivesItsMemoryBackAfterItsLastBlockIsFreed) {
  PoolId pool = a().create_pool({}, 0);
  void* live;
  {
    ThreadRoute route(a(), pool);
    live = alloc(8 * MiB);
  }
  a().release_pool(pool, 0);  // use count 0 with a live block
  a().empty_cache();
  EXPECT_GT(stats().private_pool_reserved_bytes, 0) << "a live block's segment was returned";
  EXPECT_EQ(stats().private_pools, 1);
  EXPECT_THROW(a().retain_pool(pool, {}, 0), InvalidArgumentError);  // released, not yet gone
  free(live);
  a().empty_cache();
  EXPECT_EQ(stats().private_pool_reserved_bytes, 0);
  EXPECT_EQ(stats().private_pools, 0);
  EXPECT_EQ(reserved(), 0);
  EXPECT_THROW(a().pool_use_count(pool, 0), InvalidArgumentError);  // forgotten
}

// release_pool(empty_cache = true), torch.cuda.MemPool's destructor: at the last use
// the pool's cache goes back at once, the default pools' cache stays; with another use
// left (a route), nothing goes back; during a capture, nothing goes back either.
TEST_P(Pools, ReleasingWithEmptyCacheGivesThePoolsCacheBackAtOnce) {
  PoolId pool = a().create_pool({}, 0);
  {
    ThreadRoute route(a(), pool);
    free(alloc(8 * MiB));
  }
  free(alloc(8 * MiB));  // a default block, cached
  const std::int64_t default_bytes = reserved() - stats().private_pool_reserved_bytes;
  ASSERT_GT(stats().private_pool_reserved_bytes, 0);
  a().release_pool(pool, 0, /*empty_cache=*/true);
  EXPECT_EQ(stats().private_pool_reserved_bytes, 0);
  EXPECT_EQ(stats().private_pools, 0);
  EXPECT_EQ(reserved(), default_bytes) << "the default pools' cache went too";
  EXPECT_THROW(a().pool_use_count(pool, 0), InvalidArgumentError);  // forgotten
  a().empty_cache();

  PoolId kept = a().create_pool({}, 0);
  {
    ThreadRoute route(a(), kept);  // a second use while the first is released
    free(alloc(8 * MiB));
    a().release_pool(kept, 0, true);
    EXPECT_GT(stats().private_pool_reserved_bytes, 0) << "a pool still in use lost its cache";
  }
  a().empty_cache();
  EXPECT_EQ(reserved(), 0);

  PoolId captured = a().create_pool({}, 0);
  {
    ThreadRoute route(a(), captured);
    free(alloc(8 * MiB));
  }
  PoolId graph = a().create_pool({}, 0);
  a().begin_capture_to_pool(graph, 9, 0);
  a().release_pool(captured, 0, true);
  EXPECT_GT(stats().private_pool_reserved_bytes, 0) << "memory went back during a capture";
  a().end_allocate_to_pool(graph, 0);
  a().release_pool(graph, 0);
  a().empty_cache();
  EXPECT_EQ(reserved(), 0);
}

TEST_P(Pools, APoolInUseKeepsItsCacheThroughEmptyCache) {
  PoolId pool = a().create_pool({}, 0);
  {
    ThreadRoute route(a(), pool);
    free(alloc(8 * MiB));
  }
  free(alloc(8 * MiB));  // a default block too
  const std::int64_t pool_bytes = stats().private_pool_reserved_bytes;
  ASSERT_GT(pool_bytes, 0);
  a().empty_cache();
  EXPECT_EQ(stats().private_pool_reserved_bytes, pool_bytes)
      << "a pool whose graphs may replay lost its memory";
  EXPECT_EQ(reserved(), pool_bytes) << "the default cache was not released";
  a().release_pool(pool, 0);
  a().empty_cache();
  EXPECT_EQ(reserved(), 0);
}

TEST_P(Pools, FreesOfBlocksUsedOnOtherStreamsWaitUntilTheCaptureEnds) {
  SimBackend* sim = this->sim();
  if (!sim) GTEST_SKIP() << "counts recorded events on the simulated device";
  StreamHandle capturing = harness_->new_stream();
  StreamHandle user = harness_->new_stream();
  void* p = alloc_on(4 * MiB, capturing);  // before the capture
  a().record_stream(p, user);
  harness_->hold_stream(user);
  PoolId pool = a().create_pool({}, 0);
  a().begin_capture_to_pool(pool, capturing, 0);
  ASSERT_TRUE(capture(capturing));
  const auto recorded = sim->counters().events_recorded;
  free(p);
  EXPECT_EQ(sim->counters().events_recorded, recorded) << "an event was recorded in a capture";
  // The PyTorch policy keeps the block pending until the capture ends, then records
  // its event; policy:compact frees it at once and fences its pages with markers that
  // are recorded later, when a request needs them (after the capture).
  if (!compact()) {
    EXPECT_EQ(stats().active_bytes.all().current, static_cast<std::int64_t>(4 * MiB));
  }
  harness_->end_capture(capturing);
  a().end_allocate_to_pool(pool, 0);
  if (!compact()) {
    EXPECT_EQ(sim->counters().events_recorded, recorded + 1) << "the deferred free recorded none";
  }
  EXPECT_EQ(sim->capture_violations(), 0u);
  harness_->release_stream(user);
  void* q = alloc_on(4 * MiB, capturing);
  EXPECT_EQ(q, p) << "the deferred free did not complete once its event passed";
  EXPECT_EQ(sim->capture_violations(), 0u);
  free(q);
  a().release_pool(pool, 0);
}

TEST_P(Pools, UsesRecordedDuringACaptureNeedNoEventAfterIt) {
  SimBackend* sim = this->sim();
  if (!sim) GTEST_SKIP() << "counts recorded events on the simulated device";
  StreamHandle capturing = harness_->new_stream();
  StreamHandle side = harness_->new_stream();
  PoolId pool = a().create_pool({}, 0);
  a().begin_capture_to_pool(pool, capturing, 0);
  ASSERT_TRUE(capture(capturing));
  void* p = alloc_on(MiB, capturing);
  a().record_stream(p, side);  // work captured into the graph, not run on `side`
  free(p);
  harness_->end_capture(capturing);
  const auto recorded = sim->counters().events_recorded;
  a().end_allocate_to_pool(pool, 0);
  EXPECT_EQ(sim->counters().events_recorded, recorded);
  EXPECT_EQ(stats().active.all().current, 0) << "the free should have completed at the end";
  a().release_pool(pool, 0);
}

TEST_P(Pools, NothingGoesBackToTheDeviceDuringACapture) {
  if (!sim()) GTEST_SKIP() << "the simulated device refuses frees during a capture";
  free(alloc(40 * MiB));  // cached, releasable
  cap(60 * MiB);
  StreamHandle capturing = harness_->new_stream();
  PoolId pool = a().create_pool({}, 0);
  a().begin_capture_to_pool(pool, capturing, 0);
  ASSERT_TRUE(capture(capturing));
  const std::int64_t frees = stats().num_device_free;
  a().empty_cache();
  EXPECT_THROW(alloc_on(40 * MiB, capturing), OutOfMemoryError)
      << "the ladder released cache to make room during a capture";
  EXPECT_EQ(stats().num_device_free, frees);
  EXPECT_EQ(sim()->capture_violations(), 0u);
  harness_->end_capture(capturing);
  a().end_allocate_to_pool(pool, 0);
  a().release_pool(pool, 0);
  void* after = alloc_on(40 * MiB, capturing);  // the ladder may release again
  // (policy:compact serves it from its own free pages: nothing needs to go back.)
  if (!compact()) {
    EXPECT_GT(stats().num_device_free, frees);
  }
  free(after);
}

TEST_P(Pools, NoEventIsQueriedDuringACapture) {
  if (!sim()) GTEST_SKIP() << "the simulated device refuses event queries during a capture";
  StreamHandle capturing = harness_->new_stream();
  StreamHandle other = harness_->new_stream();
  StreamHandle user = harness_->new_stream();
  void* p = alloc_on(MiB, other);
  a().record_stream(p, user);
  harness_->hold_stream(user);
  free(p);  // pending on an event in other's cache
  PoolId pool = a().create_pool({}, 0);
  a().begin_capture_to_pool(pool, capturing, 0);
  ASSERT_TRUE(capture(capturing));
  harness_->release_stream(user);
  void* q = alloc_on(MiB, other);  // would query the pending free's event
  a().notify_host_wait(other, 0);  // likewise
  EXPECT_EQ(sim()->capture_violations(), 0u);
  EXPECT_NE(q, p) << "the pending free completed without its event being queried";
  harness_->end_capture(capturing);
  a().end_allocate_to_pool(pool, 0);
  void* r = alloc_on(MiB, other);  // after the capture: the event is queried, p is free
  EXPECT_EQ(r, p);
  free(q);
  free(r);
  a().release_pool(pool, 0);
}

// The pointers in address order: a restore lists its blocks in no promised order.
std::vector<void*> sorted(std::vector<void*> pointers) {
  std::sort(pointers.begin(), pointers.end());
  return pointers;
}

TEST_P(Pools, CheckpointRestoresBlocksAndStatistics) {
  REGULAR_SEGMENTS_ONLY();
  PoolId pool = a().create_pool({}, 0);
  void *x, *y, *z;
  {
    ThreadRoute route(a(), pool);
    x = alloc(256 * KiB);
    y = alloc(128 * KiB);
    z = alloc(512 * KiB);
    free(y);
  }
  const DeviceStats at_checkpoint = stats();
  PoolCheckpoint checkpoint = a().checkpoint_pool(pool, 0);
  ASSERT_EQ(checkpoint.segments.size(), 1u);
  ASSERT_EQ(checkpoint.segments[0].blocks.size(), 4u);  // x, y (free), z, the rest
  void* w;
  {
    ThreadRoute route(a(), pool);
    free(x);
    w = alloc(64 * KiB);
  }
  PoolRestore restored = a().restore_pool(checkpoint);
  EXPECT_EQ(sorted(restored.freed), sorted({w, z}));
  EXPECT_EQ(sorted(restored.allocated), sorted({x, z}));
  EXPECT_TRUE(a().pool_live_allocations_are(pool, {x, z}, 0));
  EXPECT_EQ(a().block_size(x), 256 * KiB);
  const DeviceStats after = stats();
  EXPECT_EQ(after.allocated_bytes.all().current, at_checkpoint.allocated_bytes.all().current);
  EXPECT_EQ(after.requested_bytes.all().current, at_checkpoint.requested_bytes.all().current);
  EXPECT_EQ(after.inactive_split.all().current, at_checkpoint.inactive_split.all().current);
  EXPECT_EQ(after.inactive_split_bytes.all().current,
            at_checkpoint.inactive_split_bytes.all().current);
  EXPECT_EQ(after.allocation.all().current, 2);
  a().validate();
  free(x);
  free(z);
  a().release_pool(pool, 0);
}

TEST_P(Pools, ARestoreThatDoesNotFitChangesNothing) {
  REGULAR_SEGMENTS_ONLY();
  PoolId pool = a().create_pool({}, 0);
  void* x;
  {
    ThreadRoute route(a(), pool);
    x = alloc(256 * KiB);
  }
  PoolCheckpoint bad = a().checkpoint_pool(pool, 0);
  bad.segments[0].blocks[0].size += 512;  // no longer tiles the segment
  EXPECT_THROW(a().restore_pool(bad), InvalidArgumentError);
  PoolCheckpoint moved = a().checkpoint_pool(pool, 0);
  moved.segments[0].base += 2 * MiB;
  EXPECT_THROW(a().restore_pool(moved), InvalidArgumentError);
  EXPECT_TRUE(a().pool_live_allocations_are(pool, {x}, 0)) << "a refused restore freed blocks";
  free(x);
  a().release_pool(pool, 0);
}

// Expandable segments (cudagraph trees under expandable_segments:True, as PyTorch
// allows): the checkpoint lists the mapped blocks; a restore carves the allocated ones
// out of the pool's free memory, wherever its mapping grew since; a forged one naming
// memory the segment does not map is refused, changing nothing.
TEST_P(Pools, CheckpointsOfExpandableSegmentsRestoreTheirBlocks) {
  if (!expandable()) GTEST_SKIP() << "expandable segments (the expandable mode)";
  PoolId pool = a().create_pool({}, 0);
  void *x, *y, *z;
  {
    ThreadRoute route(a(), pool);
    x = alloc(3 * MiB);
    y = alloc(1536 * KiB);
    z = alloc(5 * MiB);
    free(y);
  }
  const DeviceStats at_checkpoint = stats();
  PoolCheckpoint checkpoint = a().checkpoint_pool(pool, 0);
  ASSERT_FALSE(checkpoint.segments.empty());
  EXPECT_TRUE(checkpoint.segments[0].expandable);
  void *w, *big;
  {
    ThreadRoute route(a(), pool);
    free(x);
    w = alloc(1 * MiB);
    big = alloc(40 * MiB);  // the pool maps more pages
  }
  PoolRestore restored = a().restore_pool(checkpoint);
  EXPECT_EQ(sorted(restored.freed), sorted({w, z, big}));
  EXPECT_EQ(sorted(restored.allocated), sorted({x, z}));
  EXPECT_TRUE(a().pool_live_allocations_are(pool, {x, z}, 0));
  EXPECT_EQ(a().requested_size(x), 3 * MiB);
  const DeviceStats after = stats();
  EXPECT_EQ(after.allocated_bytes.all().current, at_checkpoint.allocated_bytes.all().current);
  EXPECT_EQ(after.requested_bytes.all().current, at_checkpoint.requested_bytes.all().current);
  EXPECT_EQ(after.allocation.all().current, 2);
  a().validate();
  // A block where the segment maps nothing: refused, nothing changed.
  PoolCheckpoint forged = checkpoint;
  auto& blocks = forged.segments[0].blocks;
  const auto last = std::find_if(blocks.rbegin(), blocks.rend(),
                                 [](const CheckpointBlock& b) { return b.allocated; });
  ASSERT_NE(last, blocks.rend());
  last->address += 512 * MiB;
  EXPECT_THROW(a().restore_pool(forged), InvalidArgumentError);
  EXPECT_TRUE(a().pool_live_allocations_are(pool, {x, z}, 0));
  a().validate();
  free(x);
  free(z);
  a().release_pool(pool, 0);
}

TEST_P(Pools, UseOnOomPoolsLendTheirFreeBlocks) {
  for (bool use_on_oom : {false, true}) {
    make();
    PoolId pool = a().create_pool({use_on_oom, false}, 0);
    void* in_pool;
    {
      ThreadRoute route(a(), pool);
      in_pool = alloc(40 * MiB);
    }
    free(in_pool);
    cap(static_cast<std::size_t>(reserved()) + 4 * MiB);
    if (use_on_oom) {
      void* lent = alloc(40 * MiB);
      EXPECT_EQ(lent, in_pool);
      free(lent);
    } else {
      EXPECT_THROW(alloc(40 * MiB), OutOfMemoryError);
    }
    a().release_pool(pool, 0);
    alloc_.reset();
  }
}

TEST_P(Pools, NoSplitPoolsHandOutWholeBlocks) {
  REGULAR_SEGMENTS_ONLY();
  PoolId pool = a().create_pool({false, true}, 0);
  {
    ThreadRoute route(a(), pool);
    void* p = alloc(KiB);
    void* q = alloc(KiB);
    EXPECT_EQ(a().block_size(p), 2 * MiB) << "a no_split pool split its segment";
    EXPECT_EQ(stats().segment.all().current, 2);
    free(p);
    free(q);
  }
  a().release_pool(pool, 0);
}

TEST_P(Pools, SnapshotsHistoryAndStatisticsNameThePool) {
  a().record_history(true, 1000);
  PoolId pool = a().create_pool({}, 0);
  void* p;
  {
    ThreadRoute route(a(), pool);
    p = alloc(3 * MiB);
  }
  void* q = alloc(3 * MiB);
  auto pool_segments = segments_of(pool);
  ASSERT_FALSE(pool_segments.empty());
  std::size_t pool_bytes = 0;
  for (const SegmentInfo& s : pool_segments) pool_bytes += s.total_size;
  EXPECT_EQ(stats().private_pool_reserved_bytes, static_cast<std::int64_t>(pool_bytes));
  EXPECT_EQ(stats().private_pools, 1);
  bool alloc_in_pool = false, alloc_outside = false;
  for (const TraceEntry& e : a().history(0)) {
    if (e.action != TraceAction::alloc) continue;
    if (e.address == reinterpret_cast<std::uintptr_t>(p)) alloc_in_pool = e.pool == pool;
    if (e.address == reinterpret_cast<std::uintptr_t>(q)) alloc_outside = e.pool.is_default();
  }
  EXPECT_TRUE(alloc_in_pool);
  EXPECT_TRUE(alloc_outside);
  EXPECT_NE(a().summary(0).find("Private pools (CUDA graphs, MemPool): 1"), std::string::npos);
  free(p);
  free(q);
  a().release_pool(pool, 0);
}

TEST_P(Pools, ARecycledPoolCacheCarriesNoOldState) {
  for (int round = 0; round < 3; ++round) {
    PoolId pool = a().create_pool({}, 0);
    {
      ThreadRoute route(a(), pool);
      free(alloc(2 * MiB));
    }
    a().release_pool(pool, 0);
    a().empty_cache();
    EXPECT_EQ(stats().private_pools, 0);
    EXPECT_EQ(reserved(), 0);
    a().validate();
  }
}

TEST_P(Pools, UncachedModeRefusesPools) {
  ::setenv("RESERVOIR_NO_CACHING", "1", 1);
  Allocator uncached(backend_, Config{});
  ::unsetenv("RESERVOIR_NO_CACHING");
  EXPECT_THROW(uncached.create_pool({}, 0), InvalidArgumentError);
}

TEST_P(Pools, TheAsyncBackendRefusesPools) {
  Allocator async(backend_, Config::parse("backend:cudaMallocAsync"));
  try {
    async.create_pool({}, 0);
    ADD_FAILURE() << "create_pool under backend:cudaMallocAsync did not throw";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("backend:native"), std::string::npos) << e.what();
  }
  void* p = async.allocate(MiB, 0, 0);  // the allocator itself still works
  EXPECT_NE(p, nullptr);
  async.deallocate(p);
}

INSTANTIATE_TEST_SUITE_P(Backends, Pools, ::testing::ValuesIn(harness_names()), harness_test_name);

}  // namespace
}  // namespace reservoir::testing
