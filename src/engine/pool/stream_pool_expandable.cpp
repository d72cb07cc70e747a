// StreamPool's expandable segments: one growing address range per stream and pool
// (the spec's Note [Expandable Segments]). Blocks of such a segment are free,
// allocated, pending or unmapped; mapping turns unmapped blocks into free ones at
// the lowest address that fits (filling gaps first), unmapping gives whole free
// pages back to the device.
//
// The segment map holds only [base, base + vm->reach()) of such a segment — the pages
// mapped so far — not its whole reservation (device memory plus 1/8, tens of
// thousands of 2 MiB map slots per stream and pool): registering those cost more
// host time on a multi-stream trace than all its allocations together.
#include <algorithm>

#include "engine/pool/expandable_segment.hpp"
#include "engine/pool/stream_pool.hpp"
#include "reservoir/errors.hpp"
#include "util/checks.hpp"
#include "util/format.hpp"

namespace reservoir::detail {

namespace {
bool allocatable(const Block* b) {
  return b && (b->state == BlockState::free || b->state == BlockState::unmapped);
}
}  // namespace

Block* StreamPool::allocate_expandable(std::size_t size, PoolIndex pool, const Context& context) {
  // Under a memory fraction, PyTorch's gate: the allocation size a regular segment
  // would take for this request must fit beside what is mapped; the whole pages then
  // mapped are not checked again (so reserved may pass the cap by less than a page,
  // and a request whose run is partly mapped already still needs that room).
  if (!services_.budget.fits(SizePolicy::segment_size(size))) return nullptr;
  Block* c = find_expandable(size, pool);
  if (!c) return nullptr;
  Segment* seg = c->segment;
  // A failed grow of a segment that maps nothing (a new one) gives back its range too,
  // except during a capture (nothing goes back then): the range, mapping nothing, is
  // given back at the next release of the cache.
  auto undo_reserve = [&] {
    std::string ignored;  // what the device refused stays on the books, retried later
    if (seg->mapped_bytes == 0 && !services_.capture.underway())
      release_expandable_segment(seg, &ignored);
  };
  try {
    if (c->state == BlockState::unmapped) c = map_block(c, std::min(c->size, size), context);
    // c is free and mapped; grow it into the unmapped room after it.
    while (c && c->size < size) {
      Block* next = c->next;
      RESERVOIR_ASSERT(next && next->state == BlockState::unmapped);
      c = map_block(next, std::min(size - c->size, next->size), context);
    }
  } catch (...) {
    undo_reserve();
    throw;
  }
  if (!c) undo_reserve();
  return c;
}

// The lowest-address run of free and unmapped blocks with room for size bytes
// (starting at a free block just before an unmapped one when there is one), or a
// new segment's single unmapped block.
Block* StreamPool::find_expandable(std::size_t size, PoolIndex pool) {
  for (Block* u : unmapped_[pool]) {
    Block* start = u->prev && u->prev->state == BlockState::free ? u->prev : u;
    std::size_t room = 0;
    for (Block* b = start; room < size && allocatable(b); b = b->next) room += b->size;
    if (room >= size) return start;
  }
  // More than the device has can never be mapped: out of memory, not a device error.
  MemoryInfo info;
  if (services_.backend.memory_info(services_.device, &info) == DeviceStatus::ok &&
      size > info.total)
    return nullptr;
  Segment* seg = new_expandable_segment(pool, size);
  return seg ? seg->head : nullptr;
}

// Address space each new expandable segment reserves (expandable_segments_reserve,
// else device memory plus 1/8).
std::size_t StreamPool::expandable_reserve() {
  const PoolSettings& s = services_.settings;
  if (s.expandable_reserve) return s.expandable_reserve;
  MemoryInfo info;
  if (services_.backend.memory_info(services_.device, &info) != DeviceStatus::ok)
    throw DeviceError("reservoir: reading memory info of device " +
                      std::to_string(services_.device) +
                      " failed: " + services_.backend.last_error());
  if (s.expandable_reserve_fraction > 0)
    return static_cast<std::size_t>(s.expandable_reserve_fraction *
                                    static_cast<double>(info.total));
  return info.total + info.total / 8;
}

Segment* StreamPool::new_expandable_segment(PoolIndex pool, std::size_t at_least) {
  std::size_t page = pool == kSmallPool ? SizePolicy::kSmallBuffer : SizePolicy::kLargeBuffer;
  std::size_t granularity = 0;
  if (services_.backend.granularity(services_.device, &granularity) == DeviceStatus::ok &&
      granularity > 0 && page % granularity != 0)
    page = (page + granularity - 1) / granularity * granularity;
  // A request larger than the configured reservation gets a segment of its own size.
  ExpandableSegment* vm = nullptr;
  try {
    vm = new ExpandableSegment(services_.backend, services_.host_stash, services_.device, page,
                               std::max(expandable_reserve(), at_least), services_.peers.list());
  } catch (const NoAddressSpace&) {
    return nullptr;  // out of memory: the ladder releases what it can and retries
  }
  Segment* seg = services_.segments.make();
  seg->set_range(vm->base(), vm->size());
  seg->pool = pool;
  seg->expandable = true;
  seg->vm = vm;
  index_unmapped(block_list::start(block_nodes_, seg, BlockState::unmapped));
  seg->set_owner(this);
  link_segment(seg);
  // Registered in the segment map as its pages are mapped (map_block): nothing yet.
  stats().add<kSegment>(pool, 1);
  return seg;
}

// Maps the pages under the first bytes of the unmapped block b; returns the free
// block that now holds them (merged with free neighbours), or nullptr when the
// device has no room (the memory fraction was checked by allocate_expandable).
Block* StreamPool::map_block(Block* b, std::size_t bytes, const Context& context) {
  Segment* seg = b->segment;
  const std::size_t page = seg->vm->page_size();
  const std::size_t want = std::min(b->size, (bytes + page - 1) / page * page);
  services_.budget.reserve_past_limit(want);  // allocate_expandable's gate decided
  const std::size_t held = seg->vm->held_bytes();
  const std::size_t reach = seg->vm->reach();
  std::size_t mapped = 0;
  try {
    mapped = seg->vm->map(b->address, want, !services_.capture.underway());
  } catch (...) {
    count_held(seg, held, want);  // nothing was mapped
    throw;
  }
  count_held(seg, held, want - mapped);
  if (mapped == 0) return nullptr;
  // Before any block there is handed out: the free path finds the segment.
  if (seg->vm->reach() > reach)
    services_.segments.publish_part(seg, seg->base + reach, seg->vm->reach() - reach);
  unindex_unmapped(b);
  if (mapped < b->size) {  // the rest stays unmapped, after b
    index_unmapped(block_list::split_back(block_nodes_, b, mapped, BlockState::unmapped));
  }
  const std::uintptr_t mapped_at = b->address;
  b->state = BlockState::pending;  // neither free nor unmapped while merging
  std::int64_t merged = 0, merged_bytes = 0;
  Block* keep = coalesce(b, BlockState::free, &merged, &merged_bytes);
  seg->mapped_bytes += mapped;
  stats().add<kReservedBytes>(seg->pool, static_cast<std::int64_t>(mapped));
  DeviceCounters::bump(services_.counters.device_allocs);
  DeviceCounters::bump(services_.counters.device_maps, static_cast<std::int64_t>(mapped / page));
  if (tracing()) trace(TraceAction::segment_map, mapped_at, mapped, context);
  return keep;
}

// Gives the whole free pages inside the free block b back to the device. Returns
// false when b holds no whole page.
bool StreamPool::unmap_block(Block* b) {
  Segment* seg = b->segment;
  auto inner = seg->vm->inner_pages(b->address, b->size);
  if (inner.second == 0) return false;
  // Unmapping does not wait for the device: work on this stream may still use the
  // pages (freed blocks are reused in stream order), so wait for it; for the whole
  // device once the program has said it destroys the stream (release_stream).
  const DeviceStatus synced =
      stream_released_ ? services_.backend.synchronize_device(services_.device)
                       : services_.backend.synchronize_stream(services_.device, stream());
  if (synced != DeviceStatus::ok)
    throw DeviceError(std::string("reservoir: synchronizing the ") +
                      (stream_released_ ? "device" : "stream") + " before unmapping on device " +
                      std::to_string(services_.device) +
                      " failed: " + services_.backend.last_error());
  std::string error;
  const std::size_t held = seg->vm->held_bytes();
  auto [start, length] = seg->vm->unmap(inner.first, inner.second, &error);
  if (length > 0) {
    unindex_free(b);
    const std::size_t before = start - b->address;
    const std::size_t after = b->size - before - length;
    // b becomes [start, start + length): the free head and tail stay mapped.
    if (before > 0) index_free(block_list::split_front(block_nodes_, b, before, BlockState::free));
    if (after > 0) index_free(block_list::split_back(block_nodes_, b, length, BlockState::free));
    b->state = BlockState::pending;  // neither free nor unmapped while merging
    std::int64_t merged = 0, merged_bytes = 0;
    coalesce(b, BlockState::unmapped, &merged, &merged_bytes);
    seg->mapped_bytes -= length;
    count_held(seg, held, length);  // pages whose memory could not be released stay reserved
    stats().add<kReservedBytes>(seg->pool, -static_cast<std::int64_t>(length));
    DeviceCounters::bump(services_.counters.device_frees);
    DeviceCounters::bump(services_.counters.device_unmaps,
                         static_cast<std::int64_t>(length / seg->vm->page_size()));
    if (tracing()) trace(TraceAction::segment_unmap, start, length, seg->context);
  }
  if (!error.empty()) throw DeviceError("reservoir: " + error);
  return length > 0;
}

bool StreamPool::release_expandable_segment(Segment* seg, std::string* error) {
  Block* b = seg->head;
  RESERVOIR_ASSERT(b && !b->next && b->state == BlockState::unmapped && seg->mapped_bytes == 0);
  const std::size_t held = seg->vm->held_bytes();
  // Out of the map before the address range goes back (see release_segment): once it
  // is back, another thread's new segment may be given it and must be the one found
  // there. Nothing of it is allocated (no page is mapped), so no free looks for it.
  const std::size_t published = seg->vm->reach();
  services_.segments.unpublish_part(seg, published);
  *error = seg->vm->release();
  count_held(seg, held, 0);
  if (!error->empty()) {  // kept, with what it still holds counted, and found again
    services_.segments.publish_part(seg, seg->base, published);
    return false;
  }
  unindex_unmapped(b);
  delete_block(b);
  delete seg->vm;
  unlink_segment(seg);
  stats().add<kSegment>(seg->pool, -1);
  services_.segments.recycle(seg);
  return true;
}

// Retries the held pages of every expandable segment and gives back each segment
// that maps nothing (all its pages were unmapped, or a failed grow left it held
// pages). Returns the bytes given back; throws DeviceError, after trying them all,
// when the device refused some.
std::size_t StreamPool::release_idle_expandable() {
  std::size_t released = 0;
  std::string failure;
  for (Segment *seg = segments_, *next = nullptr; seg; seg = next) {
    next = seg->next_in_pool;
    if (!seg->expandable || (seg->mapped_bytes > 0 && seg->vm->held_bytes() == 0)) continue;
    const std::size_t held = seg->vm->held_bytes();
    std::string error;
    std::size_t left = 0;
    if (seg->mapped_bytes == 0) {
      if (!release_expandable_segment(seg, &error)) left = seg->vm->held_bytes();
    } else {
      error = seg->vm->release_held();
      count_held(seg, held, 0);
      left = seg->vm->held_bytes();
    }
    released += held - left;
    if (failure.empty()) failure = std::move(error);
  }
  if (!failure.empty()) throw DeviceError("reservoir: " + failure);
  return released;
}

// seg's held bytes (ExpandableSegment::held_bytes) changed since held_before: they
// count as reserved. unused: budget the caller reserved but did not map (returned
// here, less what became held).
void StreamPool::count_held(Segment* seg, std::size_t held_before, std::size_t unused) {
  const std::size_t held = seg->vm->held_bytes();
  RESERVOIR_ASSERT(unused + held_before >= held);
  if (held != held_before)
    stats().add<kReservedBytes>(
        seg->pool, static_cast<std::int64_t>(held) - static_cast<std::int64_t>(held_before));
  if (unused + held_before > held) services_.budget.unreserve(unused + held_before - held);
}

}  // namespace reservoir::detail
