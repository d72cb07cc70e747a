// record_stream, pending frees, per-stream event queues, and threads.
#include <random>
#include <thread>

#include "conformance/fixture.hpp"

namespace reservoir::testing {
namespace {

TEST_P(Conformance, RecordStreamDefersReuseUntilTheStreamFinishes) {
  StreamHandle user = harness_->new_stream();
  void* p = alloc(8 * MiB);
  a().record_stream(p, user);
  harness_->hold_stream(user);  // work on `user` that has not finished
  free(p);
  DeviceStats s = stats();
  EXPECT_EQ(s.allocated_bytes.all().current, 0);
  EXPECT_EQ(s.active_bytes.all().current, static_cast<std::int64_t>(8 * MiB));  // pending
  void* q = alloc(8 * MiB);
  EXPECT_NE(q, p) << "a block was reused while its last user's work was unfinished";
  free(q);
  harness_->release_stream(user);
  void* r = alloc(8 * MiB);  // the event has passed: p's block is free again
  EXPECT_TRUE(r == p || r == q);
  EXPECT_EQ(stats().active_bytes.all().current, static_cast<std::int64_t>(8 * MiB));
  free(r);
}

TEST_P(Conformance, RecordStreamOnTheAllocationStreamIsIgnored) {
  void* p = alloc(MiB);
  a().record_stream(p, stream_);
  free(p);
  EXPECT_EQ(stats().active.all().current, 0);  // freed at once
}

TEST_P(Conformance, ASlowStreamDoesNotDelayFreesOnAnother) {
  StreamHandle slow = harness_->new_stream();
  StreamHandle quick = harness_->new_stream();
  void* p = alloc(12 * MiB);
  void* q = alloc(12 * MiB);
  a().record_stream(p, slow);
  a().record_stream(q, quick);
  harness_->hold_stream(slow);
  free(p);                          // waits for `slow`
  free(q);                          // waits for `quick`
  harness_->release_stream(quick);  // `quick` finishes; `slow` does not
  void* r = alloc(12 * MiB);
  EXPECT_EQ(r, q) << "the free on the idle stream should complete despite the slow one";
  EXPECT_EQ(stats().active.all().current, 2);  // r, and p still pending
  harness_->release_stream(slow);
  free(r);
}

TEST_P(Conformance, EmptyCacheWaitsForPendingFreesAndReleasesThem) {
  StreamHandle user = harness_->new_stream();
  void* p = alloc(30 * MiB);
  a().record_stream(p, user);
  harness_->hold_stream(user);
  free(p);
  // On the simulated device empty_cache's wait on the event is what completes the
  // work; a real device needs the held work let go first.
  if (!sim()) harness_->release_stream(user);
  a().empty_cache();
  DeviceStats s = stats();
  EXPECT_EQ(s.reserved_bytes.all().current, 0);
  EXPECT_EQ(s.active.all().current, 0);
  EXPECT_EQ(s.num_sync_all_streams, 1);
  if (sim()) {
    EXPECT_EQ(sim()->pending_events(user), 0u);
  }
}

TEST_P(Conformance, InvalidPointersAreRejectedAndChangeNothing) {
  void* p = alloc(4096);
  void* q = alloc(4096);
  free(q);
  DeviceStats before = stats();
  int local = 0;
  auto expect_invalid = [&](void* bad, const char* what) {
    try {
      free(bad);
      ADD_FAILURE() << what << ": no error";
    } catch (const InvalidPointerError& e) {
      char hex[32];
      std::snprintf(hex, sizeof hex, "%p", bad);
      EXPECT_NE(std::string(e.what()).find(hex), std::string::npos)
          << what << ": message does not name the pointer: " << e.what();
    }
  };
  expect_invalid(&local, "foreign pointer");
  expect_invalid(q, "double free");
  expect_invalid(static_cast<char*>(p) + 100, "interior pointer");
  EXPECT_THROW(a().record_stream(q, stream_), InvalidPointerError);
  DeviceStats after = stats();
  EXPECT_EQ(after.allocated_bytes.all().current, before.allocated_bytes.all().current);
  EXPECT_EQ(after.allocation.all().allocated, before.allocation.all().allocated);
  EXPECT_EQ(after.allocation.all().freed, before.allocation.all().freed);
  a().validate();
  free(p);
}

TEST_P(Conformance, HugeSizesFailBeforeAnyDeviceCall) {
  std::size_t device_allocs = stats().num_device_alloc;
  EXPECT_THROW(alloc(std::size_t{1} << 60), OutOfMemoryError);
  EXPECT_THROW(alloc(~std::size_t{0}), std::bad_alloc);
  EXPECT_EQ(stats().num_device_alloc, static_cast<std::int64_t>(device_allocs));
}

TEST_P(Conformance, UnknownDeviceIsAnError) {
  EXPECT_THROW(a().allocate(512, stream_, 4096), InvalidArgumentError);
  EXPECT_THROW(a().stats(4096), InvalidArgumentError);
}

TEST_P(Conformance, ThreadsOnTheirOwnStreamsAllocateConcurrently) {
  constexpr int kThreads = 8;
  constexpr int kOps = 3000;
  std::vector<StreamHandle> streams;
  for (int t = 0; t < kThreads; ++t) streams.push_back(harness_->new_stream());
  a();
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(1234 + t);
      std::vector<void*> live;
      try {
        for (int i = 0; i < kOps; ++i) {
          if (live.empty() || (live.size() < 64 && rng() % 2)) {
            std::size_t size = std::size_t{256} << (rng() % 16);
            // Every third allocation lands on a neighbour's stream, freed from here.
            StreamHandle s = (i % 3 == 0) ? streams[(t + 1) % kThreads] : streams[t];
            live.push_back(a().allocate(size + rng() % size, s, 0));
          } else {
            std::size_t k = rng() % live.size();
            a().deallocate(live[k]);
            live[k] = live.back();
            live.pop_back();
          }
        }
        for (void* p : live) a().deallocate(p);
      } catch (const std::exception& e) {
        ++failures;
        ADD_FAILURE() << "thread " << t << ": " << e.what();
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  a().validate();
  DeviceStats s = stats();
  EXPECT_EQ(s.allocated_bytes.all().current, 0);
  EXPECT_EQ(s.allocation.all().allocated, s.allocation.all().freed);
  EXPECT_GE(s.allocated_bytes.all().peak, static_cast<std::int64_t>(256));
}

}  // namespace
}  // namespace reservoir::testing
