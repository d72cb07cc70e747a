// UncachedAllocator: RESERVOIR_NO_CACHING=1 (PyTorch's PYTORCH_NO_CUDA_MEMORY_CACHING)
// — every request goes to the device, every free back to it, for debugging with
// compute-sanitizer or when another allocator manages memory. Its statistics are
// complete: each device has a statistics shard in that device's ledger, so stats(),
// summaries and metrics read the same way in both modes (one allocation = one
// segment of exactly the requested size).
// Invariant: live_ holds exactly the allocations handed out and not freed;
//   for each device d, shard d's allocated_bytes == reserved_bytes == requested_bytes
//   == sum of live_ sizes on d, and allocation == segment == their count.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "engine/allocators/caching_allocator.hpp"
#include "engine/allocators/memory_resource.hpp"
#include "engine/stats/stat_ledger.hpp"
#include "reservoir/backend.hpp"

namespace reservoir::detail {

class UncachedAllocator final : public BlockResource {
 public:
  // engines: where each device's statistics ledger and counters live.
  UncachedAllocator(Backend& backend, CachingAllocator& engines);
  ~UncachedAllocator() override;

  void* allocate(std::size_t size, StreamHandle stream, int device) override;
  void deallocate(void* ptr) override;
  // Frees go straight to the device, which waits for all work: nothing to record.
  void record_stream(void* ptr, StreamHandle stream) override;
  void notify_host_wait(StreamHandle, int) override {}
  BaseAllocation base_allocation(void* ptr) override;
  std::size_t block_size(void* ptr) override;
  std::size_t requested_size(void* ptr) override { return block_size(ptr); }
  void empty_cache(int) override {}
  std::size_t largest_cached_block(int) override { return 0; }
  const EngineTraits& traits() const override;

 private:
  struct Live {
    std::size_t size;
    int device;
  };
  ShardCounters& shard(int device);                 // under mutex_
  const Live& live(void* ptr, const char* action);  // under mutex_; throws when not live

  Backend& backend_;
  CachingAllocator& engines_;
  std::mutex mutex_;
  std::unordered_map<std::uintptr_t, Live> live_;
  std::vector<std::unique_ptr<ShardCounters>> shards_;  // per device, made on first use
};

}  // namespace reservoir::detail
