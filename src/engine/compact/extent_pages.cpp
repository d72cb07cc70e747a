// ExtentMap: the pages of the compact pool's arenas — their books, memory under a
// block's pages (back_pages), the live bytes on them, and the validator's walk of
// pages, extents and ghosts. See extent_map.hpp.
#include <algorithm>

#include "engine/compact/extent_map.hpp"
#include "reservoir/errors.hpp"
#include "util/checks.hpp"
#include "util/format.hpp"

namespace reservoir::detail {

namespace {
// Pages an arena grows by at least, at its frontier.
constexpr std::size_t kGrowPages = 4;
// Pages booked at least when an arena starts being used (1 GiB of 2 MiB pages).
constexpr std::size_t kMinPublishedPages = 512;
}  // namespace

// Books for pages [0, end) of a (and their entries in the segment map), grown by
// doubling so that a request far into the arena costs one registration.
void ExtentMap::grow_pages_to(Arena& a, std::size_t end) {
  const std::size_t have = a.pages.size();
  const std::size_t total = pages_total(a);
  const std::size_t want = std::min(total, std::max({end, 2 * have, kMinPublishedPages}));
  a.pages.resize(want);
  services_.segments.publish_part(a.segment, a.segment->base + have * page_, (want - have) * page_);
}

// Maps memory under every unmapped page of [first, end) of a and grants access to every
// extent there without it, one call per run of them. All or nothing: on failure what
// this call mapped is unmapped again and kept as spare extents.
bool ExtentMap::back_pages(Arena& a, std::uintptr_t address, std::size_t size) {
  const auto [first, end] = page_span(a, address, size);
  if (end <= a.mapped_end && a.ready()) return true;  // the common case, in O(1)
  // Pages wholly inside the block: only they share extents, so that the extent is free
  // again, as a whole, when the block is (a page at an end may hold a neighbour too).
  const auto [inner_first, inner_end] = inner_span(a, address, size);
  const std::size_t total = pages_total(a);
  bool ready = true;
  for (std::size_t i = first; i < end && ready; ++i)
    ready = a.pages[i].extent && a.pages[i].extent->accessible;
  if (ready) return true;
  // Free extents of this span are about to hold the block: off the reclaimable list
  // (so that the search for memory does not take them), back on it if the request fails.
  std::vector<Extent*>& unlisted = unlisted_;
  std::vector<Extent*>& placed = placed_;
  unlisted.clear();
  placed.clear();
  for (std::size_t i = first; i < end;) {
    Extent* x = a.pages[i].extent;
    if (!x) {
      ++i;
      continue;
    }
    if (x->listed) {
      list_remove(x);
      unlisted.push_back(x);
    }
    i = x->first + x->pages;
  }
  // A failed request leaves nothing mapped, except an extent the device refuses to
  // unmap: that one stays mapped without access (counted, reclaimable), never forgotten.
  auto undo = [&] {
    for (Extent* x : placed) {
      try {
        unmap_extent(x);
        spare_.push_back(x);
      } catch (const DeviceError&) {
        list_push(x);
      }
    }
    for (Extent* x : unlisted)
      if (x->arena && x->live_pages == 0 && !x->listed) list_push(x);
  };
  try {
    for (std::size_t i = first; i < end;) {
      if (Extent* x = a.pages[i].extent) {
        i = x->first + x->pages;
        continue;
      }
      std::size_t e = i;
      while (e < end && !a.pages[e].extent) ++e;
      while (i < e) {
        // Memory that was here before and may come back: no device call.
        if (Extent* y = a.pages[i].ghost) {
          if (movable(*y)) {
            if (!y->arena) spare_.erase(std::find(spare_.begin(), spare_.end(), y));
            return_to_ghost(y);
            placed.push_back(y);
            i = y->first + y->pages;
            continue;
          }
          unmap_ghost(y);
        }
        // At the arena's frontier (nothing mapped from i on) the block's whole run is
        // asked for, at least kGrowPages (within the extent limit): growth takes few
        // calls, and the next blocks there find their memory mapped. Elsewhere, only
        // pages wholly inside the block share an extent.
        // (Never past the arena's end: an extent must fit the pages it is mapped under.)
        std::size_t need = 1;
        if (i >= a.mapped_end)
          need = std::min(std::max(e - i, std::min(kGrowPages, extent_limit(e - i))), total - i);
        else if (i >= inner_first && i < inner_end)
          need = std::min(e, inner_end) - i;
        Extent* x = take_extent(a, i, need);
        if (!x) {
          undo();
          return false;
        }
        grow_pages(a, i + x->pages);
        try {
          map_extent(a, i, x);
        } catch (...) {
          spare_.push_back(x);
          throw;
        }
        placed.push_back(x);
        i += x->pages;
      }
    }
    const std::vector<int> peers = services_.peers.list();
    std::vector<int> devices{services_.device};
    devices.insert(devices.end(), peers.begin(), peers.end());
    std::size_t lo = 0, hi = 0;  // pages of the run of extents to grant access to
    auto grant = [&] {
      if (hi == lo) return;
      if (services_.backend.set_access(services_.device,
                                       reinterpret_cast<void*>(a.segment->base + lo * page_),
                                       (hi - lo) * page_, devices.data(),
                                       static_cast<int>(devices.size())) != DeviceStatus::ok)
        throw DeviceError("reservoir: granting access to " + format_size((hi - lo) * page_) +
                          " of policy:compact memory on device " +
                          std::to_string(services_.device) +
                          " failed: " + services_.backend.last_error());
    };
    for (std::size_t i = first; i < end;) {
      Extent* x = a.pages[i].extent;
      i = x->first + x->pages;
      if (x->accessible) continue;
      if (hi != x->first) {
        grant();
        lo = x->first;
      }
      hi = x->first + x->pages;
    }
    grant();
  } catch (...) {
    undo();
    throw;
  }
  for (std::size_t i = first; i < end;) {
    Extent* x = a.pages[i].extent;
    if (!x->accessible) a.unready_pages -= x->pages;
    x->accessible = true;
    i = x->first + x->pages;
  }
  return true;
}

// f(i, bytes) for each page i of a under [address, address + size) with the bytes of
// the range on it: interior pages are whole, only the two ends need the arithmetic.
template <typename F>
RESERVOIR_INLINE void ExtentMap::for_pages(const Arena& a, std::uintptr_t address, std::size_t size,
                                           F&& f) const {
  const auto [first, end] = page_span(a, address, size);
  if (end - first == 1) {
    f(first, size);
    return;
  }
  const std::uintptr_t base = a.segment->base;
  f(first, base + (first + 1) * page_ - address);
  for (std::size_t i = first + 1; i + 1 < end; ++i) f(i, page_);
  f(end - 1, address + size - (base + (end - 1) * page_));
}

// A block of [address, address + size) was handed out: its bytes are live on their pages.
void ExtentMap::add_live(Arena& a, std::uintptr_t address, std::size_t size) {
  for_pages(a, address, size, [&](std::size_t i, std::uint64_t bytes) {
    Page& p = a.pages[i];
    if (p.live == 0 && p.extent->live_pages++ == 0 && p.extent->listed) list_remove(p.extent);
    p.live += bytes;
  });
}

// A block was freed: its pages learn the marks of its users (its stream, and those
// record_stream named), lose its bytes, and join the reclaimable list when empty.
void ExtentMap::remove_live(Arena& a, const Block& b) {
  const std::uint64_t own = fences_.want_marker(b.stream);
  for_pages(a, b.address, b.size, [&](std::size_t i, std::uint64_t bytes) {
    Page& p = a.pages[i];
    // Marks of b's stream alone are replaced by the newer one: nothing to drop.
    if (!p.fence.only_on(b.stream)) fences_.drop_completed(p.fence);
    p.fence.add(b.stream, own);
    p.live -= bytes;
    if (p.live == 0 && --p.extent->live_pages == 0) list_push(p.extent);
  });
  if (b.extras) {
    const auto [first, end] = page_span(a, b.address, b.size);
    for (StreamHandle s : b.extras->uses) {
      const std::uint64_t seq = fences_.want_marker(s);
      for (std::size_t i = first; i < end; ++i) a.pages[i].fence.add(s, seq);
    }
  }
}

std::size_t ExtentMap::unbacked_pages(const Arena& a, std::uintptr_t address,
                                      std::size_t size) const {
  auto [first, end] = page_span(a, address, size);
  // No hole below the frontier: only pages past it lack memory.
  if (a.mapped_pages == a.mapped_end)
    return end > a.mapped_end ? end - std::max(first, a.mapped_end) : 0;
  std::size_t missing = end > a.pages.size() ? end - std::max(first, a.pages.size()) : 0;
  for (std::size_t i = first; i < std::min(end, a.pages.size()); ++i)
    if (!a.pages[i].extent) ++missing;
  return missing;
}

// ---------------------------------------------------------------- the validator

void ExtentMap::validate_arena(const Arena& a, const std::vector<std::uint64_t>& live,
                               Audit* audit) const {
  auto at = [](std::uintptr_t x) { return format_pointer(reinterpret_cast<void*>(x)); };
  const Segment* seg = a.segment;
  std::size_t mapped_here = 0, unready_here = 0;
  for (std::size_t i = 0; i < a.pages.size(); ++i) {
    const Page& p = a.pages[i];
    // Built only when a check fails: the checks build validates after every operation.
    auto page = [&] { return "page " + std::to_string(i) + " of arena " + at(seg->base); };
    RESERVOIR_CHECK(p.live == live[i], page() + " counts " + std::to_string(p.live) +
                                           " live bytes, its blocks " + std::to_string(live[i]));
    RESERVOIR_CHECK(p.live == 0 || p.extent, page() + " holds a block but is unmapped");
    RESERVOIR_CHECK(p.live == 0 || p.extent->accessible,
                    page() + " holds a block but its access was never granted");
    if (p.ghost) {
      const Extent& g = *p.ghost;
      RESERVOIR_CHECK(!p.extent && p.live == 0, page() + " is a ghost but holds memory or a block");
      RESERVOIR_CHECK(g.ghost_arena == &a && g.ghost_first <= i && i < g.ghost_first + g.pages,
                      page() + " names a ghost mapped elsewhere");
      if (g.ghost_first == i) audit->ghost_pages += static_cast<std::ptrdiff_t>(g.pages);
      --audit->ghost_pages;
    }
    if (!p.extent) continue;
    ++mapped_here;
    const Extent& x = *p.extent;
    if (!x.accessible) ++unready_here;
    RESERVOIR_CHECK(x.arena == &a && x.first <= i && i < x.first + x.pages,
                    page() + " names an extent mapped elsewhere");
    if (x.first != i) continue;
    // The extent's books, once, at its first page.
    RESERVOIR_CHECK(x.first + x.pages <= a.pages.size(),
                    page() + ": its extent runs past the booked pages");
    std::size_t live_pages = 0;
    for (std::size_t j = i; j < i + x.pages; ++j) live_pages += live[j] > 0 ? 1 : 0;
    RESERVOIR_CHECK(x.live_pages == live_pages,
                    page() + ": its extent counts " + std::to_string(x.live_pages) +
                        " pages in use, its blocks " + std::to_string(live_pages));
    RESERVOIR_CHECK(x.listed == (x.live_pages == 0),
                    page() + (x.listed ? ": its extent is reclaimable but holds a block"
                                       : ": its extent holds nothing but is not reclaimable"));
    audit->held_pages += x.pages;
    if (x.listed) ++audit->listed;
  }
  RESERVOIR_CHECK(a.mapped_pages == mapped_here && a.unready_pages == unready_here,
                  "arena " + at(seg->base) + " counts " + std::to_string(a.mapped_pages) +
                      " pages with memory and " + std::to_string(a.unready_pages) +
                      " of them without access, its pages " + std::to_string(mapped_here) +
                      " and " + std::to_string(unready_here));
  std::size_t mapped_end = a.pages.size();
  while (mapped_end > 0 && !a.pages[mapped_end - 1].extent) --mapped_end;
  RESERVOIR_CHECK(a.mapped_end == mapped_end,
                  "arena " + at(seg->base) + " places its frontier at page " +
                      std::to_string(a.mapped_end) + ", its last mapped page ends at " +
                      std::to_string(mapped_end));
  RESERVOIR_CHECK(seg->mapped_bytes == mapped_here * page_,
                  "arena " + at(seg->base) + " counts mapped bytes wrong");
  audit->mapped_pages += mapped_here;
}

std::size_t ExtentMap::validate_end(const Audit& audit) const {
  std::size_t spare_pages = 0;
  for (const Extent* x : spare_) {
    RESERVOIR_CHECK(!x->arena && !x->listed && !x->accessible && x->pages > 0,
                    "a spare extent is mapped, listed or empty");
    spare_pages += x->pages;
  }
  std::size_t walked = 0;
  for (const Extent* x = reclaim_head_; x; x = x->next) {
    RESERVOIR_CHECK(x->listed && x->arena, "the reclaimable list holds an extent not listed");
    RESERVOIR_CHECK(x->next ? x->next->prev == x : reclaim_tail_ == x,
                    "the reclaimable list's links are broken");
    RESERVOIR_CHECK(++walked <= audit.listed,
                    "the reclaimable list holds more extents than are free");
  }
  RESERVOIR_CHECK(walked == audit.listed,
                  "a free mapped extent is missing from the reclaimable list");
  // Every page of a mapped extent names it (each page was counted once above).
  RESERVOIR_CHECK(audit.held_pages == audit.mapped_pages,
                  "a mapped extent's pages do not all name it");
  RESERVOIR_CHECK(audit.ghost_pages == 0, "a ghost's pages do not all name it");
  RESERVOIR_CHECK(held_pages_ == audit.held_pages + spare_pages,
                  "the pages held are miscounted (" + std::to_string(held_pages_) + " counted, " +
                      std::to_string(audit.held_pages + spare_pages) + " in extents)");
  return (audit.held_pages + spare_pages) * page_;
}

}  // namespace reservoir::detail
