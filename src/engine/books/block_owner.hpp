// BlockOwner: what the free path needs from whatever owns a segment's blocks (a
// StreamPool today). The process-wide SegmentMap resolves an address to its Segment
// without a lock; the segment names its owner, and the owner answers under its own
// lock. Each call returns false when address is not (or no longer) an allocated block
// of this owner: the caller then re-checks its lookup (the segment may have been
// released and reused meanwhile) before calling the pointer invalid.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "reservoir/hooks.hpp"
#include "reservoir/types.hpp"

namespace reservoir::detail {

struct SharedBlock;

class BlockOwner {
 public:
  virtual bool free(std::uintptr_t address) = 0;
  virtual bool record_use(std::uintptr_t address, StreamHandle other) = 0;
  // Size and requested size of the allocated block at address (either may be null).
  virtual bool block_sizes(std::uintptr_t address, std::size_t* size, std::size_t* requested) = 0;
  // The segment holding address, in any block state. Throws InvalidArgumentError for
  // segments that have no single base (expandable segments).
  virtual bool segment_of(std::uintptr_t address, BaseAllocation* out) = 0;
  // Why address is not an allocated block here, for error messages.
  virtual std::string explain_not_allocated(std::uintptr_t address) = 0;
  // What IPC needs to share the allocated block at address (ipc_handle.hpp). By
  // default an owner cannot share: it throws InvalidArgumentError saying so.
  virtual bool share(std::uintptr_t address, SharedBlock* out);

 protected:
  ~BlockOwner() = default;
};

}  // namespace reservoir::detail
