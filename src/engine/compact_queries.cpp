// CompactPool: reading the books (sizes, snapshots, error explanations) and the
// validator's walk of arenas, blocks and pages.
#include <algorithm>

#include "engine/compact_pool.hpp"
#include "reservoir/errors.hpp"
#include "util/checks.hpp"
#include "util/format.hpp"

namespace reservoir::detail {

std::size_t CompactPool::largest_free_block() {
  Guard guard(lock_);
  // The tail of an arena is address space, not memory: count only mapped free bytes.
  std::size_t largest = 0;
  for (auto& a : arenas_)
    for (Block* b = a->segment->head; b; b = b->next) {
      if (b->state != BlockState::free) continue;
      auto [first, end] = page_span(*a, b->address, b->size);
      end = std::min(end, a->pages.size());
      std::size_t run = 0;
      for (std::size_t i = first; i < end; ++i) {
        run = a->pages[i].mapping ? run + page_ : 0;
        largest = std::max(largest, std::min(run, b->size));
      }
    }
  return largest;
}

std::size_t CompactPool::cached_bytes() {
  Guard guard(lock_);
  const std::size_t held = held_pages_ * page_;
  std::size_t allocated = 0;
  allocated_.for_each([&](std::uintptr_t, Block* b) { allocated += b->size; });
  return held > allocated ? held - allocated : 0;
}

bool CompactPool::block_sizes(std::uintptr_t address, std::size_t* size, std::size_t* requested) {
  Guard guard(lock_);
  Block* b = allocated_.find(address);
  if (!b) return false;
  if (size) *size = b->size;
  if (requested) *requested = b->requested;
  return true;
}

bool CompactPool::segment_of(std::uintptr_t address, BaseAllocation*) {
  Guard guard(lock_);
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
  Guard guard(lock_);
  for (auto& a : arenas_) {
    if (!a->segment->holds(address)) continue;
    for (Block* b = a->segment->head; b; b = b->next) {
      if (address < b->address || address - b->address >= b->size) continue;
      if (b->state == BlockState::allocated)
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
  Guard guard(lock_);
  std::size_t active = 0;
  for (auto& a : arenas_) {
    // Each run of mapped pages is reported as a segment; blocks clipped to it.
    const std::uintptr_t base = a->segment->base;
    for (std::size_t i = 0; i < a->pages.size();) {
      if (!a->pages[i].mapping) {
        ++i;
        continue;
      }
      std::size_t end = i;
      while (end < a->pages.size() && a->pages[end].mapping) ++end;
      const std::uintptr_t lo = base + i * page_, hi = base + end * page_;
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
        if (b->state == BlockState::allocated) {
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

void CompactPool::reset_accumulated() {
  Guard guard(lock_);
  StatLedger::reset_accumulated(&counters_);
}

void CompactPool::validate(ValidationTotals* totals) {
  Guard guard(lock_);
  validate_locked(totals);
}

void CompactPool::validate_locked(ValidationTotals* totals) {
  auto at = [](std::uintptr_t x) { return format_pointer(reinterpret_cast<void*>(x)); };
  std::int64_t allocation[kPoolCount] = {}, allocated_bytes[kPoolCount] = {},
               requested[kPoolCount] = {};
  std::size_t free_blocks = 0, allocated_blocks = 0, mapped_pages = 0, mappings = 0;
  std::vector<Extent> owned;  // the chunk pages under each mapping
  for (auto& a : arenas_) {
    Segment* seg = a->segment;
    RESERVOIR_CHECK(seg->owner == this, "arena " + at(seg->base) + " has another owner");
    RESERVOIR_CHECK(a->pages.empty() || services_.segments.published(seg),
                    "arena " + at(seg->base) + " missing from the segment map");
    RESERVOIR_CHECK(seg->head && seg->head->address == seg->base && !seg->head->prev,
                    "arena " + at(seg->base) + " does not start with its head block");
    std::vector<std::uint64_t> live(a->pages.size(), 0);
    std::size_t tiled = 0;
    for (Block* b = seg->head; b; b = b->next) {
      const std::string where = "block " + at(b->address) + " of arena " + at(seg->base);
      RESERVOIR_CHECK(b->segment == seg && b->address == seg->base + tiled && b->size > 0 &&
                          b->size % SizePolicy::kMinBlockSize == 0,
                      where + " breaks the tiling");
      if (b->next) {
        RESERVOIR_CHECK(b->next->prev == b, where + ": next->prev != block");
        RESERVOIR_CHECK(!(b->state == BlockState::free && b->next->state == BlockState::free),
                        where + " and its successor are both free but not merged");
      }
      tiled += b->size;
      if (b->state == BlockState::free) {
        ++free_blocks;
        RESERVOIR_CHECK(free_.count(b) == 1 && *b->free_at == b,
                        where + " is free but not in the free set");
        continue;
      }
      RESERVOIR_CHECK(b->state == BlockState::allocated, where + " is neither free nor allocated");
      RESERVOIR_CHECK(allocated_.find(b->address) == b, where + " missing from the allocated map");
      ++allocated_blocks;
      const int pool = SizePolicy::pool_for(b->size);
      allocation[pool] += 1;
      allocated_bytes[pool] += static_cast<std::int64_t>(b->size);
      requested[pool] += static_cast<std::int64_t>(b->requested);
      auto [first, end] = page_span(*a, b->address, b->size);
      for (std::size_t i = first; i < end; ++i) {
        const std::uintptr_t lo = std::max(b->address, seg->base + i * page_);
        const std::uintptr_t hi = std::min(b->address + b->size, seg->base + (i + 1) * page_);
        live[i] += hi - lo;
      }
    }
    RESERVOIR_CHECK(tiled == seg->size, "blocks of arena " + at(seg->base) + " do not tile it");
    std::size_t mapped_here = 0;
    for (std::size_t i = 0; i < a->pages.size(); ++i) {
      const Page& p = a->pages[i];
      auto page = [&] { return "page " + std::to_string(i) + " of arena " + at(seg->base); };
      RESERVOIR_CHECK(p.live == live[i], page() + " counts " + std::to_string(p.live) +
                                             " live bytes, its blocks " + std::to_string(live[i]));
      RESERVOIR_CHECK(p.live == 0 || p.mapping, page() + " holds a block but is unmapped");
      RESERVOIR_CHECK(p.live == 0 || p.accessible,
                      page() + " holds a block but its access was never granted");
      RESERVOIR_CHECK(!p.accessible || p.mapping, page() + " is accessible but unmapped");
      if (!p.mapping) continue;
      ++mapped_here;
      const Mapping& m = *p.mapping;
      RESERVOIR_CHECK(m.arena == a.get() && m.first <= i && i < m.first + m.count,
                      page() + " refers to a mapping that does not cover it");
      if (i != m.first) continue;
      // The mapping, once, from its first page.
      ++mappings;
      std::size_t busy = 0;
      for (std::size_t j = m.first; j < m.first + m.count; ++j) {
        RESERVOIR_CHECK(j < a->pages.size() && a->pages[j].mapping == &m,
                        page() + ": a page of its mapping refers to another");
        busy += a->pages[j].live > 0 ? 1 : 0;
      }
      RESERVOIR_CHECK(m.busy == busy, page() + ": its mapping counts " + std::to_string(m.busy) +
                                          " pages holding blocks, its pages " +
                                          std::to_string(busy));
      RESERVOIR_CHECK(m.listed == (busy == 0),
                      page() + (m.listed ? ": its mapping is reclaimable but holds a block"
                                         : ": its mapping holds no block but is not reclaimable"));
      owned.push_back(Extent{m.chunk, m.offset, m.count});
    }
    RESERVOIR_CHECK(seg->mapped_bytes == mapped_here * page_,
                    "arena " + at(seg->base) + " counts mapped bytes wrong");
    mapped_pages += mapped_here;
    totals->segments += 1;
  }
  RESERVOIR_CHECK(mappings == mappings_, "the pages show " + std::to_string(mappings) +
                                             " mappings, the pool counts " +
                                             std::to_string(mappings_));
  std::size_t listed = 0;
  for (const Mapping* m = reclaim_head_; m; m = m->next) {
    RESERVOIR_CHECK(m->listed && (m->next ? m->next->prev == m : reclaim_tail_ == m),
                    "the reclaimable list is broken");
    ++listed;
  }
  std::size_t idle = 0;  // mappings that hold no block
  for (auto& a : arenas_)
    for (std::size_t i = 0; i < a->pages.size(); ++i)
      if (const Mapping* m = a->pages[i].mapping; m && i == m->first && m->busy == 0) ++idle;
  RESERVOIR_CHECK(listed == idle, "the reclaimable list holds " + std::to_string(listed) +
                                      " mappings, " + std::to_string(idle) + " hold no block");
  // Every page of every chunk in exactly one mapping or spare extent: sorted by chunk
  // and page, the extents of a chunk follow one another without gap or overlap.
  for (Extent& e : owned) e.count |= std::size_t{1} << 63;  // marks a mapping's pages
  owned.insert(owned.end(), spare_.begin(), spare_.end());
  std::sort(owned.begin(), owned.end(), [](const Extent& x, const Extent& y) {
    return x.chunk != y.chunk ? std::less<const Chunk*>{}(x.chunk, y.chunk) : x.first < y.first;
  });
  std::vector<const Chunk*> held_chunks;
  for (const auto& c : chunks_) held_chunks.push_back(c.get());
  std::sort(held_chunks.begin(), held_chunks.end(), std::less<const Chunk*>{});
  std::size_t held_pages = 0, chunk_mapped = 0, chunks_seen = 0;
  for (std::size_t k = 0; k < owned.size();) {
    const Chunk* c = owned[k].chunk;
    ++chunks_seen;
    RESERVOIR_CHECK(
        std::binary_search(held_chunks.begin(), held_chunks.end(), c, std::less<const Chunk*>{}),
        "a mapping or spare extent refers to a chunk the pool does not hold");
    auto chunk = [&] { return "a " + format_size(c->pages * page_) + " chunk"; };
    std::size_t next = 0, mapped = 0;  // pages of c covered so far: [0, next)
    for (; k < owned.size() && owned[k].chunk == c; ++k) {
      const bool under_mapping = (owned[k].count >> 63) != 0;
      const std::size_t count = owned[k].count & ~(std::size_t{1} << 63);
      RESERVOIR_CHECK(owned[k].first == next && count > 0,
                      "page " + std::to_string(std::min(owned[k].first, next)) + " of " + chunk() +
                          " is mapped or spare twice, or neither");
      next += count;
      if (under_mapping) mapped += count;
    }
    RESERVOIR_CHECK(next == c->pages, "pages of " + chunk() + " past " + std::to_string(next) +
                                          " are neither mapped nor spare, or it runs past");
    RESERVOIR_CHECK(c->mapped == mapped, chunk() + " counts " + std::to_string(c->mapped) +
                                             " pages mapped, its mappings " +
                                             std::to_string(mapped));
  }
  for (const auto& c : chunks_) {
    held_pages += c->pages;
    chunk_mapped += c->mapped;
    RESERVOIR_CHECK(c->pages > 0, "a chunk holds no page");
  }
  RESERVOIR_CHECK(chunks_seen == chunks_.size(), "a chunk has pages neither mapped nor spare");
  RESERVOIR_CHECK(chunk_mapped == mapped_pages, "chunks count " + std::to_string(chunk_mapped) +
                                                    " pages mapped, the arenas " +
                                                    std::to_string(mapped_pages));
  RESERVOIR_CHECK(held_pages == held_pages_, "the pool counts " + std::to_string(held_pages_) +
                                                 " pages held, its chunks " +
                                                 std::to_string(held_pages));
  const std::size_t held = held_pages * page_;
  totals->reserved += held;
  RESERVOIR_CHECK(free_blocks == free_.size(), "the free set holds blocks that are not free");
  RESERVOIR_CHECK(allocated_blocks == allocated_.size(),
                  "the allocated map holds blocks that are not allocated");
  RESERVOIR_CHECK(
      counters_.get(kReservedBytes, kSmallPool) + counters_.get(kReservedBytes, kLargePool) ==
          static_cast<std::int64_t>(held),
      "reserved_bytes is not the physical memory held (" + std::to_string(held) + ")");
  RESERVOIR_CHECK(counters_.get(kSegment, kLargePool) == static_cast<std::int64_t>(arenas_.size()),
                  "segment count is not the number of arenas");
  for (int pool = 0; pool < kPoolCount; ++pool) {
    RESERVOIR_CHECK(counters_.get(kAllocation, pool) == allocation[pool],
                    "allocation count of pool " + std::to_string(pool) + " is off");
    RESERVOIR_CHECK(counters_.get(kAllocatedBytes, pool) == allocated_bytes[pool],
                    "allocated_bytes of pool " + std::to_string(pool) + " is off");
    RESERVOIR_CHECK(counters_.get(kRequestedBytes, pool) == requested[pool],
                    "requested_bytes of pool " + std::to_string(pool) + " is off");
  }
}

}  // namespace reservoir::detail
