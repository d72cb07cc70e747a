// MemoryResource: the request path as the front drives it — allocate, free,
// record_stream, host waits — so that concerns can wrap the engine as layers (trace
// recording, the OOM snapshot; RMM's resource adaptors), and the bottom of the chain
// can be the caching engine or the uncached mode.
//
// Contract for every implementation: device is a valid device index (the front
// resolves -1 and refuses others); size > 0 and below 1 EiB; ptr is not null.
// allocate throws OutOfMemoryError / DeviceError; deallocate and record_stream throw
// InvalidPointerError for a pointer not handed out (changing nothing).
#pragma once

#include <cstddef>

#include "reservoir/hooks.hpp"
#include "reservoir/types.hpp"

namespace reservoir::detail {

class MemoryResource {
 public:
  virtual ~MemoryResource() = default;
  virtual void* allocate(std::size_t size, StreamHandle stream, int device) = 0;
  virtual void deallocate(void* ptr) = 0;
  virtual void record_stream(void* ptr, StreamHandle stream) = 0;
  virtual void notify_host_wait(StreamHandle stream, int device) = 0;
};

// The bottom of a chain: it holds the blocks, so it also answers for them.
class BlockResource : public MemoryResource {
 public:
  virtual BaseAllocation base_allocation(void* ptr) = 0;
  virtual std::size_t block_size(void* ptr) = 0;
  virtual std::size_t requested_size(void* ptr) = 0;
  virtual void empty_cache(int device) = 0;
  virtual std::size_t largest_cached_block(int device) = 0;
  // The program is about to destroy stream (Allocator::release_stream): nothing may be
  // left to record on it. Only the caching core defers work to a stream's later calls.
  virtual void release_stream(StreamHandle, int) {}
};

}  // namespace reservoir::detail
