// reservoir::Allocator over CudaBackend on a real GPU: kernels write and check every
// byte the allocator hands out, across streams and threads, and a real
// out-of-memory. Skips (with the reason) on machines without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <new>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "gpu/gpu_kernels.hpp"
#include "gpu/gpu_test_util.hpp"
#include "reservoir/allocator.hpp"
#include "reservoir/errors.hpp"

namespace reservoir::gpu_test {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;

// Log-uniform in [lo, hi], at byte granularity (odd sizes included on purpose).
std::size_t log_uniform(std::mt19937_64& rng, std::size_t lo, std::size_t hi) {
  std::uniform_real_distribution<double> exponent(std::log2(static_cast<double>(lo)),
                                                  std::log2(static_cast<double>(hi)));
  auto size = static_cast<std::size_t>(std::exp2(exponent(rng)));
  return std::clamp(size, lo, hi);
}

// Host-side check that no two regions overlap (names the first pair that does).
::testing::AssertionResult disjoint(std::vector<Region> regions) {
  std::sort(regions.begin(), regions.end(), [](const Region& a, const Region& b) {
    return reinterpret_cast<std::uintptr_t>(a.ptr) < reinterpret_cast<std::uintptr_t>(b.ptr);
  });
  for (std::size_t i = 1; i < regions.size(); ++i) {
    auto end = reinterpret_cast<std::uintptr_t>(regions[i - 1].ptr) + regions[i - 1].size;
    if (end > reinterpret_cast<std::uintptr_t>(regions[i].ptr)) {
      return ::testing::AssertionFailure()
             << "blocks overlap: " << regions[i - 1].ptr << " (" << regions[i - 1].size
             << " bytes) and " << regions[i].ptr << " (" << regions[i].size << " bytes)";
    }
  }
  return ::testing::AssertionSuccess();
}

using CudaAllocatorTest = GpuTest;

// (a) Thousands of live blocks of varied sizes each hold their own pattern: catches
// overlapping blocks and memory that is not mapped. Then half are freed and new ones
// allocated (reusing the freed blocks), and everything is checked again.
// Runs the test under config; with empty_cache, the cache is emptied between the two
// rounds, so expandable segments unmap whole free pages and map them again.
void many_live_allocations(const std::shared_ptr<CudaBackend>& backend_, const char* config,
                           bool empty_cache) {
  Stream stream;
  ASSERT_CUDA(stream.status());
  MemoryInfo info;
  ASSERT_EQ(backend_->memory_info(0, &info), DeviceStatus::ok) << backend_->last_error();
  // About 11 GB live with 64 MiB blocks; smaller GPUs get smaller blocks.
  const std::size_t max_size = info.free >= 48 * kGiB ? 64 * kMiB : 8 * kMiB;
  constexpr int kFirst = 2000, kMore = 1000;

  Allocator alloc(backend_, Config::parse(config));
  std::mt19937_64 rng(20260601);
  std::vector<Region> live;
  std::uint32_t next_tag = 1;
  auto allocate = [&](int n, std::vector<Region>* fresh) {
    for (int i = 0; i < n; ++i) {
      Region r;
      r.size = log_uniform(rng, 512, max_size);
      r.ptr = alloc.allocate(r.size, stream.handle(), 0);
      r.tag = next_tag++;
      ASSERT_NE(r.ptr, nullptr);
      // cudaMalloc's guarantee, which kernels rely on.
      ASSERT_EQ(reinterpret_cast<std::uintptr_t>(r.ptr) % 256, 0u) << r.ptr;
      live.push_back(r);
      fresh->push_back(r);
    }
  };
  DeviceArray<Region> table(kFirst + kMore);
  DeviceArray<unsigned long long> mismatches(kFirst + kMore);
  ASSERT_CUDA(table.status());
  ASSERT_CUDA(mismatches.status());
  auto run = [&](const std::vector<Region>& regions, bool fill) {
    ASSERT_LE(regions.size(), table.size());
    const int n = static_cast<int>(regions.size());
    ASSERT_CUDA(cudaMemcpyAsync(table.get(), regions.data(), regions.size() * sizeof(Region),
                                cudaMemcpyHostToDevice, stream.get()));
    if (fill) {
      ASSERT_CUDA(fill_regions(table.get(), n, stream.get()));
      ASSERT_CUDA(cudaStreamSynchronize(stream.get()));
      return;
    }
    ASSERT_CUDA(cudaMemsetAsync(mismatches.get(), 0, n * sizeof(unsigned long long), stream.get()));
    ASSERT_CUDA(verify_regions(table.get(), n, mismatches.get(), stream.get()));
    std::vector<unsigned long long> bad(regions.size());
    ASSERT_CUDA(cudaMemcpyAsync(bad.data(), mismatches.get(), n * sizeof(unsigned long long),
                                cudaMemcpyDeviceToHost, stream.get()));
    ASSERT_CUDA(cudaStreamSynchronize(stream.get()));
    int bad_blocks = 0;
    for (int i = 0; i < n; ++i) {
      if (bad[i] == 0) continue;
      if (++bad_blocks <= 5) {
        ADD_FAILURE() << "block " << regions[i].ptr << " (" << regions[i].size << " bytes, tag "
                      << regions[i].tag << "): " << bad[i] << " bytes lost their pattern";
      }
    }
    EXPECT_EQ(bad_blocks, 0) << "of " << n << " live blocks";
  };

  std::vector<Region> fresh;
  ASSERT_NO_FATAL_FAILURE(allocate(kFirst, &fresh));
  ASSERT_TRUE(disjoint(live));
  ASSERT_NO_FATAL_FAILURE(run(fresh, /*fill=*/true));
  ASSERT_NO_FATAL_FAILURE(run(live, /*fill=*/false));

  // Free a deterministic half, then allocate more: freed blocks come back.
  std::shuffle(live.begin(), live.end(), rng);
  for (std::size_t i = live.size() / 2; i < live.size(); ++i) alloc.deallocate(live[i].ptr);
  live.resize(live.size() / 2);
  if (empty_cache) {
    const auto before = alloc.stats(0).num_device_free;
    alloc.empty_cache();
    EXPECT_GT(alloc.stats(0).num_device_free, before) << "nothing was unmapped";
  }
  fresh.clear();
  ASSERT_NO_FATAL_FAILURE(allocate(kMore, &fresh));
  ASSERT_TRUE(disjoint(live));
  ASSERT_NO_FATAL_FAILURE(run(fresh, /*fill=*/true));
  ASSERT_NO_FATAL_FAILURE(run(live, /*fill=*/false));

  for (const Region& r : live) alloc.deallocate(r.ptr);
  EXPECT_NO_THROW(alloc.validate());
  EXPECT_EQ(alloc.stats(0).allocation.all().current, 0);
}

TEST_F(CudaAllocatorTest, ManyLiveAllocationsHoldTheirPatterns) {
  many_live_allocations(backend_, "", false);
}

// Expandable segments: blocks up to 64 MiB span several 20 MiB pages; after the cache
// is emptied, pages are unmapped and new blocks land on pages mapped again.
TEST_F(CudaAllocatorTest, ExpandableBlocksAcrossPagesAndRemappedPagesHoldTheirPatterns) {
  if (!Allocator(backend_, Config{}).caching())
    GTEST_SKIP() << "expandable segments are part of the cache; RESERVOIR_NO_CACHING=1 is on";
  many_live_allocations(backend_, "expandable_segments:True", true);
}

// (b) A block used on another stream (record_stream) is not handed out again while
// that stream's work runs: stream B spins ~200 ms and then checks the pattern that
// stream A wrote, while the host frees the block and at once allocates the same size
// on A and overwrites the new block. Whether or not the same address comes back, B
// must see its pattern intact.
TEST_F(CudaAllocatorTest, RecordStreamKeepsBlockUntilOtherStreamFinishes) {
  constexpr std::size_t kSize = 8 * kMiB;
  constexpr std::uint64_t kSpinNs = 200'000'000;
  Stream a, b;
  Event written;
  DeviceArray<SpinResult> result(1);
  DeviceArray<unsigned long long> new_block_bad(1);
  ASSERT_CUDA(a.status());
  ASSERT_CUDA(b.status());
  ASSERT_CUDA(written.status());
  ASSERT_CUDA(result.status());
  ASSERT_CUDA(new_block_bad.status());

  Allocator alloc(backend_, Config{});
  void* p = alloc.allocate(kSize, a.handle(), 0);
  ASSERT_NE(p, nullptr);
  const Region old_block{p, kSize, 0x0b0b};
  ASSERT_CUDA(fill(old_block, a.get()));
  ASSERT_CUDA(cudaEventRecord(written.get(), a.get()));
  ASSERT_CUDA(cudaStreamWaitEvent(b.get(), written.get(), 0));
  ASSERT_CUDA(spin_then_verify(old_block, kSpinNs, result.get(), b.get()));

  alloc.record_stream(p, b.handle());
  alloc.deallocate(p);
  void* q = alloc.allocate(kSize, a.handle(), 0);
  ASSERT_NE(q, nullptr);
  const bool b_was_running = cudaStreamQuery(b.get()) == cudaErrorNotReady;
  const Region new_block{q, kSize, 0x0c0c};
  ASSERT_CUDA(fill(new_block, a.get()));
  ASSERT_CUDA(verify(new_block, new_block_bad.get(), a.get()));

  ASSERT_CUDA(cudaStreamSynchronize(a.get()));
  ASSERT_CUDA(cudaStreamSynchronize(b.get()));
  SpinResult seen{};
  unsigned long long bad_new = 0;
  ASSERT_CUDA(cudaMemcpy(&seen, result.get(), sizeof seen, cudaMemcpyDeviceToHost));
  ASSERT_CUDA(cudaMemcpy(&bad_new, new_block_bad.get(), sizeof bad_new, cudaMemcpyDeviceToHost));
  EXPECT_EQ(seen.blocks_done, kSpinBlocks) << "stream B's check did not run to the end";
  EXPECT_EQ(seen.mismatches, 0u) << "stream B saw " << seen.mismatches
                                 << " bytes overwritten while it still used the block ("
                                 << (q == p ? "same" : "different") << " address handed out again)";
  EXPECT_EQ(bad_new, 0u);
  if (!b_was_running) {
    std::printf(
        "note: stream B had finished before the second allocate returned; this run "
        "did not exercise the overlap (slow host?)\n");
  }
  alloc.deallocate(q);
  EXPECT_NO_THROW(alloc.validate());
}

// (c) Eight threads, each on its own stream, allocate, fill, verify and free
// concurrently; then the allocator's books must still balance.
TEST_F(CudaAllocatorTest, ThreadsOnOwnStreamsKeepBlocksApart) {
  constexpr int kThreads = 8, kOps = 2000, kMaxLive = 16;
  Allocator alloc(backend_, Config{});
  std::vector<std::string> errors(kThreads);
  std::vector<unsigned long long> mismatches(kThreads, 0);

  auto worker = [&](int t) {
    try {
      if (cudaSetDevice(0) != cudaSuccess) throw std::runtime_error("cudaSetDevice failed");
      Stream stream;
      DeviceArray<unsigned long long> bad(1);
      if (stream.status() != cudaSuccess || bad.status() != cudaSuccess)
        throw std::runtime_error("could not create the thread's stream or counter");
      auto check = [](cudaError_t e, const char* what) {
        if (e != cudaSuccess)
          throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
      };
      std::mt19937_64 rng(1000 + t);
      std::vector<Region> live;
      std::uint32_t tag = static_cast<std::uint32_t>(t) << 24;
      auto release = [&](std::size_t k) {
        check(verify(live[k], bad.get(), stream.get()), "verify");
        alloc.deallocate(live[k].ptr);
        live[k] = live.back();
        live.pop_back();
      };
      for (int op = 0; op < kOps; ++op) {
        const bool grow = live.empty() || (live.size() < kMaxLive && rng() % 2 == 0);
        if (grow) {
          // Mostly small and medium blocks, now and then a large one.
          std::size_t size = rng() % 50 == 0 ? log_uniform(rng, 4 * kMiB, 32 * kMiB)
                                             : log_uniform(rng, 256, 4 * kMiB);
          Region r{alloc.allocate(size, stream.handle(), 0), size, ++tag};
          check(fill(r, stream.get()), "fill");
          live.push_back(r);
        } else {
          release(rng() % live.size());
        }
      }
      while (!live.empty()) release(live.size() - 1);
      check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
      check(
          cudaMemcpy(&mismatches[t], bad.get(), sizeof(unsigned long long), cudaMemcpyDeviceToHost),
          "cudaMemcpy");
    } catch (const std::exception& e) {
      errors[t] = e.what();
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();

  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(errors[t], "") << "thread " << t;
    EXPECT_EQ(mismatches[t], 0u) << "thread " << t << ": bytes that lost their pattern";
  }
  EXPECT_NO_THROW(alloc.validate());
  EXPECT_EQ(alloc.stats(0).allocation.all().current, 0);
}

using CudaAllocatorOom = GpuTest;

// (d) An out-of-memory under a memory fraction: OutOfMemoryError (a std::bad_alloc)
// naming the request, counted in num_ooms; smaller requests still succeed, and the
// request succeeds once the limit is lifted.
TEST_F(CudaAllocatorOom, MemoryFractionLimitThrowsAndRecovers) {
  if (!Allocator(backend_, Config{}).caching())
    GTEST_SKIP() << "tests the cache's out-of-memory ladder and statistics; "
                    "RESERVOIR_NO_CACHING=1 sends every request to the device";
  MemoryInfo info;
  ASSERT_EQ(backend_->memory_info(0, &info), DeviceStatus::ok) << backend_->last_error();
  Allocator alloc(backend_, Config{});
  alloc.set_memory_fraction(0.05, 0);
  const std::size_t allowed = static_cast<std::size_t>(0.05 * static_cast<double>(info.total));
  const std::size_t request = ((allowed + kGiB) / kMiB) * kMiB;  // a whole number of MiB
  ASSERT_LT(request, info.free) << "the device itself must be able to hold the request";
  const std::int64_t ooms = alloc.stats(0).num_ooms;

  static_assert(std::is_base_of_v<std::bad_alloc, OutOfMemoryError>);
  try {
    void* p = alloc.allocate(request, 0, 0);
    alloc.deallocate(p);
    FAIL() << "allocate(" << request << ") under a limit of " << allowed << " bytes succeeded";
  } catch (const std::bad_alloc& e) {
    EXPECT_NE(dynamic_cast<const OutOfMemoryError*>(&e), nullptr)
        << "a bad_alloc that is not an OutOfMemoryError: " << e.what();
    EXPECT_TRUE(names_size(e.what(), request))
        << "message does not name the request of " << request << " bytes: " << e.what();
  }
  EXPECT_EQ(alloc.stats(0).num_ooms, ooms + 1);

  void* small = alloc.allocate(64 * kMiB, 0, 0);
  EXPECT_NE(small, nullptr);
  alloc.deallocate(small);
  alloc.set_memory_fraction(1.0, 0);
  void* big = nullptr;
  EXPECT_NO_THROW(big = alloc.allocate(request, 0, 0));
  EXPECT_NE(big, nullptr);
  alloc.deallocate(big);
  EXPECT_NO_THROW(alloc.validate());
}

// (d) A real device out-of-memory: 1 GiB blocks until the GPU has none left. The
// error is a std::bad_alloc naming the request; after freeing, allocation works
// again and the memory is usable.
TEST_F(CudaAllocatorOom, FillingTheDeviceThrowsAndRecovers) {
  if (!Allocator(backend_, Config{}).caching())
    GTEST_SKIP() << "tests the cache's out-of-memory ladder and statistics; "
                    "RESERVOIR_NO_CACHING=1 sends every request to the device";
  constexpr std::size_t kChunk = kGiB;
  MemoryInfo before;
  ASSERT_EQ(backend_->memory_info(0, &before), DeviceStatus::ok) << backend_->last_error();
  Stream stream;
  DeviceArray<unsigned long long> bad(1);
  ASSERT_CUDA(stream.status());
  ASSERT_CUDA(bad.status());

  Allocator alloc(backend_, Config{});
  const std::int64_t ooms = alloc.stats(0).num_ooms;
  std::vector<void*> held;
  std::string message;
  const std::size_t limit = before.total / kChunk + 8;  // can never need more
  while (held.size() < limit) {
    try {
      held.push_back(alloc.allocate(kChunk, stream.handle(), 0));
    } catch (const std::bad_alloc& e) {
      EXPECT_NE(dynamic_cast<const OutOfMemoryError*>(&e), nullptr)
          << "a bad_alloc that is not an OutOfMemoryError: " << e.what();
      message = e.what();
      break;
    }
  }
  ASSERT_FALSE(message.empty()) << "no out-of-memory after " << held.size() << " GiB";
  EXPECT_TRUE(names_size(message, kChunk))
      << "message does not name the 1 GiB request: " << message;
  EXPECT_EQ(alloc.stats(0).num_ooms, ooms + 1);
  EXPECT_GT(held.size(), 0u);

  for (void* p : held) alloc.deallocate(p);
  alloc.empty_cache();
  MemoryInfo after;
  ASSERT_EQ(backend_->memory_info(0, &after), DeviceStatus::ok) << backend_->last_error();
  EXPECT_GE(after.free + 2 * kChunk, before.free) << "memory was not given back";

  void* p = nullptr;
  ASSERT_NO_THROW(p = alloc.allocate(kChunk, stream.handle(), 0));
  const Region r{p, kChunk, 0xd00d};
  ASSERT_CUDA(fill(r, stream.get()));
  ASSERT_CUDA(verify(r, bad.get(), stream.get()));
  unsigned long long bad_bytes = 0;
  ASSERT_CUDA(cudaMemcpyAsync(&bad_bytes, bad.get(), sizeof bad_bytes, cudaMemcpyDeviceToHost,
                              stream.get()));
  ASSERT_CUDA(cudaStreamSynchronize(stream.get()));
  EXPECT_EQ(bad_bytes, 0u);
  alloc.deallocate(p);
  EXPECT_NO_THROW(alloc.validate());
}

}  // namespace
}  // namespace reservoir::gpu_test
