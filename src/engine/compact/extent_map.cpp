// ExtentMap: extents of physical memory made, mapped, moved (stitched), kept as
// ghosts and given back. Backing a block's pages, the live bytes and the validator are
// in extent_pages.cpp. See extent_map.hpp.
#include "engine/compact/extent_map.hpp"

#include <algorithm>
#include <memory>

#include "reservoir/errors.hpp"
#include "util/checks.hpp"
#include "util/format.hpp"

namespace reservoir::detail {

namespace {
// Reclaimable extents examined for each run of pages a request lacks, before new
// memory is taken instead: the oldest are the likeliest to have completed their fences.
constexpr int kReclaimProbes = 16;
// The largest extent created (pages): every extent moved costs an unmap, a map and an
// access grant whatever its size (tens of microseconds on an H200), so large ones
// make stitching cheap per byte; bounded so that one block cannot pin a great deal
// of free memory (an extent moves only whole).
constexpr std::size_t kMaxExtentPages = 16;
// And at most this share of the memory held (1/kExtentShare, the request's pages
// counted in): the free pages that partly used extents keep (an extent moves only
// whole) then stay a small share of the pool at every scale. With sixteen-page
// extents from the start, the bundled traces scaled down 8x (programs of 100-200 MB)
// held 1.10-1.18x what they asked for, against 1.04-1.05 with this bound
// (tests/replay/compact_replay_test.cpp; the figures in docs/memory.md).
constexpr std::size_t kExtentShare = 128;
}  // namespace

std::size_t ExtentMap::extent_limit(std::size_t need) const {
  if (services_.budget.limited()) return 1;
  return std::clamp<std::size_t>((held_pages_ + need) / kExtentShare, 1, kMaxExtentPages);
}

ExtentMap::~ExtentMap() {
  // The pool is going away (every arena abandoned): the memory goes back, whatever
  // the device says.
  for (Extent* x : spare_) {
    (void)services_.backend.release_physical(services_.device, x->handle);
    services_.budget.unreserve(x->pages * page_);
    delete x;
  }
}

// An extent of pages pages, new from the device (within the memory fraction); nullptr
// when refused.
ExtentMap::Extent* ExtentMap::create_extent(std::size_t pages) {
  const std::size_t bytes = pages * page_;
  auto x = std::make_unique<Extent>();  // first: a handle is never left without its books
  if (!services_.budget.reserve(bytes)) return nullptr;  // over the memory fraction
  const DeviceStatus st = services_.backend.create_physical(services_.device, bytes, &x->handle);
  if (st != DeviceStatus::ok) {
    services_.budget.unreserve(bytes);
    if (st == DeviceStatus::out_of_memory) return nullptr;
    throw DeviceError("reservoir: creating " + format_size(bytes) +
                      " of physical memory on device " + std::to_string(services_.device) +
                      " failed: " + services_.backend.last_error());
  }
  x->pages = pages;
  held_pages_ += pages;
  services_.ledger.mine().add<kReservedBytes>(kLargePool, static_cast<std::int64_t>(bytes));
  DeviceCounters::bump(services_.counters.device_allocs);
  return x.release();
}

// x is spare; its memory goes back to the device.
void ExtentMap::release_extent(Extent* x) {
  if (x->ghost_arena) {
    try {
      unmap_ghost(x);
    } catch (...) {
      spare_.push_back(x);
      throw;
    }
  }
  if (services_.backend.release_physical(services_.device, x->handle) != DeviceStatus::ok) {
    // Kept as a spare rather than lost: counted, and retried by the next release.
    spare_.push_back(x);
    throw DeviceError("reservoir: releasing physical memory on device " +
                      std::to_string(services_.device) +
                      " failed: " + services_.backend.last_error());
  }
  const std::size_t bytes = x->pages * page_;
  held_pages_ -= x->pages;
  services_.budget.unreserve(bytes);
  services_.ledger.mine().add<kReservedBytes>(kLargePool, -static_cast<std::int64_t>(bytes));
  DeviceCounters::bump(services_.counters.device_frees);
  delete x;
}

// x (spare) under pages [at, at + x->pages) of a, which are unmapped and booked.
void ExtentMap::map_extent(Arena& a, std::size_t at, Extent* x) {
  RESERVOIR_ASSERT(at + x->pages <= a.pages.size());  // booked (grow_pages), in the arena
  if (x->ghost_arena == &a && x->ghost_first == at) return return_to_ghost(x);
  // Ghosts where it goes are unmapped first (they hold no block).
  for (std::size_t i = at; i < at + x->pages; ++i)
    if (Extent* g = a.pages[i].ghost) unmap_ghost(g);
  const std::uintptr_t address = a.segment->base + at * page_;
  const std::size_t bytes = x->pages * page_;
  if (services_.backend.map(services_.device, reinterpret_cast<void*>(address), bytes, x->handle) !=
      DeviceStatus::ok)
    throw DeviceError("reservoir: mapping " + format_size(bytes) +
                      " for policy:compact on device " + std::to_string(services_.device) +
                      " failed: " + services_.backend.last_error());
  take_place(a, at, x, false);
  DeviceCounters::bump(services_.counters.device_maps);
  if (services_.history.active())
    services_.trace(TraceAction::segment_map, address, bytes, 0, nullptr);
}

// The device call of an unmap; throws with nothing changed.
void ExtentMap::unmap_range(std::uintptr_t address, std::size_t bytes) {
  if (services_.backend.unmap(services_.device, reinterpret_cast<void*>(address), bytes) !=
      DeviceStatus::ok)
    throw DeviceError("reservoir: unmapping " + format_size(bytes) +
                      " of policy:compact memory on device " + std::to_string(services_.device) +
                      " failed: " + services_.backend.last_error());
  DeviceCounters::bump(services_.counters.device_unmaps);
}

// Pages [at, at + x->pages) of a name x (mapped there, ghosts there gone).
void ExtentMap::take_place(Arena& a, std::size_t at, Extent* x, bool accessible) {
  for (std::size_t i = at; i < at + x->pages; ++i) {
    a.pages[i].extent = x;
    a.pages[i].ghost = nullptr;
    a.pages[i].fence.clear();
  }
  x->arena = &a;
  x->first = at;
  x->accessible = accessible;
  a.mapped_pages += x->pages;
  if (!accessible) a.unready_pages += x->pages;
  a.segment->mapped_bytes += x->pages * page_;
  a.mapped_end = std::max(a.mapped_end, at + x->pages);
}

// x's pages lose it (they name ghost instead: x itself, or nullptr).
void ExtentMap::leave_place(Extent* x, Extent* ghost) {
  Arena& a = *x->arena;
  for (std::size_t i = x->first; i < x->first + x->pages; ++i) {
    a.pages[i].extent = nullptr;
    a.pages[i].ghost = ghost;
    a.pages[i].fence.clear();
  }
  if (a.mapped_end == x->first + x->pages) {
    a.mapped_end = x->first;
    while (a.mapped_end > 0 && !a.pages[a.mapped_end - 1].extent) --a.mapped_end;
  }
  a.mapped_pages -= x->pages;
  if (!x->accessible) a.unready_pages -= x->pages;
  a.segment->mapped_bytes -= x->pages * page_;
  x->arena = nullptr;
  x->accessible = false;
}

void ExtentMap::unmap_extent(Extent* x) {
  Arena& a = *x->arena;
  const std::uintptr_t address = a.segment->base + x->first * page_;
  const std::size_t bytes = x->pages * page_;
  unmap_range(address, bytes);
  leave_place(x, nullptr);
  if (services_.history.active())
    services_.trace(TraceAction::segment_unmap, address, bytes, 0, a.segment->context);
}

void ExtentMap::retire(Extent* x) {
  if (x->ghost_arena) unmap_ghost(x);  // throws with nothing changed
  x->ghost_arena = x->arena;
  x->ghost_first = x->first;
  leave_place(x, x);
}

void ExtentMap::unmap_ghost(Extent* x) {
  Arena& a = *x->ghost_arena;
  const std::uintptr_t address = a.segment->base + x->ghost_first * page_;
  const std::size_t bytes = x->pages * page_;
  unmap_range(address, bytes);
  for (std::size_t i = x->ghost_first; i < x->ghost_first + x->pages; ++i)
    a.pages[i].ghost = nullptr;
  x->ghost_arena = nullptr;
  if (services_.history.active())
    services_.trace(TraceAction::segment_unmap, address, bytes, 0, a.segment->context);
}

void ExtentMap::return_to_ghost(Extent* x) {
  Arena& g = *x->ghost_arena;
  const std::size_t at = x->ghost_first;
  x->ghost_arena = nullptr;
  if (x->arena) {
    if (x->listed) list_remove(x);
    retire(x);  // no older ghost now: no device call
  }
  take_place(g, at, x, true);  // a ghost keeps the access it had
}

bool ExtentMap::movable(Extent& x) {
  if (!x.arena) return true;  // spare
  return x.listed && fences_complete(x);
}

bool ExtentMap::fences_complete(const Extent& x) {
  for (std::size_t i = x.first; i < x.first + x.pages; ++i)
    if (!fences_.complete(x.arena->pages[i].fence)) return false;
  return true;
}

void ExtentMap::list_push(Extent* x) {
  x->listed = true;
  x->prev = reclaim_tail_;
  x->next = nullptr;
  if (reclaim_tail_)
    reclaim_tail_->next = x;
  else
    reclaim_head_ = x;
  reclaim_tail_ = x;
}

void ExtentMap::list_remove(Extent* x) {
  if (x->prev)
    x->prev->next = x->next;
  else
    reclaim_head_ = x->next;
  if (x->next)
    x->next->prev = x->prev;
  else
    reclaim_tail_ = x->prev;
  x->prev = x->next = nullptr;
  x->listed = false;
}

// Memory for need unmapped pages of a from s on: a spare extent, else a mapped one
// whose pages hold nothing and whose users have completed (stitching: unmapped there
// here), before any new memory is taken from the device. Of those, one of exactly need
// pages; else the smallest larger one that the unmapped pages from s can hold (the
// rest of it is cached there); else the largest smaller one (the caller asks again
// for the rest). New memory comes in one extent of up to extent_limit() pages, halved
// while the device or the fraction refuses it.
ExtentMap::Extent* ExtentMap::take_extent(Arena& a, std::size_t s, std::size_t need) {
  const std::size_t total = pages_total(a);
  auto window_holds = [&](std::size_t n) {  // pages [s, s + n) are all unmapped
    if (s + n > total) return false;
    for (std::size_t i = s; i < std::min(s + n, a.pages.size()); ++i)
      if (a.pages[i].extent) return false;
    return true;
  };
  Extent *smaller = nullptr, *larger = nullptr, *misfit = nullptr;
  auto consider = [&](Extent* x) {
    if (x->pages <= need) {
      if (!smaller || x->pages > smaller->pages) smaller = x;
    } else if ((!larger || x->pages < larger->pages) && window_holds(x->pages)) {
      larger = x;
    } else if (!misfit || x->pages < misfit->pages) {
      misfit = x;
    }
  };
  auto exact = [&] { return smaller && smaller->pages == need; };
  for (Extent* x : spare_) consider(x);
  int probes = 0;
  for (Extent* x = reclaim_head_; x && probes < kReclaimProbes && !exact(); x = x->next) {
    ++probes;
    if (fences_complete(*x)) consider(x);
  }
  // A mapped extent leaves as a ghost (no call) when it can come back there for free.
  auto detach = [&](Extent* x, bool keep_ghost) {
    if (x->arena) {
      if (keep_ghost && x->accessible)
        retire(x);  // throws with nothing changed
      else
        unmap_extent(x);  // throws with nothing changed
      list_remove(x);
    } else {
      spare_.erase(std::find(spare_.begin(), spare_.end(), x));
    }
  };
  if (Extent* chosen = exact() ? smaller : larger ? larger : smaller) {
    detach(chosen, true);
    return chosen;
  }
  // Only larger free extents, which cannot be mapped here: one goes back to the device
  // and the memory is made again in the size needed, rather than new memory taken
  // beside it (free memory never makes the pool grow).
  if (misfit) {
    detach(misfit, false);
    release_extent(misfit);
  }
  for (std::size_t n = std::min(need, extent_limit(need)); n >= 1; n /= 2)
    if (Extent* x = create_extent(n)) return x;
  return nullptr;
}

std::size_t ExtentMap::spare_bytes() const {
  std::size_t held = 0;
  for (const Extent* x : spare_) held += x->pages * page_;
  return held;
}

// ---------------------------------------------------------------- the ladder's release

void ExtentMap::unmap_ghosts(Arena& a) {
  for (std::size_t i = 0; i < a.pages.size(); ++i)
    if (Extent* g = a.pages[i].ghost; g && g->ghost_first == i) unmap_ghost(g);
}

void ExtentMap::unmap_unused(Arena& a) {
  for (std::size_t i = 0; i < a.pages.size(); ++i) {
    Extent* x = a.pages[i].extent;
    if (!x || x->first != i || x->live_pages != 0) continue;
    unmap_extent(x);  // throws with nothing changed
    list_remove(x);
    spare_.push_back(x);
  }
}

std::size_t ExtentMap::release_spares() {
  std::size_t released = 0;
  while (!spare_.empty()) {
    Extent* x = spare_.back();
    spare_.pop_back();
    const std::size_t bytes = x->pages * page_;
    release_extent(x);
    released += bytes;
  }
  return released;
}

// Every ghost and extent of a unmapped, whatever the device says; the extents become
// spare (the destructor gives their memory back). The books of a are left as they
// were: the arena goes next.
void ExtentMap::abandon(Arena& a) noexcept {
  for (std::size_t i = 0; i < a.pages.size(); ++i) {
    if (Extent* g = a.pages[i].ghost; g && g->ghost_first == i)
      (void)services_.backend.unmap(
          services_.device, reinterpret_cast<void*>(a.segment->base + i * page_), g->pages * page_);
    Extent* x = a.pages[i].extent;
    if (!x || x->first != i) continue;
    (void)services_.backend.unmap(
        services_.device, reinterpret_cast<void*>(a.segment->base + i * page_), x->pages * page_);
    spare_.push_back(x);
  }
}

}  // namespace reservoir::detail
