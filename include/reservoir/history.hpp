// History and snapshots: what the allocator did, and what it holds now — the data
// behind PyTorch's memory viewer (Allocator::record_history, snapshot,
// dump_snapshot; docs/observability.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "reservoir/export.hpp"
#include "reservoir/types.hpp"

namespace reservoir {

// What a history entry records. The names are PyTorch's trace actions.
enum class TraceAction : std::uint8_t {
  alloc,           // a block was handed to the program
  free_requested,  // the program freed it (it may wait for other streams)
  free_completed,  // its memory is reusable
  segment_alloc,   // a device allocation
  segment_free,    // a device free
  segment_map,     // expandable segment pages mapped
  segment_unmap,   // expandable segment pages unmapped
  snapshot,        // a snapshot was taken (size = active bytes)
  oom,             // out of memory (address = device free bytes)
};
RESERVOIR_API const char* to_string(TraceAction action) noexcept;

// How much context (stack traces or strings from the user's recorder) to keep:
// none; state (blocks currently allocated keep theirs); alloc (also on alloc
// entries); all (also on free entries).
enum class ContextLevel : std::uint8_t { none = 0, state = 1, alloc = 2, all = 3 };

// Returns the caller's context, e.g. a formatted stack ("file:line fn\n...").
using ContextRecorder = std::function<std::string()>;
using Context = std::shared_ptr<const std::string>;

struct TraceEntry {
  TraceAction action = TraceAction::alloc;
  int device = 0;
  std::uintptr_t address = 0;
  std::size_t size = 0;
  StreamHandle stream = 0;
  std::uint64_t time_us = 0;  // backend clock (microseconds)
  Context context;            // may be null
  PoolId pool;                // the private pool the block or segment belongs to ({0, 0}: default)
};

// Called on every entry, whether or not history is kept (PyTorch's trace trackers).
using TraceTracker = std::function<void(const TraceEntry&)>;

struct Annotation {
  int device = 0;
  std::uint64_t time_us = 0;
  std::string name;
  std::string value;
};

enum class BlockStateInfo : std::uint8_t { active_allocated, active_pending_free, inactive };
RESERVOIR_API const char* to_string(BlockStateInfo state) noexcept;

struct BlockInfo {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  std::size_t requested_size = 0;  // 0 for inactive blocks
  BlockStateInfo state = BlockStateInfo::inactive;
  Context context;  // where it was last allocated (context level >= state)
};

struct SegmentInfo {
  int device = 0;
  std::uintptr_t address = 0;
  std::size_t total_size = 0;
  std::size_t allocated_size = 0;
  std::size_t active_size = 0;     // allocated + pending free
  std::size_t requested_size = 0;  // of active blocks
  StreamHandle stream = 0;
  bool is_large = false;
  bool is_expandable = false;
  PoolId pool;                    // the private pool owning it ({0, 0}: the default pools)
  std::string tag;                // the tag its memory carries ("": none; docs/sleep.md)
  bool asleep = false;            // its tag sleeps: addresses kept, no device memory under them
  Context context;                // where the device allocation was made
  std::vector<BlockInfo> blocks;  // in address order, tiling the segment
};

struct Snapshot {
  std::vector<SegmentInfo> segments;                   // in address order
  std::vector<std::vector<TraceEntry>> device_traces;  // one list per device, oldest first
  std::vector<Annotation> annotations;
  std::string settings;  // the configuration in force ("key:value,...")
  bool expandable_segments = false;
  std::size_t max_split_size = 0;
  double garbage_collection_threshold = 0;
  bool release_lock_on_cudamalloc = false;
  bool graph_capture_record_stream_reuse = false;
  std::vector<std::size_t> roundup_power2_divisions;
};

}  // namespace reservoir
