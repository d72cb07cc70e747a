// AsyncPoolAllocator: backend:cudaMallocAsync — the second engine behind the same
// Allocator API, as PyTorch's CUDAMallocAsyncAllocator: every request goes to one
// driver memory pool per device (Backend::create_pool; release threshold UINT64_MAX so
// the pool keeps what it maps; trim_pool(0) for empty_cache), stream-ordered. A block
// is allocated on its stream and freed on that stream once every other stream it was
// used on (record_stream) has reached the free: an event recorded on each, waited for
// by the allocating stream, after which the pool reuses the memory on that stream at
// once and on others by the driver's rules.
//
// Reservoir's books on top: statistics in the device's ledger (a shard, as uncached
// mode keeps them; reserved memory is the pool's own figure, read from the driver),
// history entries (alloc, free, oom), snapshots (one segment per live allocation),
// the out-of-memory report with PyTorch's first sentences, and trace recording (a
// layer over any engine). The memory fraction caps allocated bytes, as in PyTorch.
//
// Invariants (outside a call, under mutex_):
//   live_ holds exactly the allocations handed out and not freed;
//   for each device d, shard d's allocated_bytes == requested_bytes == sum of the
//     sizes of live_ entries on d == devices_[d].used;
//   every live allocation's pool is devices_[its device].pool.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/allocators/caching_allocator.hpp"
#include "engine/allocators/memory_resource.hpp"
#include "engine/stats/stat_ledger.hpp"
#include "reservoir/backend.hpp"
#include "reservoir/history.hpp"
#include "reservoir/stats.hpp"
#include "util/insertion_set.hpp"

namespace reservoir::detail {

class AsyncPoolAllocator final : public BlockResource {
 public:
  // engines: each device's ledger, counters, history, hooks and memory fraction.
  // Throws ConfigError when backend has no stream-ordered pools.
  AsyncPoolAllocator(Backend& backend, CachingAllocator& engines);
  // Frees what the program still holds and destroys the pools (errors ignored).
  ~AsyncPoolAllocator() override;

  void* allocate(std::size_t size, StreamHandle stream, int device) override;
  void deallocate(void* ptr) override;
  void record_stream(void* ptr, StreamHandle stream) override;
  void notify_host_wait(StreamHandle, int) override {}  // the driver tracks streams
  BaseAllocation base_allocation(void* ptr) override;
  std::size_t block_size(void* ptr) override { return requested_size(ptr); }
  std::size_t requested_size(void* ptr) override;
  // Waits for the device, then gives every unused byte of its pool back (-1: all).
  void empty_cache(int device) override;
  // Unknown inside the driver's pool: 0.
  std::size_t largest_cached_block(int) override { return 0; }

  const EngineTraits& traits() const override;
  // Reserved memory is the pool's (cudaMemPoolAttrReservedMem{Current,High}):
  // writes it into stats read from the ledger, all of it in the large pool.
  void adjust_stats(int device, DeviceStats* stats) override;
  // Also resets the pool's high marks.
  void reset_peaks(int device) override;
  // One segment per live allocation, with one block.
  void snapshot(std::vector<SegmentInfo>* out) override;
  // Lets peer read and write device's pool memory (cuMemPoolSetAccess), now and
  // for pools made later.
  void add_peer(int device, int peer) override;
  // The pool's figures (zero before the device's first allocation).
  PoolUsage usage(int device);

 private:
  struct Live {
    std::size_t size;
    int device;
    StreamHandle stream;
    InsertionSet<StreamHandle> uses;  // other streams (record_stream)
    Context context;
  };
  struct Device {
    PoolHandle pool = 0;
    bool made = false;
    EventHandle event = 0;  // re-recorded for each cross-stream free
    std::unique_ptr<ShardCounters> shard;
    std::size_t used = 0;
    std::vector<int> peers;
  };
  Device& device_state(int device);  // under mutex_; makes the pool on first use
  // One try at the pool; true when it served the request (*ptr set).
  bool try_allocate(int device, std::size_t size, StreamHandle stream, void** ptr);
  // The report, the observers and the history entry; call without mutex_.
  [[noreturn]] void out_of_memory(int device, std::size_t size, StreamHandle stream,
                                  bool over_fraction);
  std::map<std::uintptr_t, Live>::iterator find(void* ptr, const char* action);  // under mutex_
  void trace(int device, TraceAction action, std::uintptr_t address, std::size_t size,
             StreamHandle stream, Context context);

  Backend& backend_;
  CachingAllocator& engines_;
  std::mutex mutex_;
  std::map<std::uintptr_t, Live> live_;
  std::vector<Device> devices_;
};

}  // namespace reservoir::detail
