// The private pools of a trace in a replay (trace format v2's p, x, g, t, e, k, r, y and
// o lines): each trace pool is a pool of the replay's allocator, each route a route of
// its own whose filter accepts exactly the requests the trace says went to its pool,
// so that the replay routes as the program did whatever the filters were (a capture's
// stream, a thread, PyTorch's capture ids). A capture route takes a capture to be under
// way, so the engine applies its capture rules (frees of blocks used on other streams
// deferred, nothing given back to the device); no kernel is captured, so the replay
// models the capture on the host on a GPU as on the simulated device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "reservoir/allocator.hpp"
#include "trace_reader.hpp"

namespace reservoir::replay {

// One trace pool's figures in a replay. peak_* are read after each request routed to
// the pool and each restore (reserved memory grows only then); end_* when the trace
// ends, before the blocks it never freed are given back.
struct PoolFigures {
  std::uint32_t number = 0;          // the trace's pool number
  std::uint64_t peak_live = 0;       // the trace's highest live requested bytes in it
  std::uint64_t peak_allocated = 0;  // its blocks' bytes (rounded sizes)
  std::uint64_t peak_reserved = 0;
  std::uint64_t end_allocated = 0;
  std::uint64_t end_reserved = 0;  // what stays reserved for the graphs' replays
  bool released = false;           // its last use was dropped by the end
  std::uint64_t requests = 0;      // allocations routed to it (restores' blocks excluded)
};

// One capture of the trace (a g line to its e line) in a replay: what the program asked
// for in it and how the allocator's reserved memory (every pool's) grew meanwhile.
// Invariant: reserved_after is set once its e line was replayed (ended).
struct CaptureFigures {
  std::uint32_t pool = 0;             // the trace's pool number
  std::uint64_t requests = 0;         // allocations routed to the pool during it
  std::uint64_t requested_bytes = 0;  // their bytes
  std::uint64_t reserved_before = 0;  // reserved_bytes at its g line
  std::uint64_t reserved_after = 0;   // and at its e line
  // Reserved by every private pool at its e line: the graphs' memory so far.
  std::uint64_t pools_reserved_after = 0;
  bool ended = false;
};

class TracePools {
 public:
  // Nothing happens for a trace without pools.
  TracePools(Allocator& alloc, const Trace& trace, int device);
  ~TracePools();  // ends the routes still on
  TracePools(const TracePools&) = delete;
  TracePools& operator=(const TracePools&) = delete;

  bool any() const { return !trace_.alloc_pools.empty() || trace_.pools != 0; }
  // Around allocation slot's request: routes it to its pool (or to none).
  void before_alloc(std::uint32_t slot) {
    target_ = trace_.alloc_pools.empty() ? 0 : trace_.alloc_pools[slot];
  }
  // After it (size bytes asked): ptr (nullptr when it failed) joins its pool's books.
  void after_alloc(std::uint32_t slot, std::uint64_t size, void* ptr);
  // A free of slot's block (ptr) by the trace.
  void on_free(std::uint32_t slot, void* ptr) {
    if (target_of(slot) != 0) pooled_.erase(ptr);
  }
  // The pool events (pool_retain .. route_end, checkpoint): events[index].
  void apply(const Event& ev);
  // events[index] is a restore: restores the replay's checkpoint and applies its y and
  // o events (ptrs follows). Returns the events consumed after it. Throws TraceError
  // when the replay's restore freed other blocks than the trace's did.
  std::size_t restore(std::size_t index, std::vector<void*>& ptrs);
  // Every pool's figures now (end_*), peaks as sampled.
  std::vector<PoolFigures> finish();
  // Blocks a restore allocated that no trace ID names: given back with the trace's.
  const std::vector<void*>& orphans() const { return orphans_; }
  // Every capture begun so far, in the order of their g lines.
  const std::vector<CaptureFigures>& captures() const { return captures_; }

 private:
  std::uint16_t target_of(std::uint32_t slot) const {
    return trace_.alloc_pools.empty() ? 0 : trace_.alloc_pools[slot];
  }
  PoolId id_of(std::uint32_t pool) const { return PoolId{0, pool}; }
  void sample(std::uint32_t pool);
  std::uint64_t reserved_now();
  [[noreturn]] void diverged(std::size_t index, const std::string& what) const;

  struct Checkpoint {
    PoolCheckpoint state;
    std::unordered_map<std::uint32_t, std::uintptr_t> address_of;  // pooled slot -> address
  };
  Allocator& alloc_;
  const Trace& trace_;
  const int device_;
  std::uint16_t target_ = 0;  // the pool the request under way goes to; 0: none
  std::vector<bool> routed_;  // by pool number: a route of ours is on
  std::vector<std::int64_t> uses_;
  std::vector<std::int64_t> open_capture_;  // by pool number: its capture's index, or -1
  std::vector<bool> released_;
  std::vector<PoolFigures> figures_;                 // by pool number
  std::unordered_map<void*, std::uint32_t> pooled_;  // live blocks routed to a pool -> slot
  std::unordered_map<std::uint32_t, Checkpoint> checkpoints_;  // by CKPT
  std::vector<void*> orphans_;
  std::vector<CaptureFigures> captures_;
};

}  // namespace reservoir::replay
