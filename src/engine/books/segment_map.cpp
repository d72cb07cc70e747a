#include "engine/books/segment_map.hpp"

#include <algorithm>

#include "engine/books/block.hpp"
#include "util/checks.hpp"

namespace reservoir::detail {

constinit thread_local OwnerHints tls_owner_hints;

namespace {
// Generations of every map of the process: a value is never used twice, so a hint
// of a map that is gone never matches a later map at the same address.
std::atomic<std::uint64_t> g_generations{0};
}  // namespace

SegmentMap::SegmentMap() : generation_(g_generations.fetch_add(1) + 1) {
  for (auto& m : root_) m.store(nullptr, std::memory_order_relaxed);
}

void SegmentMap::next_generation() {
  generation_.store(g_generations.fetch_add(1) + 1, std::memory_order_release);
}

SegmentMap::~SegmentMap() {
  for (auto& m : root_) {
    Middle* middle = m.load(std::memory_order_relaxed);
    if (!middle) continue;
    for (auto& l : middle->leaves) delete l.load(std::memory_order_relaxed);
    delete middle;
  }
}

SegmentMap::Slot* SegmentMap::slot(std::uint64_t page, bool create) {
  std::size_t top = static_cast<std::size_t>(page >> (2 * kLevelBits)) & (kFanout - 1);
  std::size_t mid = static_cast<std::size_t>(page >> kLevelBits) & (kFanout - 1);
  std::size_t low = static_cast<std::size_t>(page) & (kFanout - 1);
  if ((page >> (3 * kLevelBits)) != 0) return nullptr;  // beyond 57-bit addresses
  Middle* middle = root_[top].load(std::memory_order_acquire);
  if (!middle) {
    if (!create) return nullptr;
    middle = new Middle();
    for (auto& l : middle->leaves) l.store(nullptr, std::memory_order_relaxed);
    root_[top].store(middle, std::memory_order_release);
  }
  Leaf* leaf = middle->leaves[mid].load(std::memory_order_acquire);
  if (!leaf) {
    if (!create) return nullptr;
    leaf = new Leaf();
    middle->leaves[mid].store(leaf, std::memory_order_release);
  }
  return &leaf->slots[low];
}

void SegmentMap::insert(Segment* segment) {
  insert(segment, segment->base, segment->size);
}

void SegmentMap::erase(Segment* segment) {
  erase(segment, segment->base, segment->size);
}

// Both walk the range a leaf at a time (one tree descent per 4096 pages), and erase
// skips leaves never created: a range far larger than what is registered in it
// costs a few steps per 8 GiB.
void SegmentMap::owner_gone(BlockOwner* owner) {
  std::lock_guard<std::mutex> guard(write_mutex_);
  next_generation();  // hints naming the owner go stale
  if (sole_.load(std::memory_order_relaxed) == owner) {
    sole_.store(nullptr, std::memory_order_release);
    owners_differ_ = true;
  }
}

void SegmentMap::insert(Segment* segment, std::uintptr_t address, std::size_t bytes) {
  if (bytes == 0) return;
  std::lock_guard<std::mutex> guard(write_mutex_);
  // Before the segment is findable (so before any pointer into it exists).
  if (!owners_differ_) {
    BlockOwner* owner = segment->owner_now();
    BlockOwner* sole = sole_.load(std::memory_order_relaxed);
    if (sole == nullptr) {
      sole_.store(owner, std::memory_order_release);
    } else if (sole != owner) {
      sole_.store(nullptr, std::memory_order_release);
      owners_differ_ = true;
    }
  }
  const std::uint64_t last = (address + bytes - 1) >> kPageBits;
  for (std::uint64_t page = address >> kPageBits; page <= last;) {
    const std::uint64_t leaf_last = std::min<std::uint64_t>(last, page | (kFanout - 1));
    Slot* s = slot(page, true);
    RESERVOIR_CHECK(s != nullptr, "segment address beyond 57 bits");
    for (; page <= leaf_last; ++page, ++s) {
      // Entries never move between the two places, so a concurrent reader cannot
      // miss a segment that stays registered.
      if (s->first.load(std::memory_order_relaxed) == nullptr) {
        s->first.store(segment, std::memory_order_release);
      } else {
        RESERVOIR_CHECK(s->second.load(std::memory_order_relaxed) == nullptr,
                        "three segments share one 2 MiB page");
        s->second.store(segment, std::memory_order_release);
      }
    }
  }
}

void SegmentMap::erase(Segment* segment, std::uintptr_t address, std::size_t bytes) {
  if (bytes == 0) return;
  std::lock_guard<std::mutex> guard(write_mutex_);
  next_generation();  // before the range can be reused: hints of the segment go stale
  const std::uint64_t last = (address + bytes - 1) >> kPageBits;
  for (std::uint64_t page = address >> kPageBits; page <= last;) {
    const std::uint64_t leaf_last = std::min<std::uint64_t>(last, page | (kFanout - 1));
    Slot* s = slot(page, false);
    for (; s && page <= leaf_last; ++page, ++s) {
      if (s->first.load(std::memory_order_relaxed) == segment)
        s->first.store(nullptr, std::memory_order_release);
      else if (s->second.load(std::memory_order_relaxed) == segment)
        s->second.store(nullptr, std::memory_order_release);
    }
    page = leaf_last + 1;
  }
}

}  // namespace reservoir::detail
