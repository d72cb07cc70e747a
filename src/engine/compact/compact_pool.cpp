// CompactPool: allocation over arenas of pages, stitching, fences. See compact_pool.hpp.
#include "engine/compact/compact_pool.hpp"

#include <algorithm>
#include <new>

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
// Pages an arena grows by at least, at its frontier.
constexpr std::size_t kGrowPages = 4;
// Free blocks after the best fit examined for one whose memory is all there.
constexpr int kPlacementProbes = 32;
// Pages booked at least when an arena starts being used (1 GiB of 2 MiB pages).
constexpr std::size_t kMinPublishedPages = 512;
}  // namespace

CompactPool::CompactPool(PoolServices& services)
    : services_(services),
      block_nodes_(sizeof(Block)),
      fences_(services.backend, services.device, services.events) {
  if (services.backend.granularity(services.device, &page_) != DeviceStatus::ok || page_ == 0)
    throw DeviceError(
        "reservoir: policy:compact needs the device's virtual memory management "
        "(mapping pages), which device " +
        std::to_string(services.device) + " (" + services.backend.name() +
        ") lacks: " + services.backend.last_error() + "; use policy:pytorch on this device");
}

CompactPool::~CompactPool() {
  services_.segments.owner_gone(this);
  // The engine is going away: every extent and range goes back, whatever it holds.
  for (auto& a : arenas_) {
    for (std::size_t i = 0; i < a->pages.size(); ++i) {
      if (Extent* g = a->pages[i].ghost; g && g->ghost_first == i)
        (void)services_.backend.unmap(services_.device,
                                      reinterpret_cast<void*>(a->segment->base + i * page_),
                                      g->pages * page_);
      Extent* x = a->pages[i].extent;
      if (!x || x->first != i) continue;
      (void)services_.backend.unmap(services_.device,
                                    reinterpret_cast<void*>(a->segment->base + i * page_),
                                    x->pages * page_);
      spare_.push_back(x);
    }
    for (Block* b = a->segment->head; b;) {
      Block* n = b->next;
      block_list::destroy(block_nodes_, b);
      b = n;
    }
    (void)services_.backend.release_address_range(
        services_.device, reinterpret_cast<void*>(a->segment->base), a->segment->size);
    services_.segments.retire_part(a->segment, a->pages.size() * page_);
  }
  for (Extent* x : spare_) {
    (void)services_.backend.release_physical(services_.device, x->handle);
    services_.budget.unreserve(x->pages * page_);
    delete x;
  }
}

// ---------------------------------------------------------------- blocks

void CompactPool::index_free(Block* b) {
  b->state = BlockState::free;
  free_.insert(b);
}

void CompactPool::reposition_free(Block* b) {
  free_.reposition(b);
}

// b (allocated until now, in no index) becomes free, merged with free neighbours
// (block_list::coalesce over the free index; nothing counted).
Block* CompactPool::coalesce_free(Block* b) {
  struct Hooks {
    CompactPool& pool;
    void drop(Block* x) { block_list::destroy(pool.block_nodes_, x); }
    void unindex(Block* x) { pool.free_.erase(x); }
    void index(Block* x) { pool.index_free(x); }
    void reposition(Block* x) { pool.reposition_free(x); }
    void absorbed(const Block&) {}
  };
  Hooks hooks{*this};
  return block_list::coalesce(b, BlockState::free, hooks);
}

CompactPool::Arena* CompactPool::arena_of(const Block* b) const {
  for (const auto& a : arenas_)
    if (a->segment == b->segment) return a.get();
  return nullptr;  // unreachable: every block is in an arena
}

std::pair<std::size_t, std::size_t> CompactPool::page_span(const Arena& a, std::uintptr_t address,
                                                           std::size_t size) const {
  const std::size_t first = (address - a.segment->base) / page_;
  const std::size_t end = (address - a.segment->base + size + page_ - 1) / page_;
  return {first, end};
}

// Twice the device's memory of address space (pages are mapped only where blocks
// live, so the range costs nothing); a request larger than that gets its own.
CompactPool::Arena* CompactPool::new_arena(std::size_t at_least) {
  MemoryInfo info;
  if (services_.backend.memory_info(services_.device, &info) != DeviceStatus::ok)
    throw DeviceError("reservoir: reading memory info of device " +
                      std::to_string(services_.device) +
                      " failed: " + services_.backend.last_error());
  std::size_t size = std::max(2 * info.total, at_least);
  size = (size + page_ - 1) / page_ * page_;
  void* ptr = nullptr;
  if (services_.backend.reserve_address_range(services_.device, size, page_, &ptr) !=
      DeviceStatus::ok)
    throw DeviceError("reservoir: reserving " + format_size(size) +
                      " of address space for policy:compact on device " +
                      std::to_string(services_.device) +
                      " failed: " + services_.backend.last_error());
  auto arena = std::make_unique<Arena>();
  Segment* seg = services_.segments.make();
  seg->set_range(reinterpret_cast<std::uintptr_t>(ptr), size);
  seg->pool = kLargePool;
  seg->expandable = true;  // no single base allocation (and no IPC handle)
  Block* b = block_list::start(block_nodes_, seg, BlockState::free);
  seg->set_owner(this);
  arena->segment = seg;
  // Pages (and the segment map's entries) follow the highest block in use (grow_pages):
  // an arena is far larger than what it holds.
  index_free(b);
  counters_.add<kSegment>(kLargePool, 1);
  arenas_.push_back(std::move(arena));
  return arenas_.back().get();
}

// Books for pages [0, end) of a (and their entries in the segment map), grown by
// doubling so that a request far into the arena costs one registration.
void CompactPool::grow_pages(Arena& a, std::size_t end) {
  const std::size_t have = a.pages.size();
  if (end <= have) return;
  const std::size_t total = pages_total(a);
  const std::size_t want = std::min(total, std::max({end, 2 * have, kMinPublishedPages}));
  a.pages.resize(want);
  services_.segments.publish_part(a.segment, a.segment->base + have * page_, (want - have) * page_);
}

// ---------------------------------------------------------------- physical memory

// An extent of pages pages, new from the device (within the memory fraction); nullptr
// when refused.
CompactPool::Extent* CompactPool::create_extent(std::size_t pages) {
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
  counters_.add<kReservedBytes>(kLargePool, static_cast<std::int64_t>(bytes));
  DeviceCounters::bump(services_.counters.device_allocs);
  return x.release();
}

// x is spare; its memory goes back to the device.
void CompactPool::release_extent(Extent* x) {
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
  services_.budget.unreserve(bytes);
  counters_.add<kReservedBytes>(kLargePool, -static_cast<std::int64_t>(bytes));
  DeviceCounters::bump(services_.counters.device_frees);
  delete x;
}

// x (spare) under pages [at, at + x->pages) of a, which are unmapped and booked.
void CompactPool::map_extent(Arena& a, std::size_t at, Extent* x) {
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
void CompactPool::unmap_range(std::uintptr_t address, std::size_t bytes) {
  if (services_.backend.unmap(services_.device, reinterpret_cast<void*>(address), bytes) !=
      DeviceStatus::ok)
    throw DeviceError("reservoir: unmapping " + format_size(bytes) +
                      " of policy:compact memory on device " + std::to_string(services_.device) +
                      " failed: " + services_.backend.last_error());
  DeviceCounters::bump(services_.counters.device_unmaps);
}

// Pages [at, at + x->pages) of a name x (mapped there, ghosts there gone).
void CompactPool::take_place(Arena& a, std::size_t at, Extent* x, bool accessible) {
  for (std::size_t i = at; i < at + x->pages; ++i) {
    a.pages[i].extent = x;
    a.pages[i].ghost = nullptr;
    a.pages[i].fence.clear();
  }
  x->arena = &a;
  x->first = at;
  x->accessible = accessible;
  a.segment->mapped_bytes += x->pages * page_;
  a.mapped_end = std::max(a.mapped_end, at + x->pages);
}

// x's pages lose it (they name ghost instead: x itself, or nullptr).
void CompactPool::leave_place(Extent* x, Extent* ghost) {
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
  a.segment->mapped_bytes -= x->pages * page_;
  x->arena = nullptr;
  x->accessible = false;
}

void CompactPool::unmap_extent(Extent* x) {
  Arena& a = *x->arena;
  const std::uintptr_t address = a.segment->base + x->first * page_;
  const std::size_t bytes = x->pages * page_;
  unmap_range(address, bytes);
  leave_place(x, nullptr);
  if (services_.history.active())
    services_.trace(TraceAction::segment_unmap, address, bytes, 0, a.segment->context);
}

void CompactPool::retire(Extent* x) {
  if (x->ghost_arena) unmap_ghost(x);  // throws with nothing changed
  x->ghost_arena = x->arena;
  x->ghost_first = x->first;
  leave_place(x, x);
}

void CompactPool::unmap_ghost(Extent* x) {
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

void CompactPool::return_to_ghost(Extent* x) {
  Arena& g = *x->ghost_arena;
  const std::size_t at = x->ghost_first;
  x->ghost_arena = nullptr;
  if (x->arena) {
    if (x->listed) list_remove(x);
    retire(x);  // no older ghost now: no device call
  }
  take_place(g, at, x, true);  // a ghost keeps the access it had
}

bool CompactPool::movable(Extent& x) {
  if (!x.arena) return true;  // spare
  return x.listed && fences_complete(x);
}

bool CompactPool::fences_complete(const Extent& x) {
  for (std::size_t i = x.first; i < x.first + x.pages; ++i)
    if (!fences_.complete(x.arena->pages[i].fence)) return false;
  return true;
}

void CompactPool::list_push(Extent* x) {
  x->listed = true;
  x->prev = reclaim_tail_;
  x->next = nullptr;
  if (reclaim_tail_)
    reclaim_tail_->next = x;
  else
    reclaim_head_ = x;
  reclaim_tail_ = x;
}

void CompactPool::list_remove(Extent* x) {
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
// for the rest). New memory comes in one extent of up to kMaxExtentPages pages (one
// page under a memory fraction: memory moves page by page there, so the fraction's
// every byte can be used), halved while the device or the fraction refuses it.
CompactPool::Extent* CompactPool::take_extent(Arena& a, std::size_t s, std::size_t need) {
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
  const std::size_t most = services_.budget.limited() ? 1 : kMaxExtentPages;
  for (std::size_t n = std::min(need, most); n >= 1; n /= 2)
    if (Extent* x = create_extent(n)) return x;
  return nullptr;
}

// Maps memory under every unmapped page of [first, end) of a and grants access to every
// extent there without it, one call per run of them. All or nothing: on failure what
// this call mapped is unmapped again and kept as spare extents.
bool CompactPool::back_pages(Arena& a, std::uintptr_t address, std::size_t size) {
  const auto [first, end] = page_span(a, address, size);
  // Pages wholly inside the block: only they share extents, so that the extent is free
  // again, as a whole, when the block is (a page at an end may hold a neighbour too).
  const std::size_t inner_first = (address - a.segment->base + page_ - 1) / page_;
  const std::size_t inner_end = (address - a.segment->base + size) / page_;
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
        // At the arena's frontier (nothing mapped from i on) the block's whole run is one
        // extent of at least kGrowPages: growth takes few calls, and the next blocks
        // there find their memory mapped. Elsewhere, only pages wholly inside the block
        // share an extent.
        // (Never past the arena's end: an extent must fit the pages it is mapped under.)
        std::size_t need = 1;
        if (i >= a.mapped_end)
          need =
              services_.budget.limited() ? e - i : std::min(std::max(e - i, kGrowPages), total - i);
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
    x->accessible = true;
    i = x->first + x->pages;
  }
  return true;
}

// The bytes of [address, address + size) that lie on page i of a.
std::size_t CompactPool::overlap(const Arena& a, std::size_t i, std::uintptr_t address,
                                 std::size_t size) const {
  const std::uintptr_t lo = std::max(address, a.segment->base + i * page_);
  const std::uintptr_t hi = std::min(address + size, a.segment->base + (i + 1) * page_);
  return hi - lo;
}

// A block of [address, address + size) was handed out: its bytes are live on their
// pages (interior pages are whole: only the two ends need the arithmetic).
void CompactPool::add_live(Arena& a, std::uintptr_t address, std::size_t size) {
  auto [first, end] = page_span(a, address, size);
  for (std::size_t i = first; i < end; ++i) {
    Page& p = a.pages[i];
    if (p.live == 0 && p.extent->live_pages++ == 0 && p.extent->listed) list_remove(p.extent);
    p.live += (i == first || i + 1 == end) ? overlap(a, i, address, size) : page_;
  }
}

// A block was freed: its pages learn the marks of its users (its stream, and those
// record_stream named), lose its bytes, and join the reclaimable list when empty.
void CompactPool::remove_live(Arena& a, const Block& b) {
  const std::uint64_t own = fences_.want_marker(b.stream);
  auto [first, end] = page_span(a, b.address, b.size);
  for (std::size_t i = first; i < end; ++i) {
    Page& p = a.pages[i];
    p.fence.add(b.stream, own);
    p.live -= (i == first || i + 1 == end) ? overlap(a, i, b.address, b.size) : page_;
    if (p.live == 0 && --p.extent->live_pages == 0) list_push(p.extent);
  }
  if (b.extras)
    for (StreamHandle s : b.extras->uses) {
      const std::uint64_t seq = fences_.want_marker(s);
      for (std::size_t i = first; i < end; ++i) a.pages[i].fence.add(s, seq);
    }
}

// Pages of [address, address + size) of the block's arena that have no memory.
std::size_t CompactPool::unbacked_pages(const Block* b, std::size_t size) const {
  const Arena& a = *arena_of(b);
  auto [first, end] = page_span(a, b->address, size);
  std::size_t missing = end > a.pages.size() ? end - std::max(first, a.pages.size()) : 0;
  for (std::size_t i = first; i < std::min(end, a.pages.size()); ++i)
    if (!a.pages[i].extent) ++missing;
  return missing;
}

// Best fit, but where the best-fitting block would need new pages and a slightly
// larger free block already has all its memory, the latter: moving memory costs
// device calls every time the program's layout drifts, while the address space a
// larger block leaves free costs nothing.
Block* CompactPool::choose(FreeIndex::iterator best, std::size_t size) const {
  Block* chosen = *best;
  std::size_t fewest = unbacked_pages(chosen, size);
  int looked = 0;
  for (auto it = std::next(best); fewest > 0 && it != free_.end() && looked < kPlacementProbes;
       ++it, ++looked) {
    const std::size_t missing = unbacked_pages(*it, size);
    if (missing < fewest) {
      fewest = missing;
      chosen = *it;
    }
  }
  return chosen;
}

// ---------------------------------------------------------------- requests

std::uintptr_t CompactPool::allocate(std::size_t requested, StreamHandle stream,
                                     const Context& context) {
  Guard guard(lock_);
  // A new arena or extent counted, then the request refused (out of memory or a
  // device error): the ledger is settled on the way out all the same.
  SettleOnExit settle(services_.ledger, counters_);
  const std::size_t size = services_.policy().round(requested);
  fences_.settle(stream);  // frees on this stream before now are fenced from here
  auto it = free_.lower_bound(size);
  Block* b;
  if (it != free_.end()) {
    // Under a memory fraction every byte counts: best fit. Without one, moving memory
    // less is worth a little address space (choose).
    b = services_.budget.limited() ? *it : choose(it, size);
  } else {
    // More than the device has can never be backed: out of memory, not a device error.
    MemoryInfo info;
    if (services_.backend.memory_info(services_.device, &info) == DeviceStatus::ok &&
        size > info.total)
      return 0;
    b = new_arena(size)->segment->head;
  }
  Arena& a = *arena_of(b);
  const std::uintptr_t address = b->address;
  const std::size_t taken = b->size - size >= SizePolicy::kMinBlockSize ? size : b->size;
  auto [first, end] = page_span(a, address, taken);
  grow_pages(a, end);
  // Memory last used on other streams: this stream waits for that work (on the device).
  // First, as it may throw: nothing has changed yet (a wait inserted for a request that
  // then fails costs nothing but the wait).
  bool foreign = false;
  for (std::size_t i = first; i < end && !foreign; ++i) foreign = !a.pages[i].fence.only_on(stream);
  if (foreign) {
    Fence before;
    for (std::size_t i = first; i < end; ++i) before.merge(a.pages[i].fence);
    if (int waits = fences_.order_after(stream, before))
      DeviceCounters::bump(services_.counters.stream_waits, waits);
  }
  if (!back_pages(a, address, taken)) return 0;
  Block* out;
  if (taken < b->size) {
    out = block_list::split_front(block_nodes_, b, taken, BlockState::allocated);
    reposition_free(b);
  } else {
    free_.erase(b);
    out = b;
    out->state = BlockState::allocated;
  }
  out->requested = requested;
  out->stream = stream;
  allocated_.insert(address, out);
  add_live(a, address, taken);
  counters_.on_allocate(SizePolicy::pool_for(taken), static_cast<std::int64_t>(taken),
                        static_cast<std::int64_t>(requested));
  if (services_.history.active()) {
    services_.trace(TraceAction::alloc, address, requested, stream,
                    services_.history.level() >= ContextLevel::alloc ? context : nullptr);
    if (context) out->extra().context = context;
  }
  finish_operation();
  return address;
}

bool CompactPool::free(std::uintptr_t address) {
  // The history flag read once (as StreamPool::free): the context gathered before the
  // lock and the records under it agree.
  const bool traced = services_.history.active();
  Context context;
  if (traced) context = services_.history.gather(ContextLevel::all);
  Guard guard(lock_);
  Block* b = allocated_.erase(address);
  if (!b) return false;
  Arena& a = *arena_of(b);
  if (traced) {
    services_.trace(TraceAction::free_requested, b->address, b->requested, b->stream,
                    context ? context : b->context());
    services_.trace(TraceAction::free_completed, b->address, b->requested, b->stream, b->context());
  }
  // The memory's users so far: its own stream and those record_stream named.
  remove_live(a, *b);
  counters_.on_free(SizePolicy::pool_for(b->size), static_cast<std::int64_t>(b->size),
                    static_cast<std::int64_t>(b->requested));
  b->extras.reset();
  b->requested = 0;
  coalesce_free(b);
  finish_operation();
  return true;
}

bool CompactPool::record_use(std::uintptr_t address, StreamHandle other) {
  Guard guard(lock_);
  Block* b = allocated_.find(address);
  if (!b) return false;
  if (other == b->stream) return true;
  auto& uses = b->extra().uses;
  if (std::find(uses.begin(), uses.end(), other) == uses.end()) uses.push_back(other);
  return true;
}

void CompactPool::host_waited(StreamHandle stream) {
  Guard guard(lock_);
  fences_.host_waited(stream);
}

void CompactPool::release_stream(StreamHandle stream) {
  Guard guard(lock_);
  fences_.release(stream);
}

std::size_t CompactPool::release_free_pages(bool give_back) {
  Guard guard(lock_);
  SettleOnExit settle(services_.ledger, counters_);  // an unmap may throw part way
  fences_.synchronize_all();
  std::size_t released = 0;
  // Ghosts first: memory goes back only once unmapped everywhere, and an arena only
  // once nothing is mapped in it.
  for (auto& a : arenas_)
    for (std::size_t i = 0; i < a->pages.size(); ++i)
      if (Extent* g = a->pages[i].ghost; g && g->ghost_first == i) unmap_ghost(g);
  for (auto& a : arenas_)
    for (std::size_t i = 0; i < a->pages.size(); ++i) {
      Extent* x = a->pages[i].extent;
      if (!x || x->first != i || x->live_pages != 0) continue;
      unmap_extent(x);  // throws with nothing changed
      list_remove(x);
      spare_.push_back(x);
    }
  if (give_back) {
    while (!spare_.empty()) {
      Extent* x = spare_.back();
      spare_.pop_back();
      const std::size_t bytes = x->pages * page_;
      release_extent(x);
      released += bytes;
    }
    // Arenas holding nothing go back too (a new one is reserved when needed). A range
    // the device refuses to release stays, counted as a segment, and is retried by the
    // next release.
    std::string failure;
    for (auto it = arenas_.begin(); it != arenas_.end();) {
      Arena& a = **it;
      Block* head = a.segment->head;
      if (head->next || head->state != BlockState::free || a.segment->mapped_bytes != 0) {
        ++it;
        continue;
      }
      // Out of the map before the range goes back (see StreamPool::release_segment).
      const std::size_t published = a.pages.size() * page_;
      services_.segments.unpublish_part(a.segment, published);
      if (services_.backend.release_address_range(services_.device,
                                                  reinterpret_cast<void*>(a.segment->base),
                                                  a.segment->size) != DeviceStatus::ok) {
        services_.segments.publish_part(a.segment, a.segment->base, published);
        if (failure.empty()) failure = services_.backend.last_error();
        ++it;
        continue;
      }
      free_.erase(head);
      block_list::destroy(block_nodes_, head);
      counters_.add<kSegment>(kLargePool, -1);
      services_.segments.recycle(a.segment);
      it = arenas_.erase(it);
    }
    if (!failure.empty()) {
      finish_operation();
      throw DeviceError("reservoir: releasing policy:compact address space on device " +
                        std::to_string(services_.device) + " failed: " + failure);
    }
  }
  finish_operation();
  return released;
}

void CompactPool::finish_operation() {
  services_.ledger.settle(counters_);
  RESERVOIR_ASSERT_EXPENSIVE({
    ValidationTotals totals;
    validate_locked(&totals);
  });
}

}  // namespace reservoir::detail
