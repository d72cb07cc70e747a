// CompactPool: allocation over arenas of pages, stitching, fences. See compact_pool.hpp.
#include "engine/compact_pool.hpp"

#include <algorithm>
#include <new>

#include "reservoir/errors.hpp"
#include "util/checks.hpp"
#include "util/format.hpp"

namespace reservoir::detail {

namespace {
constexpr std::size_t kSetNodeSize = 64;
// Reclaimable pages examined per request before new memory is taken instead: the
// oldest are the likeliest to have completed their fences.
constexpr int kReclaimProbes = 8;
// Free blocks after the best fit examined for one whose memory is all there.
constexpr int kPlacementProbes = 32;
// Pages booked at least when an arena starts being used (1 GiB of 2 MiB pages).
constexpr std::size_t kMinPublishedPages = 512;
}  // namespace

CompactPool::CompactPool(PoolServices& services)
    : services_(services),
      set_nodes_(kSetNodeSize),
      block_nodes_(sizeof(Block)),
      free_(BySizeThenAddress{}, PoolAllocator<Block*>(&set_nodes_)),
      fences_(services.backend, services.device, services.events) {
  if (services.backend.granularity(services.device, &page_) != DeviceStatus::ok || page_ == 0)
    throw DeviceError(
        "reservoir: policy:compact needs the device's virtual memory management "
        "(mapping pages), which device " +
        std::to_string(services.device) + " (" + services.backend.name() +
        ") lacks: " + services.backend.last_error() + "; use policy:pytorch on this device");
}

CompactPool::~CompactPool() {
  // The engine is going away: every page and range goes back, whatever it holds.
  for (auto& a : arenas_) {
    for (std::size_t i = 0; i < a->pages.size(); ++i) {
      Page& p = a->pages[i];
      if (!p.mapped) continue;
      (void)services_.backend.unmap(services_.device,
                                    reinterpret_cast<void*>(a->segment->base + i * page_), page_);
      (void)services_.backend.release_physical(services_.device, p.handle);
      services_.budget.unreserve(page_);
    }
    for (Block* b = a->segment->head; b;) {
      Block* n = b->next;
      delete_block(b);
      b = n;
    }
    (void)services_.backend.release_address_range(
        services_.device, reinterpret_cast<void*>(a->segment->base), a->segment->size);
    services_.segments.retire_part(a->segment, a->pages.size() * page_);
  }
  for (PhysicalHandle h : spare_) {
    (void)services_.backend.release_physical(services_.device, h);
    services_.budget.unreserve(page_);
  }
}

// ---------------------------------------------------------------- blocks

Block* CompactPool::new_block(std::uintptr_t address, std::size_t size, Segment* segment,
                              BlockState state) {
  Block* b = new (block_nodes_.get()) Block;
  b->address = address;
  b->size = size;
  b->prev = b->next = nullptr;
  b->segment = segment;
  b->requested = 0;
  b->state = state;
  b->oversize = false;
  b->event_count = 0;
  b->gc_stamp = 0;
  b->stream = 0;
  return b;
}

void CompactPool::delete_block(Block* b) {
  b->~Block();
  block_nodes_.put(b);
}

void CompactPool::index_free(Block* b) {
  b->state = BlockState::free;
  b->free_at = free_.insert(b).first;
}

void CompactPool::reposition_free(Block* b) {
  if (free_.size() == 1) return;
  BySizeThenAddress less;
  auto it = b->free_at;
  if ((it == free_.begin() || less(*std::prev(it), b)) &&
      (std::next(it) == free_.end() || less(b, *std::next(it))))
    return;
  free_.erase(it);
  b->free_at = free_.insert(b).first;
}

// b (allocated until now, in no index) becomes free, merged with free neighbours.
Block* CompactPool::coalesce_free(Block* b) {
  Block* keep = nullptr;
  if (b->prev && b->prev->state == BlockState::free) {
    Block* prev = b->prev;
    prev->size += b->size;
    prev->next = b->next;
    if (prev->next) prev->next->prev = prev;
    delete_block(b);
    keep = b = prev;
  }
  if (b->next && b->next->state == BlockState::free) {
    Block* next = b->next;
    if (keep) {
      free_.erase(next->free_at);
      b->size += next->size;
      b->next = next->next;
      if (b->next) b->next->prev = b;
      delete_block(next);
    } else {
      next->address = b->address;
      next->size += b->size;
      next->prev = b->prev;
      if (next->prev)
        next->prev->next = next;
      else
        next->segment->head = next;
      delete_block(b);
      keep = b = next;
    }
  }
  if (keep)
    reposition_free(b);
  else
    index_free(b);
  return b;
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
  Block* b = new_block(seg->base, size, seg, BlockState::free);
  seg->head = b;
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
  const std::size_t total = a.segment->size / page_;
  const std::size_t want = std::min(total, std::max({end, 2 * have, kMinPublishedPages}));
  a.pages.resize(want);
  services_.segments.publish_part(a.segment, a.segment->base + have * page_, (want - have) * page_);
}

// ---------------------------------------------------------------- physical pages

void CompactPool::release_handle(PhysicalHandle handle) {
  if (services_.backend.release_physical(services_.device, handle) != DeviceStatus::ok) {
    // Kept as a spare rather than lost: counted, and retried by the next release.
    spare_.push_back(handle);
    throw DeviceError("reservoir: releasing a physical page on device " +
                      std::to_string(services_.device) +
                      " failed: " + services_.backend.last_error());
  }
  services_.budget.unreserve(page_);
  counters_.add<kReservedBytes>(kLargePool, -static_cast<std::int64_t>(page_));
  DeviceCounters::bump(services_.counters.device_frees);
}

void CompactPool::unmap_page(Arena& a, std::size_t index) {
  Page& p = a.pages[index];
  const std::uintptr_t at = a.segment->base + index * page_;
  if (services_.backend.unmap(services_.device, reinterpret_cast<void*>(at), page_) !=
      DeviceStatus::ok)
    throw DeviceError("reservoir: unmapping a page on device " + std::to_string(services_.device) +
                      " failed: " + services_.backend.last_error());
  p.mapped = false;
  p.accessible = false;
  p.fence.clear();
  a.segment->mapped_bytes -= page_;
  DeviceCounters::bump(services_.counters.device_unmaps);
  if (services_.history.active())
    services_.trace(TraceAction::segment_unmap, at, page_, 0, a.segment->context);
}

void CompactPool::list_push(PageRef r) {
  Page& p = page(r);
  p.listed = true;
  p.prev = reclaim_tail_;
  p.next = PageRef{};
  if (reclaim_tail_)
    page(reclaim_tail_).next = r;
  else
    reclaim_head_ = r;
  reclaim_tail_ = r;
}

void CompactPool::list_remove(PageRef r) {
  Page& p = page(r);
  if (p.prev)
    page(p.prev).next = p.next;
  else
    reclaim_head_ = p.next;
  if (p.next)
    page(p.next).prev = p.prev;
  else
    reclaim_tail_ = p.prev;
  p.prev = p.next = PageRef{};
  p.listed = false;
}

// The oldest free page whose last users have completed gives its memory up (not one
// of the span being backed, which is about to hold a block).
bool CompactPool::reclaim_one(PhysicalHandle* handle, const Span& keep) {
  int probes = 0;
  for (PageRef r = reclaim_head_; r && probes < kReclaimProbes;) {
    Page& p = page(r);
    const PageRef next = p.next;
    if (r.arena == keep.arena && r.index >= keep.first && r.index < keep.end) {
      r = next;
      continue;
    }
    ++probes;
    if (fences_.complete(p.fence)) {
      unmap_page(*r.arena, r.index);  // throws with nothing changed
      list_remove(r);
      *handle = p.handle;
      return true;
    }
    r = next;
  }
  return false;
}

// New memory from the device (within the memory fraction); false when refused.
bool CompactPool::create_page(PhysicalHandle* handle) {
  if (!services_.budget.reserve(page_)) return false;  // over the memory fraction
  DeviceStatus st = services_.backend.create_physical(services_.device, page_, handle);
  if (st != DeviceStatus::ok) {
    services_.budget.unreserve(page_);
    if (st == DeviceStatus::out_of_memory) return false;
    throw DeviceError("reservoir: creating a " + format_size(page_) + " physical page on device " +
                      std::to_string(services_.device) +
                      " failed: " + services_.backend.last_error());
  }
  counters_.add<kReservedBytes>(kLargePool, static_cast<std::int64_t>(page_));
  DeviceCounters::bump(services_.counters.device_allocs);
  return true;
}

// Memory for one page: a spare; else a free page's memory moved here (stitching),
// before any new memory is taken from the device.
bool CompactPool::take_physical(PhysicalHandle* handle, const Span& keep) {
  if (!spare_.empty()) {
    *handle = spare_.back();
    spare_.pop_back();
    return true;
  }
  if (reclaim_one(handle, keep)) return true;
  return create_page(handle);
}

// Maps physical memory under every unmapped page of [first, end). All or nothing: on
// failure nothing stays mapped and the memory taken is kept as spare pages.
bool CompactPool::back_pages(Arena& a, std::size_t first, std::size_t end) {
  std::vector<std::size_t>& missing = missing_;
  missing.clear();
  bool inaccessible = false;  // a mapped page of the span that has no access yet
  for (std::size_t i = first; i < end; ++i) {
    if (!a.pages[i].mapped) missing.push_back(i);
    inaccessible |= a.pages[i].mapped && !a.pages[i].accessible;
  }
  if (missing.empty() && !inaccessible) return true;
  // Free pages of this span are about to hold the block: off the reclaimable list (so
  // the search for memory does not walk them), back on it if the request fails.
  std::vector<std::size_t>& unlisted = unlisted_;
  unlisted.clear();
  for (std::size_t i = first; i < end; ++i)
    if (a.pages[i].listed) {
      list_remove(PageRef{&a, i});
      unlisted.push_back(i);
    }
  auto relist = [&] {
    for (std::size_t i : unlisted) list_push(PageRef{&a, i});
  };
  const Span keep{&a, first, end};
  std::vector<PhysicalHandle>& got = got_;
  got.clear();
  bool enough = true;
  try {
    for (std::size_t k = 0; k < missing.size() && enough; ++k) {
      PhysicalHandle h = 0;
      enough = take_physical(&h, keep);
      if (enough) got.push_back(h);
    }
  } catch (...) {
    spare_.insert(spare_.end(), got.begin(), got.end());
    relist();
    throw;
  }
  if (!enough) {
    spare_.insert(spare_.end(), got.begin(), got.end());
    relist();
    return false;
  }
  const std::uintptr_t base = a.segment->base;
  std::size_t mapped = 0;
  // A failed request leaves nothing mapped, except a page the device refuses to unmap:
  // that one stays a free mapped page (counted, reclaimable), never forgotten.
  auto undo = [&](const std::string& why) {
    const std::string reason = services_.backend.last_error();
    for (std::size_t k = 0; k < got.size(); ++k) {
      if (k < mapped && services_.backend.unmap(services_.device,
                                                reinterpret_cast<void*>(base + missing[k] * page_),
                                                page_) != DeviceStatus::ok) {
        Page& p = a.pages[missing[k]];
        p.handle = got[k];
        p.mapped = true;
        p.accessible = false;
        p.fence.clear();
        a.segment->mapped_bytes += page_;
        list_push(PageRef{&a, missing[k]});
        continue;
      }
      spare_.push_back(got[k]);
    }
    relist();
    throw DeviceError("reservoir: " + why + " on device " + std::to_string(services_.device) +
                      " failed: " + reason);
  };
  for (; mapped < missing.size(); ++mapped)
    if (services_.backend.map(services_.device,
                              reinterpret_cast<void*>(base + missing[mapped] * page_), page_,
                              got[mapped]) != DeviceStatus::ok)
      undo("mapping a page for policy:compact");
  // Access for each run of newly mapped pages (and mapped pages still without
  // access), one call per run.
  std::vector<std::size_t>& grant = grant_;
  grant.clear();
  for (std::size_t i = first, k = 0; i < end; ++i) {
    const bool fresh = k < missing.size() && missing[k] == i;
    if (fresh) ++k;
    if (fresh || !a.pages[i].accessible) grant.push_back(i);
  }
  const std::vector<int> peers = services_.peers.list();
  std::vector<int> devices{services_.device};
  devices.insert(devices.end(), peers.begin(), peers.end());
  for (std::size_t k = 0; k < grant.size();) {
    std::size_t run = k + 1;
    while (run < grant.size() && grant[run] == grant[run - 1] + 1) ++run;
    if (services_.backend.set_access(
            services_.device, reinterpret_cast<void*>(base + grant[k] * page_), (run - k) * page_,
            devices.data(), static_cast<int>(devices.size())) != DeviceStatus::ok)
      undo("granting access to pages for policy:compact");
    k = run;
  }
  for (std::size_t i : grant) a.pages[i].accessible = true;
  for (std::size_t k = 0; k < missing.size(); ++k) {
    Page& p = a.pages[missing[k]];
    p.handle = got[k];
    p.mapped = true;
    p.fence.clear();
    if (services_.history.active())
      services_.trace(TraceAction::segment_map, base + missing[k] * page_, page_, 0, nullptr);
  }
  a.segment->mapped_bytes += missing.size() * page_;
  DeviceCounters::bump(services_.counters.device_maps, static_cast<std::int64_t>(missing.size()));
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
    if (p.listed) list_remove(PageRef{&a, i});
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
    if (p.live == 0) list_push(PageRef{&a, i});
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
    if (!a.pages[i].mapped) ++missing;
  return missing;
}

// Best fit, but where the best-fitting block would need new pages and a slightly
// larger free block already has all its memory, the latter: moving memory costs
// device calls every time the program's layout drifts, while the address space a
// larger block leaves free costs nothing.
Block* CompactPool::choose(FreeSet::iterator best, std::size_t size) const {
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
  const std::size_t size = services_.policy().round(requested);
  fences_.settle(stream);  // frees on this stream before now are fenced from here
  auto it = free_.lower_bound(SizeKey{size});
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
  if (!back_pages(a, first, end)) return 0;
  Block* out;
  if (taken < b->size) {
    out = new_block(address, taken, b->segment, BlockState::allocated);
    out->prev = b->prev;
    if (out->prev)
      out->prev->next = out;
    else
      b->segment->head = out;
    out->next = b;
    b->prev = out;
    b->address += taken;
    b->size -= taken;
    reposition_free(b);
  } else {
    free_.erase(b->free_at);
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
  Context context;
  if (services_.history.active()) context = services_.history.gather(ContextLevel::all);
  Guard guard(lock_);
  Block* b = allocated_.erase(address);
  if (!b) return false;
  Arena& a = *arena_of(b);
  if (services_.history.active()) {
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

std::size_t CompactPool::release_free_pages(bool give_back) {
  Guard guard(lock_);
  fences_.synchronize_all();
  std::size_t released = 0;
  for (auto& a : arenas_)
    for (std::size_t i = 0; i < a->pages.size(); ++i) {
      Page& p = a->pages[i];
      if (!p.mapped || p.live != 0) continue;
      const PhysicalHandle h = p.handle;
      unmap_page(*a, i);  // throws with nothing changed
      list_remove(PageRef{a.get(), i});
      spare_.push_back(h);
    }
  if (give_back) {
    while (!spare_.empty()) {
      PhysicalHandle h = spare_.back();
      spare_.pop_back();
      release_handle(h);
      released += page_;
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
      free_.erase(head->free_at);
      delete_block(head);
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
  if (counters_.over) services_.ledger.rebalance(&counters_);
  RESERVOIR_ASSERT_EXPENSIVE({
    ValidationTotals totals;
    validate_locked(&totals);
  });
}

}  // namespace reservoir::detail
