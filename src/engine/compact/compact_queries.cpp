// CompactPool: reading the books (sizes, snapshots, error explanations) and the
// validator's walk of arenas and blocks (their pages and extents: ExtentMap's
// validate_arena and validate_end, extent_pages.cpp).
#include <algorithm>

#include "engine/compact/compact_pool.hpp"
#include "reservoir/errors.hpp"
#include "util/checks.hpp"
#include "util/format.hpp"

namespace reservoir::detail {

namespace {
// Whether b is in blocks (sorted by address: StreamCaches::AllLocked::blocks).
bool holds(const std::vector<Block*>& blocks, const Block* b) {
  auto it = std::lower_bound(blocks.begin(), blocks.end(), b->address,
                             [](const Block* x, std::uintptr_t a) { return x->address < a; });
  return it != blocks.end() && *it == b;
}
}  // namespace

std::size_t CompactPool::largest_free_block() {
  std::lock_guard<Lock> guard(lock_);
  // The tail of an arena is address space, not memory: count only mapped free bytes.
  std::size_t largest = 0;
  for (auto& a : arenas_)
    for (Block* b = a->segment->head; b; b = b->next) {
      if (b->state != BlockState::free) continue;
      auto [first, end] = extents_.page_span(*a, b->address, b->size);
      end = std::min(end, a->pages.size());
      std::size_t run = 0;
      for (std::size_t i = first; i < end; ++i) {
        run = a->pages[i].extent ? run + extents_.page() : 0;
        largest = std::max(largest, std::min(run, b->size));
      }
    }
  return largest;
}

std::size_t CompactPool::cached_bytes() {
  std::lock_guard<Lock> guard(lock_);
  std::size_t held = extents_.spare_bytes();
  for (auto& a : arenas_) held += a->segment->mapped_bytes;
  // Cached blocks are in no stripe: they count as cached here.
  std::size_t allocated = 0;
  allocated_.for_each([&](std::uintptr_t, Block* b) { allocated += b->size; });
  return held > allocated ? held - allocated : 0;
}

bool CompactPool::block_sizes(std::uintptr_t address, std::size_t* size, std::size_t* requested) {
  std::lock_guard<Lock> guard(lock_);
  Block* b = allocated_.find(address);
  if (!b) return false;
  if (size) *size = b->size;
  if (requested) *requested = b->requested;
  return true;
}

bool CompactPool::segment_of(std::uintptr_t address, BaseAllocation*) {
  std::lock_guard<Lock> guard(lock_);
  for (auto& a : arenas_)
    if (a->segment->holds(address))
      throw InvalidArgumentError(
          "reservoir: " + format_pointer(reinterpret_cast<void*>(address)) +
          " lies in policy:compact memory, whose pages are mapped where blocks live: it has no "
          "single base allocation (and cannot be shared with other processes); allocate it "
          "under policy:pytorch with expandable_segments:False");
  return false;
}

std::string CompactPool::explain_not_allocated(std::uintptr_t address) {
  std::lock_guard<Lock> guard(lock_);
  for (auto& a : arenas_) {
    if (!a->segment->holds(address)) continue;
    for (Block* b = a->segment->head; b; b = b->next) {
      if (address < b->address || address - b->address >= b->size) continue;
      // A block in a stream's cache is allocated for its neighbours but freed for
      // the program: it is in no stripe.
      if (b->state == BlockState::allocated && allocated_.find(b->address) == b)
        return "it points " + std::to_string(address - b->address) +
               " bytes inside the allocated block at " +
               format_pointer(reinterpret_cast<void*>(b->address)) + " (" + format_size(b->size) +
               "); free the pointer that allocate() returned";
      return "no block is allocated there: it was freed already (double free?) or never "
             "handed out";
    }
  }
  return "no Reservoir segment holds it any more";
}

std::size_t CompactPool::snapshot(std::vector<SegmentInfo>* out) {
  std::lock_guard<Lock> guard(lock_);
  // Cached blocks are inactive (the program freed them); the caches are held still
  // while the blocks are read.
  StreamCaches::AllLocked caches(caches_);
  const std::vector<Block*> cached = caches.blocks();
  std::size_t active = 0;
  for (auto& a : arenas_) {
    // Each extent's mapping is reported as a segment (one device allocation, mapped
    // whole: the range of its SEGMENT_MAP entry, which a communication library
    // registers and its SEGMENT_UNMAP deregisters); blocks clipped to it.
    const std::uintptr_t base = a->segment->base;
    for (std::size_t i = 0; i < a->pages.size();) {
      const ExtentMap::Extent* x = a->pages[i].extent;
      if (!x) {
        ++i;
        continue;
      }
      const std::size_t end = x->first + x->pages;
      const std::uintptr_t lo = base + i * extents_.page(), hi = base + end * extents_.page();
      SegmentInfo info;
      info.device = services_.device;
      info.address = lo;
      info.is_large = true;
      info.is_expandable = true;
      for (Block* b = a->segment->head; b; b = b->next) {
        const std::uintptr_t bl = std::max(lo, b->address), bh = std::min(hi, b->address + b->size);
        if (bl >= bh) continue;
        BlockInfo block;
        block.address = bl;
        block.size = bh - bl;
        block.context = b->context();
        if (b->state == BlockState::allocated && !holds(cached, b)) {
          block.state = BlockStateInfo::active_allocated;
          block.requested_size = b->requested;
          info.allocated_size += block.size;
          info.active_size += block.size;
          info.requested_size += b->requested;
          info.stream = b->stream;
          active += block.size;
        }
        info.total_size += block.size;
        info.blocks.push_back(std::move(block));
      }
      out->push_back(std::move(info));
      i = end;
    }
  }
  return active;
}

void CompactPool::validate_locked(ValidationTotals* totals, const RequestsHeld& requests) {
  auto at = [](std::uintptr_t x) { return format_pointer(reinterpret_cast<void*>(x)); };
  std::int64_t allocation[kPoolCount] = {}, allocated_bytes[kPoolCount] = {},
               requested[kPoolCount] = {};
  std::size_t free_blocks = 0, allocated_blocks = 0;
  ExtentMap::Audit audit;
  const std::size_t page = extents_.page();
  {
    const std::string fences = fences_.problem();
    RESERVOIR_CHECK(fences.empty(), "stream markers: " + fences);
  }
  const StreamCaches::AllLocked& caches = requests.caches;
  const AllocatedStripes::AllLocked& stripes = requests.stripes;
  {
    const std::string problem = caches.problem();
    RESERVOIR_CHECK(problem.empty(), "stream caches: " + problem);
  }
  const std::vector<Block*> cached = caches.blocks();
  std::size_t cached_seen = 0;
  for (auto& a : arenas_) {
    Segment* seg = a->segment;
    RESERVOIR_CHECK(seg->owner == this, "arena " + at(seg->base) + " has another owner");
    RESERVOIR_CHECK(a->pages.empty() || services_.segments.published(seg),
                    "arena " + at(seg->base) + " missing from the segment map");
    const BlockOwner* sole = services_.segments.sole_owner();
    RESERVOIR_CHECK(a->pages.empty() || sole == nullptr || sole == this,
                    "arena " + at(seg->base) + " is findable, but frees go to another owner");
    RESERVOIR_CHECK(seg->head && seg->head->address == seg->base && !seg->head->prev,
                    "arena " + at(seg->base) + " does not start with its head block");
    // The live bytes on each page as the blocks say: the extent map's books must agree.
    std::vector<std::uint64_t> live(a->pages.size(), 0);
    std::size_t tiled = 0;
    for (Block* b = seg->head; b; b = b->next) {
      // Built only when a check fails.
      auto where = [&] { return "block " + at(b->address) + " of arena " + at(seg->base); };
      RESERVOIR_CHECK(b->segment == seg && b->address == seg->base + tiled && b->size > 0 &&
                          b->size % SizePolicy::kMinBlockSize == 0,
                      where() + " breaks the tiling");
      RESERVOIR_CHECK(b->pool_index == seg->pool && b->in_expandable == seg->expandable,
                      where() + "'s copies of its arena's pool and kind are stale");
      if (b->next) {
        RESERVOIR_CHECK(b->next->prev == b, where() + ": next->prev != block");
        RESERVOIR_CHECK(!(b->state == BlockState::free && b->next->state == BlockState::free),
                        where() + " and its successor are both free but not merged");
      }
      tiled += b->size;
      if (b->state == BlockState::free) {
        ++free_blocks;
        RESERVOIR_CHECK(free_.holds(b), where() + " is free but not in the free set");
        continue;
      }
      RESERVOIR_CHECK(b->state == BlockState::allocated,
                      where() + " is neither free nor allocated");
      if (holds(cached, b)) {
        // Freed for the statistics, live for its pages.
        RESERVOIR_CHECK(stripes.find(b->address) == nullptr,
                        where() + " is both in a stream cache and allocated");
        ++cached_seen;
      } else {
        RESERVOIR_CHECK(stripes.find(b->address) == b, where() + " missing from the allocated map");
        ++allocated_blocks;
        const int pool = SizePolicy::pool_for(b->size);
        allocation[pool] += 1;
        allocated_bytes[pool] += static_cast<std::int64_t>(b->size);
        requested[pool] += static_cast<std::int64_t>(b->requested);
      }
      auto [first, end] = extents_.page_span(*a, b->address, b->size);
      for (std::size_t i = first; i < end; ++i) {
        const std::uintptr_t lo = std::max(b->address, seg->base + i * page);
        const std::uintptr_t hi = std::min(b->address + b->size, seg->base + (i + 1) * page);
        live[i] += hi - lo;
      }
    }
    RESERVOIR_CHECK(tiled == seg->size, "blocks of arena " + at(seg->base) + " do not tile it");
    extents_.validate_arena(*a, live, &audit);
    totals->segments += 1;
  }
  const std::size_t held = extents_.validate_end(audit);
  totals->reserved += held;
  RESERVOIR_CHECK(free_blocks == free_.size(), "the free set holds blocks that are not free");
  const std::string index_problem = free_.problem();
  RESERVOIR_CHECK(index_problem.empty(), index_problem);
  RESERVOIR_CHECK(allocated_blocks == stripes.size(),
                  "the allocated map holds blocks that are not allocated");
  RESERVOIR_CHECK(cached_seen == cached.size(), "the stream caches hold blocks no arena has");
  // What the statistics must count for this pool (the device compares the sums): the
  // physical memory held and the arenas, in the large pool; the live blocks by size.
  totals->counted[kReservedBytes][kLargePool] += static_cast<std::int64_t>(held);
  totals->counted[kSegment][kLargePool] += static_cast<std::int64_t>(arenas_.size());
  for (int pool = 0; pool < kPoolCount; ++pool) {
    totals->counted[kAllocation][pool] += allocation[pool];
    totals->counted[kAllocatedBytes][pool] += allocated_bytes[pool];
    totals->counted[kRequestedBytes][pool] += requested[pool];
  }
}

}  // namespace reservoir::detail
