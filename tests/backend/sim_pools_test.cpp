// SimBackend's stream-ordered pools: the model of the driver pool behind
// backend:cudaMallocAsync (reuse rules, growth, trim, release threshold, capacity).
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "backend/sim/memory_pool.hpp"
#include "reservoir/sim_backend.hpp"

namespace reservoir {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr DeviceStatus kOk = DeviceStatus::ok;
constexpr StreamHandle kS1 = 0x10, kS2 = 0x20;

class SimPool : public ::testing::Test {
 protected:
  void SetUp() override { make(SimOptions{}); }
  void make(SimOptions o) {
    sim_ = std::make_unique<SimBackend>(o);
    ASSERT_EQ(sim_->create_pool(0, &pool_), kOk);
    ASSERT_EQ(sim_->set_pool_release_threshold(0, pool_, std::numeric_limits<std::uint64_t>::max()),
              kOk);
  }
  void* alloc(std::size_t size, StreamHandle s) {
    void* p = nullptr;
    EXPECT_EQ(sim_->allocate_from_pool(0, pool_, size, s, &p), kOk) << sim_->last_error();
    return p;
  }
  PoolUsage usage() {
    PoolUsage u;
    EXPECT_EQ(sim_->pool_usage(0, pool_, &u), kOk);
    return u;
  }
  std::unique_ptr<SimBackend> sim_;
  PoolHandle pool_ = 0;
};

TEST_F(SimPool, ReusesOnItsStreamAtOnceAndOnOthersOnceTheFreeIsComplete) {
  void* a = alloc(8 * MiB, kS1);
  void* rest = alloc(24 * MiB, kS1);  // the chunk is full: only a's free can serve
  sim_->submit_work(kS1);             // a kernel on s1 that has not finished: the free is pending
  ASSERT_EQ(sim_->free_async(0, a, kS1), kOk);
  void* same = alloc(8 * MiB, kS1);  // stream order makes it safe on s1
  EXPECT_EQ(same, a);
  ASSERT_EQ(sim_->free_async(0, same, kS1), kOk);
  void* other = alloc(8 * MiB, kS2);  // s2 is not ordered after the free: a new chunk
  EXPECT_NE(other, a);
  EXPECT_EQ(usage().reserved, 64 * MiB);
  sim_->advance(kS1);  // the free's work finished: opportunistic reuse
  void* later = alloc(8 * MiB, kS2);
  EXPECT_EQ(later, a);
  EXPECT_EQ(usage().reserved, 64 * MiB);
  for (void* p : {rest, other, later}) EXPECT_EQ(sim_->free_async(0, p, kS2), kOk);
}

TEST_F(SimPool, FollowsEventDependencies) {
  void* a = alloc(8 * MiB, kS1);
  sim_->submit_work(kS1);
  ASSERT_EQ(sim_->free_async(0, a, kS1), kOk);
  void* block = alloc(24 * MiB, kS2);  // fills the rest of the chunk
  EventHandle e = 0;
  ASSERT_EQ(sim_->create_event(0, &e), kOk);
  ASSERT_EQ(sim_->record_event(0, e, kS1), kOk);  // after the free on s1
  ASSERT_EQ(sim_->stream_wait_event(0, kS2, e), kOk);
  void* b = alloc(8 * MiB, kS2);  // s2 now follows the free
  EXPECT_EQ(b, a);
  EXPECT_EQ(usage().reserved, 32 * MiB);
  EXPECT_EQ(sim_->free_async(0, b, kS2), kOk);
  EXPECT_EQ(sim_->free_async(0, block, kS2), kOk);
}

TEST_F(SimPool, AFreeAfterAWaitCompletesWithTheWorkItWaitedFor) {
  // s1 waits for unfinished work of s2, then frees: the free is not complete while
  // s2's work runs, though s1 itself has nothing outstanding.
  EventHandle e = 0;
  ASSERT_EQ(sim_->create_event(0, &e), kOk);
  void* a = alloc(32 * MiB, kS1);
  sim_->submit_work(kS2);
  ASSERT_EQ(sim_->record_event(0, e, kS2), kOk);
  ASSERT_EQ(sim_->stream_wait_event(0, kS1, e), kOk);
  ASSERT_EQ(sim_->free_async(0, a, kS1), kOk);
  constexpr StreamHandle kS3 = 0x30;
  void* b = alloc(32 * MiB, kS3);
  EXPECT_NE(b, a);
  EXPECT_EQ(usage().reserved, 64 * MiB);
  sim_->advance(kS2);
  void* c = alloc(32 * MiB, kS3);
  EXPECT_EQ(c, a);
  EXPECT_EQ(sim_->free_async(0, b, kS3), kOk);
  EXPECT_EQ(sim_->free_async(0, c, kS3), kOk);
}

TEST_F(SimPool, GrowsByChunksAndTrimGivesFreeChunksBack) {
  void* small = alloc(1000, kS1);
  EXPECT_EQ(usage().reserved, 32 * MiB);
  EXPECT_EQ(usage().used, 1024u);    // 512-byte rounding
  void* big = alloc(40 * MiB, kS1);  // its own chunk, rounded to 32 MiB
  EXPECT_EQ(usage().reserved, 96 * MiB);
  EXPECT_EQ(sim_->used(0), 96 * MiB);  // chunks are device memory
  EXPECT_EQ(sim_->counters().pool_chunks, 2u);
  ASSERT_EQ(sim_->free_async(0, big, kS1), kOk);
  ASSERT_EQ(sim_->trim_pool(0, pool_, 0), kOk);  // the small chunk is still in use
  EXPECT_EQ(usage().reserved, 32 * MiB);
  EXPECT_EQ(usage().reserved_high, 96 * MiB);
  ASSERT_EQ(sim_->reset_pool_peaks(0, pool_), kOk);
  EXPECT_EQ(usage().reserved_high, 32 * MiB);
  ASSERT_EQ(sim_->free_async(0, small, kS1), kOk);
  ASSERT_EQ(sim_->trim_pool(0, pool_, 0), kOk);
  EXPECT_EQ(usage().reserved, 0u);
  EXPECT_EQ(sim_->used(0), 0u);
}

TEST_F(SimPool, TheReleaseThresholdAppliesAtSynchronization) {
  ASSERT_EQ(sim_->set_pool_release_threshold(0, pool_, 0), kOk);  // CUDA's default
  void* p = alloc(MiB, kS1);
  ASSERT_EQ(sim_->free_async(0, p, kS1), kOk);
  EXPECT_EQ(usage().reserved, 32 * MiB);  // until a synchronization
  ASSERT_EQ(sim_->synchronize_stream(0, kS1), kOk);
  EXPECT_EQ(usage().reserved, 0u);
}

TEST_F(SimPool, EntirelyFreeChunksMakeRoomForALargerOne) {
  SimOptions o;
  o.capacity = 96 * MiB;
  make(o);
  void* a = alloc(60 * MiB, kS1);  // a 64 MiB chunk
  ASSERT_EQ(sim_->free_async(0, a, kS1), kOk);
  void* b = alloc(96 * MiB, kS1);  // needs 96 MiB: the free chunk goes back first
  EXPECT_NE(b, nullptr);
  EXPECT_EQ(usage().reserved, 96 * MiB);
  EXPECT_EQ(usage().reserved_high, 96 * MiB);
  void* c = nullptr;
  EXPECT_EQ(sim_->allocate_from_pool(0, pool_, MiB, kS1, &c), DeviceStatus::out_of_memory);
  EXPECT_NE(sim_->last_error().find("out of memory"), std::string::npos);
  EXPECT_EQ(sim_->free_async(0, b, kS1), kOk);
}

TEST_F(SimPool, RefusesBadCalls) {
  void* p = alloc(MiB, kS1);
  EXPECT_EQ(sim_->destroy_pool(0, pool_), DeviceStatus::error);  // still live
  EXPECT_NE(sim_->last_error().find("still live"), std::string::npos);
  EXPECT_EQ(sim_->free_async(0, static_cast<char*>(p) + 512, kS1), DeviceStatus::error);
  EXPECT_EQ(sim_->free_async(1, p, kS1), DeviceStatus::error);  // no device 1
  EXPECT_EQ(sim_->set_pool_release_threshold(0, pool_ + 1, 0), DeviceStatus::error);
  ASSERT_EQ(sim_->free_async(0, p, kS1), kOk);
  EXPECT_EQ(sim_->free_async(0, p, kS1), DeviceStatus::error);  // twice
  EXPECT_EQ(sim_->destroy_pool(0, pool_), kOk);
  EXPECT_EQ(sim_->live_pools(), 0u);
  EXPECT_EQ(sim_->used(0), 0u);
}

TEST_F(SimPool, FaultsCanBeInjected) {
  sim_->fail_operation_number(SimOp::allocate_from_pool, 1, DeviceStatus::out_of_memory);
  void* p = nullptr;
  EXPECT_EQ(sim_->allocate_from_pool(0, pool_, MiB, kS1, &p), DeviceStatus::out_of_memory);
  p = alloc(MiB, kS1);
  sim_->fail_operation_number(SimOp::free_async, 1, DeviceStatus::error);
  EXPECT_EQ(sim_->free_async(0, p, kS1), DeviceStatus::error);
  EXPECT_EQ(sim_->free_async(0, p, kS1), kOk);  // nothing changed by the failed call
}

TEST_F(SimPool, FirstOrBestFitAsConfigured) {
  SimOptions o;
  o.pool.best_fit = true;
  make(o);
  void* a = alloc(8 * MiB, kS1);
  void* b = alloc(MiB, kS1);
  void* c = alloc(4 * MiB, kS1);
  void* d = alloc(MiB, kS1);
  ASSERT_EQ(sim_->free_async(0, a, kS1), kOk);  // an 8 MiB hole first
  ASSERT_EQ(sim_->free_async(0, c, kS1), kOk);  // a 4 MiB hole after it
  void* e = alloc(4 * MiB, kS1);
  EXPECT_EQ(e, c);  // best fit: the 4 MiB hole
  ASSERT_EQ(sim_->free_async(0, e, kS1), kOk);
  o.pool.best_fit = false;
  make(o);
  a = alloc(8 * MiB, kS1);
  b = alloc(MiB, kS1);
  c = alloc(4 * MiB, kS1);
  d = alloc(MiB, kS1);
  ASSERT_EQ(sim_->free_async(0, a, kS1), kOk);
  ASSERT_EQ(sim_->free_async(0, c, kS1), kOk);
  e = alloc(4 * MiB, kS1);
  EXPECT_EQ(e, a);  // first fit: the lowest address that fits
  (void)b;
  (void)d;
}

// A program whose device work never completes (no synchronization): every free stays
// pending. A request must not look at every pending free (settling stops at the first
// position its stream has not reached; a best fit walks a size index or the prefix
// another stream may reuse, the shorter): 16 threads on the simulated driver pool took
// 72 s where the caching engine took 0.4 s.
TEST(SimPoolModel, WorkPerRequestStaysBoundedWhileFreesStayPending) {
  constexpr int kFrees = 20000;
  constexpr StreamHandle kS3 = 0x30, kS4 = 0x40;
  sim::PoolModel model(SimPoolOptions{});
  sim::StreamProgress progress;
  progress.completed = [](StreamHandle) -> std::uint64_t { return 0; };  // nothing completes
  progress.waited = [](StreamHandle t, StreamHandle s) -> std::uint64_t {
    if (s != kS1) return 0;
    return t == kS2 ? kFrees : t == kS3 ? 8 : 0;  // s2 waited for all of s1, s3 for its start
  };
  std::uintptr_t next = std::uintptr_t{1} << 40;
  auto grow = [&](std::size_t n, std::uintptr_t* a) {
    *a = next;
    next += n;
    return true;
  };
  auto shrink = [](std::uintptr_t, std::size_t) {};
  auto size_of = [](int i) { return std::size_t{4096} * (1 + i % 7); };
  std::vector<std::uintptr_t> blocks;
  for (int i = 0; i < kFrees; ++i)
    blocks.push_back(model.allocate(size_of(i), kS1, progress, grow, shrink));
  std::uint64_t position = 0;
  for (std::uintptr_t b : blocks) ASSERT_EQ(model.free(b, kS1, ++position, {}, progress), "");
  const std::uint64_t before = model.pending_steps();
  constexpr StreamHandle kRequesters[] = {kS1, kS2, kS3, kS4};
  constexpr int kRequests = 3 * kFrees;
  for (int i = 0; i < kRequests; ++i)
    ASSERT_NE(model.allocate(size_of(i), kRequesters[i % 4], progress, grow, shrink), 0u);
  EXPECT_LE(model.pending_steps() - before, std::uint64_t{16} * kRequests)
      << "a request looked at pending frees in proportion to their number";
}

}  // namespace
}  // namespace reservoir
