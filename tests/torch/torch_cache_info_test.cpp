// reservoir_torch_cache_info, what reservoir.torch's native allocator answers for
// c10's cacheInfo (cuDNN's benchmark sizes its workspace by it), on the simulated
// device: a zero start is the device's free memory, a non-zero one is raised to the
// largest cached free block only.
#include <gtest/gtest.h>

#include <cstddef>

#include "integrations/torch_hooks.hpp"
#include "reservoir/allocator.hpp"

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

TEST(TorchCacheInfo, ZeroStartsFromTheDevicesFreeMemory) {
  reservoir::Allocator& a = reservoir::Allocator::instance();
  a.empty_cache();
  reservoir::MemoryInfo info;
  ASSERT_EQ(a.backend().memory_info(0, &info), reservoir::DeviceStatus::ok);
  std::size_t largest = 0;
  reservoir_torch_cache_info(0, &largest);
  EXPECT_EQ(largest, info.free);
}

TEST(TorchCacheInfo, RaisedToTheLargestCachedBlock) {
  reservoir::Allocator& a = reservoir::Allocator::instance();
  a.empty_cache();
  std::size_t largest = 1;
  reservoir_torch_cache_info(0, &largest);
  EXPECT_EQ(largest, 1u) << "nothing cached: the caller's value stays";
  void* p = a.allocate(40 * kMiB, 0, 0);
  a.deallocate(p);
  reservoir_torch_cache_info(0, &largest);
  EXPECT_EQ(largest, a.largest_cached_block(0));
  EXPECT_GE(largest, 40 * kMiB);
  std::size_t big = std::size_t{1} << 50;
  reservoir_torch_cache_info(-1, &big);  // -1: the current device
  EXPECT_EQ(big, std::size_t{1} << 50) << "a larger start is never lowered";
  reservoir_torch_cache_info(0, nullptr);  // ignored, as a null out-pointer must be
  a.empty_cache();
}

}  // namespace
