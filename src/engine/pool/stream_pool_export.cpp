// The owner's side of sharing a block with another process: what a segment's owner
// tells IPC about an allocated block (BlockOwner::share; the front exports it,
// src/front/ipc_service.cpp). An ordinary segment is shared whole (the receiver maps it once,
// whichever of its blocks it opens); an expandable segment shares the pages that hold
// the block.
#include "engine/ipc/ipc_handle.hpp"
#include "engine/pool/expandable_segment.hpp"
#include "engine/pool/stream_pool.hpp"
#include "reservoir/errors.hpp"
#include "util/format.hpp"

namespace reservoir::detail {

bool BlockOwner::share(std::uintptr_t address, SharedBlock*) {
  throw InvalidArgumentError("reservoir: cannot share " +
                             format_pointer(reinterpret_cast<void*>(address)) +
                             ": memory of policy:compact cannot be shared with other processes; "
                             "allocate it under policy:pytorch");
}

bool StreamPool::share(std::uintptr_t address, SharedBlock* out) {
  Guard guard(*this);
  Block* b = allocated_.find(address);
  if (!b) return false;
  if (asleep_)
    throw InvalidArgumentError("reservoir: cannot share " +
                               format_pointer(reinterpret_cast<void*>(address)) +
                               ": its tag is asleep (its memory was given back); wake it first");
  const Segment* seg = b->segment;
  out->device = services_.device;
  out->block = b->address;
  out->block_size = b->size;
  out->expandable = seg->expandable;
  if (!seg->expandable) {
    out->segment = seg->base;
    out->segment_size = seg->size;
  } else {
    out->page_size = seg->vm->page_size();
    out->pages = seg->vm->handles(b->address, b->size, &out->first_page);
  }
  return true;
}

}  // namespace reservoir::detail
