// Allocator statistics, with the meaning and names of PyTorch's
// torch.cuda.memory_stats() (allocated_bytes.all.current, ...).
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "reservoir/export.hpp"

namespace reservoir {

// One counter: its value now, its highest value since the last reset_peak, and the
// totals added and removed since the last reset_accumulated.
struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;
  std::int64_t freed = 0;
};

enum class PoolKind : int { all = 0, small = 1, large = 2 };
inline constexpr int kPoolKinds = 3;

// A counter for the whole device (all) and for each pool (small: blocks of 1 MiB
// and less; large: the rest). Invariant: all == small + large for current,
// allocated and freed.
struct StatArray {
  std::array<Stat, kPoolKinds> pool{};
  const Stat& all() const { return pool[0]; }
  const Stat& small() const { return pool[1]; }
  const Stat& large() const { return pool[2]; }
};

struct DeviceStats {
  StatArray allocation;       // blocks handed to the program
  StatArray segment;          // device allocations (cudaMalloc'd segments)
  StatArray active;           // allocated, or freed but pending stream work
  StatArray inactive_split;   // free blocks inside split segments
  StatArray allocated_bytes;  // bytes of allocation (rounded sizes)
  StatArray reserved_bytes;   // bytes held from the device
  StatArray active_bytes;
  StatArray inactive_split_bytes;
  StatArray requested_bytes;              // bytes the program asked for (unrounded)
  std::int64_t num_alloc_retries = 0;     // device allocations retried after releasing cache
  std::int64_t num_ooms = 0;              // OutOfMemoryErrors raised
  std::int64_t num_sync_all_streams = 0;  // synchronizations of every pending event
  std::int64_t num_device_alloc = 0;      // device allocations (and maps)
  std::int64_t num_device_free = 0;       // device frees (and unmaps)
  std::int64_t num_device_map = 0;        // pages mapped (expandable segments, policy:compact)
  std::int64_t num_device_unmap = 0;      // pages unmapped
  std::int64_t num_stream_waits = 0;  // device-side waits inserted to reuse memory across streams
  Stat oversize_allocations;          // allocations of >= max_split_size
  Stat oversize_segments;             // segments of >= max_split_size
  std::int64_t max_split_size = 0;    // the setting in force, bytes
  // Private pools (CUDA graphs, MemPool): bytes of reserved_bytes held by them, and
  // how many pools exist (released ones too, until their last segment is returned).
  std::int64_t private_pool_reserved_bytes = 0;
  std::int64_t private_pools = 0;
  // Pinned host memory kept after a wake for the next offload (sleep); given back by
  // empty_host_cache (docs/sleep.md).
  std::int64_t host_kept_bytes = 0;
};

// What Allocator::summary(device, options) shows besides its default table.
struct SummaryOptions {
  bool abbreviated = false;     // each statistic's all-pools row only (no large/small rows)
  bool sync_and_split = false;  // a line with num_sync_all_streams and max_split_size
};

// "allocated_bytes.all.current" style key for one of the 9 StatArray members.
RESERVOIR_API const char* const* stat_array_names() noexcept;  // 9 names, in member order

}  // namespace reservoir
