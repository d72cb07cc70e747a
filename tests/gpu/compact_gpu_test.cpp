// policy:compact on a real GPU: memory freed on one stream while a kernel there still
// uses it is handed to another stream at once — that stream must be made to wait on the
// device (a missing wait shows as the first kernel's data overwritten); and a free
// page's memory must not move to another address while a kernel still uses it.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "gpu/gpu_kernels.hpp"
#include "gpu/gpu_test_util.hpp"
#include "reservoir/allocator.hpp"

namespace reservoir::gpu_test {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::uint64_t kSpinNs = 200'000'000;  // the first kernel runs ~200 ms

class CompactGpuTest : public GpuTest {};

struct Checked {
  SpinResult seen{};
  unsigned long long bad_new = 0;
};

// Stream A writes a block, a kernel on A spins, then checks it; the host frees the block
// and at once allocates the same size on stream B and overwrites it there.
Checked reuse_across_streams(Allocator& alloc, bool* same_address, bool* a_was_running) {
  Stream a, b;
  DeviceArray<SpinResult> result(1);
  DeviceArray<unsigned long long> bad(1);
  Checked out;
  constexpr std::size_t kSize = 16 * kMiB;
  void* p = alloc.allocate(kSize, a.handle(), 0);
  const Region old_block{p, kSize, 0x1a1a};
  EXPECT_CUDA(fill(old_block, a.get()));
  EXPECT_CUDA(spin_then_verify(old_block, kSpinNs, result.get(), a.get()));
  alloc.deallocate(p);  // no host wait: the kernel on A still uses it
  void* q = alloc.allocate(kSize, b.handle(), 0);
  *same_address = q == p;
  *a_was_running = cudaStreamQuery(a.get()) == cudaErrorNotReady;
  const Region new_block{q, kSize, 0x2b2b};
  EXPECT_CUDA(fill(new_block, b.get()));
  EXPECT_CUDA(verify(new_block, bad.get(), b.get()));
  EXPECT_CUDA(cudaStreamSynchronize(a.get()));
  EXPECT_CUDA(cudaStreamSynchronize(b.get()));
  EXPECT_CUDA(cudaMemcpy(&out.seen, result.get(), sizeof out.seen, cudaMemcpyDeviceToHost));
  EXPECT_CUDA(cudaMemcpy(&out.bad_new, bad.get(), sizeof out.bad_new, cudaMemcpyDeviceToHost));
  alloc.deallocate(q);
  return out;
}

TEST_F(CompactGpuTest, ReuseOnAnotherStreamWaitsForTheFirstStreamsWork) {
  Allocator alloc(backend_, Config::parse("policy:compact"));
  bool same = false, running = false;
  const Checked c = reuse_across_streams(alloc, &same, &running);
  EXPECT_TRUE(same) << "the policy should reuse the memory across streams";
  EXPECT_TRUE(running) << "stream A had finished before the reuse (slow host?)";
  EXPECT_EQ(c.seen.blocks_done, kSpinBlocks);
  EXPECT_EQ(c.seen.mismatches, 0u) << "stream B overwrote memory stream A still used: a "
                                      "missing device-side wait";
  EXPECT_EQ(c.bad_new, 0u);
  EXPECT_GE(alloc.stats(0).num_stream_waits, 1);
  EXPECT_NO_THROW(alloc.validate());
}

// Under a memory fraction that leaves no room for new pages, a request elsewhere needs
// the memory of pages a running kernel still uses: the allocator must wait for it (the
// ladder) rather than move it.
TEST_F(CompactGpuTest, FreePagesDoNotMoveWhileAKernelUsesThem) {
  MemoryInfo info;
  ASSERT_EQ(backend_->memory_info(0, &info), DeviceStatus::ok);
  Allocator alloc(backend_, Config::parse("policy:compact"));
  alloc.set_memory_fraction(static_cast<double>(40 * kMiB) / static_cast<double>(info.total), 0);
  Stream a, b;
  DeviceArray<SpinResult> result(1);
  constexpr std::size_t kSize = 16 * kMiB;
  void* p = alloc.allocate(kSize, a.handle(), 0);
  void* guard = alloc.allocate(512, a.handle(), 0);  // the next request cannot reuse p's range
  const Region old_block{p, kSize, 0x3c3c};
  ASSERT_CUDA(fill(old_block, a.get()));
  ASSERT_CUDA(spin_then_verify(old_block, kSpinNs, result.get(), a.get()));
  alloc.deallocate(p);
  void* q = alloc.allocate(24 * kMiB, b.handle(), 0);  // needs p's memory at another address
  ASSERT_NE(q, nullptr);
  ASSERT_CUDA(fill(Region{q, 24 * kMiB, 0x4d4d}, b.get()));
  ASSERT_CUDA(cudaStreamSynchronize(a.get()));
  ASSERT_CUDA(cudaStreamSynchronize(b.get()));
  SpinResult seen{};
  ASSERT_CUDA(cudaMemcpy(&seen, result.get(), sizeof seen, cudaMemcpyDeviceToHost));
  EXPECT_EQ(seen.blocks_done, kSpinBlocks);
  EXPECT_EQ(seen.mismatches, 0u) << "a page's memory moved while the kernel used it";
  EXPECT_GE(alloc.stats(0).num_sync_all_streams, 1) << "the ladder should have waited";
  alloc.deallocate(q);
  alloc.deallocate(guard);
  EXPECT_NO_THROW(alloc.validate());
}

// Many blocks on four streams, freed and reused across them, each checked by a kernel.
TEST_F(CompactGpuTest, BlocksStayApartAcrossStreams) {
  Allocator alloc(backend_, Config::parse("policy:compact"));
  Stream s[4];
  DeviceArray<unsigned long long> bad(1);
  std::vector<Region> live;
  std::uint32_t tag = 1;
  for (int round = 0; round < 200; ++round) {
    const int k = round % 4;
    const std::size_t size = (1 + (round * 7919) % 40) * 512 * 1024 + (round % 3) * 4096;
    void* p = alloc.allocate(size, s[k].handle(), 0);
    Region r{p, size, tag++};
    ASSERT_CUDA(fill(r, s[k].get()));
    live.push_back(r);
    if (live.size() > 12) {
      const Region old = live.front();
      live.erase(live.begin());
      const int owner = static_cast<int>((old.tag - 1) % 4);
      ASSERT_CUDA(verify(old, bad.get(), s[owner].get()));
      alloc.deallocate(old.ptr);
    }
  }
  for (int k = 0; k < 4; ++k) ASSERT_CUDA(cudaStreamSynchronize(s[k].get()));
  unsigned long long mismatches = 0;
  ASSERT_CUDA(cudaMemcpy(&mismatches, bad.get(), sizeof mismatches, cudaMemcpyDeviceToHost));
  EXPECT_EQ(mismatches, 0u);
  for (const Region& r : live) alloc.deallocate(r.ptr);
  EXPECT_NO_THROW(alloc.validate());
}

}  // namespace
}  // namespace reservoir::gpu_test
