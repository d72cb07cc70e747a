// The hooks reservoir.torch's native part builds c10's snapshot and the profiler's
// memory events from (reservoir_torch_segments, reservoir_torch_block_size,
// reservoir_torch_memory_in_use), on the simulated device.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "integrations/torch_hooks.hpp"
#include "reservoir/allocator.hpp"
#include "reservoir/errors.hpp"

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

struct Listed {
  reservoir_segment segment;
  std::vector<reservoir_torch_block> blocks;
};

void collect(void* ctx, const reservoir_segment* segment, const reservoir_torch_block* blocks,
             size_t count) {
  static_cast<std::vector<Listed>*>(ctx)->push_back(
      Listed{*segment, std::vector<reservoir_torch_block>(blocks, blocks + count)});
}

const Listed* holding(const std::vector<Listed>& listed, const void* ptr) {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  for (const Listed& l : listed)
    if (address >= l.segment.address && address < l.segment.address + l.segment.size) return &l;
  return nullptr;
}

TEST(TorchSnapshotHooks, SegmentsComeWithBlocksThatTileThem) {
  reservoir::Allocator& a = reservoir::Allocator::instance();
  a.empty_cache();
  void* kept = a.allocate(3 * kMiB + 100, 0, 0);
  void* freed = a.allocate(5 * kMiB, 0, 0);
  a.deallocate(freed);

  std::vector<Listed> listed;
  reservoir_torch_segments(0, &collect, &listed);
  const Listed* segment = holding(listed, kept);
  ASSERT_NE(segment, nullptr) << "the live block's segment is listed";
  EXPECT_EQ(segment->segment.size, a.base_allocation(kept).size);
  std::uintptr_t next = segment->segment.address;
  bool found = false;
  for (const reservoir_torch_block& b : segment->blocks) {
    EXPECT_EQ(b.address, next) << "blocks follow each other from the segment's start";
    next += b.size;
    if (b.address == reinterpret_cast<std::uintptr_t>(kept)) {
      found = true;
      EXPECT_EQ(b.state, 0) << "active_allocated";
      EXPECT_EQ(b.requested, 3 * kMiB + 100);
      EXPECT_EQ(b.size, a.block_size(kept));
    } else {
      EXPECT_EQ(b.state, 2) << "inactive";
      EXPECT_EQ(b.requested, 0u);
    }
  }
  EXPECT_TRUE(found);
  EXPECT_EQ(next, segment->segment.address + segment->segment.size) << "the blocks tile it";

  std::vector<Listed> everywhere;
  reservoir_torch_segments(-1, &collect, &everywhere);
  EXPECT_EQ(everywhere.size(), a.segments(-1).size());
  EXPECT_THROW(reservoir_torch_segments(0, nullptr, nullptr), reservoir::InvalidArgumentError);
  a.deallocate(kept);
  a.empty_cache();
}

TEST(TorchSnapshotHooks, BlockSizeAndMemoryInUseAreWhatTheProfilerIsTold) {
  reservoir::Allocator& a = reservoir::Allocator::instance();
  a.empty_cache();
  void* p = a.allocate(kMiB + 1, 0, 0);
  EXPECT_EQ(reservoir_torch_block_size(p), a.block_size(p));
  EXPECT_GE(reservoir_torch_block_size(p), kMiB + 1);
  EXPECT_EQ(reservoir_torch_block_size(nullptr), 0u);
  int not_a_block = 0;
  EXPECT_EQ(reservoir_torch_block_size(&not_a_block), 0u) << "a host pointer: none, no throw";

  std::size_t allocated = 0, reserved = 0;
  reservoir_torch_memory_in_use(0, &allocated, &reserved);
  const reservoir::DeviceStats stats = a.stats(0);
  EXPECT_EQ(allocated, static_cast<std::size_t>(stats.allocated_bytes.all().current));
  EXPECT_EQ(reserved, static_cast<std::size_t>(stats.reserved_bytes.all().current));
  EXPECT_GE(allocated, kMiB + 1);
  reservoir_torch_memory_in_use(12345, &allocated, &reserved);  // no such device
  EXPECT_EQ(allocated, 0u);
  EXPECT_EQ(reserved, 0u);
  reservoir_torch_memory_in_use(0, nullptr, nullptr);  // ignored
  a.deallocate(p);
  a.empty_cache();
}

}  // namespace
