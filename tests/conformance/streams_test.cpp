// record_stream, pending frees, per-stream event queues, and threads.
#include <atomic>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "conformance/fixture.hpp"

namespace reservoir::testing {
namespace {

TEST_P(Conformance, RecordStreamDefersReuseUntilTheStreamFinishes) {
  PYTORCH_POLICY_ONLY();
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
  PYTORCH_POLICY_ONLY();
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
  NATIVE_ENGINE_ONLY();
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

TEST_P(Conformance, ThreadsOnTheirOwnStreamsAllocateConcurrently) {
  constexpr int kThreads = 8;
  constexpr int kOps = 3000;
  std::vector<StreamHandle> streams;
  for (int t = 0; t < kThreads; ++t) streams.push_back(harness_->new_stream());
  a();
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  // Each thread's own high-water mark of the (rounded) bytes it holds: the device's
  // peak can be no lower than any of them and no higher than their sum.
  std::vector<std::int64_t> thread_peak(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(1234 + t);
      std::vector<void*> live;
      std::int64_t held = 0;
      try {
        for (int i = 0; i < kOps; ++i) {
          if (live.empty() || (live.size() < 64 && rng() % 2)) {
            std::size_t size = std::size_t{256} << (rng() % 16);
            // Every third allocation lands on a neighbour's stream, freed from here.
            StreamHandle s = (i % 3 == 0) ? streams[(t + 1) % kThreads] : streams[t];
            live.push_back(a().allocate(size + rng() % size, s, 0));
            held += static_cast<std::int64_t>(a().block_size(live.back()));
            thread_peak[t] = std::max(thread_peak[t], held);
          } else {
            std::size_t k = rng() % live.size();
            held -= static_cast<std::int64_t>(a().block_size(live[k]));
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
  std::int64_t sum = 0;
  for (std::int64_t p : thread_peak) {
    EXPECT_GE(s.allocated_bytes.all().peak, p);
    sum += p;
  }
  EXPECT_LE(s.allocated_bytes.all().peak, sum);
}

// validate() is public API with no "quiescent only" condition: beside threads that
// allocate 1 KiB - 64 MiB, free, record uses on other streams, move their streams on
// and empty the cache, every call must pass, in each engine and policy the mode has
// (a false report came from comparing pools walked one by one with the device budget
// read afterwards). Bounded: a fixed number of validations; the workers stop then.
TEST_P(Conformance, ValidateBesideWorkingThreadsAlwaysPasses) {
  constexpr int kThreads = 8;
  constexpr int kValidations = 2000;
  struct Setup {
    std::string config;
    bool uncached;
  };
  std::vector<Setup> setups{{"", false}};
  if (!expandable() && !async())
    setups.insert(setups.end(), {{"policy:compact", false},
                                 {"release_lock_on_cudamalloc:True", false},
                                 {"", true}});  // RESERVOIR_NO_CACHING=1
  std::vector<StreamHandle> streams;
  for (int t = 0; t < kThreads; ++t) streams.push_back(harness_->new_stream());
  for (const Setup& setup : setups) {
    SCOPED_TRACE("config \"" + setup.config + "\"" + (setup.uncached ? ", uncached" : ""));
    if (setup.uncached) setenv("RESERVOIR_NO_CACHING", "1", 1);
    Allocator& al = make(setup.config);
    if (setup.uncached) unsetenv("RESERVOIR_NO_CACHING");
    std::atomic<bool> stop{false};
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937_64 rng(77 + t);
        std::vector<void*> live;
        try {
          // At least a few operations each, whatever the validations' pace.
          for (int i = 0; !stop.load(std::memory_order_relaxed) || i < 200; ++i) {
            const unsigned op = rng() % 16;
            if (live.empty() || (live.size() < 8 && op < 7)) {
              const std::size_t size = std::size_t{1024} << (rng() % 17);  // 1 KiB - 64 MiB
              try {
                live.push_back(al.allocate(size + rng() % size, streams[t], 0));
              } catch (const OutOfMemoryError&) {
                // Every thread at its most holds 8 x 128 MiB: no refusal on 80 GiB, but
                // a device that is shared may refuse; that is no validation failure.
              }
            } else if (op < 13) {
              const std::size_t k = rng() % live.size();
              al.deallocate(live[k]);
              live[k] = live.back();
              live.pop_back();
            } else if (op < 15) {
              al.record_stream(live[rng() % live.size()], streams[(t + 1) % kThreads]);
              if (sim()) {
                harness_->hold_stream(streams[t]);
                harness_->release_stream(streams[(t + kThreads - 1) % kThreads]);
              }
            } else {
              al.empty_cache();
            }
          }
          for (void* p : live) al.deallocate(p);
        } catch (const std::exception& e) {
          ++failures;
          ADD_FAILURE() << "thread " << t << ": " << e.what();
        }
      });
    }
    int passed = 0;
    std::string first_problem;
    for (int i = 0; i < kValidations; ++i) {
      try {
        al.validate();
        ++passed;
      } catch (const std::exception& e) {
        if (first_problem.empty()) first_problem = e.what();
      }
    }
    stop.store(true);
    for (auto& th : threads) th.join();
    EXPECT_EQ(failures.load(), 0);
    EXPECT_EQ(passed, kValidations) << "first false report: " << first_problem;
    if (sim()) sim()->advance_all();
    al.validate();  // and quiescent again
  }
}

}  // namespace
}  // namespace reservoir::testing
