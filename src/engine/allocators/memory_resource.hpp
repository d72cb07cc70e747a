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
#include <string>
#include <string_view>
#include <vector>

#include "reservoir/history.hpp"
#include "reservoir/hooks.hpp"
#include "reservoir/stats.hpp"
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

// What the front tells users about an engine, and what it refuses.
struct EngineTraits {
  std::string name;    // Allocator::engine_name(): "native", "cudaMallocAsync", "uncached"
  bool caches = true;  // false: every request goes to the device, every free back
  // Why the engine's memory cannot be shared with another process (the middle of
  // Allocator::share's refusal); empty when it can.
  std::string_view share_refusal;
  // Why private pools (CUDA graphs, MemPool) cannot be used: the whole message; empty
  // when they can.
  std::string_view pool_refusal;
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

  // What sets this engine apart (the front asks this, never which engine it has).
  virtual const EngineTraits& traits() const = 0;

  // ---- What an engine keeps beyond the caching core's books ----
  // The core holds every engine's ledger, peers and history, and the front reads those
  // from it; these add what the engine in force keeps elsewhere (the defaults: nothing).
  // peer may now read and write device's memory: also what the engine maps itself.
  virtual void add_peer(int /*device*/, int /*peer*/) {}
  // Writes the engine's own figures into stats read from device's ledger.
  virtual void adjust_stats(int /*device*/, DeviceStats* /*stats*/) {}
  // Resets the high marks, and the allocated / freed totals, that the engine keeps.
  virtual void reset_peaks(int /*device*/) {}
  virtual void reset_accumulated(int /*device*/) {}
  // Appends the segments the engine holds outside the core's engines (a snapshot).
  virtual void snapshot(std::vector<SegmentInfo>* /*out*/) {}
};

}  // namespace reservoir::detail
