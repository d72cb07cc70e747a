// DriverPlacement: see placement.hpp and include/reservoir/sim_placement.hpp.
#include "backend/sim/placement.hpp"

#include <algorithm>
#include <iterator>
#include <vector>

namespace reservoir::sim {

namespace {

bool power_of_two(std::size_t v) {
  return v != 0 && (v & (v - 1)) == 0;
}

std::uintptr_t align_up(std::uintptr_t v, std::size_t a) {
  return (v + a - 1) / a * a;
}

std::uintptr_t align_down(std::uintptr_t v, std::size_t a) {
  return v / a * a;
}

std::string bytes(std::size_t n) {
  return std::to_string(n) + " bytes";
}

}  // namespace

std::string placement_problem(const SimPlacement& p) {
  const std::string where = "SimOptions: placement.";
  if (!power_of_two(p.small_alignment)) {
    return where + "small_alignment " + bytes(p.small_alignment) + " is not a power of two";
  }
  if (!power_of_two(p.page) || p.page < p.small_alignment) {
    return where + "page " + bytes(p.page) +
           " is not a power of two at least as large as small_alignment";
  }
  if (p.chunk == 0 || p.chunk % p.page != 0) {
    return where + "chunk " + bytes(p.chunk) + " is not a positive multiple of page " +
           bytes(p.page);
  }
  if (p.context_bytes % p.chunk != 0) {
    return where + "context_bytes " + bytes(p.context_bytes) + " is not a multiple of chunk " +
           bytes(p.chunk);
  }
  std::vector<SimContextHole> holes = p.context_holes;
  std::sort(holes.begin(), holes.end(), [](const SimContextHole& a, const SimContextHole& b) {
    return a.below_top > b.below_top;
  });
  std::size_t floor = p.context_bytes;  // holes sorted by address: each starts above the last
  for (const SimContextHole& h : holes) {
    if (h.size == 0 || h.size % p.page != 0 || h.below_top % p.page != 0 || h.below_top > floor ||
        h.size > h.below_top) {
      return where + "context_holes: the hole " + bytes(h.size) + " at " + bytes(h.below_top) +
             " below the top is empty, not page-aligned, outside context_bytes or overlaps "
             "another";
    }
    floor = h.below_top - h.size;
  }
  return "";
}

DriverPlacement::DriverPlacement(std::uintptr_t lo, std::uintptr_t hi, const SimPlacement& params)
    : params_(params) {
  lo = align_up(lo, params.chunk);
  hi = align_down(hi, params.chunk);
  const std::uintptr_t context = hi - params.context_bytes;
  if (context > lo) free_.emplace(lo, context);
  // Context holes are chunks of their own, older than any chunk the program makes; the
  // first listed is the newest of them (tried first).
  next_key_ = params.context_holes.size() + 1;
  std::uint64_t key = params.context_holes.size();
  for (const SimContextHole& h : params.context_holes) {
    Chunk c;
    c.base = hi - h.below_top;
    c.size = h.size;
    c.context = true;
    c.holes.emplace(c.base, c.size);
    c.largest = c.size;
    chunks_.emplace(key--, std::move(c));
  }
}

std::uintptr_t DriverPlacement::best_fit(const Chunk& c, std::size_t footprint,
                                         std::size_t alignment) {
  std::uintptr_t best = 0;
  std::size_t best_length = 0;
  for (const auto& [start, length] : c.holes) {
    const std::uintptr_t p = align_up(start, alignment);
    if (p - start > length || length - (p - start) < footprint) continue;
    if (best == 0 || length < best_length) {
      best = p;
      best_length = length;
    }
  }
  return best;
}

void DriverPlacement::update_largest(Chunk& c) {
  c.largest = 0;
  for (const auto& hole : c.holes) c.largest = std::max(c.largest, hole.second);
}

void DriverPlacement::take(Chunk& c, std::uintptr_t p, std::size_t footprint) {
  auto it = std::prev(c.holes.upper_bound(p));
  const std::uintptr_t start = it->first;
  const std::uintptr_t end = start + it->second;
  c.holes.erase(it);
  if (start < p) c.holes.emplace(start, p - start);
  if (p + footprint < end) c.holes.emplace(p + footprint, end - p - footprint);
  update_largest(c);
}

void DriverPlacement::give(Chunk& c, std::uintptr_t p, std::size_t footprint) {
  std::uintptr_t start = p;
  std::uintptr_t end = p + footprint;
  auto next = c.holes.lower_bound(p);
  if (next != c.holes.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      c.holes.erase(prev);
    }
  }
  if (next != c.holes.end() && next->first == end) {
    end += next->second;
    c.holes.erase(next);
  }
  c.holes.emplace(start, end - start);
  c.largest = std::max(c.largest, end - start);
}

std::uint64_t DriverPlacement::new_chunk(std::size_t size, std::size_t alignment, bool top_down) {
  std::uintptr_t base = 0;
  if (top_down) {
    // The highest range strictly larger than the chunk: the driver passes over an exact fit.
    for (auto it = free_.rbegin(); it != free_.rend(); ++it) {
      const auto [start, end] = *it;
      if (end - start <= size) continue;
      const std::uintptr_t p = align_down(end - size, alignment);
      if (p >= start) {
        base = p;
        break;
      }
    }
  } else {
    for (const auto& [start, end] : free_) {
      const std::uintptr_t p = align_up(start, alignment);
      if (p >= start && p <= end && end - p >= size) {
        base = p;
        break;
      }
    }
  }
  if (base == 0) return 0;
  auto it = std::prev(free_.upper_bound(base));
  const auto [start, end] = *it;
  free_.erase(it);
  if (start < base) free_.emplace(start, base);
  if (base + size < end) free_.emplace(base + size, end);
  Chunk c;
  c.base = base;
  c.size = size;
  c.holes.emplace(base, size);
  c.largest = size;
  const std::uint64_t key = next_key_++;
  chunks_.emplace(key, std::move(c));
  return key;
}

void DriverPlacement::free_range(std::uintptr_t start, std::uintptr_t end) {
  auto next = free_.lower_bound(start);
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->second == start) {
      start = prev->first;
      free_.erase(prev);
    }
  }
  if (next != free_.end() && next->first == end) {
    end = next->second;
    free_.erase(next);
  }
  free_.emplace(start, end);
}

std::uintptr_t DriverPlacement::place(std::uint64_t key, std::uintptr_t p, std::size_t footprint) {
  Chunk& c = chunks_.at(key);
  take(c, p, footprint);
  ++c.live;
  live_.emplace(p, Live{key, footprint});
  return p;
}

std::uintptr_t DriverPlacement::allocate(std::size_t size) {
  const bool small = size < params_.page;
  const std::size_t alignment = small ? params_.small_alignment : params_.page;
  const std::size_t footprint = align_up(size, alignment);
  for (auto& [key, c] : chunks_) {
    if (c.largest < footprint) continue;
    if (const std::uintptr_t p = best_fit(c, footprint, alignment)) return place(key, p, footprint);
  }
  const std::uint64_t key =
      new_chunk(align_up(footprint, params_.chunk), params_.chunk, /*top_down=*/true);
  return key == 0 ? 0 : place(key, chunks_.at(key).base, footprint);
}

std::uintptr_t DriverPlacement::reserve(std::size_t size, std::size_t alignment) {
  const std::size_t footprint = align_up(size, params_.page);
  const std::uint64_t key = new_chunk(align_up(footprint, params_.chunk),
                                      std::max(alignment, params_.chunk), /*top_down=*/false);
  return key == 0 ? 0 : place(key, chunks_.at(key).base, footprint);
}

bool DriverPlacement::release(std::uintptr_t start) {
  auto it = live_.find(start);
  if (it == live_.end()) return false;
  const Live l = it->second;
  live_.erase(it);
  auto chunk = chunks_.find(l.chunk);
  Chunk& c = chunk->second;
  give(c, start, l.footprint);
  if (--c.live == 0 && !c.context) {
    free_range(c.base, c.base + c.size);
    chunks_.erase(chunk);
  }
  return true;
}

}  // namespace reservoir::sim
