// The simulated driver pool: see memory_pool.hpp.
#include "backend/sim/memory_pool.hpp"

#include <algorithm>
#include <iterator>
#include <vector>

#include "backend/sim/address_space.hpp"

namespace reservoir::sim {

namespace {
std::size_t round_up(std::size_t value, std::size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}
}  // namespace

PoolModel::PoolModel(const SimPoolOptions& options) : options_(options) {}

std::size_t PoolModel::rounded(std::size_t size) const {
  return round_up(size, options_.alignment);
}

std::uintptr_t PoolModel::chunk_of(std::uintptr_t address) const {
  auto it = chunks_.upper_bound(address);
  return it == chunks_.begin() ? 0 : std::prev(it)->first;
}

void PoolModel::erase_free(std::map<std::uintptr_t, std::size_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  free_.erase(it);
}

void PoolModel::insert_free(std::uintptr_t address, std::size_t size) {
  const std::uintptr_t chunk = chunk_of(address);
  auto next = free_.lower_bound(address);
  if (next != free_.end() && next->first == address + size && chunk_of(next->first) == chunk) {
    size += next->second;
    auto after = std::next(next);
    erase_free(next);
    next = after;
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == address && chunk_of(prev->first) == chunk) {
      address = prev->first;
      size += prev->second;
      erase_free(prev);
    }
  }
  free_.emplace(address, size);
  by_size_.insert({size, address});
}

bool PoolModel::complete(const Pending& p, StreamHandle stream, const StreamProgress& progress) {
  if (p.position > progress.completed(stream)) return false;
  for (const auto& [s, position] : p.after)
    if (position > progress.completed(s)) return false;
  return true;
}

void PoolModel::settle(const StreamProgress& progress) {
  for (auto it = pending_.begin(); it != pending_.end();) {
    PendingQueue& q = it->second;
    // Frees past the stream's completed work cannot be complete: the scan stops there.
    const std::uint64_t reached = progress.completed(it->first);
    for (auto p = q.by_position.begin(); p != q.by_position.end() && p->first <= reached;) {
      ++steps_;
      if (complete(p->second, it->first, progress)) {
        insert_free(p->second.address, p->second.size);
        p = q.erase(p);
      } else {
        ++p;
      }
    }
    it = q.by_position.empty() ? pending_.erase(it) : std::next(it);
  }
}

std::map<std::uintptr_t, std::size_t>::iterator PoolModel::find_free(std::size_t size) {
  if (options_.best_fit) {
    auto it = by_size_.lower_bound({size, 0});
    return it == by_size_.end() ? free_.end() : free_.find(it->second);
  }
  return std::find_if(free_.begin(), free_.end(),
                      [size](const auto& r) { return r.second >= size; });
}

void PoolModel::take(std::uintptr_t address, std::size_t range, std::size_t size) {
  if (range > size) insert_free(address + size, range - size);
  live_.emplace(address, size);
  usage_.used += size;
  usage_.used_high = std::max(usage_.used_high, usage_.used);
}

PoolModel::PendingQueue::Iterator PoolModel::PendingQueue::fit(std::size_t size,
                                                               std::uint64_t limit,
                                                               std::uint64_t* steps) {
  // Best fit among the frees up to limit: the first of the size order within the
  // prefix, or the best of a walk over the prefix. Both walks step together and the
  // first to end answers, so a long prefix or many too-late fits cost only the shorter.
  auto in_size = by_size.lower_bound({size, 0});
  auto in_prefix = by_position.begin();
  auto best = by_position.end();
  for (;; ++*steps) {
    if (in_size == by_size.end()) return by_position.end();
    if (in_size->second <= limit) return by_position.find(in_size->second);
    ++in_size;
    if (in_prefix == by_position.end() || in_prefix->first > limit) return best;
    if (in_prefix->second.size >= size &&
        (best == by_position.end() || in_prefix->second.size < best->second.size))
      best = in_prefix;
    ++in_prefix;
  }
}

std::uintptr_t PoolModel::take_pending(std::size_t size, StreamHandle stream,
                                       const StreamProgress& progress) {
  // Best fit among the frees stream may reuse before they are complete: all of its
  // own, another stream's up to the position stream waited for. Ties go to the first
  // queue met, then the lowest position.
  PendingQueue* best_queue = nullptr;
  PendingQueue::Iterator best;
  for (auto& [s, q] : pending_) {
    const std::uint64_t limit = s == stream       ? UINT64_MAX
                                : progress.waited ? progress.waited(stream, s)
                                                  : 0;
    auto fit = q.fit(size, limit, &steps_);
    if (fit != q.by_position.end() && (!best_queue || fit->second.size < best->second.size)) {
      best_queue = &q;
      best = fit;
    }
  }
  if (!best_queue) return 0;
  Pending p = best->second;
  best_queue->erase(best);
  // The rest stays a pending free of the same stream and position.
  if (p.size > size) best_queue->add(Pending{p.address + size, p.size - size, p.position, p.after});
  live_.emplace(p.address, size);
  usage_.used += size;
  usage_.used_high = std::max(usage_.used_high, usage_.used);
  return p.address;
}

void PoolModel::give_back_free_chunks(std::size_t keep, const Shrink& shrink) {
  for (auto it = chunks_.begin(); it != chunks_.end() && usage_.reserved > keep;) {
    auto f = free_.find(it->first);
    if (f == free_.end() || f->second != it->second) {
      ++it;
      continue;
    }
    erase_free(f);
    shrink(it->first, it->second);
    usage_.reserved -= it->second;
    it = chunks_.erase(it);
  }
}

std::uintptr_t PoolModel::allocate(std::size_t size, StreamHandle stream,
                                   const StreamProgress& progress, const Grow& grow,
                                   const Shrink& shrink) {
  const std::size_t need = rounded(size);
  settle(progress);
  auto it = find_free(need);
  if (it != free_.end()) {
    const std::uintptr_t address = it->first;
    const std::size_t range = it->second;
    erase_free(it);
    take(address, range, need);
    return address;
  }
  if (std::uintptr_t address = take_pending(need, stream, progress)) return address;
  const std::size_t chunk =
      std::max(options_.chunk_min, round_up(need, options_.chunk_granularity));
  if (options_.reuse_free_chunks) give_back_free_chunks(0, shrink);
  std::uintptr_t address = 0;
  if (!grow(chunk, &address)) {
    give_back_free_chunks(0, shrink);  // the device may now have room
    if (!grow(chunk, &address)) return 0;
  }
  chunks_.emplace(address, chunk);
  usage_.reserved += chunk;
  usage_.reserved_high = std::max(usage_.reserved_high, usage_.reserved);
  take(address, chunk, need);
  return address;
}

std::string PoolModel::free(std::uintptr_t address, StreamHandle stream, std::uint64_t position,
                            Dependencies after, const StreamProgress& progress) {
  auto it = live_.find(address);
  if (it == live_.end())
    return "sim: free_async: " + hex(address) + " is not a live allocation of this pool";
  const std::size_t size = it->second;
  live_.erase(it);
  usage_.used -= size;
  Pending p{address, size, position, std::move(after)};
  if (complete(p, stream, progress)) {
    insert_free(address, size);
  } else {
    pending_[stream].add(std::move(p));
  }
  return "";
}

std::size_t PoolModel::trim(std::size_t keep, const StreamProgress& progress,
                            const Shrink& shrink) {
  settle(progress);
  const std::size_t before = usage_.reserved;
  give_back_free_chunks(keep, shrink);
  return before - usage_.reserved;
}

void PoolModel::release_all(const Shrink& shrink) {
  for (const auto& [address, size] : chunks_) shrink(address, size);
  chunks_.clear();
  free_.clear();
  by_size_.clear();
  pending_.clear();
  usage_.reserved = 0;
}

}  // namespace reservoir::sim
