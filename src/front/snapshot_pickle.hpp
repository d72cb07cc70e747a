// Snapshots as pickles in the layout of PyTorch's torch.cuda.memory._snapshot(), so
// that PyTorch's memory viewer (pytorch.org/memory_viz, torch.cuda._memory_viz) opens
// them. Internal: the API is Allocator::dump_snapshot.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reservoir/history.hpp"

namespace reservoir::detail {

// One stack frame as PyTorch's viewer shows it.
struct Frame {
  std::string filename;
  std::int64_t line = 0;
  std::string name;
};

// Frames of a context string: each non-empty line "file:line name" becomes a frame
// (innermost first, as the recorder wrote them). Text in any other shape becomes a
// single frame {filename: the whole text, line: 0, name: ""}.
std::vector<Frame> context_frames(const std::string& context);

// The pickle (protocol 2) of a snapshot.
std::string snapshot_pickle(const Snapshot& snapshot);

// Writes the pickle to path (through a temporary file renamed into place, so a
// reader never sees half a snapshot). Throws std::runtime_error naming the path.
void write_snapshot_pickle(const Snapshot& snapshot, const std::string& path);

}  // namespace reservoir::detail
