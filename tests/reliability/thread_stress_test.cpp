// Thread stress: 16 threads allocate on their own streams and on two shared ones,
// hand blocks to each other through a mutex-protected exchange (so blocks are
// freed by other threads than the allocating one), record stream uses across
// streams while the simulator's streams advance or the host waits for them, release
// their streams, and empty the cache now and then. Blocks live in host-backed memory and carry
// their owner's pattern, so a block handed out twice shows up as a corrupted pattern (and, under
// TSan, as a data race). Bounded: 20,000 operations in all, well under 10 s under TSan. A second
// test keeps eight threads on one stream, across the end of the sole-owner free path.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <latch>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "reservoir/allocator.hpp"
#include "reservoir/errors.hpp"
#include "reservoir/sim_backend.hpp"

namespace reservoir {
namespace {

constexpr int kThreads = 16;
constexpr int kOpsPerThread = 20000 / kThreads;
constexpr std::size_t kPattern = 64;  // bytes written at the start of each block
constexpr StreamHandle kShared[] = {100, 101};

struct Block {
  void* ptr;
  std::size_t size;
  std::uint8_t tag;  // written over the first bytes
};

bool intact(const Block& b) {
  const auto* bytes = static_cast<const std::uint8_t*>(b.ptr);
  for (std::size_t i = 0; i < std::min(b.size, kPattern); ++i)
    if (bytes[i] != static_cast<std::uint8_t>(b.tag + i)) return false;
  return true;
}

void fill(const Block& b) {
  auto* bytes = static_cast<std::uint8_t*>(b.ptr);
  for (std::size_t i = 0; i < std::min(b.size, kPattern); ++i)
    bytes[i] = static_cast<std::uint8_t>(b.tag + i);
}

class Exchange {
 public:
  void put(const Block& b) {
    std::lock_guard<std::mutex> guard(mutex_);
    blocks_.push_back(b);
  }
  bool take(Block* out) {
    std::lock_guard<std::mutex> guard(mutex_);
    if (blocks_.empty()) return false;
    *out = blocks_.back();
    blocks_.pop_back();
    return true;
  }
  // Frees every block left; returns how many had lost their pattern.
  int drain(Allocator& a) {
    int corrupted = 0;
    Block b;
    while (take(&b)) {
      if (!intact(b)) ++corrupted;
      a.deallocate(b.ptr);
    }
    return corrupted;
  }

 private:
  std::mutex mutex_;
  std::vector<Block> blocks_;
};

// A 4 GiB simulated device whose blocks are host memory (patterns can be checked).
std::shared_ptr<SimBackend> host_backed_device() {
  SimOptions o;
  o.capacity = std::size_t{4} << 30;
  o.host_backed = true;
  return std::make_shared<SimBackend>(o);
}

// Runs worker(t) on threads t = 0 .. n-1 and waits for them.
template <typename Worker>
void run_threads(int n, Worker worker) {
  std::vector<std::thread> threads;
  for (int t = 0; t < n; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();
}

class ThreadStress : public ::testing::TestWithParam<const char*> {};

TEST_P(ThreadStress, SixteenThreadsOnOwnAndSharedStreams) {
  auto sim = host_backed_device();
  Allocator a(sim, Config::parse(GetParam()));
  Exchange exchange;
  std::atomic<int> corrupted{0}, errors{0}, ooms{0};
  std::mutex error_mutex;
  std::string first_error;

  std::latch start(kThreads);  // all threads begin together, so their work overlaps
  auto worker = [&](int t) {
    start.arrive_and_wait();
    std::mt19937_64 rng(1000 + t);
    const StreamHandle own = 1 + t;
    std::vector<Block> live;
    auto release = [&](const Block& b) {
      if (!intact(b)) ++corrupted;
      a.deallocate(b.ptr);
    };
    try {
      for (int i = 0; i < kOpsPerThread; ++i) {
        const unsigned r = rng() % 100;
        if (r < 45 && live.size() < 8) {
          const std::size_t size = (std::size_t{256} << (rng() % 16)) + rng() % 4096;
          const StreamHandle s = rng() % 4 == 0 ? kShared[rng() % 2] : own;
          try {
            void* p = a.allocate(size, s, 0);
            live.push_back({p, size, static_cast<std::uint8_t>(rng())});
            fill(live.back());
          } catch (const OutOfMemoryError&) {
            ++ooms;
          }
        } else if (r < 70 && !live.empty()) {
          const std::size_t k = rng() % live.size();
          release(live[k]);
          live[k] = live.back();
          live.pop_back();
        } else if (r < 80 && !live.empty()) {
          exchange.put(live.back());  // freed by whichever thread takes it
          live.pop_back();
        } else if (r < 88) {
          Block b;
          if (exchange.take(&b)) release(b);
        } else if (r < 94 && !live.empty()) {
          const StreamHandle other = rng() % 2 ? kShared[rng() % 2] : 1 + rng() % kThreads;
          a.record_stream(live[rng() % live.size()].ptr, other);
        } else if (r < 97) {
          const StreamHandle s = rng() % 3 == 0 ? kShared[rng() % 2] : 1 + rng() % kThreads;
          if (rng() % 2)
            sim->advance(s);
          else
            a.notify_host_wait(s, 0);  // the host waited: the pools waiting on s check
        } else if (r < 98) {
          // The thread's stream released while others may hold its blocks (its pool
          // drains); the stream stays usable and gets a pool again on its next request.
          a.release_stream(own, 0);
        } else {
          a.empty_cache();
          (void)a.stats(0);
        }
      }
      for (const Block& b : live) release(b);
    } catch (const std::exception& e) {
      ++errors;
      std::lock_guard<std::mutex> guard(error_mutex);
      if (first_error.empty()) first_error = "thread " + std::to_string(t) + ": " + e.what();
    }
  };

  run_threads(kThreads, worker);
  corrupted += exchange.drain(a);

  EXPECT_EQ(errors.load(), 0) << first_error;
  EXPECT_EQ(corrupted.load(), 0) << "a live block was overwritten: handed out twice?";
  EXPECT_EQ(ooms.load(), 0);
  a.validate();
  DeviceStats s = a.stats(0);
  EXPECT_EQ(s.allocated_bytes.all().current, 0);
  EXPECT_EQ(s.allocation.all().current, 0);
  sim->advance_all();
  a.empty_cache();  // waits for the frees still pending on other streams
  a.validate();
  s = a.stats(0);
  EXPECT_EQ(s.active_bytes.all().current, 0);
  EXPECT_EQ(s.reserved_bytes.all().current, 0);
  EXPECT_EQ(sim->used(0), 0u);
  EXPECT_GT(s.allocation.all().allocated, kThreads * kOpsPerThread / 4);
}

// Eight threads on one stream free each other's blocks: every free goes straight to
// the segment map's sole owner and the first stream's pool is found without the
// table, until, half way, one thread allocates on a second stream and frees must
// take the lookup again while others are in flight. Nothing may be lost or handed
// out twice across that switch.
TEST_P(ThreadStress, EightThreadsOnOneStreamAcrossTheSoleOwnersEnd) {
  constexpr int kOne = 8, kOps = 1500;
  auto sim = host_backed_device();
  Allocator a(sim, Config::parse(GetParam()));
  Exchange exchange;
  std::atomic<int> corrupted{0}, errors{0};
  std::latch start(kOne);
  auto worker = [&](int t) {
    start.arrive_and_wait();
    std::mt19937_64 rng(2000 + t);
    try {
      for (int i = 0; i < kOps; ++i) {
        const StreamHandle s = t == 0 && i == kOps / 2 ? 7 : 5;  // the second stream, once
        const std::size_t size = (std::size_t{256} << (rng() % 14)) + rng() % 2048;
        Block b{a.allocate(size, s, 0), size, static_cast<std::uint8_t>(rng())};
        fill(b);
        exchange.put(b);
        Block other;
        if (rng() % 3 != 0 && exchange.take(&other)) {
          if (!intact(other)) ++corrupted;
          a.deallocate(other.ptr);
        }
      }
    } catch (const std::exception&) {
      ++errors;
    }
  };
  run_threads(kOne, worker);
  corrupted += exchange.drain(a);
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(corrupted.load(), 0) << "a live block was overwritten: handed out twice?";
  a.validate();
  const DeviceStats st = a.stats(0);
  EXPECT_EQ(st.allocation.all().current, 0);
  EXPECT_EQ(st.allocation.all().allocated, kOne * kOps);
  EXPECT_EQ(st.allocation.all().freed, kOne * kOps);
  a.empty_cache();
  EXPECT_EQ(a.stats(0).reserved_bytes.all().current, 0);
  EXPECT_EQ(sim->used(0), 0u);
}

// Sleep and wake beside working threads: three threads allocate and free under a tag
// (refused while it sleeps; their frees and record_stream go on), three others
// allocate untagged and hand blocks to each other, while the main thread puts the tag
// to sleep and wakes it, offload and discard in turn (some wakes with their copies on
// a stream). Resident tagged blocks, touched
// only while the tag is awake, keep their contents across each offload; nothing is
// lost or handed out twice; the books hold after each wake.
TEST_P(ThreadStress, SleepAndWakeBesideThreadsThatAllocate) {
  if (std::string(GetParam()) == "backend:cudaMallocAsync") GTEST_SKIP() << "no pools to sleep";
  constexpr int kTagged = 3, kPlain = 3, kCycles = 8;
  auto sim = host_backed_device();
  Allocator a(sim, Config::parse(GetParam()));
  const std::string tag = std::string("stress.sleep.") + (*GetParam() ? GetParam() : "default");
  std::vector<Block> resident;
  {
    TagScope scope(a, tag);
    for (int i = 0; i < 4; ++i) {
      const std::size_t size = (std::size_t{1} << (12 + 3 * i)) + 100;
      resident.push_back(Block{a.allocate(size, 0), size, static_cast<std::uint8_t>(40 + i)});
      fill(resident.back());
    }
  }
  Exchange exchange;
  std::atomic<bool> done{false};
  std::atomic<int> corrupted{0}, errors{0}, refused{0}, tagged_ok{0};
  std::latch start(kTagged + kPlain + 1);
  auto worker = [&](int t) {
    start.arrive_and_wait();
    std::mt19937_64 rng(3000 + t);
    const StreamHandle own = 200 + t;
    std::vector<void*> mine;
    try {
      if (t < kTagged) {
        TagScope scope(a, tag);
        while (!done.load(std::memory_order_relaxed)) {
          try {
            mine.push_back(a.allocate((std::size_t{512} << (rng() % 9)) + rng() % 4096, own, 0));
            ++tagged_ok;
          } catch (const InvalidArgumentError&) {
            ++refused;  // asleep
          }
          if (!mine.empty() && rng() % 4 == 0) a.record_stream(mine.back(), kShared[rng() % 2]);
          if (mine.size() > 6 || (!mine.empty() && rng() % 2 == 0)) {
            a.deallocate(mine.front());
            mine.erase(mine.begin());
          }
          if (rng() % 8 == 0) sim->advance_all();
        }
      } else {
        while (!done.load(std::memory_order_relaxed)) {
          const std::size_t size = (std::size_t{256} << (rng() % 12)) + rng() % 2048;
          Block b{a.allocate(size, rng() % 3 == 0 ? kShared[t % 2] : own, 0), size,
                  static_cast<std::uint8_t>(rng())};
          fill(b);
          exchange.put(b);
          Block other;
          if (exchange.take(&other)) {  // as many freed as made: the time-bound loop stays small
            if (!intact(other)) ++corrupted;
            a.deallocate(other.ptr);
          }
        }
      }
    } catch (const std::exception& e) {
      ADD_FAILURE() << "thread " << t << ": " << e.what();
      ++errors;
    }
    for (void* p : mine) a.deallocate(p);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kTagged + kPlain; ++t) threads.emplace_back(worker, t);
  start.arrive_and_wait();
  try {
    for (int c = 0; c < kCycles; ++c) {
      const bool offload = c % 2 == 0;
      a.sleep(tag, offload ? SleepMode::offload : SleepMode::discard, 0);
      std::this_thread::yield();
      if (c % 4 == 2) {  // the copies back on a stream, waited for before the check
        a.wake_async(tag, 300, 0);
        EXPECT_EQ(sim->synchronize_stream(0, 300), DeviceStatus::ok);
      } else {
        a.wake(tag, 0);
      }
      for (Block& b : resident) {
        if (offload && !intact(b)) ++corrupted;
        fill(b);
      }
      a.validate();
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << "sleep and wake: " << e.what();
  }
  done = true;
  for (auto& th : threads) th.join();
  corrupted += exchange.drain(a);
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(corrupted.load(), 0) << "a block lost its contents: handed out twice, or not restored?";
  EXPECT_GT(tagged_ok.load(), 0);
  for (const Block& b : resident) a.deallocate(b.ptr);
  a.validate();
  EXPECT_EQ(a.stats(0).allocation.all().current, 0);
  EXPECT_FALSE(a.tag_state(tag, 0).asleep);
  a.empty_cache();
  EXPECT_EQ(a.stats(0).reserved_bytes.all().current, 0);
}

std::string config_name(const ::testing::TestParamInfo<const char*>& info) {
  static const char* const kNames[] = {"Default", "Expandable", "MallocAsync", "Compact"};
  return kNames[info.index];
}

INSTANTIATE_TEST_SUITE_P(Configs, ThreadStress,
                         ::testing::Values("", "expandable_segments:True",
                                           "backend:cudaMallocAsync", "policy:compact"),
                         config_name);

}  // namespace
}  // namespace reservoir
