// CompactPool: physical memory — chunks, spare extents, mappings, stitching and the
// ladder's release. See compact_pool.hpp.
//
// Driver calls are what policy:compact costs on a GPU (each a few to tens of
// microseconds), so memory is created in chunks of several pages, a run of pages is
// mapped with one call at its chunk's offset, and adjacent free mappings are unmapped
// with one call.
#include <algorithm>

#include "engine/compact_pool.hpp"
#include "reservoir/errors.hpp"
#include "util/checks.hpp"
#include "util/format.hpp"

namespace reservoir::detail {

namespace {
// Mappings examined per request before new memory is taken instead: the oldest are
// the likeliest to have completed their fences.
constexpr int kReclaimProbes = 8;
// A new chunk holds what the request needs plus held / kGrowthDivisor pages (at most
// kMaxGrowthBytes): a stream of one-page growths makes O(log) creations, and the
// spare memory this leaves is at most 1/kGrowthDivisor of what is held.
constexpr std::size_t kGrowthDivisor = 128;
constexpr std::size_t kMaxGrowthBytes = std::size_t{64} << 20;
// Pages one map call covers at most, and the fewest pages a block must span for its
// pages to be mapped in runs at all (else each is mapped alone). A mapping moves only
// whole, once none of its pages holds a block, so a long one can pin free pages that a
// request elsewhere needs; smaller blocks are the ones whose pages later blocks share.
// Measured on the bundled traces (docs/memory.md): these keep peak reserved within 5%
// of requested on every one; runs of 64 pages, or runs for every block, do not.
constexpr std::size_t kMaxRunPages = 16;
constexpr std::size_t kMinRunBlockPages = 16;
}  // namespace

// ---------------------------------------------------------------- the reclaimable list

void CompactPool::list_push(Mapping* m) {
  m->listed = true;
  m->prev = reclaim_tail_;
  m->next = nullptr;
  if (reclaim_tail_)
    reclaim_tail_->next = m;
  else
    reclaim_head_ = m;
  reclaim_tail_ = m;
}

void CompactPool::list_remove(Mapping* m) {
  if (m->prev)
    m->prev->next = m->next;
  else
    reclaim_head_ = m->next;
  if (m->next)
    m->next->prev = m->prev;
  else
    reclaim_tail_ = m->prev;
  m->prev = m->next = nullptr;
  m->listed = false;
}

// ---------------------------------------------------------------- chunks and spares

// Spare pages [first, first + count) of chunk, merged with an adjacent extent of it.
void CompactPool::add_spare(Chunk* chunk, std::size_t first, std::size_t count) {
  for (Extent& e : spare_) {
    if (e.chunk != chunk) continue;
    if (e.first + e.count == first) {
      e.count += count;
      return;
    }
    if (first + count == e.first) {
      e.first = first;
      e.count += count;
      return;
    }
  }
  spare_.push_back(Extent{chunk, first, count});
}

// count pages (or all spare_ has, if less) into got_: the smallest extent that holds
// them all, else the largest (fewest pieces, so fewest map calls).
void CompactPool::take_spare(std::size_t count) {
  std::size_t pick = 0;
  for (std::size_t i = 1; i < spare_.size(); ++i) {
    const Extent& e = spare_[i];
    const Extent& best = spare_[pick];
    const bool fits = e.count >= count, best_fits = best.count >= count;
    if (fits ? (!best_fits || e.count < best.count) : (!best_fits && e.count > best.count))
      pick = i;
  }
  Extent& e = spare_[pick];
  const std::size_t n = std::min(count, e.count);
  got_.push_back(Extent{e.chunk, e.first, n});
  e.first += n;
  e.count -= n;
  if (e.count == 0) {
    e = spare_.back();
    spare_.pop_back();
  }
}

// Pages to create for a request that still needs need: the need alone under a memory
// fraction (every byte counts there), else plus a quantum proportional to what is held.
std::size_t CompactPool::grow_pages_for(std::size_t need) const {
  if (services_.budget.limited()) return need;
  const std::size_t quantum = std::min(held_pages_ / kGrowthDivisor, kMaxGrowthBytes / page_);
  return need + quantum;
}

// A new chunk of at least need pages, all spare; false when the device or the memory
// fraction refuses. A chunk with room to grow that the device refuses is retried at
// what the request needs.
bool CompactPool::create_chunk(std::size_t need) {
  std::size_t pages = grow_pages_for(need);
  for (;;) {
    const std::size_t bytes = pages * page_;
    DeviceStatus st = DeviceStatus::out_of_memory;
    PhysicalHandle handle = 0;
    if (services_.budget.reserve(bytes)) {  // within the memory fraction
      st = services_.backend.create_physical(services_.device, bytes, &handle);
      if (st != DeviceStatus::ok) services_.budget.unreserve(bytes);
    }
    if (st == DeviceStatus::ok) {
      auto chunk = std::make_unique<Chunk>();
      chunk->handle = handle;
      chunk->pages = pages;
      add_spare(chunk.get(), 0, pages);
      chunks_.push_back(std::move(chunk));
      held_pages_ += pages;
      counters_.add<kReservedBytes>(kLargePool, static_cast<std::int64_t>(bytes));
      DeviceCounters::bump(services_.counters.device_allocs);
      return true;
    }
    if (st != DeviceStatus::out_of_memory)
      throw DeviceError("reservoir: creating " + format_size(bytes) +
                        " of physical memory on device " + std::to_string(services_.device) +
                        " failed: " + services_.backend.last_error());
    if (pages == need) return false;
    pages = need;
  }
}

void CompactPool::release_chunk(Chunk* chunk) {
  if (services_.backend.release_physical(services_.device, chunk->handle) != DeviceStatus::ok)
    throw DeviceError("reservoir: releasing " + format_size(chunk->pages * page_) +
                      " of physical memory on device " + std::to_string(services_.device) +
                      " failed: " + services_.backend.last_error());
  const std::size_t bytes = chunk->pages * page_;
  services_.budget.unreserve(bytes);
  counters_.add<kReservedBytes>(kLargePool, -static_cast<std::int64_t>(bytes));
  DeviceCounters::bump(services_.counters.device_frees);
  held_pages_ -= chunk->pages;
  spare_.erase(std::remove_if(spare_.begin(), spare_.end(),
                              [chunk](const Extent& e) { return e.chunk == chunk; }),
               spare_.end());
  chunks_.erase(std::find_if(chunks_.begin(), chunks_.end(),
                             [chunk](const auto& c) { return c.get() == chunk; }));
}

// A chunk goes back only when none of its pages is mapped; one the device refuses
// to release stays spare (counted), retried by the next release.
std::size_t CompactPool::release_spare_chunks() {
  std::size_t released = 0;
  std::string failure;
  for (std::size_t i = chunks_.size(); i-- > 0;) {
    Chunk* c = chunks_[i].get();
    if (c->mapped != 0) continue;
    const std::size_t bytes = c->pages * page_;
    try {
      release_chunk(c);
      released += bytes;
    } catch (const DeviceError& e) {
      if (failure.empty()) failure = e.what();
    }
  }
  if (!failure.empty()) throw DeviceError(failure);
  return released;
}

// ---------------------------------------------------------------- mappings

CompactPool::Mapping* CompactPool::map_run(Arena& a, std::size_t first, std::size_t count,
                                           Chunk* chunk, std::size_t offset) {
  const std::uintptr_t at = a.segment->base + first * page_;
  if (services_.backend.map(services_.device, reinterpret_cast<void*>(at), count * page_,
                            chunk->handle, offset * page_) != DeviceStatus::ok)
    return nullptr;
  Mapping* m = new (mapping_nodes_.get()) Mapping;
  m->arena = &a;
  m->first = first;
  m->count = count;
  m->chunk = chunk;
  m->offset = offset;
  ++mappings_;
  chunk->mapped += count;
  for (std::size_t i = first; i < first + count; ++i) {
    Page& p = a.pages[i];
    p.mapping = m;
    p.accessible = false;
    p.fence.clear();
  }
  a.segment->mapped_bytes += count * page_;
  list_push(m);  // holds no block yet (add_live takes it off)
  DeviceCounters::bump(services_.counters.device_maps);
  if (services_.history.active())
    services_.trace(TraceAction::segment_map, at, count * page_, 0, nullptr);
  return m;
}

void CompactPool::forget_mapping(Mapping* m) {
  Arena& a = *m->arena;
  for (std::size_t i = m->first; i < m->first + m->count; ++i) {
    Page& p = a.pages[i];
    p.mapping = nullptr;
    p.accessible = false;
    p.fence.clear();
  }
  a.segment->mapped_bytes -= m->count * page_;
  m->chunk->mapped -= m->count;
  add_spare(m->chunk, m->offset, m->count);
  if (m->listed) list_remove(m);
  m->~Mapping();
  mapping_nodes_.put(m);
  --mappings_;
}

void CompactPool::unmap_run(Mapping* m, std::size_t count) {
  Arena& a = *m->arena;
  const std::uintptr_t at = a.segment->base + m->first * page_;
  if (services_.backend.unmap(services_.device, reinterpret_cast<void*>(at), count * page_) !=
      DeviceStatus::ok)
    throw DeviceError("reservoir: unmapping " + format_size(count * page_) + " on device " +
                      std::to_string(services_.device) +
                      " failed: " + services_.backend.last_error());
  DeviceCounters::bump(services_.counters.device_unmaps);
  if (services_.history.active())
    services_.trace(TraceAction::segment_unmap, at, count * page_, 0, a.segment->context);
  for (std::size_t i = m->first, end = m->first + count; i < end;) {
    Mapping* here = a.pages[i].mapping;
    i += here->count;
    forget_mapping(here);
  }
}

// The oldest mapping that holds no block and whose last users have completed gives its
// memory up (not one of the span being backed, which is about to hold a block).
bool CompactPool::reclaim_one(const Span& keep) {
  int probes = 0;
  for (Mapping* m = reclaim_head_; m && probes < kReclaimProbes; m = m->next) {
    if (overlaps(*m, keep)) continue;
    ++probes;
    bool done = true;
    for (std::size_t i = m->first; i < m->first + m->count && done; ++i)
      done = fences_.complete(m->arena->pages[i].fence);
    if (!done) continue;
    unmap_run(m, m->count);  // throws with nothing changed
    return true;
  }
  return false;
}

// count pages of memory into got_: spares first, then memory moved from free mappings
// (stitching), before any new memory is taken from the device.
bool CompactPool::gather(std::size_t count, const Span& keep) {
  std::size_t have = 0;
  auto give_back = [&] {
    for (const Extent& e : got_) add_spare(e.chunk, e.first, e.count);
    got_.clear();
  };
  try {
    while (have < count) {
      if (spare_.empty() && !reclaim_one(keep) && !create_chunk(count - have)) {
        give_back();
        return false;
      }
      take_spare(count - have);
      have += got_.back().count;
    }
  } catch (...) {
    give_back();
    throw;
  }
  return true;
}

// Maps physical memory under every unmapped page of [first, end): one call per run of
// pages that lie side by side at consecutive offsets of one chunk. All or nothing: on
// failure nothing stays mapped and the memory taken is kept as spare pages.
bool CompactPool::back_pages(Arena& a, std::uintptr_t address, std::size_t size) {
  const auto [first, end] = page_span(a, address, size);
  // A page the block covers only in part is mapped alone: it may hold other blocks
  // later, and a mapping moves only once none of its pages holds a block. Under a
  // memory fraction every page is (each can move alone: every byte counts there), and
  // so is every page of a block of fewer than kMinRunBlockPages.
  const std::uintptr_t base = a.segment->base;
  const bool alone_all = services_.budget.limited() || end - first < kMinRunBlockPages;
  auto alone = [&](std::size_t i) {
    return alone_all || (i == first && (address - base) % page_ != 0) ||
           (i + 1 == end && (address + size - base) % page_ != 0);
  };
  std::vector<std::size_t>& missing = missing_;
  missing.clear();
  bool inaccessible = false;  // a mapped page of the span that has no access yet
  for (std::size_t i = first; i < end; ++i) {
    if (!a.pages[i].mapping) missing.push_back(i);
    inaccessible |= a.pages[i].mapping && !a.pages[i].accessible;
  }
  if (missing.empty() && !inaccessible) return true;
  got_.clear();
  if (!gather(missing.size(), Span{&a, first, end})) return false;
  std::vector<Mapping*>& made = made_;
  made.clear();
  // A failed request leaves nothing mapped, except a mapping the device refuses to
  // unmap: that one stays, holding no block (counted, reclaimable), never forgotten.
  auto undo = [&](const std::string& why) {
    const std::string reason = services_.backend.last_error();
    std::size_t used = 0;  // pages of got_ under the mappings made
    for (Mapping* m : made) {
      used += m->count;
      try {
        unmap_run(m, m->count);
      } catch (const DeviceError&) {
      }
    }
    // The pages of got_ not mapped yet go back to spare.
    for (const Extent& e : got_) {
      const std::size_t skip = std::min(used, e.count);
      used -= skip;
      if (skip < e.count) add_spare(e.chunk, e.first + skip, e.count - skip);
    }
    got_.clear();
    throw DeviceError("reservoir: " + why + " on device " + std::to_string(services_.device) +
                      " failed: " + reason);
  };
  // missing[k..] against got_[g] from its page o: each call takes the longest run of
  // neighbouring missing pages that the current extent can back.
  std::size_t k = 0, g = 0, o = 0;
  while (k < missing.size()) {
    const Extent& e = got_[g];
    std::size_t run = 1;
    if (!alone(missing[k]))
      while (run < kMaxRunPages && k + run < missing.size() && o + run < e.count &&
             missing[k + run] == missing[k] + run && !alone(missing[k + run]))
        ++run;
    Mapping* m = map_run(a, missing[k], run, e.chunk, e.first + o);
    if (!m) undo("mapping " + format_size(run * page_) + " for policy:compact");
    made.push_back(m);
    k += run;
    o += run;
    if (o == e.count) {
      ++g;
      o = 0;
    }
  }
  // Access for each run of newly mapped pages (and mapped pages still without
  // access), one call per run.
  std::vector<std::size_t>& grant = grant_;
  grant.clear();
  for (std::size_t i = first; i < end; ++i)
    if (!a.pages[i].accessible) grant.push_back(i);
  const std::vector<int> peers = services_.peers.list();
  std::vector<int> devices{services_.device};
  devices.insert(devices.end(), peers.begin(), peers.end());
  for (std::size_t j = 0; j < grant.size();) {
    std::size_t run = j + 1;
    while (run < grant.size() && grant[run] == grant[run - 1] + 1) ++run;
    if (services_.backend.set_access(
            services_.device, reinterpret_cast<void*>(base + grant[j] * page_), (run - j) * page_,
            devices.data(), static_cast<int>(devices.size())) != DeviceStatus::ok)
      undo("granting access to pages for policy:compact");
    j = run;
  }
  for (std::size_t i : grant) a.pages[i].accessible = true;
  got_.clear();
  return true;
}

// ---------------------------------------------------------------- the ladder's rung

std::size_t CompactPool::release_free_pages(bool give_back) {
  Guard guard(lock_);
  fences_.synchronize_all();
  // Every mapping that holds no block, adjacent ones unmapped with one call.
  for (auto& a : arenas_)
    for (std::size_t i = 0; i < a->pages.size();) {
      Mapping* m = a->pages[i].mapping;
      if (!m || !m->listed) {
        i += m ? m->count : 1;
        continue;
      }
      std::size_t count = 0;
      while (i + count < a->pages.size()) {
        Mapping* next = a->pages[i + count].mapping;
        if (!next || !next->listed) break;
        count += next->count;
      }
      unmap_run(m, count);  // throws with nothing changed
      i += count;
    }
  std::size_t released = 0;
  if (give_back) {
    released = release_spare_chunks();
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
      if (services_.backend.release_address_range(services_.device,
                                                  reinterpret_cast<void*>(a.segment->base),
                                                  a.segment->size) != DeviceStatus::ok) {
        if (failure.empty()) failure = services_.backend.last_error();
        ++it;
        continue;
      }
      free_.erase(head->free_at);
      delete_block(head);
      counters_.add<kSegment>(kLargePool, -1);
      services_.segments.retire_part(a.segment, a.pages.size() * page_);
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

}  // namespace reservoir::detail
