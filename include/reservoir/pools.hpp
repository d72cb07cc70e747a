// Private memory pools: the vocabulary of Allocator's pool API (docs/pools.md).
//
// A private pool keeps its own segments and blocks, apart from the default pools:
// its blocks never serve other requests (unless use_on_oom, when the device is out of
// memory), and other requests never take its memory. While routing to a pool is on
// (begin_allocate_to_pool), requests that its filter accepts go there; CUDA graph
// capture uses this so that a graph's baked-in addresses stay reserved for replays.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "reservoir/types.hpp"

namespace reservoir {

struct PoolOptions {
  // When a request outside the pool finds no memory, the pool's free blocks (on the
  // request's stream) may serve it (PyTorch's MemPool(use_on_oom=True)).
  bool use_on_oom = false;
  // Blocks of the pool's segments are never split: each request gets a segment's
  // whole block (PyTorch's MemPool(no_split=True)).
  bool no_split = false;
};

// Decides, for each request while routing is on, whether it goes to the pool. Called
// on the requesting thread, with no allocator lock held; it must not call the
// allocator.
using StreamFilter = std::function<bool(StreamHandle)>;

// A recorded state of a private pool: every segment and each block's extent and state.
struct CheckpointBlock {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  std::size_t requested = 0;  // bytes asked for (allocated blocks)
  bool allocated = false;
};
struct CheckpointSegment {
  StreamHandle stream = 0;
  std::uintptr_t base = 0;
  std::size_t size = 0;
  bool is_small = false;
  // An expandable segment (expandable_segments:True): blocks lists its mapped blocks
  // only, which need not tile it; a restore needs the allocated ones mapped.
  bool expandable = false;
  std::vector<CheckpointBlock> blocks;  // in address order, tiling the segment
};
struct PoolCheckpoint {
  int device = 0;
  PoolId pool;
  // Which checkpoint_pool call made it, unique in the process (a trace's restore names
  // it); 0 for one built otherwise.
  std::uint64_t number = 0;
  std::vector<CheckpointSegment> segments;
};

// A private pool's memory now (Allocator::pool_usage).
struct PrivatePoolUsage {
  std::size_t reserved_bytes = 0;   // device memory its segments hold
  std::size_t allocated_bytes = 0;  // of which in allocated blocks (rounded sizes)
};

// What restore_pool changed: blocks that were allocated and are now free (their
// pointers must no longer be used), and blocks that the checkpoint says are allocated
// (the caller owns them again and frees them with deallocate). A pointer may be in
// both lists.
struct PoolRestore {
  std::vector<void*> freed;
  std::vector<void*> allocated;
};

}  // namespace reservoir
